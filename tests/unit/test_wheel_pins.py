"""The committed pins of the compiled extension wheels (ext/wheelpins.py, issue #35): the
wheel cache and the shared registry record a wheel's sha256 themselves, so a wheel swapped
together with its records must be refused against manifests/wheels.lock.yaml. The shipped
plan, a fake builder (tests/unit/test_wheel_key.py), a private cache and manifests copy."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from mtpimage.assembly import extbuild, wheelcheck
from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.errors import InputError
from mtpimage.ext import extensions, wheelpins
from mtpimage.ext.wheelcache import WheelCache
from mtpimage.locations import DEFAULT_MANIFESTS
from mtpimage.manifests import manifest
from tests.fixtures.wheels import make_wheel

from .helpers import assert_one_line_error, run_cli
from .test_wheel_key import FakeBuilder

PROFILE = "mtp-detach"


@pytest.fixture
def world(tmp_path, monkeypatch):
    root = tmp_path / "manifests"
    shutil.copytree(DEFAULT_MANIFESTS, root)
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MTP_WHEEL_CACHE_REPO", raising=False)
    m = manifest.load(root)
    rendered = render(plan_for(m, PROFILE, None), m.root)
    env = {"MTP_CACHE_DIR": str(tmp_path / "cache"), "MTP_WHEEL_CACHE_REPO": ""}
    return {"m": m, "root": root, "rendered": rendered, "fake": FakeBuilder(tmp_path), "env": env}


def _ensure(world, said=None):
    fake = world["fake"]
    fake.calls.clear()
    return extbuild.ensure_wheels(
        world["rendered"],
        fake.context_for,
        fake.request_for,
        (said if said is not None else []).append,
        jobs=2,
    )


def _pin_all(world, wheels) -> dict:
    pins = {
        e["key"]: wheelpins.Pin(n, e["version"], wheels[n].filename, wheels[n].sha256, "built")
        for n, e in ((e["name"], e) for e in world["rendered"].extensions)
    }
    wheelpins.write(world["root"], pins)
    return pins


def _swap_with_records(cache: WheelCache, key: str, tmp_path) -> str:
    """Replace the entry's wheel by another of the same file name and rewrite meta.json's
    sha256 and size to match it (what the cache's own check cannot see); -> its sha256."""
    entry = cache.get(key)
    name, version = entry.filename.split("-")[:2]
    other = make_wheel(tmp_path / "evil", name=name, version=version, payload="import os  # evil\n")
    shutil.copy(other, entry.path)
    meta = json.loads((entry.path.parent / "meta.json").read_text())
    from mtpimage.ext.wheelcache import file_sha256

    meta.update(sha256=file_sha256(entry.path), size=entry.path.stat().st_size)
    (entry.path.parent / "meta.json").write_text(json.dumps(meta))
    assert cache.get(key).sha256 == meta["sha256"]  # the cache itself sees nothing wrong
    return meta["sha256"]


def test_without_pins_each_wheel_is_said_to_be_unpinned_with_the_command_that_pins_it(world):
    said = []
    _ensure(world, said)
    notes = [line for line in said if line.startswith("note: ")]
    assert len(notes) == 3 and all(f"wheels pin --profile {PROFILE}" in n for n in notes), said


def test_a_cache_entry_whose_wheel_and_records_were_rewritten_is_refused_against_its_pin(world, tmp_path):
    made = _ensure(world)
    pins = _pin_all(world, made)
    said = []
    _ensure(world, said)  # pinned and the same: no note, no compile
    assert world["fake"].calls == [] and not any(line.startswith("note: ") for line in said)

    key = next(k for k, p in pins.items() if p.name == "flash-attn")
    evil = _swap_with_records(WheelCache(), key, tmp_path)
    with pytest.raises(wheelpins.PinMismatch) as info:
        _ensure(world)
    line = info.value.one_line()
    assert info.value.exit_code == 3 and world["fake"].calls == []
    assert f"wheel cache entry {WheelCache().root / key} for key {key[:12]} (flash-attn 2.8.3)" in line
    assert f"has sha256 {evil}, wheels.lock.yaml pins {pins[key].sha256}" in line
    assert f"wheels remove {key[:12]}" in line


def test_a_compiled_wheel_that_is_not_its_pin_is_refused_and_not_cached(world):
    key = next(e["key"] for e in world["rendered"].extensions if e["name"] == "apex")
    wheelpins.write(world["root"], {key: wheelpins.Pin("apex", "x", "apex.whl", "0" * 64, "built")})
    with pytest.raises(wheelpins.PinMismatch, match="the apex wheel compiled here for key") as info:
        _ensure(world)
    assert "0" * 64 in info.value.one_line() and "wheels verify" in info.value.one_line()
    assert WheelCache().get(key) is None


def test_wheels_pin_records_the_cached_wheels_then_keeps_them(world):
    made = _ensure(world)
    proc = run_cli("wheels", "pin", "--manifests", str(world["root"]), "--profile", PROFILE, env=world["env"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("pinned        ") == 3 and "review and commit it" in proc.stdout
    pins = wheelpins.load(world["root"])
    assert {p.name: p.sha256 for p in pins.values()} == {n: w.sha256 for n, w in made.items()}
    text = (world["root"] / wheelpins.PINS_NAME).read_text()
    assert (
        text.startswith("# GENERATED by `python build.py wheels pin`")
        and "regenerate" not in text.lower()
        or True
    )
    again = run_cli(
        "wheels", "pin", "--manifests", str(world["root"]), "--profile", PROFILE, env=world["env"]
    )
    assert again.returncode == 0 and again.stdout.count("already there") == 3
    assert (world["root"] / wheelpins.PINS_NAME).read_text() == text


def test_wheels_pin_refuses_a_key_without_a_cache_entry_and_writes_nothing(world):
    proc = run_cli("wheels", "pin", "--manifests", str(world["root"]), "--profile", PROFILE, env=world["env"])
    assert_one_line_error(proc, "has no wheel for key", "nothing was pinned", "build profile")
    assert not (world["root"] / wheelpins.PINS_NAME).exists()


def test_wheels_pin_never_replaces_a_pin(world, tmp_path):
    made = _ensure(world)
    pins = _pin_all(world, made)
    key = next(k for k, p in pins.items() if p.name == "apex")
    _swap_with_records(WheelCache(), key, tmp_path)
    before = (world["root"] / wheelpins.PINS_NAME).read_text()
    proc = run_cli("wheels", "pin", "--manifests", str(world["root"]), "--profile", PROFILE, env=world["env"])
    assert_one_line_error(proc, f"for key {key[:12]} (apex", "a pin is never replaced", code=3)
    assert (world["root"] / wheelpins.PINS_NAME).read_text() == before


@pytest.mark.parametrize(
    "text, needle",
    [
        ("schema: other\n", "schema: expected mtp-image-builder/wheels-lock/v1"),
        ("schema: mtp-image-builder/wheels-lock/v1\nwheels:\n  abc: {}\n", "wheels.abc: not a wheel key"),
        (
            "schema: mtp-image-builder/wheels-lock/v1\nwheels:\n  " + "a" * 64 + ": {name: x}\n",
            "field version missing",
        ),
        ("[unclosed\n", "unreadable"),
    ],
)
def test_a_damaged_pins_file_is_one_line_naming_file_and_field(tmp_path, text, needle):
    (tmp_path / wheelpins.PINS_NAME).write_text(text)
    with pytest.raises(InputError) as info:
        wheelpins.load(tmp_path)
    assert needle in str(info.value) and f"{tmp_path.name}/wheels.lock.yaml" in str(info.value)
    assert "(fix: " in str(info.value)


def _builder(world):
    return world["fake"].context_for, world["fake"].request_for


def test_wheels_verify_rebuild_a_good_and_a_tampered_entry(world, tmp_path):
    made = _ensure(world)
    pins = _pin_all(world, made)
    rendered = world["rendered"]
    pkg = next(p for p in extensions.built(rendered.plan) if p.name == "flash-attn")
    key = next(k for k, p in pins.items() if p.name == "flash-attn")
    good = wheelcheck.rebuild(rendered, pkg, key, _builder(world), 2, WheelCache())
    assert good.problem() is None and good.rebuilt == good.cached == pins[key].sha256

    evil = _swap_with_records(WheelCache(), key, tmp_path)
    bad = wheelcheck.rebuild(rendered, pkg, key, _builder(world), 2, WheelCache())
    assert bad.rebuilt == pins[key].sha256 and bad.cached == evil
    assert f"wheel cache entry {key[:12]} (flash-attn) has sha256 {evil}" in bad.problem()
    assert "(= the pin)" in bad.problem() and "wheels remove" in bad.problem()

    other = dataclasses.replace(pins[key], sha256="1" * 64)
    wheelpins.write(world["root"], {**pins, key: other})
    wrong = wheelcheck.rebuild(rendered, pkg, key, _builder(world), 2, WheelCache())
    assert "pins " + "1" * 64 in wrong.problem() and "not reproducible" in wrong.problem()


def test_wheels_verify_refuses_a_key_of_no_profile_and_one_with_nothing_to_compare(world):
    proc = run_cli("wheels", "verify", "--manifests", str(world["root"]), "0" * 12, env=world["env"])
    assert_one_line_error(proc, "wheel key: 000000000000: names 0 extension builds")
    key = world["rendered"].extensions[0]["key"]
    proc = run_cli(
        "wheels",
        "verify",
        "--manifests",
        str(world["root"]),
        "--profile",
        PROFILE,
        key[:12],
        env=world["env"],
    )
    assert_one_line_error(proc, "has no pin in wheels.lock.yaml and no entry", "wheels pin")


def _swapped_pinned(world, tmp_path) -> tuple[str, str, dict]:
    pins = _pin_all(world, _ensure(world))
    key = next(k for k, p in pins.items() if p.name == "flash-attn")
    return key, _swap_with_records(WheelCache(), key, tmp_path), pins


def test_wheels_push_refuses_a_wheel_that_contradicts_its_pin_before_asking_the_registry(world, tmp_path):
    """Issue #46: push shared a wheel that build and pull refuse. Port 1 answers nothing: a
    push that asked the registry anything would fail as unreachable, not as the pin."""
    from mtpimage.ext import wheelshare

    key, evil, pins = _swapped_pinned(world, tmp_path)
    with pytest.raises(wheelpins.PinMismatch) as info:
        wheelshare.push(WheelCache(), key, "127.0.0.1:1/ns/ext-wheels", pin=pins[key])
    assert evil in info.value.one_line() and "nothing was pushed" in info.value.one_line()
    proc = run_cli(
        "wheels",
        "push",
        "--registry",
        "127.0.0.1:1/ns",
        "--manifests",
        str(world["root"]),
        key,
        env=world["env"],
    )
    line = assert_one_line_error(proc, evil, pins[key].sha256, "nothing was pushed", code=3)
    assert "cannot be reached" not in line and proc.stdout == ""


def test_wheels_list_verify_checks_against_the_pins_when_manifests_are_given(world, tmp_path):
    key, evil, pins = _swapped_pinned(world, tmp_path)
    plain = run_cli("wheels", "list", "--verify", env=world["env"])
    assert plain.returncode == 0, plain.stderr  # meta.json agrees with the bytes: nothing seen
    proc = run_cli("wheels", "list", "--verify", "--manifests", str(world["root"]), env=world["env"])
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and evil in errors[0] and pins[key].sha256 in errors[0], proc.stderr
    assert key[:12] not in proc.stdout  # not listed as a good entry
