"""The reproducible engine's layer cache (engine/buildahengine.py): which flags a cached and a
cold build give buildah, the registry cache's specs, and what a load hands dockerd. No buildah
or dockerd needed."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from mtpimage.engine import ocilayout
from mtpimage.engine.buildahengine import BuildahEngine, held_prefix, registry_cache_argv
from mtpimage.engine.containerengine import BuildRequest
from mtpimage.errors import InputError


def _req(**kw) -> BuildRequest:
    return BuildRequest(context_tar=b"", labels={}, **kw)


def test_a_cached_build_drops_no_cache_and_a_cold_one_keeps_it(tmp_path):
    eng = BuildahEngine(docker=object())
    cached = eng._bud_argv(_req(), tmp_path / "iid", cached=True)
    cold = eng._bud_argv(_req(), tmp_path / "iid", cached=False)
    assert "--layers" in cached and "--no-cache" not in cached
    assert "--no-cache" in cold and "--timestamp" in cold


def test_registry_cache_specs_become_buildahs_one_repository_each():
    req = _req(
        cache_from=("type=registry,ref=127.0.0.1:5000/ns/mtp-verl:buildcache",),
        cache_to=("type=registry,ref=127.0.0.1:5000/ns/mtp-verl:buildcache,mode=max", "type=inline"),
    )
    assert registry_cache_argv(req) == [
        "--cache-from",
        "127.0.0.1:5000/ns/mtp-verl-buildcache",  # a repository of its own: no cache tags in the image's
        "--cache-to",
        "127.0.0.1:5000/ns/mtp-verl-buildcache",
        "--tls-verify=false",  # loopback: plain HTTP
    ]
    assert registry_cache_argv(_req(cache_from=("ghcr.io/org/cache",))) == [
        "--cache-from",
        "ghcr.io/org/cache",
    ]
    assert registry_cache_argv(_req(cache_to=("type=inline",))) == []  # BuildKit's, not buildah's


def test_a_cold_build_takes_no_registry_cache(tmp_path):
    eng = BuildahEngine(docker=object())
    argv = eng._bud_argv(_req(cache_from=("ghcr.io/org/cache",)), tmp_path / "iid", cached=False)
    assert "--cache-from" not in argv


@pytest.mark.parametrize(
    "kw,match",
    [
        (
            {"cache_from": ("type=local,src=/tmp/c",)},
            "--cache-from: type=local,src=/tmp/c: .*registry repository only",
        ),
        ({"cache_to": ("ghcr.io/a/x", "ghcr.io/b/y")}, "--cache-to: .*buildah takes one cache repository"),
    ],
)
def test_a_cache_buildah_cannot_use_is_an_input_error(kw, match):
    with pytest.raises(InputError, match=match):
        registry_cache_argv(_req(**kw))


def test_a_builder_is_refused(tmp_path):
    with pytest.raises(InputError, match="--builder: remote: the reproducible engine builds with buildah"):
        BuildahEngine(docker=object())._bud_argv(_req(builder="remote"), tmp_path / "iid", cached=True)


def test_held_prefix_is_the_longest_chain_dockerd_holds():
    ours = ["sha256:a", "sha256:b", "sha256:c"]
    assert held_prefix(ours, []) == 0
    assert held_prefix(ours, [["sha256:a", "sha256:x"], ["sha256:a", "sha256:b"]]) == 2
    # the same layer on another chain is not held: a layer is its chain
    assert held_prefix(ours, [["sha256:b", "sha256:c"]]) == 0
    assert held_prefix(ours, [ours + ["sha256:d"]]) == 3


from tests.unit.test_ocilayout import _layout, _tar  # noqa: E402 - the layouts those tests make


class _Docker:
    """dockerd as the load sees it: which images it has, and their layers."""

    def __init__(self, images: dict[str, list[str]]):
        self.images = dict(images)
        self.untagged: list[str] = []

    def image_id(self, ref):
        return ref if ref in self.images else None

    def layer_lists(self):
        return list(self.images.values())

    def untag(self, ref):
        self.untagged.append(ref)
        self.images.pop(ref, None)


def test_an_incremental_load_streams_only_the_new_layers_and_removes_its_step_images(tmp_path, monkeypatch):
    tars = [_tar({"a": b"1"}), _tar({"b": b"2"}), _tar({"c": b"3"}), _tar({"d": b"4"})]
    layout = ocilayout.normalise(_layout(tmp_path / "l", tars, "FROM x"))
    docker = _Docker({"sha256:old": layout.diff_ids[:2] + ["sha256:other"]})
    eng = BuildahEngine(docker=docker)
    loads = []

    def load(chunks, image_id):
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            manifest = json.loads(tar.extractfile("manifest.json").read())[0]
            config = json.loads(tar.extractfile(manifest["Config"]).read())
            carried = [n for n in manifest["Layers"] if tar.getmember(n).size]
        loads.append((len(manifest["Layers"]), carried))
        docker.images["sha256:" + manifest["Config"].removesuffix(".json")] = config["rootfs"]["diff_ids"]

    monkeypatch.setattr(eng, "_docker_load", load)
    eng._load(layout)
    name = [f"{d.split(':')[1]}/layer.tar" for d in layout.diff_ids]
    assert loads == [(3, [name[2]]), (4, [name[3]])]  # the two held layers never streamed
    assert docker.image_id(layout.image_id) == layout.image_id
    assert len(docker.untagged) == 1 and docker.untagged[0] not in (layout.image_id, "sha256:old")
    # already there: nothing loaded
    loads.clear()
    eng._load(layout)
    assert loads == []
