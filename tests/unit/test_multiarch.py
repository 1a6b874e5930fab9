"""Issue 49 item 3, build and publish: builds.platform reaches the engines, arm64 runs under
qemu's binfmt handler (or says in one line that it cannot), each platform's image has its own
tag, and one canonical OCI index lists them (the same images, the same bytes)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from mtpimage.assembly import formattags
from mtpimage.assembly.pipeline import BuildOptions
from mtpimage.commands.load import plan_for
from mtpimage.engine import buildahengine, emulation, layercompress
from mtpimage.engine.containerengine import BuildRequest, build_flags
from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.ext import extensions
from mtpimage.imageref import Registry
from mtpimage.manifests import manifest
from mtpimage.outputs import reproduce
from mtpimage.plan import platforms, rules
from mtpimage.publish import digests, imageindex
from mtpimage.publish.baseplatform import BUILD_PLATFORM
from mtpimage.schemas import __path__ as schemas_path

from .helpers import REPO

ARM = "linux/arm64"
TEST_MANIFESTS = REPO / "tests" / "manifests"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# -- the plan and the engines ------------------------------------------------------------------
def test_a_non_default_platform_reaches_the_build_request_and_both_engines_argv():
    m = manifest.load(TEST_MANIFESTS)
    amd = plan_for(m, "test-detach", [])
    arm = plan_for(m, "test-detach", [f"builds.platform={ARM}"])
    opts = BuildOptions(engine=None)
    # the lock's platform is never named: an amd64 build's argv is what it was
    assert opts.request(b"", {}, amd).platform is None
    req = opts.request(b"", {}, arm)
    assert req.platform == ARM
    assert build_flags(req)[:2] == ["--platform", ARM]
    assert "--platform" not in build_flags(opts.request(b"", {}, amd))
    # the buildah engine's bud takes it (and its base pull: _pull_base)
    argv = buildahengine.BuildahEngine(docker=object())._bud_argv(req, Path("/x/iid"))
    assert argv[argv.index("--platform") + 1] == ARM


def test_each_platform_has_its_own_tag_and_the_profile_tag_is_the_index():
    m = manifest.load(TEST_MANIFESTS)
    assert plan_for(m, "test-detach", []).profile_tag == "test-detach"
    arm = plan_for(m, "test-detach", [f"builds.platform={ARM}"])
    assert arm.profile_tag == "test-detach.arm64"
    # with a layer format too: the platform's tag, then the format's (one rule: variant_tag)
    assert formattags.for_format("x", arm.profile_tag, "zstd").profile == "test-detach.arm64.zstd"


def test_no_profile_named_like_another_profiles_platform_tag_can_move_that_image(tmp_path):
    """`test-detach-arm64` is a valid profile name: with a hyphen between profile and arch, its
    amd64 image would have gone under the tag of test-detach's arm64 image. Every tag of every
    profile, platform and layer format is distinct, and no platform's tag is a name at all."""
    man = tmp_path / "manifests"
    shutil.copytree(TEST_MANIFESTS, man)
    twin = (
        (man / "profiles" / "test-detach.yaml")
        .read_text()
        .replace("name: test-detach\n", "name: test-detach-arm64\n")
    )
    (man / "profiles" / "test-detach-arm64.yaml").write_text(twin)
    m = manifest.load(man)
    assert "test-detach-arm64" in m.names()
    name = json.loads((Path(schemas_path[0]) / "profile.v1.json").read_text())["$defs"]["profile_name"][
        "pattern"
    ]
    arches = {p.rsplit("/", 1)[-1] for p in platforms.known()}
    assert not arches & set(layercompress.formats())  # a platform's suffix is never a format's
    owner: dict[str, tuple] = {}
    for profile in m.names():
        for platform in platforms.known():
            plan = plan_for(m, profile, [f"builds.platform={platform}"])
            if platform != BUILD_PLATFORM:
                assert not re.fullmatch(name, plan.profile_tag), plan.profile_tag  # no profile's name
            for fmt in layercompress.formats():
                tag = formattags.for_format("x", plan.profile_tag, fmt).profile
                assert tag not in owner, (tag, owner.get(tag), (profile, platform, fmt))
                owner[tag] = (profile, platform, fmt)
    assert owner["test-detach.arm64"][:2] == ("test-detach", ARM)
    assert owner["test-detach-arm64"][:2] == ("test-detach-arm64", BUILD_PLATFORM)


