"""#21 item 6: `build.py check | head -1` and `--dry-run | head` stop quietly, as standard
command-line tools do when their reader has gone: no "internal error", exit 141 (128 +
SIGPIPE, what a shell reports for `yes | head`). The reader's end is closed before the
command starts, so its first write always meets a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = str(ROOT / "tests" / "manifests")


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--manifests", MANIFESTS],
        ["--manifests", MANIFESTS, "--profile", "test-detach", "--dry-run"],
    ],
    ids=["check", "dry-run"],
)
def test_a_reader_that_went_away_ends_the_command_quietly(args, tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -1` after its line: nobody reads any more
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "build.py"), *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "MTP_FASTPATH": "0", "MTP_CACHE_DIR": str(tmp_path / "cache")},
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


def test_output_that_fits_still_exits_0():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "check", "--manifests", MANIFESTS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MTP_FASTPATH": "0"},
        timeout=120,
    )
    assert proc.returncode in (0, 1) and proc.stdout, proc.stderr
