"""The gradient contract check on the CPU with the real packages (issue 45), no fakes: the
image's own images/checks/gpu_check.py --cpu-model, run on real torch (CPU build), real
megatron-core 0.19.1 (PyPI's wheel of Megatron-LM 5be96267, the pin) and verl 0.9.1's
mtp_patch.py (byte-identical to verl 7bc80c00's, the pin), with each shipped profile's rendered
overrides: what the `mtp-grad` group runs inside every real-stack image before it is tagged.

It must say yes to every shipped profile, and no to the two configurations that broke the
promise: the mtp-cp-recompute overrides of 2026-12-03 (verl's detach alone: the output layer
gets MTP-loss gradient) and detach_encoder + mtp_detach_heads under full recompute (no MTP
parameter gets gradient, silently).

The environment is a venv kept under the cache root (keyed by what it holds), so later runs
only check it: torch, triton (megatron imports it), numpy, einops and packaging from PyPI by
version (torch's CPU build where the index has one; a test tool, not image content), and the
two upstream wheels by sha256, unpacked onto the path (megatron-core's wheel says Python >=
3.12; its MTP code runs on this Python too: the check imports only the pure-Python modules).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mtpimage import settings
from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "images" / "checks" / "gpu_check.py"
REQUIREMENTS = ("torch==2.13.0", "triton==3.9.0", "numpy==2.4.6", "einops==0.8.2", "packaging==26.4")
# (distribution file, sha256, PyPI file URL): the pins' own code, by hash
WHEELS = (
    (
        "megatron_core-0.19.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        "615c0cc84df2d0cb67dc9ade04686d78ac1624772550315db2150fd941dd9390",
        "megatron-core",
    ),
    (
        "verl-0.9.1-py3-none-any.whl",
        "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14",
        "verl",
    ),
)
OLD_CP_RECOMPUTE = "model.mtp.detach_encoder=True"  # the 2026-12-03 recipe: verl's detach alone


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pinned_wheel(python: Path, filename: str, sha: str, dest: Path) -> Path:
    """One distribution file by its sha256, through pip's configured index (a site's mirror too)."""
    path = dest / filename
    if not (path.is_file() and _sha256(path) == sha):
        name, version = filename.split("-")[:2]
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "download",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "-d",
                str(dest),
                f"{name}=={version}",
            ],
            check=True,
            timeout=600,
        )
    if _sha256(path) != sha:
        path.unlink()
        raise AssertionError(f"{filename}: sha256 differs from the pin")
    return path


@pytest.fixture(scope="session")
def grad_env() -> tuple[Path, Path]:
    """(python, site dir with megatron/ and verl/): made once, then reused from the cache."""
    key = hashlib.sha256(json.dumps([REQUIREMENTS, WHEELS, sys.version_info[:2]]).encode()).hexdigest()[:12]
    root = settings.current().cache_root / "test-gradcheck" / key
    python, site = root / "venv" / "bin" / "python", root / "site"
    if not (root / ".complete").is_file():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(root / "venv")], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
            check=True,
            timeout=1800,
        )
        site.mkdir(exist_ok=True)
        for filename, sha, project in WHEELS:
            wheel = pinned_wheel(python, filename, sha, root)
            with zipfile.ZipFile(wheel) as z:
                top = "megatron/" if project == "megatron-core" else "verl/"
                z.extractall(site, [n for n in z.namelist() if n.startswith(top)])
        (root / ".complete").write_text(key)
    return python, site


def _check(grad_env, tmp_path: Path, vector: bytes, overrides: str) -> dict:
    python, site = grad_env
    (tmp_path / "version.json").write_bytes(vector)
    (tmp_path / "sft.overrides").write_text(overrides)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            str(python),
            str(SCRIPT),
            "--cpu-model",
            "--json",
            "--version-vector",
            str(tmp_path / "version.json"),
            "--overrides",
            str(tmp_path / "sft.overrides"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == (0 if report["ok"] else 1), proc.stderr[-2000:]
    assert "mtp_patch.py" in report["env"]["mtp_patch"], report["env"]  # verl's own patch, not the fallback
    return report


def _training(report: dict) -> dict[str, tuple[str, str | None]]:
    return {
        c["name"]: (c["status"], c["rule"])
        for c in report["checks"]
        if c["name"] not in ("torch-cuda", "nccl-allreduce")
    }


def _rendered(profile: str) -> tuple[bytes, str]:
    m = manifest.load()
    files = render(plan_for(m, profile, None), m.root).files
    return files["mtp/version.json"], files["mtp/verl/sft.overrides"].decode()


@pytest.mark.parametrize("profile", ["mtp-load-only", "mtp-full", "mtp-detach", "mtp-cp-recompute"])
def test_every_shipped_profile_keeps_its_gradient_contract(grad_env, tmp_path, profile):
    vector, overrides = _rendered(profile)
    report = _check(grad_env, tmp_path, vector, overrides)
    checks = _training(report)
    assert report["ok"] and checks and all(s == "PASS" for s, _ in checks.values()), checks
    if profile == "mtp-cp-recompute":  # with and without full recompute
        assert set(checks) == {"mtp-only", "cp-recompute[mtp-only]"}
    grads = report["env"]["gradients"]
    if profile in ("mtp-detach", "mtp-cp-recompute"):
        for rec in grads.values():  # the output layer counted: exactly none
            assert rec["output_layer"]["norm"] == 0.0 and rec["mtp"]["with_grad"] == rec["mtp"]["params"]


def test_the_rollout_profiles_training_side_keeps_the_mtp_only_contract(grad_env, tmp_path):
    """mtp-rollout has only the RL target: its training side is checked with its rl overrides."""
    m = manifest.load()
    files = render(plan_for(m, "mtp-rollout", None), m.root).files
    report = _check(grad_env, tmp_path, files["mtp/version.json"], files["mtp/verl/rl.overrides"].decode())
    assert report["ok"] and _training(report) == {"mtp-only": ("PASS", None)}


def test_the_configurations_that_broke_the_promise_fail(grad_env, tmp_path):
    vector, overrides = _rendered("mtp-cp-recompute")
    old = overrides.replace("model.mtp.detach_encoder=False", OLD_CP_RECOMPUTE)
    old = "\n".join(ln for ln in old.splitlines() if "mtp_detach_heads" not in ln) + "\n"
    leak = _check(grad_env, tmp_path, vector, old)
    assert not leak["ok"]
    assert _training(leak) == {
        "mtp-only": ("FAIL", "mtp-loss-leak"),
        "cp-recompute[mtp-only]": ("FAIL", "mtp-loss-leak"),
    }
    silent = _check(
        grad_env, tmp_path, vector, overrides.replace("detach_encoder=False", "detach_encoder=True")
    )
    assert _training(silent) == {
        "mtp-only": ("PASS", None),
        "cp-recompute[mtp-only]": ("FAIL", "mtp-no-gradient"),
    }
    assert silent["env"]["gradients"]["cp-recompute[mtp-only]"]["mtp"]["with_grad"] == 0
