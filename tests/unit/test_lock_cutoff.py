"""The resolution cutoff (#21 item 1): uv's exclude-newer recorded in lock.yaml, so a lock
with unchanged inputs does not move when the index publishes something; what moves it and
what it says. Resolutions run uv against a loopback index that serves upload times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mtpimage.errors import InputError
from mtpimage.lock import lockfile, resolver
from mtpimage.lock.locker import SETTLE, choose_cutoff
from tests.fixtures.dated_index import DatedIndex

OLD, NEW = "2020-06-01T00:00:00Z", "2022-06-01T00:00:00Z"
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)  # a fixed clock: no wall-clock assertions


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MTP_LOCK_REFRESH", raising=False)
    monkeypatch.delenv("MTP_INDEX_REWRITE", raising=False)
    with DatedIndex(tmp_path / "index") as idx:
        idx.add("demo", "1.0", OLD)
        yield idx


def _demo(index, **cutoff) -> str:
    return resolver.resolve(["demo"], {}, [], [], [index.url], "3.12", **cutoff).packages["demo"]["version"]


def test_a_cutoff_leaves_out_what_was_uploaded_after_it(index):
    index.add("demo", "2.0", NEW)
    assert _demo(index) == "2.0"
    assert _demo(index, exclude_newer="2021-01-01T00:00:00Z") == "1.0"
    assert _demo(index, exclude_newer="2023-01-01T00:00:00Z") == "2.0"
    # a per-package hold is older than the cutoff for that package alone
    assert (
        _demo(
            index,
            exclude_newer="2023-01-01T00:00:00Z",
            exclude_newer_package={"demo": "2021-01-01T00:00:00Z"},
        )
        == "1.0"
    )


def test_a_cache_filled_before_the_cutoff_moved_does_not_answer(index):
    """A cutoff moved elsewhere (a pulled lock.yaml) must not be answered from pages this
    machine cached before it: those lack what was uploaded between the two."""
    assert _demo(index, exclude_newer="2021-01-01T00:00:00Z") == "1.0"  # caches demo's page
    index.add("demo", "2.0", NEW)
    assert _demo(index, exclude_newer="2023-01-01T00:00:00Z") == "2.0"


def test_an_index_without_upload_times_resolves_unbounded_and_says_so(tmp_path, http_server, monkeypatch):
    from mtpimage.lock.pydeps import write_stub_wheel

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    d = http_server.root / "simple" / "demo"
    d.mkdir(parents=True)
    write_stub_wheel(d, "demo", "1.0", [])  # a plain directory listing: no upload times
    res = resolver.resolve(
        ["demo"], {}, [], [], [http_server.url_for("simple")], "3.12", exclude_newer="2021-01-01T00:00:00Z"
    )
    assert res.packages["demo"]["version"] == "1.0"
    assert res.unbounded == ["demo"]


# ----------------------------------------------------------------------------- choosing it

RECORDED = {
    "schema": lockfile.LOCK_SCHEMA,
    lockfile.CUTOFF_KEY: {
        "exclude_newer": "2026-11-30T00:00:00Z",
        "exclude_newer_package": {"ml-dtypes": "2026-11-16T00:00:00Z"},
    },
    "profiles": {"a": {}, "b": {}},
}


def test_lock_keeps_the_recorded_cutoff():
    cutoff, notes = choose_cutoff(RECORDED, None, None, None, "lock.yaml", NOW)
    assert cutoff == RECORDED[lockfile.CUTOFF_KEY] and notes == []
    # moving one git pin keeps it too
    assert choose_cutoff(RECORDED, None, "sglang", None, "lock.yaml", NOW)[0] == cutoff


def test_upgrade_moves_the_cutoff_to_now_and_drops_the_holds():
    cutoff, _ = choose_cutoff(RECORDED, None, "*", None, "lock.yaml", NOW)
    assert cutoff == {"exclude_newer": lockfile.stamp(NOW - SETTLE), "exclude_newer_package": {}}
    explicit, _ = choose_cutoff(RECORDED, None, None, "2026-12-01T00:00:00Z", "lock.yaml", NOW)
    assert explicit == {"exclude_newer": "2026-12-01T00:00:00Z", "exclude_newer_package": {}}


def test_one_profile_cannot_move_the_cutoff_of_the_others():
    with pytest.raises(InputError, match="one resolution cutoff.*b"):
        choose_cutoff(RECORDED, "a", None, "now", "lock.yaml", NOW)
    kept, notes = choose_cutoff(RECORDED, "a", "*", None, "lock.yaml", NOW)
    assert kept == RECORDED[lockfile.CUTOFF_KEY] and "kept" in notes[0]


def test_a_lock_without_a_cutoff_gets_one():
    cutoff, notes = choose_cutoff({"schema": lockfile.LOCK_SCHEMA}, None, None, None, "lock.yaml", NOW)
    assert cutoff["exclude_newer"] == "2026-12-01T11:00:00Z" and "no resolution cutoff" in notes[0]


@pytest.mark.parametrize(
    "value, message",
    [
        ("yesterday", "not a UTC timestamp"),
        ("2026-11-30 00:00", "not a UTC timestamp"),
        ("2027-01-01T00:00:00Z", "future"),
    ],
)
def test_a_bad_cutoff_is_one_line_naming_the_field(value, message):
    with pytest.raises(InputError, match=message) as exc:
        choose_cutoff(RECORDED, None, None, value, "lock.yaml", NOW)
    assert "--exclude-newer" in str(exc.value)
    doc = {**RECORDED, lockfile.CUTOFF_KEY: {"exclude_newer": value}}
    with pytest.raises(InputError, match=message) as exc:
        choose_cutoff(doc, None, None, None, "manifests/lock.yaml", NOW)
    assert "resolution_cutoff.exclude_newer" in str(exc.value)


def test_version_changes_name_each_moved_package():
    def lock(versions):
        pkgs = {n: {"version": v} for n, v in versions.items()}
        return {"profiles": {"p": {"python_set": "k"}}, "python_sets": {"k": {"packages": pkgs}}}

    old = lock({"anthropic": "2.14.0", "ml-dtypes": "0.6.0", "gone": "1"})
    new = lock({"anthropic": "2.15.0", "ml-dtypes": "0.6.0", "fresh": "3"})
    assert lockfile.version_changes(old, new) == [
        "anthropic 2.14.0 -> 2.15.0",
        "fresh 3 (added)",
        "gone 1 (removed)",
    ]
    assert lockfile.version_changes(old, old) == []


def test_the_shipped_lock_records_its_cutoff():
    from mtpimage.manifests import manifest

    doc = lockfile.read(lockfile.lock_path(manifest.load().root))
    cutoff = lockfile.cutoff_of(doc)
    assert cutoff is not None and cutoff["exclude_newer"] < "2026-11-30T19:30:59Z"  # anthropic 2.15.0


def test_a_back_dated_listing_does_not_move_a_relock_that_keeps_its_pins(index, monkeypatch):
    """An index that lists a file later than its upload time says (filelock 4.3.2 here: uploaded
    2026-11-27, listed after a lock at cutoff 2026-11-30) moves a plain re-lock at the same
    cutoff unless the previous pins are kept where they still fit, as uv keeps an output file's."""
    monkeypatch.setenv("MTP_LOCK_REFRESH", "1")  # ask the index each time, as a cold cache would
    cutoff = {"exclude_newer": "2023-01-01T00:00:00Z"}
    assert _demo(index, **cutoff) == "1.0"  # the lock as made
    index.add("demo", "1.5", NEW)  # appears later, dated before the cutoff
    assert _demo(index, **cutoff) == "1.5"  # without the pins the answer moves
    assert _demo(index, **cutoff, preferences={"demo": "1.0"}) == "1.0"
    # a pin that no longer fits (a requirement moved past it) does not hold the resolution back
    got = resolver.resolve(
        ["demo>=1.5"], {}, [], [], [index.url], "3.12", **cutoff, preferences={"demo": "1.0"}
    )
    assert got.packages["demo"]["version"] == "1.5"


