"""#50 item 7: scripts/test.sh leaves the temp folder as it was (a run used to leave 1.6 GB
under /tmp/mtp-test-logs.XXXXXX: its registry, source caches, builds), names each e2e test as
it runs, and says why a test was skipped.

The script runs for real, in a copy of the checkout's layout whose setup-test-host.sh and
.venv/bin/python are stand-ins: the stand-in pytest writes into its --basetemp and $TMPDIR as
the real sessions do (a registry's blobs, a source tree) and exits as told."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.helpers import REPO

FAKE_PYTHON = """#!/usr/bin/env bash
# a stand-in for .venv/bin/python: `-m pip ...` succeeds, `-m pytest ...` writes as pytest would
[ "$2" = pytest ] || exit 0
echo "pytest $*" >> "$CALLS"
base=
prev=
for a in "$@"; do [ "$prev" = --basetemp ] && base=$a; prev=$a; done
mkdir -p "$base/registry0/docker" "$TMPDIR/mtp-patched-x"
head -c 100000 /dev/zero > "$base/registry0/docker/blob"
echo tree > "$TMPDIR/mtp-patched-x/file"
case " $* " in
  *" tests/e2e "*) exit "${E2E_RC:-0}" ;;
  *" tests/unit "*) echo "unit says hello"; exit "${UNIT_RC:-0}" ;;
  *) exit "${ARGS_RC:-0}" ;;
esac
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", root / "scripts" / "test.sh")
    (root / "scripts" / "setup-test-host.sh").write_text("exit 0\n")
    (root / "requirements-dev.txt").write_text("")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return root


def run_script(
    checkout: Path, tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess, Path]:
    temp = tmp_path / "temp"  # the script's /tmp
    temp.mkdir(exist_ok=True)
    proc = subprocess.run(
        ["bash", str(checkout / "scripts" / "test.sh"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(temp), "CALLS": str(tmp_path / "calls"), **env},
    )
    return proc, temp


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_a_passing_run_leaves_the_temp_folder_as_it_was(checkout, tmp_path):
    proc, temp = run_script(checkout, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(temp.iterdir()) == [], list(temp.rglob("*"))
    assert "unit says hello" in proc.stdout  # the unit log was shown before it went
    e2e, unit = sorted(calls(tmp_path), key=lambda c: "tests/unit" in c)
    assert " -v " in f" {e2e} " and " -rs " in f" {e2e} "  # a line per e2e test; skip reasons
    assert " -q " in f" {unit} " and " -rs " in f" {unit} "


def test_two_passing_runs_in_a_row_leave_nothing(checkout, tmp_path):
    for _ in range(2):
        proc, temp = run_script(checkout, tmp_path, "tests/unit", "-q")
        assert proc.returncode == 0, proc.stderr
    assert list(temp.iterdir()) == []
    assert all("--basetemp" in c and c.endswith("tests/unit -q") for c in calls(tmp_path))


@pytest.mark.parametrize("failing", [{"E2E_RC": "1"}, {"UNIT_RC": "1"}])
def test_a_failed_run_keeps_its_folder_and_names_it(checkout, tmp_path, failing):
    proc, temp = run_script(checkout, tmp_path, **failing)
    assert proc.returncode != 0
    [kept] = list(temp.iterdir())
    assert kept.name.startswith("mtp-test.") and (kept / "unit.log").is_file()
    assert f"test.sh: kept {kept} (" in proc.stderr and f"rm -rf {kept}" in proc.stderr


def test_own_log_folder_keeps_the_log_and_nothing_else(checkout, tmp_path):
    logs = tmp_path / "logs"
    proc, temp = run_script(checkout, tmp_path, MTP_TEST_LOGS=str(logs))
    assert proc.returncode == 0, proc.stderr
    assert list(temp.iterdir()) == []
    assert [p.name for p in logs.iterdir()] == ["unit.log"]


def test_pytests_exit_status_is_the_scripts_with_arguments(checkout, tmp_path):
    proc, temp = run_script(checkout, tmp_path, "tests/unit/test_x.py", ARGS_RC="5")
    assert proc.returncode == 5
    assert len(list(temp.iterdir())) == 1  # kept: it did not pass
