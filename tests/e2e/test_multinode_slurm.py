"""The multi-node sbatch scripts against a real Slurm controller (Debian's slurmctld 22.05,
munge authentication; scripts/setup-test-host.sh installs both and starts munged).

The test's own slurmctld runs a cluster of four 8-GPU nodes in power-saving state (CLOUD:
known to the controller, resumed on demand by a no-op program), so `sbatch --test-only` has
the controller check each script's directives against real nodes, GRES and partitions and
answer where the job would start, without running it. A job asking for more than the cluster
has is refused by the same controller: the check can fail.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from mtpimage.manifests import manifest
from mtpimage.outputs.jobscripts import job_script
from mtpimage.outputs.multinode import Layout
from mtpimage.plan.model import build_plan

pytestmark = pytest.mark.timeout(300)
DIGEST = "sha256:" + "cd" * 32

SLURM_CONF = """\
ClusterName=mtptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
StateSaveLocation={state}
SlurmctldPidFile={state}/slurmctld.pid
SlurmctldLogFile={state}/slurmctld.log
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
GresTypes=gpu
SuspendProgram=/bin/true
ResumeProgram=/bin/true
SuspendTime=600
NodeName=mtp-node[1-4] NodeAddr=127.0.0.1 CPUs=32 RealMemory=500000 Gres=gpu:8 State=CLOUD
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """SLURM_CONF of a running slurmctld of its own; stopped after the module."""
    missing = [tool for tool in ("slurmctld", "sbatch", "munge") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed (fix: run scripts/setup-test-host.sh)", pytrace=False
        )
    if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
        pytest.fail("munged is not running (fix: run scripts/setup-test-host.sh)", pytrace=False)
    state = tmp_path_factory.mktemp("slurm")
    conf = state / "slurm.conf"
    conf.write_text(SLURM_CONF.format(ctld_port=_free_port(), slurmd_port=_free_port(), state=state))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, timeout=60)
    try:
        for _ in range(150):  # bounded: 150 pings
            if subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout.count(
                "UP"
            ):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"slurmctld did not answer: {(state / 'slurmctld.log').read_text()[-2000:]}")
        yield env
    finally:
        pid = (state / "slurmctld.pid").read_text().strip() if (state / "slurmctld.pid").exists() else ""
        if pid:
            subprocess.run(["kill", pid], check=False)


def _script(cluster: str, layout: Layout) -> str:
    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-detach"))
    return job_script(plan, "rl", cluster, "ghcr.io", "acme/mtp-verl", DIGEST, layout)


def _test_only(env: dict, tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    return subprocess.run(
        ["sbatch", "--test-only", str(path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "cluster,layout,nodes",
    [
        ("slurm", Layout(nodes=2), "mtp-node[1-2]"),
        ("apptainer", Layout(nodes=2, ray_interface="ib0", ib_hca="mlx5_0"), "mtp-node[1-2]"),
        ("slurm", Layout(nodes=4, rollout_nodes=2, mounts=("/data:/data",)), "mtp-node[1-4]"),
    ],
)
def test_the_controller_accepts_the_generated_script(slurm, tmp_path, cluster, layout, nodes):
    proc = _test_only(slurm, tmp_path, _script(cluster, layout))
    assert proc.returncode == 0, proc.stderr
    assert re.search(
        rf"Job \d+ to start at \S+ using \d+ processors on nodes {re.escape(nodes)} in partition gpu",
        proc.stderr,
    )


@pytest.mark.parametrize("layout", [Layout(nodes=5), Layout(nodes=2, gpus_per_node=16)])
def test_the_controller_refuses_a_job_larger_than_the_cluster(slurm, tmp_path, layout):
    proc = _test_only(slurm, tmp_path, _script("slurm", layout))
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in proc.stderr
