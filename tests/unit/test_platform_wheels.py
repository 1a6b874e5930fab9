"""Issue 49 item 3: builds.platform, mtpimage/data/platforms.yaml and rule platform-wheels."""

from __future__ import annotations

import dataclasses

import yaml
from packaging.utils import parse_wheel_filename

from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest, schema
from mtpimage.plan import platforms, rules
from mtpimage.plan.model import COMPONENTS, LockedRow
from mtpimage.publish.baseplatform import BUILD_PLATFORM

from .helpers import MANIFESTS

ARM = "linux/arm64"


def _plan(profile="mtp-rollout", sets=()):
    return plan_for(manifest.load(None), profile, list(sets))


def _verdict(plan):
    return next(r for r in rules.evaluate(plan) if r.rule.id == "platform-wheels")


def test_the_schema_default_is_the_platform_the_lock_is_made_for():
    # the rule treats the schema default as "what lock.yaml holds files for"
    assert schema.default(COMPONENTS, "builds", "platform") == BUILD_PLATFORM


def test_amd64_plans_are_not_judged_and_keep_their_digest():
    plan = _plan()
    assert plan.platform == BUILD_PLATFORM
    assert "platform" not in plan.to_dict()  # every digest made before issue 49 keeps
    assert _verdict(plan).status == rules.NA
    arm = _plan(sets=[f"builds.platform={ARM}"])
    assert arm.platform == ARM and arm.digest != plan.digest


def test_arm64_is_refused_while_the_lock_holds_no_arm64_files():
    result = _verdict(_plan(sets=[f"builds.platform={ARM}"]))
    assert result.status == rules.FAIL and result.rule.severity == "error"
    assert "every pin has a manylinux_2_39_aarch64 wheel" in result.detail
    assert "lock.yaml holds linux/arm64 files for none of them" in result.detail
    assert "decord2==3.4.0" in result.detail  # what the arm64 resolution adds (sglang's markers)


def _with_wheel(plan, name: str, version: str, file: str):
    """The plan's survey with one pin's aarch64 wheel replaced."""
    known = platforms.known()[ARM]
    wheels = dict(known.wheels) | {(name, version): file}
    return dataclasses.replace(known, wheels=wheels)


def test_a_pin_without_an_aarch64_wheel_is_named_with_its_source_and_what_it_blocks(monkeypatch):
    plan = _plan(sets=[f"builds.platform={ARM}"])
    kernel = next(r for r in plan.locked if r.name == "sglang-kernel")
    facts = _with_wheel(plan, "sglang-kernel", kernel.version, platforms.NONE)
    monkeypatch.setattr(platforms, "known", lambda: {ARM: facts})
    detail = _verdict(plan).detail
    assert detail.startswith(
        f"linux/arm64: sglang-kernel {kernel.version} has no manylinux_2_39_aarch64 wheel"
    )
    assert "https://pypi.org/simple/sglang-kernel/" in detail
    assert f"needed by layer {kernel.layer} (" in detail and "sglang" in detail
    assert "it blocks profile mtp-rollout (targets rl)" in detail
    assert "the other pins have" in detail


def test_a_build_backend_without_an_aarch64_wheel_names_the_build(monkeypatch):
    plan = _plan(sets=[f"builds.platform={ARM}"])
    facts = _with_wheel(plan, "psutil", "7.1.3", platforms.NONE)
    monkeypatch.setattr(platforms, "known", lambda: {ARM: facts})
    assert "psutil 7.1.3 has no manylinux_2_39_aarch64 wheel" in _verdict(plan).detail
    assert "needed by the build of flash-attn" in _verdict(plan).detail


def test_a_pin_the_survey_never_read_is_said_not_passed():
    plan = _plan(sets=[f"builds.platform={ARM}"])
    bumped = tuple(
        dataclasses.replace(r, version="0.4.3") if r.name == "sglang-kernel" else r for r in plan.locked
    )
    detail = _verdict(dataclasses.replace(plan, locked=bumped)).detail
    assert "not surveyed for linux/arm64" in detail and "sglang-kernel==0.4.3" in detail


def test_pure_python_files_and_sdists_serve_every_cpu():
    row = LockedRow("a", "1", "x", "pypi", "a-1-py3-none-any.whl", "0" * 64)
    assert platforms.same_everywhere(row)
    assert platforms.same_everywhere(dataclasses.replace(row, file="a-1.tar.gz"))
    assert not platforms.same_everywhere(
        dataclasses.replace(row, file="a-1-cp312-cp312-manylinux_2_28_x86_64.whl")
    )


def test_the_survey_covers_every_platform_wheel_of_the_shipped_lock():
    """platforms.yaml was read for this lock: every x86_64-specific pin (image and build
    backends) has its arm64 row, and each named wheel is an aarch64 file of that version."""
    lock = yaml.safe_load((MANIFESTS / "lock.yaml").read_text())
    known = platforms.known()[ARM]
    pins = set()
    for pset in lock["python_sets"].values():
        backends = [r for rows in pset.get("build_requires", {}).values() for r in rows.items()]
        for name, row in list(pset["packages"].items()) + backends:
            file = row.get("file") or ""
            if file and not row.get("sdist") and not file.endswith("-none-any.whl"):
                pins.add((name, str(row["version"])))
    assert pins and pins == set(known.wheels)
    for (name, version), file in known.wheels.items():
        if file != platforms.NONE:
            wname, wversion, _, tags = parse_wheel_filename(file)
            assert (wname, str(wversion)) == (name, version), file
            assert all(t.platform.endswith("_aarch64") or t.platform == "any" for t in tags), file