class _Sets:
    """The part of Locker that _preferences reads."""

    def __init__(self, previous: dict, cutoff: dict, keep_pins: bool = True):
        from mtpimage.lock.pythonset import PythonSets

        self.previous, self.cutoff, self.keep_pins = previous, cutoff, keep_pins
        self.prefs = lambda plan, key: PythonSets._preferences(self, plan, key)


def test_relock_keeps_the_previous_pins_only_at_the_same_cutoff_without_upgrade():
    from types import SimpleNamespace

    prev = {
        "resolution_cutoff": {"exclude_newer": OLD},
        "profiles": {"p": {"python_set": "old"}},
        "python_sets": {"old": {"packages": {"demo": {"version": 1.0}, "x": {"version": "2"}}}},
    }
    same = lockfile.cutoff_of(prev)
    plan = SimpleNamespace(profile="p")
    # a changed input gives the set a new key: the profile's former set still gives its pins
    assert _Sets(prev, same).prefs(plan, "new") == {"demo": "1.0", "x": "2"}
    assert _Sets(prev, {"exclude_newer": NEW, "exclude_newer_package": {}}).prefs(plan, "new") == {}
    assert _Sets(prev, same, keep_pins=False).prefs(plan, "new") == {}  # lock --upgrade
    assert _Sets({}, same).prefs(plan, "new") == {}
