"""The extension wheel cache (mtpimage/ext/wheelcache.py): the key is the sha256 of canonical JSON
and every input changes it; an entry appears whole or not at all; a changed wheel is reported,
never returned; the first writer of a key wins. No docker, no network."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os

import pytest

from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.ext import wheelcache
from mtpimage.ext.wheelcache import CorruptEntry, WheelCache, cache_key
from tests.fixtures.wheels import make_wheel

from .helpers import assert_one_line_error, run_cli

INPUTS = {
    "schema": 1,
    "name": "flash-attn",
    "version": "2.8.3",
    "source": {"kind": "sdist", "url": "https://files.example/flash_attn-2.8.3.tar.gz", "sha256": "a" * 64},
    "torch": "2.11.0",
    "cuda": "13.0.2",
    "python": "3.12",
    "base": "sha256:" + "b" * 64,
    "archs": ["90"],
    "env": {"MAX_JOBS": "2", "FLASH_ATTENTION_FORCE_BUILD": "TRUE"},
    "build_requires": ["ninja==1.11.1.4", "packaging==25.0"],
    "recipe": "c" * 64,
}


def _with(path: str, value) -> dict:
    """INPUTS with the field at dotted `path` set to `value`."""
    out = copy.deepcopy(INPUTS)
    *parents, last = path.split(".")
    target = out
    for p in parents:
        target = target[p]
    target[last] = value
    return out


# One change per field the caller puts in a key (issue #22: source hash, torch, CUDA, archs,
# build flags, ...), nested fields included: each must give another key.
CHANGES = {
    "schema": _with("schema", 2),
    "name": _with("name", "flash_attn"),
    "version": _with("version", "2.8.2"),
    "source.kind": _with("source.kind", "git"),
    "source.url": _with("source.url", "https://mirror.example/flash_attn-2.8.3.tar.gz"),
    "source.sha256": _with("source.sha256", "d" * 64),
    "source.commit": _with("source", {"repo": "https://github.com/NVIDIA/apex", "commit": "e" * 40}),
    "torch": _with("torch", "2.11.1"),
    "cuda": _with("cuda", "13.0.1"),
    "python": _with("python", "3.13"),
    "base": _with("base", "sha256:" + "f" * 64),
    "archs": _with("archs", ["90", "100"]),
    "archs.order": _with("archs", ["100", "90"]),  # the caller sorts; the key does not
    "env.value": _with("env.MAX_JOBS", "16"),
    "env.added": _with("env.NVCC_THREADS", "4"),
    "build_requires": _with("build_requires", ["ninja==1.11.1.4", "packaging==24.2"]),
    "recipe": _with("recipe", "0" * 64),
}


def test_the_key_is_sha256_of_canonical_json():
    # Pinned, so that a change of the serialisation (which would orphan every cached wheel
    # everywhere) is a decision and not an accident.
    assert (
        cache_key({"b": [1, "x"], "a": {"é": None, "c": True}})
        == hashlib.sha256(b'{"a":{"c":true,"\\u00e9":null},"b":[1,"x"]}').hexdigest()
    )


def test_same_inputs_in_another_order_give_the_same_key():
    shuffled = {k: INPUTS[k] for k in reversed(list(INPUTS))}
    shuffled["env"] = dict(reversed(list(INPUTS["env"].items())))
    shuffled["source"] = dict(reversed(list(INPUTS["source"].items())))
    assert list(shuffled) != list(INPUTS)
    assert cache_key(shuffled) == cache_key(INPUTS)
    assert len(cache_key(INPUTS)) == 64 and int(cache_key(INPUTS), 16) >= 0


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_each_input_changes_the_key(field):
    assert CHANGES[field] != INPUTS
    assert cache_key(CHANGES[field]) != cache_key(INPUTS)


def test_the_changes_give_distinct_keys():
    keys = {cache_key(v) for v in CHANGES.values()}
    assert len(keys) == len(CHANGES)


@pytest.mark.parametrize(
    "bad",
    [
        {"torch": 2.11},
        {"env": {"X": 1.0}},
        {"archs": [90.0]},
        {"archs": ("90",)},
        {"archs": {"90"}},
        {"recipe": b"abc"},
        {"env": {1: "x"}},
        {"base": object()},
        {},
    ],
    ids=["float", "nested-float", "float-in-list", "tuple", "set", "bytes", "int-key", "object", "empty"],
)
def test_keys_never_depend_on_repr(bad):
    with pytest.raises(ValueError):
        cache_key(bad)


# -- the cache ------------------------------------------------------------------------------
KEY = cache_key(INPUTS)
META = {"inputs": INPUTS, "built_by": "builder-1", "built_at": "2026-12-01T00:00:00Z", "build_seconds": 12.5}


@pytest.fixture
def cache(tmp_path) -> WheelCache:
    return WheelCache(tmp_path / "cache")


@pytest.fixture
def wheel(tmp_path):
    return make_wheel(tmp_path / "built")


def test_put_then_get_round_trip(cache, wheel):
    put = cache.put(KEY, wheel, META)
    got = WheelCache(cache.root).get(KEY)  # another process sees what is on disk
    assert got == put
    assert got.path.read_bytes() == wheel.read_bytes() and got.path != wheel
    assert got.path.parent == cache.root / KEY
    assert got.filename == wheel.name
    assert got.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    on_disk = json.loads((cache.root / KEY / "meta.json").read_text())
    assert on_disk == got.meta
    assert on_disk["inputs"] == INPUTS and on_disk["built_by"] == "builder-1"
    assert (on_disk["key"], on_disk["filename"], on_disk["sha256"], on_disk["size"]) == (
        KEY,
        wheel.name,
        got.sha256,
        wheel.stat().st_size,
    )
    assert sorted(p.name for p in (cache.root / KEY).iterdir()) == sorted(["meta.json", wheel.name])
    assert wheel.exists()  # the caller's file is copied, not taken


def test_a_miss_is_none(cache):
    assert cache.get(KEY) is None
    assert cache.entries() == []


def test_a_failed_rename_leaves_no_entry(cache, wheel, monkeypatch):
    def broken_rename(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(wheelcache.os, "rename", broken_rename)
    with pytest.raises(EnvironmentProblem) as exc:
        cache.put(KEY, wheel, META)
    assert "Input/output error" in str(exc.value) and "fix:" in str(exc.value)
    assert len(exc.value.one_line().splitlines()) == 1
    monkeypatch.undo()
    assert cache.get(KEY) is None
    assert list(cache.root.iterdir()) == []  # the temporary directory went too


def test_a_put_killed_midway_is_no_entry_and_is_swept_later(cache, wheel):
    # What a SIGKILL during the copy leaves: a .tmp-* directory with part of an entry.
    cache.root.mkdir(parents=True)
    killed = cache.root / ".tmp-killed"
    (killed).mkdir()
    (killed / wheel.name).write_bytes(wheel.read_bytes()[:100])
    recent = cache.root / ".tmp-running"
    recent.mkdir()
    assert cache.get(KEY) is None and cache.keys() == []
    old = os.stat(killed).st_mtime - wheelcache.STALE_TMP_SECONDS - 60
    os.utime(killed, (old, old))
    cache.put(KEY, wheel, META)
    assert not killed.exists()
    assert recent.exists()  # possibly another put in progress: left alone


def test_a_changed_wheel_is_reported_never_returned(cache, wheel):
    entry = cache.put(KEY, wheel, META)
    data = bytearray(entry.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.path.write_bytes(bytes(data))
    with pytest.raises(CorruptEntry) as exc:
        cache.get(KEY)
    line = exc.value.one_line()
    assert KEY in line and str(entry.path) in line and "wheels remove" in line and "fix:" in line
    with pytest.raises(CorruptEntry):
        cache.entries(verify=True)
    good, bad = cache.scan(verify=True)
    assert good == [] and [b.key for b in bad] == [KEY]


@pytest.mark.parametrize("damage", ["no-meta", "bad-meta", "extra-wheel", "no-wheel", "truncated"])
def test_a_damaged_entry_is_corrupt(cache, wheel, damage):
    entry = cache.put(KEY, wheel, META)
    d = cache.root / KEY
    if damage == "no-meta":
        (d / "meta.json").unlink()
    elif damage == "bad-meta":
        (d / "meta.json").write_text("{")
    elif damage == "extra-wheel":
        (d / "other-1.0-py3-none-any.whl").write_bytes(b"x")
    elif damage == "no-wheel":
        entry.path.unlink()
    else:
        entry.path.write_bytes(entry.path.read_bytes()[:10])
    with pytest.raises(CorruptEntry):
        cache.get(KEY)
    with pytest.raises(CorruptEntry):  # a listing (sizes only) sees it too
        cache.entries()


def test_a_put_replaces_a_corrupt_entry(cache, wheel):
    entry = cache.put(KEY, wheel, META)
    entry.path.write_bytes(b"garbage")
    again = cache.put(KEY, wheel, META)
    assert again.path.read_bytes() == wheel.read_bytes()
    assert cache.get(KEY) == again


def test_the_first_writer_wins(cache, tmp_path, wheel):
    first = cache.put(KEY, wheel, META)
    other = make_wheel(tmp_path / "other", payload="VALUE = 2\n")  # a second build, other bytes
    assert other.read_bytes() != wheel.read_bytes()
    second = cache.put(KEY, other, {**META, "built_by": "builder-2"})
    assert second == first
    assert cache.get(KEY).path.read_bytes() == wheel.read_bytes()
    assert cache.get(KEY).meta["built_by"] == "builder-1"


def test_the_first_writer_wins_a_race(cache, tmp_path, wheel, monkeypatch):
    """Another writer finishes between our check and our rename: its entry stays."""
    other = make_wheel(tmp_path / "other", payload="VALUE = 2\n")
    real_rename = os.rename
    state = {"raced": False}

    def rename(src, dst):
        if not state["raced"]:
            state["raced"] = True
            cache.put(KEY, other, {**META, "built_by": "builder-2"})  # the other writer, first
        return real_rename(src, dst)

    monkeypatch.setattr(wheelcache.os, "rename", rename)
    got = cache.put(KEY, wheel, META)
    assert state["raced"]
    assert got.meta["built_by"] == "builder-2"
    assert got.path.read_bytes() == other.read_bytes()
    assert sorted(p.name for p in cache.root.iterdir()) == [KEY]  # our temp dir is gone


def test_entries_and_remove(cache, tmp_path, wheel):
    other_inputs = CHANGES["torch"]
    other_key = cache_key(other_inputs)
    cache.put(KEY, wheel, META)
    cache.put(other_key, make_wheel(tmp_path / "w2", payload="X = 3\n"), {"inputs": other_inputs})
    assert [e.key for e in cache.entries()] == sorted([KEY, other_key])
    assert [e.key for e in cache.entries(verify=True)] == sorted([KEY, other_key])
    assert cache.remove(KEY) is True
    assert cache.remove(KEY) is False
    assert cache.get(KEY) is None
    assert [e.key for e in cache.entries()] == [other_key]
    assert sorted(p.name for p in cache.root.iterdir()) == [other_key]


def test_resolve_a_prefix(cache, wheel):
    cache.put(KEY, wheel, META)
    assert cache.resolve(KEY[:12]) == KEY
    assert cache.resolve(KEY) == KEY
    for bad in (KEY[:7], "z" * 12, ("0" if KEY[0] != "0" else "1") * 12):
        with pytest.raises(InputError):
            cache.resolve(bad)


@pytest.mark.parametrize("bad", ["", "ABC", "g" * 64, "a" * 63, "../" + "a" * 61])
def test_a_malformed_key_is_input_error(cache, bad):
    with pytest.raises(InputError):
        cache.get(bad)
    with pytest.raises(InputError):
        cache.remove(bad)


def test_put_refuses_what_is_not_a_wheel_of_this_key(cache, tmp_path, wheel):
    not_zip = tmp_path / "x" / wheel.name
    not_zip.parent.mkdir()
    not_zip.write_bytes(b"not a zip")
    misnamed = tmp_path / "y" / "package.zip"
    misnamed.parent.mkdir()
    misnamed.write_bytes(wheel.read_bytes())
    for path, meta in ((not_zip, META), (misnamed, META), (wheel, {"inputs": CHANGES["cuda"]})):
        with pytest.raises(ValueError):
            cache.put(KEY, path, meta)
    assert cache.keys() == []


def test_the_default_root_follows_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "c"))
    assert WheelCache().root == tmp_path / "c" / "ext-wheels"


# -- the CLI (parse and print) -----------------------------------------------------------------
def test_cli_list_and_remove(tmp_path, wheel):
    cache = WheelCache(tmp_path / "c" / "ext-wheels")
    entry = cache.put(KEY, wheel, META)
    env = {"MTP_CACHE_DIR": str(tmp_path / "c")}
    proc = run_cli("wheels", "list", env=env)
    assert proc.returncode == 0, proc.stderr
    row = proc.stdout.splitlines()[1].split()
    assert row[:4] == [KEY[:12], "flash-attn", "2.8.3", entry.sha256[:12]] and row[-1] == "builder-1"
    data = json.loads(run_cli("wheels", "list", "--json", "--verify", env=env).stdout)
    assert [w["key"] for w in data["wheels"]] == [KEY] and data["corrupt"] == []

    entry.path.write_bytes(b"garbage")
    assert_one_line_error(run_cli("wheels", "list", "--verify", env=env), KEY, "wheels remove", code=3)
    proc = run_cli("wheels", "remove", KEY[:12], env=env)
    assert proc.returncode == 0 and KEY in proc.stdout
    assert cache.keys() == []
    assert_one_line_error(run_cli("wheels", "remove", KEY[:12], env=env), KEY[:12], code=2)
