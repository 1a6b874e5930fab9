"""Cluster job scripts: pinned by digest, carrying the mode's overrides, valid bash."""

from __future__ import annotations

import subprocess

import pytest

from mtpimage.manifests import manifest
from mtpimage.outputs.jobscripts import job_script
from mtpimage.plan.model import build_plan

from .helpers import run_cli

DIGEST = "sha256:" + "ab" * 32


def plan(profile):
    m = manifest.load()
    return build_plan(m, manifest.resolve_profile(m, profile))


@pytest.mark.parametrize("cluster", ["slurm", "apptainer"])
@pytest.mark.parametrize("target", ["rl", "sft"])
def test_script_is_valid_bash_with_every_override(cluster, target):
    p = plan("mtp-cp-recompute")
    text = job_script(p, target, cluster, "ghcr.io", "acme/mtp-verl", DIGEST)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    for line in p.overrides_for(target):
        assert f"    {line} \\" in text
    assert "max_position_embeddings" in text and "32768" in text
    assert ":latest" not in text and "mtp-cp-recompute-" not in text.split("SIF=")[0].split("IMAGE=")[-1]


def test_slurm_uses_pyxis_digest_reference():
    text = job_script(plan("mtp-detach"), "rl", "slurm", "127.0.0.1:5000", "mtp/mtp-verl", DIGEST)
    assert f"IMAGE='127.0.0.1:5000#mtp/mtp-verl@{DIGEST}'" in text
    assert 'srun --container-image="$IMAGE"' in text
    assert "python3 -m verl.trainer.main_ppo" in text


def test_apptainer_pulls_by_digest():
    text = job_script(plan("mtp-detach"), "sft", "apptainer", "ghcr.io", "acme/mtp-verl", DIGEST)
    assert f"docker://ghcr.io/acme/mtp-verl@{DIGEST}" in text
    assert "apptainer exec --nv" in text and "verl.trainer.sft_trainer" in text
    assert "actor_rollout_ref" not in text


def test_cluster_needs_registry():
    proc = run_cli("explain", "--profile", "mtp-detach", "--target", "rl", "--cluster", "slurm")
    assert proc.returncode == 2 and "--registry" in proc.stderr


def test_cluster_with_explicit_digest_and_bad_digest():
    ok = run_cli(
        "explain",
        "--profile",
        "mtp-detach",
        "--target",
        "rl",
        "--cluster",
        "slurm",
        "--registry",
        "ghcr.io/acme",
        "--digest",
        DIGEST,
    )
    assert ok.returncode == 0 and f"ghcr.io#acme/mtp-verl@{DIGEST}" in ok.stdout
    bad = run_cli(
        "explain",
        "--profile",
        "mtp-detach",
        "--target",
        "rl",
        "--cluster",
        "slurm",
        "--registry",
        "ghcr.io/acme",
        "--digest",
        "sha256:short",
    )
    assert bad.returncode == 2 and "--digest" in bad.stderr
