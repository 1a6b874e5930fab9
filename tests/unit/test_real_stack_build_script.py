"""scripts/real-stack/build.sh reports failing profiles (issue 21 item 2).

The main job is replaced by a fake PYTHON that exits with a code chosen per profile, so the
loop and exit handling run as written without building anything.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "real-stack" / "build.sh"

# `"$PY" build.py --profile P ...`: the profile is the third argument
FAKE_PYTHON = """#!/usr/bin/env bash
echo "main job for $3"
case "$3" in
  broken-*) exit 3 ;;
  refused) exit 2 ;;
esac
exit 0
"""


def run_build(tmp_path: Path, *profiles: str, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    full_env = {
        **os.environ,
        "PYTHON": str(fake),
        "MTP_REAL_STACK_OUT": str(tmp_path / "out"),
        "MTP_SUBSTITUTE_BASE": "127.0.0.1:5000/standin:t@sha256:" + "0" * 64,
        "MTP_CACHE_DIR": str(tmp_path / "cache"),
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *profiles], capture_output=True, text=True, env=full_env, timeout=60
    )


def test_a_failing_profile_fails_the_run_and_is_named(tmp_path):
    proc = run_build(tmp_path, "ok-one", "broken-one", "ok-two", "refused")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line for line in proc.stderr.splitlines() if line.startswith("failed: ")]
    assert failed == ["failed: broken-one (exit 3)", "failed: refused (exit 2)"]
    # the profile after a failure still ran
    assert (tmp_path / "out" / "ok-two.log").read_text() == "main job for ok-two\n"


def test_all_profiles_passing_exits_zero(tmp_path):
    proc = run_build(tmp_path, "ok-one", "ok-two")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "failed:" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ok-one.log", "ok-two.log"]


def test_a_failing_base_stops_before_any_profile(tmp_path):
    # no MTP_SUBSTITUTE_BASE: make-base.sh runs and fails on a Python 3.12 that is not there
    proc = run_build(
        tmp_path,
        "ok-one",
        MTP_SUBSTITUTE_BASE="",
        MTP_STANDIN_PYTHON=str(tmp_path / "no-python"),
        MTP_STANDIN_DIR=str(tmp_path / "standin"),
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "no Python 3.12" in proc.stderr
    assert not (tmp_path / "out" / "ok-one.log").exists()
