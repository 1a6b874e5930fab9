"""images/lib/mtp_install.py `record` on a git source, against real pip: the installed
distribution says where it came from (PEP 610 direct_url.json: repository and commit, not
the throwaway wheel's file:// path), RECORD stays true, and the paths a partial mirror lacked
reach the image's install record."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMIT = "5be96267" + "0" * 32
REPO_URL = "https://github.com/NVIDIA/Megatron-LM"


@pytest.fixture
def helper(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("mtp_install", REPO / "images" / "lib" / "mtp_install.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "RECORDS", tmp_path / "installed")
    return mod


def _wheel(where: Path, name: str = "demo_core", version: str = "0.19.1") -> Path:
    """A minimal pure wheel, as `pip wheel` of a git source leaves in /tmp/mtp-wheels-<name>."""
    where.mkdir(parents=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"x = 1\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
        for p, b in files.items()
    )
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, b in files.items():
            z.writestr(p, b)
        z.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
    return path


def _install(tmp_path: Path, monkeypatch) -> Path:
    site = tmp_path / "site"
    wheel = _wheel(tmp_path / "mtp-wheels-megatron-lm")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
    )
    monkeypatch.syspath_prepend(str(site))
    return site


def _freeze(site: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--path", str(site)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _source(tmp_path: Path, **extra) -> Path:
    src = tmp_path / "mtp-src" / "megatron-lm"
    src.mkdir(parents=True)
    origin = {"name": "megatron-lm", "repo": REPO_URL, "commit": COMMIT, "ref": "core_v0.19.0", **extra}
    (src / ".mtp-source.json").write_text(json.dumps(origin))
    return src


def test_pip_freeze_names_the_repository_and_commit_not_the_wheel_path(helper, tmp_path, monkeypatch):
    site = _install(tmp_path, monkeypatch)
    assert "@ file://" in _freeze(site)  # what pip records for the throwaway wheel
    src = _source(tmp_path)
    assert (
        helper.main(
            [
                "record",
                "--name",
                "megatron-lm",
                "--package",
                "demo_core",
                "--source",
                "git",
                "--src",
                str(src),
            ]
        )
        == 0
    )

    assert _freeze(site).strip() == f"demo_core @ git+{REPO_URL}@{COMMIT}"
    info = site / "demo_core-0.19.1.dist-info"
    direct = json.loads((info / "direct_url.json").read_text())
    assert direct == {
        "url": REPO_URL,
        "vcs_info": {"vcs": "git", "commit_id": COMMIT, "requested_revision": "core_v0.19.0"},
    }
    # RECORD still describes every file, direct_url.json with its new hash and size
    rows = {r[0]: r for r in csv.reader((info / "RECORD").read_text().splitlines()) if r}
    body = (info / "direct_url.json").read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    assert rows[f"{info.name}/direct_url.json"][1:] == [f"sha256={digest}", str(len(body))]
    assert "demo_core/__init__.py" in rows
    record = json.loads((tmp_path / "installed" / "megatron-lm.json").read_text())
    assert record["direct_url"] == direct and record["commit"] == COMMIT


def test_a_package_in_a_subdirectory_says_so(helper, tmp_path, monkeypatch):
    site = _install(tmp_path, monkeypatch)
    src = _source(tmp_path, subdir="python")
    helper.main(
        ["record", "--name", "megatron-lm", "--package", "demo_core", "--source", "git", "--src", str(src)]
    )
    assert _freeze(site).strip() == f"demo_core @ git+{REPO_URL}@{COMMIT}#subdirectory=python"


def test_paths_missing_from_the_mirror_reach_the_image_install_record(helper, tmp_path, monkeypatch):
    """docs/lock-and-mirrors.md: absent paths are recorded in the image. src/<name>/.mtp-source.json is only
    bind-mounted during the build; /opt/mtp/installed/<name>.json stays in the image."""
    _install(tmp_path, monkeypatch)
    src = _source(tmp_path, missing_from_mirror=["docs/a.gif"])
    helper.main(
        ["record", "--name", "megatron-lm", "--package", "demo_core", "--source", "git", "--src", str(src)]
    )
    record = json.loads((tmp_path / "installed" / "megatron-lm.json").read_text())
    assert record["missing_from_mirror"] == ["docs/a.gif"]