@pytest.mark.parametrize("taken", ["test-detach-0123456789ab", "stack-0123456789abcdef"])
def test_a_profile_named_like_a_content_or_stack_tag_is_refused_in_one_line(tmp_path, taken):
    """`<profile>-<12 hex>` is a profile's content tag (its identity) and `stack-<16 hex>` the
    stack cache's: a profile of that name would push its profile tag over another image."""
    man = tmp_path / "manifests"
    shutil.copytree(TEST_MANIFESTS, man)
    path = man / "profiles" / f"{taken}.yaml"
    path.write_text(
        (man / "profiles" / "test-detach.yaml").read_text().replace("name: test-detach\n", f"name: {taken}\n")
    )
    with pytest.raises(InputError) as exc:
        manifest.load(man)
    line = str(exc.value)
    assert str(path) in line and "name" in line and "content tag" in line and "rename the profile" in line, (
        line
    )
    assert "\n" not in line


def test_a_stand_in_plan_without_platform_files_passes_the_rule_the_real_stack_does_not():
    m = manifest.load(TEST_MANIFESTS)
    arm = plan_for(m, "test-detach", [f"builds.platform={ARM}"])
    assert not arm.locked
    verdict = rules.platform_wheels(arm, {})
    assert (
        verdict.status == rules.PASS and "no pin of this plan has a platform-specific file" in verdict.detail
    )
    # the real stack pins packages: it passes only with lock.yaml's linux/arm64 set, which the
    # shipped lock has (a plan that pins packages and has no set fails: test_platform_wheels.py)
    real = plan_for(manifest.load(None), "mtp-detach", [f"builds.platform={ARM}"])
    assert real.locked and rules.platform_wheels(real, {}).status == rules.PASS


def test_an_extension_wheel_key_names_a_non_default_platform_only():
    m = manifest.load(None)
    amd = plan_for(m, "mtp-detach", [])
    arm = dataclasses.replace(amd, platform=ARM)
    pkg = next(p for p in amd.packages if p.build is not None)
    assert "platform" not in extensions.key_inputs(amd, pkg, "r")  # no amd64 key moved
    assert extensions.key_inputs(arm, pkg, "r")["platform"] == ARM
    assert extensions.key_of(extensions.key_inputs(arm, pkg, "r")) != extensions.key_of(
        extensions.key_inputs(amd, pkg, "r")
    )


# -- emulation -----------------------------------------------------------------------------------
def _binfmt(tmp_path: Path, state: str | None) -> Path:
    if state is not None:
        (tmp_path / "qemu-aarch64").write_text(
            f"{state}\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n"
        )
    return tmp_path


def test_native_needs_nothing_and_arm64_on_x86_needs_qemu_registered(tmp_path, monkeypatch):
    monkeypatch.setattr(emulation, "host_platform", lambda: "linux/amd64")
    assert emulation.handler("linux/amd64", _binfmt(tmp_path, None)) is None
    assert emulation.handler(ARM, _binfmt(tmp_path, "enabled")) == "qemu-aarch64"
    monkeypatch.setattr(emulation, "host_platform", lambda: ARM)  # an arm64 runner: native
    assert emulation.handler(ARM, _binfmt(tmp_path, None)) is None


@pytest.mark.parametrize("state", [None, "disabled"])
def test_arm64_without_a_registered_qemu_is_one_line_with_the_fix(tmp_path, monkeypatch, state):
    monkeypatch.setattr(emulation, "host_platform", lambda: "linux/amd64")
    with pytest.raises(EnvironmentProblem) as err:
        emulation.handler(ARM, _binfmt(tmp_path, state))
    msg = str(err.value)
    assert "\n" not in msg and "qemu-aarch64 is not registered" in msg
    assert "apt-get install qemu-user-static binfmt-support" in msg


def test_the_buildah_engine_checks_emulation_before_it_pulls_anything(monkeypatch):
    def refuse(platform):
        raise EnvironmentProblem("no qemu")

    monkeypatch.setattr(emulation, "handler", refuse)

    class NoStorage:
        def __init__(self, *a, **k):
            raise AssertionError("a storage root was made before the check")

    monkeypatch.setattr(buildahengine, "Storage", NoStorage)
    eng = buildahengine.BuildahEngine(docker=object())
    with pytest.raises(EnvironmentProblem, match="no qemu"):
        eng.build_layout(
            BuildRequest(context_tar=b"", labels={}, platform=ARM), Path("/nonexistent"), echo=False
        )


