"""The launch environment an upstream launch line finds in the image (issue 34): the
variables a component asks for (verl's VERL_USE_UV=0) and one copy of each pinned package
on sys.path, checked in the image (images/checks/run_checks.py, launch-env) and by the job
scripts before the trainer starts (mtpimage/outputs/preflight.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from mtpimage.assembly.render import IMAGES_DIR
from mtpimage.outputs import preflight


@pytest.fixture(scope="module")
def rc():
    spec = importlib.util.spec_from_file_location(
        "run_checks_launch_env", IMAGES_DIR / "checks" / "run_checks.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _install(site, name: str, version: str, files: list[str]) -> None:
    """A distribution as pip leaves it: its files and a dist-info whose RECORD lists them."""
    for rel in files:
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files))


@pytest.fixture
def site(tmp_path, monkeypatch):
    root = tmp_path / "site-packages"
    _install(root, "fake-megatron-core", "0.19.1", ["megatron/core/__init__.py", "megatron/core/x.py"])
    _install(root, "fake-megatron-bridge", "0.6.1", ["megatron/bridge/__init__.py"])
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return root


def test_a_namespace_package_counts_each_distributions_own_folder(rc, site):
    from importlib.metadata import distribution as dist

    assert rc.package_dirs(dist("fake-megatron-core")) == {"megatron/core"}
    assert rc.package_dirs(dist("fake-megatron-bridge")) == {"megatron/bridge"}


def test_the_pinned_copy_alone_on_sys_path_passes(rc, site):
    assert rc.shadowing("fake-megatron-core", [str(site)]) == []


def test_another_checkout_first_on_the_path_is_named(rc, site, tmp_path):
    other = tmp_path / "pythonpath" / "Megatron-LM"
    (other / "megatron" / "core").mkdir(parents=True)
    (other / "megatron" / "core" / "__init__.py").write_text("")
    (problem,) = rc.shadowing("fake-megatron-core", [str(other), str(site)])
    assert problem.startswith("megatron.core comes first from ") and str(other) in problem
    # later on the path it does not win, but it is a second copy all the same
    (later,) = rc.shadowing("fake-megatron-core", [str(site), str(other)])
    assert later.startswith("megatron.core also at ") and str(other) in later
    assert rc.shadowing("fake-megatron-bridge", [str(other), str(site)]) == []


def test_launch_env_fails_on_a_missing_variable_and_a_shadowing_path(rc, site, tmp_path, monkeypatch):
    vector = {
        "components": [
            {"name": "megatron-lm", "package": "fake-megatron-core"},
            {"name": "verl", "package": "verl-not-installed", "runtime_env": {"VERL_USE_UV": "0"}},
        ],
        "packages": [{"name": "fake-megatron-bridge"}],
    }
    monkeypatch.setenv("VERL_USE_UV", "0")
    good = {r["id"]: r for r in rc.check_launch_env(vector)}
    assert good["launch-env:variables"]["status"] == "pass", good
    assert good["launch-env:one-copy"]["status"] == "pass" and good["launch-env:one-copy"]["checked"] == 2

    monkeypatch.delenv("VERL_USE_UV")
    other = tmp_path / "Megatron-LM"
    (other / "megatron" / "core").mkdir(parents=True)
    (other / "megatron" / "core" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(other))
    bad = {r["id"]: r for r in rc.check_launch_env(vector)}
    assert bad["launch-env:variables"]["status"] == "fail"
    assert "VERL_USE_UV=None (for verl: wants '0')" in bad["launch-env:variables"]["detail"]
    assert bad["launch-env:one-copy"]["status"] == "fail"
    assert "megatron.core comes first from" in bad["launch-env:one-copy"]["detail"]
    assert "unset PYTHONPATH" in bad["launch-env:one-copy"]["detail"]


@pytest.mark.parametrize("check, ran", [("true", True), ("false", False)])
def test_the_preflight_starts_the_trainer_only_after_the_check_passed(monkeypatch, check, ran, tmp_path):
    monkeypatch.setattr(preflight, "LAUNCH_ENV_CHECK", check)
    # the image's driver check, here without its facts file: an image stating no requirement
    monkeypatch.setattr(preflight, "DRIVER_CHECK", f"{IMAGES_DIR / 'runtime' / 'driver-check.sh'} --job --")
    marker = tmp_path / "trainer-ran"
    cmd = preflight.preflighted(f"touch {marker}")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert marker.exists() is ran
    assert proc.returncode == (0 if ran else 1)
    if not ran:
        assert "mtp preflight failed" in proc.stderr


def test_every_job_script_runs_the_preflight_before_the_trainer():
    from tests.unit.helpers import run_main

    for cluster in ("slurm", "apptainer"):
        proc = run_main(
            "explain",
            "--profile",
            "mtp-detach",
            "--target",
            "sft",
            "--cluster",
            cluster,
            "--registry",
            "ghcr.io/acme",
            "--digest",
            "sha256:" + "1" * 64,
        )
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        assert preflight.LAUNCH_ENV_CHECK in text
        assert text.index("mtp-preflight") < text.index("-m verl.trainer.sft_trainer")
