"""Issue 49 item 3: lock.yaml per platform (builds.lock_platforms), builds.platform, and rule
platform-wheels: a plan installs its platform's set, and a pin with no wheel there is named
with what it blocks. The failure cases run `lock`'s own resolution and file choice against a
loopback index whose package has an x86_64 wheel only."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from packaging.utils import parse_wheel_filename

from mtpimage.commands.load import plan_for
from mtpimage.lock import lockfile, pydeps, pythonset, resolver
from mtpimage.lock.locker import Locker
from mtpimage.manifests import manifest, schema
from mtpimage.plan import platforms, rules
from mtpimage.plan.model import COMPONENTS, LockedRow, lock_platforms
from mtpimage.publish.baseplatform import BUILD_PLATFORM
from tests.fixtures.dated_index import DatedIndex

from .helpers import MANIFESTS, copy_manifests, run_main

ARM = "linux/arm64"
X86 = "cp312-cp312-manylinux_2_17_x86_64"
ARM_TAG = "cp312-cp312-manylinux_2_17_aarch64"


def _plan(profile="mtp-rollout", sets=(), m=None):
    return plan_for(m or manifest.load(None), profile, list(sets))


def _verdict(plan):
    return next(r for r in rules.evaluate(plan) if r.rule.id == "platform-wheels")


def _lock() -> dict:
    return yaml.safe_load((MANIFESTS / "lock.yaml").read_text())


def test_the_schema_default_is_the_platform_the_lock_is_made_for():
    # each profile's `python_set` is for the schema default; another platform is a platform_sets entry
    assert schema.default(COMPONENTS, "builds", "platform") == BUILD_PLATFORM == pythonset.LOCK_PLATFORM
    assert set(platforms.known()) == {BUILD_PLATFORM, ARM}
    assert platforms.arch_of(ARM) == "aarch64"


def test_amd64_plans_are_not_judged_and_keep_their_digest():
    plan = _plan()
    assert plan.platform == BUILD_PLATFORM
    assert "platform" not in plan.to_dict() and "platform_gaps" not in plan.to_dict()
    assert _verdict(plan).status == rules.NA
    arm = _plan(sets=[f"builds.platform={ARM}"])
    assert arm.platform == ARM and arm.digest != plan.digest


def test_the_shipped_lock_holds_both_platforms_for_every_profile():
    lock = _lock()
    m = manifest.load(None)
    assert lock_platforms(m.catalogue.data) == [BUILD_PLATFORM, ARM]
    assert lock["target"]["other_platforms"] == {ARM: "manylinux_2_39_aarch64"}
    for name in m.names():
        amd = lock["python_sets"][lockfile.set_key_for(lock, name, BUILD_PLATFORM)]
        arm = lock["python_sets"][lockfile.set_key_for(lock, name, ARM)]
        assert arm["platform"] == ARM and "platform" not in amd
        assert arm["resolved"] and not arm.get("no_wheel")
        # the same stack on both CPUs: every amd64 pin at the same version on arm64
        assert {n: e["version"] for n, e in amd["packages"].items()}.items() <= {
            n: e["version"] for n, e in arm["packages"].items()
        }.items()


def _files(pset: dict) -> dict:
    rows = dict(pset["packages"])
    for comp, backends in pset.get("build_requires", {}).items():
        rows.update({f"build:{comp}:{n}": e for n, e in backends.items()})
    return {n: e for n, e in rows.items() if e.get("file")}


def test_every_arm64_file_is_hashed_and_installs_on_aarch64():
    lock = _lock()
    key = lockfile.set_key_for(lock, "mtp-rollout", ARM)
    amd = _files(lock["python_sets"][lockfile.set_key_for(lock, "mtp-rollout", BUILD_PLATFORM)])
    arm = _files(lock["python_sets"][key])
    differ = 0
    for name, e in arm.items():
        assert len(e["sha256"]) == 64, name
        if e.get("sdist"):
            continue
        tags = parse_wheel_filename(e["file"])[3]
        assert all(t.platform.endswith("_aarch64") or t.platform == "any" for t in tags), e["file"]
        if name in amd and amd[name]["sha256"] != e["sha256"]:
            differ += 1
            assert not e["file"].endswith("-none-any.whl") or not amd[name]["file"].endswith("-none-any.whl")
        elif name in amd:
            assert amd[name]["file"] == e["file"]  # one file for every CPU: pure wheels, sdists
    assert differ > 0 and "torch" in arm and arm["torch"]["file"].endswith("_aarch64.whl")
    assert set(arm) - set(amd) == {"decord2"}  # sglang's marker: decord2 on aarch64 only


def test_an_arm64_plan_installs_the_arm64_files_and_passes(tmp_path):
    lock = _lock()
    arm_set = lock["python_sets"][lockfile.set_key_for(lock, "mtp-rollout", ARM)]["packages"]
    amd_set = lock["python_sets"][lockfile.set_key_for(lock, "mtp-rollout", BUILD_PLATFORM)]["packages"]
    plan = _plan(sets=[f"builds.platform={ARM}"])
    result = _verdict(plan)
    assert result.status == rules.PASS, result.detail
    rows = {r.name: r for r in plan.locked if not r.is_build_backend}
    assert rows["torch"].sha256 == arm_set["torch"]["sha256"] != amd_set["torch"]["sha256"]
    assert "decord2" in rows
    # the rendered requirements pip installs with --require-hashes carry the arm64 sha256
    out = run_main(
        "render", "--profile", "mtp-rollout", "--set", f"builds.platform={ARM}", "--out", str(tmp_path / "r")
    )
    assert out.returncode == 0, out.stderr
    text = "".join(p.read_text() for p in sorted((tmp_path / "r").rglob("*.txt")))
    assert f"torch==2.11.0 --hash=sha256:{arm_set['torch']['sha256']}" in text
    assert amd_set["torch"]["sha256"] not in text
    assert "decord2==3.4.0 --hash=sha256:" in text


def test_a_lock_without_the_platform_set_is_refused_with_the_setting_to_add():
    plan = dataclasses.replace(_plan(sets=[f"builds.platform={ARM}"]), locked=())
    result = _verdict(plan)
    assert result.status == rules.FAIL and result.rule.severity == "error"
    assert "lock.yaml holds no linux/arm64 set for profile mtp-rollout" in result.detail
    assert "builds.lock_platforms" in result.detail


def test_a_gap_is_named_with_its_page_its_layer_and_what_it_blocks():
    plan = _plan(sets=[f"builds.platform={ARM}"])
    kernel = next(r for r in plan.locked if r.name == "sglang-kernel")
    gaps = (
        LockedRow("sglang-kernel", kernel.version, kernel.layer, "pypi", "", ""),
        LockedRow("psutil", "7.1.3", "build:flash-attn", "pypi", "", ""),
    )
    detail = _verdict(dataclasses.replace(plan, platform_gaps=gaps)).detail
    assert detail.startswith(f"linux/arm64: sglang-kernel {kernel.version} has no manylinux aarch64 wheel")
    assert "https://pypi.org/simple/sglang-kernel/" in detail
    assert f"needed by layer {kernel.layer} (" in detail and "sglang" in detail
    assert "it blocks profile mtp-rollout (targets rl)" in detail
    assert (
        "psutil 7.1.3 has no manylinux aarch64 wheel" in detail
        and "needed by the build of flash-attn" in detail
    )


# ------------------------------------------------------------------ a fake index: no aarch64 wheel


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    with DatedIndex(tmp_path / "index") as idx:
        idx.add("app", "1.0", "2026-01-01T00:00:00Z", ["fastk", "both"])
        idx.add("fastk", "1.0", "2026-01-01T00:00:00Z", tag=X86)  # x86_64 only
        idx.add("both", "2.0", "2026-01-01T00:00:00Z", tag=X86)
        # another file (its metadata names an extra) for aarch64: other bytes, another sha256
        idx.add("both", "2.0", "2026-01-01T00:00:00Z", extras={"arm": []}, tag=ARM_TAG)
        idx.add("other", "1.0", "2026-01-01T00:00:00Z")
        yield idx


def test_uv_names_the_pin_without_an_aarch64_wheel_and_the_rest_resolves(index):
    amd = resolver.resolve(["app==1.0", "other==1.0"], {}, [], [], [index.url], "3.12")
    assert set(amd.packages) == {"app", "both", "fastk", "other"}
    with pytest.raises(resolver.ResolutionFailed) as exc:
        resolver.resolve(["app==1.0", "other==1.0"], {}, [], [], [index.url], "3.12", arch="aarch64")
    assert exc.value.no_platform_wheel == {"fastk": "1.0"}
    arm, gaps = resolver.resolve_allowing_gaps(
        ["app==1.0", "other==1.0"], {}, [], [], [index.url], "3.12", arch="aarch64"
    )
    assert gaps == {"fastk": "1.0"} and set(arm.packages) == {"app", "both", "other"}


def test_files_are_chosen_and_cached_per_platform(index, tmp_path):
    amd = resolver.select_files({"both": "2.0"}, index.url, "3.12")
    arm = resolver.select_files({"both": "2.0"}, index.url, "3.12", arch="aarch64")
    assert amd["both"]["file"].endswith("x86_64.whl") and arm["both"]["file"].endswith("aarch64.whl")
    assert amd["both"]["sha256"] != arm["both"]["sha256"]
    cached = sorted(p.parent.name for p in (tmp_path / "cache" / "files").rglob("both-2.0.json"))
    assert cached == [pydeps.wheel_platform("aarch64"), pydeps.wheel_platform("x86_64")]
    # a cache hit answers for its own platform only
    again = resolver.select_files({"both": "2.0"}, index.url, "3.12", arch="aarch64")
    assert again == arm
    with pytest.raises(resolver.NoPlatformWheel) as exc:
        resolver.select_files({"fastk": "1.0", "both": "2.0"}, index.url, "3.12", arch="aarch64")
    assert exc.value.missing == {"fastk": "1.0"} and "fastk==1.0: no wheel" in str(exc.value)


def test_the_lock_records_the_gap_and_the_rule_names_it_for_the_profile(index, tmp_path, monkeypatch):
    """`lock`'s python sets for both platforms on the loopback index (the plan's inputs
    narrowed to `app` and `other`): the arm64 set records fastk under no_wheel and nothing
    fails; the lock with it makes the arm64 plan fail rule platform-wheels, naming fastk."""
    m = manifest.load(None)
    plan = _plan(m=m)

    def inputs(self, plan, platform=pythonset.LOCK_PLATFORM):
        s = pythonset._SetInputs(indexes={"pypi": index.url}, used=["pypi"], reach={"pypi": None})
        s.requirements, s.reachable = ["app==1.0", "other==1.0"], [index.url]
        s.key = lockfile.set_key(s.requirements, {"pypi": index.url}, {"platform": platform})
        s.platform = platform
        return s

    monkeypatch.setattr(pythonset.PythonSets, "_set_inputs", inputs)
    monkeypatch.setattr(pythonset.PythonSets, "_build_sets", lambda *a, **k: {})
    locker = Locker(m)
    key = locker.python_set(plan)
    arm_key = locker.python_set(plan, ARM, first=key)
    assert not locker.failures
    amd, arm = locker.sets[key], locker.sets[arm_key]
    assert "fastk" in amd["packages"] and "fastk" not in arm["packages"]
    assert arm["no_wheel"] == {
        "fastk": {"version": "1.0", "layer": amd["packages"]["fastk"]["layer"], "index": "pypi"}
    }
    assert arm["packages"]["both"]["sha256"] != amd["packages"]["both"]["sha256"]

    lock = _lock()
    lock["python_sets"][arm_key] = json.loads(json.dumps(arm))
    lock["profiles"]["mtp-rollout"]["platform_sets"] = {ARM: arm_key}
    root = copy_manifests(tmp_path)
    lockfile.write(root / "lock.yaml", lock)
    arm_plan = _plan(sets=[f"builds.platform={ARM}"], m=manifest.load(root))
    assert arm_plan.locked == () and [r.name for r in arm_plan.platform_gaps] == ["fastk"]
    result = _verdict(arm_plan)
    assert result.status == rules.FAIL
    assert result.detail.startswith("linux/arm64: fastk 1.0 has no manylinux aarch64 wheel for CPython 3.12")
    assert "it blocks profile mtp-rollout (targets rl)" in result.detail
    # the amd64 plan of the same lock is untouched
    assert _verdict(_plan(m=manifest.load(root))).status == rules.NA


def test_render_refuses_a_platform_the_lock_holds_no_set_for(tmp_path):
    lock = _lock()
    for prof in lock["profiles"].values():
        prof.pop("platform_sets")
    root = copy_manifests(tmp_path)
    lockfile.write(root / "lock.yaml", lock)
    args = ["render", "--manifests", str(root), "--profile", "mtp-rollout", "--out", str(tmp_path / "r")]
    out = run_main(*args, "--set", f"builds.platform={ARM}")
    assert out.returncode != 0 and not (tmp_path / "r").exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert (
        "builds.platform: linux/arm64: lock.yaml holds no linux/arm64 set for profile mtp-rollout" in lines[0]
    )
    assert "builds.lock_platforms" in lines[0]
    assert run_main(*args).returncode == 0  # linux/amd64 renders from the same lock
