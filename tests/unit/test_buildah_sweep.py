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
