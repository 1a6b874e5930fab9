"""build.py on a Python without the dependencies: it re-runs itself inside .venv/ when that
already holds every pin of requirements.txt (no pip, no "installing" message), and runs pip
only when a pin is missing there.

The world is a copy of build.py, mtpimage/ and requirements.txt in a temporary directory, with
a real .venv/ made by the base interpreter's `venv` module. Its site-packages reaches the
pinned packages this test runs with through a .pth file and holds their *.dist-info
directories (symlinks), so it holds exactly the pinned set without a network or a copy, and
pip never writes outside the temporary directory. "A Python without the dependencies" is the
base interpreter with -S (no site-packages). PIP_LOG tells whether pip ran at all.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .helpers import MANIFESTS, REPO

BASE_PYTHON = getattr(sys, "_base_executable", None) or sys.executable


def _pins() -> list[tuple[str, str]]:
    out = []
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line.strip())
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.fixture
def checkout(tmp_path) -> Path:
    wrong = [f"{n}=={v} (have {have})" for n, v in _pins() if (have := _installed(n)) != v]
    assert not wrong, f"the tests must run with requirements.txt's pins (scripts/test.sh): {wrong}"
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy2(REPO / "build.py", root / "build.py")
    shutil.copy2(REPO / "requirements.txt", root / "requirements.txt")
    shutil.copytree(REPO / "mtpimage", root / "mtpimage", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "images", root / "images", ignore=shutil.ignore_patterns("__pycache__"))
    venv = root / ".venv"
    subprocess.run(
        [BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120
    )
    [site] = list(venv.glob("lib/python*/site-packages"))
    ours = Path(sysconfig.get_paths()["purelib"])
    (site / "pinned-deps.pth").write_text(f"{ours}\n")
    for info in ours.glob("*.dist-info"):
        (site / info.name).symlink_to(info, target_is_directory=True)
    return root


def _run(root: Path, pip_log: Path, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MTP_DEBUG", "VIRTUAL_ENV", "PYTHONPATH")}
    # pip, should it run: no config files (no find-links or extra indexes), no index at all
    env.update(PIP_LOG=str(pip_log), PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", **extra_env)
    return subprocess.run(
        [BASE_PYTHON, "-S", str(root / "build.py"), "--manifests", str(MANIFESTS), "list"],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_a_venv_holding_the_pins_is_used_without_pip(checkout, tmp_path):
    for attempt in range(2):  # every run, not only the first
        log = tmp_path / f"pip-{attempt}.log"
        proc = _run(checkout, log)
        assert proc.returncode == 0, proc.stderr
        assert "mtp-detach" in proc.stdout
        assert "installing" not in proc.stderr, proc.stderr
        assert not log.exists(), "pip ran although .venv/ holds every pin"


def test_a_missing_pin_runs_pip(checkout, tmp_path):
    req = checkout / "requirements.txt"
    req.write_text(req.read_text().replace("PyYAML==6.0.3", "PyYAML==0.0.1"))
    log = tmp_path / "pip.log"
    proc = _run(checkout, log)
    assert "installing pinned dependencies into .venv/ (it lacks PyYAML==0.0.1)" in proc.stderr, proc.stderr
    assert log.exists(), "pip did not run although a pin is missing from .venv/"
    # no index is reachable here, so pip fails: one clean line at the end, exit 3
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: could not install dependencies")
    assert "Traceback" not in proc.stderr


def test_the_fast_path_is_asked_once_by_the_venv_interpreter(checkout, tmp_path):
    """#38 item 6: the interpreter without the dependencies re-runs build.py inside .venv/; it
    does not ask the fast path itself (under its own key it could only miss, and the trace
    said `miss` before the .venv run's `hit`)."""
    proc = _run(checkout, tmp_path / "pip.log", MTP_FASTPATH_TRACE="1")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("fastpath:")]
    assert said == ["fastpath: miss (not a plain local main job)"], proc.stderr
