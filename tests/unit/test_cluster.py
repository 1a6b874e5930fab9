"""Cluster job scripts: pinned by digest, carrying the mode's overrides, valid bash."""

from __future__ import annotations

import subprocess

import pytest

from mtpimage.manifests import manifest
from mtpimage.outputs import preflight
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
    for line in p.verl_cli_overrides_for(target):
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


# -- multi-node (issue 27) -------------------------------------------------------------------
from mtpimage.outputs.multinode import Layout  # noqa: E402

MULTI = ["--registry", "ghcr.io/acme", "--digest", DIGEST]


def _shellcheck(text: str, tmp_path, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(text)
    return subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("cluster", ["slurm", "apptainer"])
@pytest.mark.parametrize(
    "layout",
    [
        Layout(nodes=2),
        Layout(nodes=4, rollout_nodes=1, mounts=("/data:/data", "/ckpt:/ckpt"), ray_interface="ib0"),
    ],
)
def test_multinode_script_is_bash_n_and_shellcheck_clean(cluster, layout, tmp_path):
    text = job_script(plan("mtp-rollout"), "rl", cluster, "ghcr.io", "acme/mtp-verl", DIGEST, layout)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    checked = _shellcheck(text, tmp_path, "job.sbatch")
    assert checked.returncode == 0, checked.stdout
    node_sh = text.split("<< 'RAY_NODE_EOF'\n", 1)[1].split("\nRAY_NODE_EOF\n", 1)[0]
    checked = _shellcheck(node_sh, tmp_path, "ray_node.sh")  # the script each node runs, a string above
    assert checked.returncode == 0, checked.stdout
    assert f"#SBATCH --nodes={layout.nodes}" in text and ":latest" not in text


def test_shellcheck_check_can_fail(tmp_path):
    assert _shellcheck("#!/bin/bash\necho $undefined_and_unquoted\n", tmp_path, "bad.sh").returncode != 0


def test_multinode_layout_reaches_verl():
    text = job_script(
        plan("mtp-detach"),
        "rl",
        "slurm",
        "ghcr.io",
        "acme/mtp-verl",
        DIGEST,
        Layout(nodes=3, gpus_per_node=4),
    )
    assert "    trainer.nnodes=3 \\\n    trainer.n_gpus_per_node=4 \\\n" in text
    assert 'CONTAINER="verl-${SLURM_JOB_ID}"' in text and '--container-name="$CONTAINER"' in text
    split = job_script(
        plan("mtp-rollout"),
        "rl",
        "slurm",
        "ghcr.io",
        "acme/mtp-verl",
        DIGEST,
        Layout(nodes=3, rollout_nodes=1),
    )
    assert "verl.experimental.fully_async_policy.fully_async_main" in split
    for line in [
        "trainer.nnodes=2",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=8",
        "actor_rollout_ref.hybrid_engine=False",
    ]:
        assert f"    {line} \\\n" in split
    assert "actor_rollout_ref.model.mtp.enable_rollout=True" in split


def test_network_options_become_the_variables_nccl_and_gloo_read():
    layout = Layout(
        nodes=2,
        nccl_socket_ifname="ib0",
        gloo_socket_ifname="eth0",
        ib_hca="mlx5_0,mlx5_1",
        ray_interface="ib0",
    )
    text = job_script(plan("mtp-detach"), "rl", "apptainer", "ghcr.io", "acme/mtp-verl", DIGEST, layout)
    assert 'export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-ib0}"' in text
    assert 'export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-eth0}"' in text
    assert 'export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5_0,mlx5_1}"' in text
    assert 'RAY_INTERFACE="${RAY_INTERFACE:-ib0}"' in text


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--target", "sft", "--cluster", "slurm", "--nodes", "2"], "--target"),
        (["--target", "rl", "--cluster", "slurm", "--nodes", "2", "--rollout-nodes", "2"], "--rollout-nodes"),
        (["--target", "rl", "--cluster", "slurm", "--nodes", "1", "--rollout-nodes", "1"], "--rollout-nodes"),
        (["--target", "rl", "--cluster", "apptainer", "--nodes", "2", "--mount", "/a,b:/c"], "--mount"),
        (["--target", "rl", "--cluster", "kuberay", "--nodes", "2", "--ib-hca", "mlx5_0;rm"], "--ib-hca"),
        (["--target", "rl", "--cluster", "slurm", "--nodes", "0"], "--nodes"),
    ],
)
def test_bad_multinode_input_is_one_line_exit_2(args, flag):
    proc = run_cli("explain", "--profile", "mtp-detach", *args, *MULTI)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}") and "(fix: " in lines[0], proc.stderr


def test_kuberay_rayjob_from_the_cli():
    import yaml

    proc = run_cli(
        "explain", "--profile", "mtp-detach", "--target", "rl", "--cluster", "kuberay", "--nodes", "4", *MULTI
    )
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    spec = doc["spec"]["rayClusterSpec"]
    pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    assert spec["workerGroupSpecs"][0]["replicas"] == 3
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["image"] == f"ghcr.io/acme/mtp-verl@{DIGEST}"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert pod["spec"]["volumes"] == [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}
        ]
    entry = doc["spec"]["entrypoint"]
    assert (
        entry.index("auto 600 4")
        < entry.index(f"&& {preflight.DRIVER_CHECK} bash -c ")
        < entry.index("mtp-preflight python3 -m verl.trainer.main_ppo")
    )
    assert entry.endswith("trainer.nnodes=4 trainer.n_gpus_per_node=8")
    assert spec["rayVersion"] == "2.60.0"  # lock.yaml's ray


def test_explain_says_which_modes_split_rollout():
    rollout = run_cli("explain", "--profile", "mtp-rollout", "--target", "rl")
    assert (
        "# multi-node: mode rollout drafts with MTP in rollout" in rollout.stdout
        and "--rollout-nodes" in rollout.stdout
    )
    detach = run_cli("explain", "--profile", "mtp-detach", "--target", "rl")
    assert "# multi-node: mode mtp-only: rollout is colocated" in detach.stdout