# -- the index -------------------------------------------------------------------------------------
class FakeRegistry:
    """Manifests and blobs by repository, as the registry client's calls see them (the real
    client's digest checks are tested in test_registry_trust; this checks what the index
    module does with what it is served)."""

    def __init__(self):
        self.registry = Registry("reg.example:5000", "ns")
        self.host = self.registry.host
        self.manifests: dict[str, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.puts = []

    def image(self, tag: str, arch: str) -> str:
        config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"diff_ids": []}}).encode()
        self.blobs[_sha(config)] = config
        body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"digest": _sha(config), "size": len(config)},
                "layers": [],
            }
        ).encode()
        self.manifests[tag] = self.manifests[_sha(body)] = body
        return _sha(body)

    def manifest(self, repository, reference, *a, **k):
        body = self.manifests.get(reference)
        return None if body is None else (body, _sha(body))

    def fetch_blob(self, repository, digest, out, max_bytes):
        out.write(self.blobs[digest])
        return digest, len(self.blobs[digest])

    def put_manifest(self, repository, reference, body, media_type):
        self.puts.append((reference, media_type))
        self.manifests[reference] = self.manifests[_sha(body)] = body
        return _sha(body)


def test_the_index_is_canonical_in_platform_order_and_reproducible():
    reg = FakeRegistry()
    amd, arm = reg.image("p-amd", "amd64"), reg.image("p-arm", "arm64")
    one = [
        imageindex.member(reg, "mtp-verl", "p-arm", ARM),
        imageindex.member(reg, "mtp-verl", "p-amd", "linux/amd64"),
    ]
    body = imageindex.index_bytes(one)
    assert body == imageindex.index_bytes(list(reversed(one)))  # order given does not matter
    doc = json.loads(body)
    assert body == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert doc["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert [e["digest"] for e in doc["manifests"]] == [amd, arm]
    assert doc["manifests"][1]["platform"] == {"architecture": "arm64", "os": "linux"}
    assert imageindex.platforms_of(body) == {"linux/amd64": amd, ARM: arm}
    digest = imageindex.publish(reg, "mtp-verl", "p", one)
    assert digest == _sha(body) and reg.puts[-1] == ("p", "application/vnd.oci.image.index.v1+json")
    assert imageindex.lists(reg, "mtp-verl", "p", ARM, arm)
    assert not imageindex.lists(reg, "mtp-verl", "p", ARM, amd)
    assert imageindex.platforms_of(reg.manifests["p-amd"]) is None  # one image, not an index


def test_an_image_of_another_platform_or_a_missing_one_is_refused():
    reg = FakeRegistry()
    reg.image("p-amd", "amd64")
    with pytest.raises(EnvironmentProblem, match="is a linux/amd64 image, not linux/arm64"):
        imageindex.member(reg, "mtp-verl", "p-amd", ARM)
    with pytest.raises(InputError, match="not in the registry"):
        imageindex.member(reg, "mtp-verl", "p-missing", ARM)
    with pytest.raises(InputError, match="named twice"):
        m = imageindex.member(reg, "mtp-verl", "p-amd", "linux/amd64")
        imageindex.index_bytes([m, m])


def test_an_index_entry_with_a_malformed_digest_is_refused_before_use():
    body = json.dumps(
        {
            "mediaType": imageindex.OCI_INDEX,
            "manifests": [{"digest": "sha256:../x", "platform": {"os": "linux"}}],
        }
    ).encode()
    with pytest.raises(digests.BadDigest, match="index entry 1"):
        imageindex.platforms_of(body)


def test_the_arm64_summary_says_verify_with_its_platform():
    r = reproduce.Reproduce("p", "reg/mtp-verl@sha256:" + "a" * 64, "https://x/y", "abc", platform=ARM)
    assert reproduce.commands(r)[-1].endswith(" --platform linux/arm64")
    assert "--platform" not in reproduce.commands(dataclasses.replace(r, platform=None))[-1]


def test_the_registry_answer_for_a_tag_must_be_the_pushed_index():
    reg = FakeRegistry()
    reg.image("p-amd", "amd64")
    one = [imageindex.member(reg, "mtp-verl", "p-amd", "linux/amd64")]
    reg.put_manifest = lambda *a: _sha(imageindex.index_bytes(one))  # says stored, keeps nothing
    with pytest.raises(EnvironmentProblem, match="names nothing after the index"):
        imageindex.publish(reg, "mtp-verl", "p", one)
