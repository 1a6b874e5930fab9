"""The reproducible engine's throwaway builders: a build killed before it could clean up
(a session's end, a cancelled CI job) leaves a storage root of up to 13 GB; the next build
removes the roots and layout scratch of builds whose process is gone, and only those."""

from __future__ import annotations

import os
import subprocess

from mtpimage.engine import buildahengine


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sweep_removes_what_dead_builds_left_and_keeps_live_ones(tmp_path):
    dead = _dead_pid()
    live = os.getpid()
    names = {
        f"root-{dead}-abcd1234": False,
        f"mtp-oci-{dead}-abcd1234": False,
        "root-k841752e": False,  # an older tool's root, no process ID: nothing owns it
        "mtp-oci-m20yk6mg": False,
        f"root-{live}-efgh5678": True,
        f"mtp-oci-{live}-efgh5678": True,
        "oci": True,  # not scratch: kept layouts live elsewhere, but never swept by name
    }
    for name in names:
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "file").write_text("x")
    gone = buildahengine.sweep_stale(tmp_path)
    assert sorted(gone) == sorted(n for n, keep in names.items() if not keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, keep in names.items() if keep)


def test_a_new_builder_is_named_for_its_process_and_sweeps_first(tmp_path):
    stale = tmp_path / f"root-{_dead_pid()}-zzzz0000"
    stale.mkdir()
    store = buildahengine.Storage(tmp_path)
    try:
        assert not stale.exists()
        assert store.root.name.startswith(f"root-{os.getpid()}-")
        assert buildahengine.owner_alive(store.root.name)
    finally:
        store.close()
    assert not store.root.exists()


def _layout(root, name: str, age_s: float, now: float):
    d = root / name
    (d / "blobs").mkdir(parents=True)
    (d / "blobs" / "x").write_bytes(b"layer")
    os.utime(d, (now - age_s, now - age_s))
    return d


def test_kept_layouts_whose_image_left_dockerd_are_pruned_and_only_those(tmp_path):
    """A kept layout is 14 GB for a real-stack image and served only while dockerd has its
    image; they piled up under MTP_CACHE_DIR/oci until a verify ran out of disk."""
    now = 1_000_000.0
    in_docker, gone, fresh = "a" * 64, "b" * 64, "c" * 64
    _layout(tmp_path, in_docker, 7200, now)
    _layout(tmp_path, gone, 7200, now)
    _layout(tmp_path, fresh, 60, now)  # another build may not have loaded it yet
    (tmp_path / "notes").mkdir()  # not a layout: never touched
    asked = []

    def has_image(image_id: str) -> bool:
        asked.append(image_id)
        return image_id == f"sha256:{in_docker}"

    assert buildahengine.prune_layouts(tmp_path, has_image, now) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([in_docker, fresh, "notes"])
    assert f"sha256:{fresh}" not in asked  # the grace period decides before dockerd is asked
    assert buildahengine.prune_layouts(tmp_path / "absent", has_image, now) == []


def test_a_reproducible_build_prunes_before_it_builds(tmp_path, monkeypatch):
    now = 1_000_000.0
    old = _layout(tmp_path, "d" * 64, 7200, now)
    engine = buildahengine.BuildahEngine()
    monkeypatch.setattr(buildahengine.BuildahEngine, "layouts", property(lambda self: tmp_path))
    monkeypatch.setattr(engine.docker, "image_id", lambda ref: None)
    monkeypatch.setattr(buildahengine.time, "time", lambda: now)

    class Stop(Exception):
        pass

    def build_layout(*args, **kwargs):
        assert not old.exists()  # pruned before the build needed the space
        raise Stop

    monkeypatch.setattr(engine, "build_layout", build_layout)
    monkeypatch.setattr(engine, "_scratch", lambda: tmp_path / "scratch")
    (tmp_path / "scratch").mkdir()
    req = type("Req", (), {"output_dir": None})()
    try:
        engine.build(req, echo=False)
    except Stop:
        pass
    else:
        raise AssertionError("build_layout was not reached")
