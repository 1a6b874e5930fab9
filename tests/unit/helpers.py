"""Shared helpers for unit tests: run the CLI, copy and edit manifests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python build.py ARGS` as users do, in a separate process."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MTP_DEBUG", None)
    return subprocess.run(
        [sys.executable, str(REPO / "build.py"), *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def copy_manifests(tmp: Path) -> Path:
    """A fresh copy of manifests/ (without lock.yaml) at tmp/manifests, replacing any earlier one."""
    dest = tmp / "manifests"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(MANIFESTS, dest, ignore=shutil.ignore_patterns("lock.yaml"))
    return dest


def edit_yaml(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err
