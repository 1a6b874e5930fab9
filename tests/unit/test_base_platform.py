"""#37 item 5: the base's platform manifest, pinned beside the index digest (publish/baseplatform.py).

A fake registry answers as the HTTP API does (manifests by digest or tag, blobs); the end-to-end
test against a real registry and a real two-platform index is tests/e2e/test_platform_pin_e2e.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from mtpimage.assembly import pipeline
from mtpimage.assembly.recipe import recipe_of
from mtpimage.assembly.versionvector import version_vector
from mtpimage.commands.load import plan_for
from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.manifests import manifest
from mtpimage.mirrors import BuildMirrors, RegistryMirror
from mtpimage.plan.model import BasePlatform
from mtpimage.publish import baseplatform
from mtpimage.publish.baseplatform import BaseNotServed
from mtpimage.publish.registryclient import RegistryUnreachable

from .helpers import REPO

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
HOST = "registry.example"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class FakeRegistry:
    """Manifests and blobs by repository path; `down` makes every call fail to connect."""

    def __init__(self):
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.asked: list[tuple[str, str, str]] = []  # (host, what, reference)
        self.down = False
        self.override: dict[str, bytes] = {}  # reference -> other bytes served for it

    def image(self, path: str, arch: str) -> str:
        config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"diff_ids": []}}).encode()
        self.blobs[_digest(config)] = config
        body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_TYPE,
                "config": {"mediaType": "x", "digest": _digest(config), "size": len(config)},
                "layers": [],
            }
        ).encode()
        self.manifests[(path, _digest(body))] = body
        return _digest(body)

    def index(self, path: str, entries: list[tuple[str, str]], tag: str | None = None) -> str:
        body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": INDEX_TYPE,
                "manifests": [
                    {
                        "mediaType": MANIFEST_TYPE,
                        "digest": d,
                        "size": 1,
                        "platform": dict(zip(("os", "architecture"), plat.split("/"), strict=True)),
                    }
                    for plat, d in entries
                ],
            }
        ).encode()
        self.manifests[(path, _digest(body))] = body
        if tag:
            self.manifests[(path, tag)] = body
        return _digest(body)

    def client(self, host: str):
        registry = self

        class Client:
            def _check(self, what, ref):
                registry.asked.append((host, what, ref))
                if registry.down:
                    raise RegistryUnreachable(host, what, OSError("[Errno 111] Connection refused"))

            def manifest(self, path, reference):
                self._check("manifest", reference)
                body = registry.override.get(reference) or registry.manifests.get((path, reference))
                return None if body is None else (body, _digest(body))

            def manifest_digest(self, path, reference):
                self._check("head", reference)
                body = registry.manifests.get((path, reference))
                return None if body is None else _digest(body)

            def fetch_blob(self, path, digest, out, max_bytes):
                self._check("blob", digest)
                data = registry.blobs[digest]
                out.write(data)
                return _digest(data), len(data)

        return Client()


@pytest.fixture
def reg(monkeypatch):
    fake = FakeRegistry()
    monkeypatch.setattr(baseplatform, "_client", fake.client)
    monkeypatch.setattr(pipeline, "_PLATFORM_VERDICTS", {})
    return fake


def _multi(reg: FakeRegistry, path="nvidia/cuda") -> tuple[str, str, str]:
    amd, arm = reg.image(path, "amd64"), reg.image(path, "arm64")
    return reg.index(path, [("linux/arm64", arm), ("linux/amd64", amd), ("unknown/unknown", arm)]), amd, arm


# ----------------------------------------------------------------------------- resolve
def test_the_index_names_the_amd64_manifest(reg):
    index, amd, arm = _multi(reg)
    got = baseplatform.resolve(f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}")
    assert (got.manifest, got.platform_digest) == ("index", amd)
    assert baseplatform.select(json.loads(reg.manifests[("nvidia/cuda", index)]), "linux/arm64") == arm
    assert baseplatform.BUILD_PLATFORM == "linux/amd64"


def test_a_single_platform_base_is_its_own_platform_manifest(reg):
    amd = reg.image("mtp-test/base", "amd64")
    got = baseplatform.resolve(f"{HOST}/mtp-test/base:b@{amd}")
    assert (got.manifest, got.platform_digest) == ("single-platform", amd)
    arm = reg.image("mtp-test/base", "arm64")
    with pytest.raises(InputError, match="single-platform image for linux/arm64, not linux/amd64"):
        baseplatform.resolve(f"{HOST}/mtp-test/base:b@{arm}")


def test_an_index_without_the_build_platform_is_refused(reg):
    arm = reg.image("x/y", "arm64")
    index = reg.index("x/y", [("linux/arm64", arm)])
    with pytest.raises(InputError, match=r"lists no linux/amd64 image \(it lists linux/arm64\)"):
        baseplatform.resolve(f"{HOST}/x/y:t@{index}")


def test_other_bytes_at_the_pinned_digest_and_a_missing_platform_manifest_are_refused(reg):
    index, amd, _arm = _multi(reg)
    other = reg.index("nvidia/cuda", [("linux/amd64", reg.image("nvidia/cuda", "arm64"))])
    reg.override[index] = reg.manifests[("nvidia/cuda", other)]
    with pytest.raises(BaseNotServed, match="answered the pinned digest .* with other bytes"):
        baseplatform.resolve(f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}")
    reg.override.clear()
    del reg.manifests[("nvidia/cuda", amd)]  # a partial copy: the index without its image
    with pytest.raises(BaseNotServed, match="lists linux/amd64 as .* but has no such manifest"):
        baseplatform.resolve(f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}")


def test_the_base_is_read_where_the_build_pulls_it_a_mirror(reg):
    index, amd, _arm = _multi(reg, "dockerhub/nvidia/cuda")
    mirrors = BuildMirrors(registries=(RegistryMirror("docker.io", "mirror.example:5000", "dockerhub"),))
    got = baseplatform.resolve(f"nvidia/cuda:13@{index}", mirrors)
    assert got.platform_digest == amd and got.source == "the registry mirror mirror.example:5000"
    assert {h for h, _w, _r in reg.asked} == {"mirror.example:5000"}
    # a mirror without the base is refused in the mirror's words: the setting, its location
    del reg.manifests[("dockerhub/nvidia/cuda", index)]
    with pytest.raises(BaseNotServed) as exc:
        baseplatform.resolve(f"nvidia/cuda:13@{index}", mirrors)
    assert str(exc.value).startswith(
        f"base image nvidia/cuda:13@{index} through its registry mirror (MTP_REGISTRY_MIRROR / "
        "--registry-mirror docker.io=mirror.example:5000/dockerhub): "
        f"mirror.example:5000/dockerhub/nvidia/cuda@{index} could not be pulled: has no manifest {index}"
    )


# ----------------------------------------------------------------------------- lock
def test_lock_records_the_platform_digest_beside_the_index(reg):
    index, amd, _arm = _multi(reg)
    entry, unverified = baseplatform.lock_entry(f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}", None)
    assert unverified is None
    assert entry == {"platform": "linux/amd64", "manifest": "index", "platform_digest": amd, "verified": True}


def test_lock_where_the_registry_does_not_answer_records_no_platform_digest(reg, monkeypatch):
    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    index, amd, _arm = _multi(reg)
    reg.down = True
    image = f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}"
    entry, unverified = baseplatform.lock_entry(image, None)
    assert entry["verified"] is False and "platform_digest" not in entry
    assert "not verified" in unverified and "connection refused" in unverified
    # a lock made earlier where it answered keeps its record, said to be not read again
    previous = {"digest": index, "manifest": "index", "platform_digest": amd, "verified": True}
    entry, unverified = baseplatform.lock_entry(image, previous)
    assert (entry["platform_digest"], entry["verified"]) == (amd, False)
    assert "kept as the previous lock recorded it" in entry["reason"]
    # ... but not a record of another pinned base
    entry, _ = baseplatform.lock_entry(image, {**previous, "digest": "sha256:" + "0" * 64})
    assert "platform_digest" not in entry


def test_a_moved_tag_is_a_note_and_the_pin_stays(reg):
    old, _amd, _arm = _multi(reg)
    assert (
        baseplatform.tag_moved(f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{old}") is None
    )  # no such tag: no note
    new = reg.index(
        "nvidia/cuda", [("linux/amd64", reg.image("nvidia/cuda", "amd64"))], tag="13.0.2-devel-ubuntu24.04"
    )
    assert new != old
    note = baseplatform.tag_moved(f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{old}")
    assert f"now names {new}" in note and f"the pin stays {old}" in note


# ----------------------------------------------------------------------------- plan, vector, check
def _manifests(tmp_path: Path, base: str, record: dict | None) -> Path:
    """The shipped manifests with `base` (NAME:TAG@DIGEST) pinned, and lock.yaml's base entry
    as a lock with `record` (its platform fields) would have written it."""
    root = tmp_path / "m"
    shutil.copytree(REPO / "manifests", root)
    name_tag, digest = base.split("@")
    name, tag = name_tag.rsplit(":", 1)
    cat = (root / "components.yaml").read_text()
    old = yaml.safe_load(cat)["platform"]["base_image"]
    cat = cat.replace(old["name"], name).replace(old["tag"], tag).replace(old["digest"], digest)
    (root / "components.yaml").write_text(cat)
    lock = yaml.safe_load((root / "lock.yaml").read_text())
    lock["base_image"] = {"name": name, "tag": tag, "digest": digest, **(record or {})}
    (root / "lock.yaml").write_text(yaml.safe_dump(lock, sort_keys=False))
    return root


def test_the_plan_and_the_version_vector_carry_the_lock_record(reg, tmp_path):
    index, amd, _arm = _multi(reg)
    base = f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}"
    record = {"platform": "linux/amd64", "manifest": "index", "platform_digest": amd, "verified": True}
    m = manifest.load(_manifests(tmp_path, base, record))
    plan = plan_for(m, "mtp-detach", None)
    assert plan.base_platform == BasePlatform("linux/amd64", "index", amd)
    assert plan.locked, "the lock still matches the manifests"
    vv = version_vector(recipe_of(plan))["base_platform"]
    assert vv == {"platform": "linux/amd64", "manifest": "index", "digest": amd}
    unrecorded = plan_for(manifest.load(_manifests(tmp_path / "u", base, None)), "mtp-detach", None)
    assert unrecorded.base_platform is None and unrecorded.digest != plan.digest
    assert version_vector(recipe_of(unrecorded))["base_platform"] == {
        "platform": "linux/amd64",
        "manifest": "unrecorded",
        "digest": None,
    }
    # a substituted base is not the one the lock recorded
    other = f"127.0.0.1:5000/standin:x@sha256:{'1' * 64}"
    assert plan_for(m, "mtp-detach", None, base=other).base_platform is None


def test_check_verifies_and_refuses_a_lock_naming_another_platform_manifest(reg, tmp_path, capsys):
    from mtpimage import cli

    index, amd, arm = _multi(reg)
    base = f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}"
    record = {"platform": "linux/amd64", "manifest": "index", "platform_digest": amd, "verified": True}
    root = _manifests(tmp_path, base, record)
    assert cli.main(["check", "--manifests", str(root), "--profile", "mtp-detach"]) == 0
    out = capsys.readouterr().out
    assert f"linux/amd64 manifest {amd} (index): verified in registry {HOST}" in out
    # a hand edit (or a merge) put the arm64 manifest there: one line, the field, the fix
    (root / "lock.yaml").write_text((root / "lock.yaml").read_text().replace(amd, arm))
    assert cli.main(["check", "--manifests", str(root), "--profile", "mtp-detach"]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith(f"error: {root / 'lock.yaml'}: base_image.platform_digest: records {arm}")
    assert f"lists {amd} (index)" in line
    assert f"(fix: run `python3 build.py lock --manifests {root}` and review the diff)" in line
    assert captured.out == ""  # nothing before the refusal


def test_check_never_says_verified_where_the_registry_does_not_answer(reg, tmp_path, capsys):
    from mtpimage import cli

    index, amd, _arm = _multi(reg)
    record = {"platform": "linux/amd64", "manifest": "index", "platform_digest": amd, "verified": True}
    root = _manifests(tmp_path, f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}", record)
    reg.down = True
    assert cli.main(["check", "--manifests", str(root), "--profile", "mtp-detach", "--json"]) == 0
    [report] = json.loads(capsys.readouterr().out)
    assert report["base_platform"]["status"] == "unverified"
    assert report["base_platform"]["detail"] == (
        f"linux/amd64 manifest lock.yaml's {amd} unverified: registry {HOST} cannot be reached: "
        "connection refused (nothing listens there)"
    )
    reg.down = False
    root = _manifests(tmp_path / "u", f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}", None)
    assert cli.main(["check", "--manifests", str(root), "--profile", "mtp-detach"]) == 0
    out = capsys.readouterr().out
    assert f"linux/amd64 manifest {amd} (index, read from registry {HOST}): not recorded in" in out
    assert ": verified" not in out


def test_a_build_refuses_the_changed_platform_manifest_before_the_engine_runs(reg, tmp_path, monkeypatch):
    from mtpimage.assembly.render import render

    index, amd, arm = _multi(reg)
    record = {"platform": "linux/amd64", "manifest": "index", "platform_digest": arm, "verified": True}
    root = _manifests(tmp_path, f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}", record)
    plan = plan_for(manifest.load(root), "mtp-load-only", None)
    built = []

    class Engine:
        name = "buildah"
        needs_local_base = False

        def build(self, request):
            built.append(request)
            return "sha256:" + "9" * 64

        def describe(self):
            return "fake"

    monkeypatch.setattr(pipeline, "build_request", lambda *a, **k: built.append("request") or object())
    said = []
    with pytest.raises(InputError, match="base_image.platform_digest"):
        pipeline.build_image(plan, render(plan, root), pipeline.BuildOptions(engine=Engine()), said.append)
    assert built == [] and said == []
    fixed = (root / "lock.yaml").read_text().replace(f"platform_digest: {arm}", f"platform_digest: {amd}")
    (root / "lock.yaml").write_text(fixed)
    monkeypatch.setattr(pipeline.sizes, "after_build", lambda *a: None)
    plan = plan_for(manifest.load(root), "mtp-load-only", None)
    pipeline.build_image(plan, render(plan, root), pipeline.BuildOptions(engine=Engine()), said.append)
    assert said[0] == (
        f"base    {HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index[:19]}: linux/amd64 manifest {amd} (index): verified in "
        f"registry {HOST}, as {root / 'lock.yaml'} records"
    )


def test_a_registry_that_serves_other_bytes_stops_check(reg, tmp_path):
    from mtpimage import cli

    index, _amd, _arm = _multi(reg)
    root = _manifests(tmp_path, f"{HOST}/nvidia/cuda:13.0.2-devel-ubuntu24.04@{index}", None)
    reg.override[index] = b'{"schemaVersion": 2, "manifests": []}'
    with pytest.raises(EnvironmentProblem, match="with other bytes"):
        cli.cmd_check(
            cli.make_parser().parse_args(["check", "--manifests", str(root), "--profile", "mtp-detach"])
        )
