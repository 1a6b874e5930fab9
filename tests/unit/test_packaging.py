"""The tool as a Python project (issue 14 item 6): pyproject.toml builds a wheel that holds
every resource the tool reads at run time, and the installed console command works outside
the checkout: with --manifests, or with ./manifests of the directory it runs in.

The wheel is built from a copy of the project (setuptools writes build/ and *.egg-info
beside the sources) with the pinned setuptools of requirements-dev.txt and no build
isolation, so no index is needed. The throwaway venv reaches the pinned runtime packages this
test runs with through a .pth file (as tests/unit/test_bootstrap.py does), so `pip check`
there proves the wheel's dependencies are requirements.txt's pins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from mtpimage import cli

from .helpers import MANIFESTS, REPO, run_cli

BASE_PYTHON = getattr(sys, "_base_executable", None) or sys.executable
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_pyproject_lists_every_subpackage_and_ships_images():
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "mtpimage").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert set(setuptools["packages"]) == on_disk | {"mtpimage.images"}
    assert setuptools["package-dir"] == {"mtpimage.images": "images"}
    assert PYPROJECT["project"]["scripts"] == {cli.CONSOLE_COMMAND: "mtpimage.cli:main"}
    # requirements.txt stays the one list of runtime pins; the wheel reads it
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv outside the checkout with the project's wheel installed; returns its bin/."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "requirements.txt"):
        shutil.copy2(REPO / name, src / name)
    for name in ("mtpimage", "images"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(src),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    [wheel] = dist.glob("mtp_image_builder-*.whl")
    venv = tmp / "venv"
    subprocess.run(
        [BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120
    )
    [site] = list(venv.glob("lib/python*/site-packages"))
    (site / "pinned-deps.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return venv / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MTP_DEBUG")}
    return subprocess.run(
        [str(bin_dir / "mtp-image-builder"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_installed_tool_is_the_package_not_the_checkout(installed, tmp_path):
    proc = subprocess.run(
        [
            str(installed / "python"),
            "-c",
            "import mtpimage.locations as l; print(l.PACKAGE); print(l.INSTALLED)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    package, flag = proc.stdout.split()
    assert Path(package).is_relative_to(installed.parent) and flag == "True"
    proc = subprocess.run(
        [str(installed / "python"), "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert "mtp-image-builder" not in proc.stdout, proc.stdout  # its pins are all there


def test_console_command_lists_and_checks_outside_the_checkout(installed, tmp_path):
    listed = _run(installed, "list", "--json", "--manifests", str(MANIFESTS), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    # the packaged image files render the same build contexts: the same identities
    assert json.loads(listed.stdout) == json.loads(run_cli("list", "--json").stdout)
    proc = _run(installed, "check", "--manifests", str(MANIFESTS), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "mtp-cp-recompute: ok" in proc.stdout
    # it calls itself by the name the user typed
    assert _run(installed, "--help", cwd=tmp_path).stdout.startswith("usage: mtp-image-builder ")
    bad = _run(installed, "--no-such-flag", cwd=tmp_path)
    assert bad.returncode == 2 and "see `mtp-image-builder --help`" in bad.stderr


def test_installed_default_manifests_are_those_of_the_current_directory(installed, tmp_path):
    proc = _run(installed, "list", cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr.startswith("error: manifests: manifests directory not found")
        and "--manifests" in proc.stderr
    )
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    proc = _run(installed, "list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "mtp-detach" in proc.stdout
