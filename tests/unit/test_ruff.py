"""ruff (pinned in requirements-dev.txt, configured in pyproject.toml) finds nothing to report
and nothing to reformat in the project."""

from __future__ import annotations

import subprocess
import sys

from .helpers import REPO


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ruff_check_is_clean():
    proc = _ruff("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_has_nothing_to_change():
    proc = _ruff("format", "--check")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
