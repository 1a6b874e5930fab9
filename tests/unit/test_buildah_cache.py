"""The reproducible engine's layer cache (engine/buildahengine.py): which flags a cached and a
cold build give buildah, and the registry cache's specs. No buildah needed."""

from __future__ import annotations

import pytest

from mtpimage.engine.buildahengine import BuildahEngine, registry_cache_argv
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
