"""Ray across nodes for real: the generated multi-node sbatch script runs unchanged with each
Slurm node a Docker container on one network (srun and scontrol are stand-ins that run a
step in the container named after its node: tests/e2e/multinode/shims/). The image is a small
one built here: the test base plus the ray that the real stack's lock pins, installed from
wheels checked by hash, and a stand-in verl trainer that joins Ray as verl's run_ppo does.

- the head and worker commands form one Ray cluster of two nodes, and the trainer, started
  the way the script starts it, sees both (a task runs on each) with the layout's overrides;
- a worker whose network cannot reach the head ends with the one-line error naming it, and
  the job stops with the node named, instead of hanging.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mtpimage.assembly import driver
from mtpimage.manifests import manifest
from mtpimage.outputs.jobscripts import job_script
from mtpimage.outputs.multinode import Layout
from mtpimage.plan.model import build_plan

pytestmark = pytest.mark.timeout(900)
HERE = Path(__file__).parent / "multinode"
DIGEST = "sha256:" + "ab" * 32
RAY_START_ARGS = "--num-cpus=1 --object-store-memory=100000000"
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "linux_x86_64"]

DOCKERFILE = """\
FROM {base}
COPY wheels /tmp/wheels
COPY requirements-ray.txt /tmp/requirements-ray.txt
RUN python3 -m venv /opt/ray \\
 && /opt/ray/bin/pip install -q --no-index --find-links /tmp/wheels --require-hashes -r /tmp/requirements-ray.txt \\
 && rm -rf /tmp/wheels
COPY standin /opt/standin
COPY checks /opt/mtp/checks
COPY runtime /opt/mtp/runtime
COPY version.json /opt/mtp/version.json
ENV PATH=/opt/ray/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONPATH=/opt/standin \
    VERL_USE_UV=0
"""
# What the job scripts' preflight (mtpimage/outputs/preflight.py) reads: the image's own checks
# and a version vector whose verl asks for VERL_USE_UV=0, as a built image's does, and its
# driver check with the facts a render writes (no driver in these containers: it goes on).
CHECKS = Path(__file__).resolve().parents[2] / "images" / "checks"
RUNTIME = Path(__file__).resolve().parents[2] / "images" / "runtime"
DRIVER_FACTS = driver.facts_text(driver.need("13.0.2"))
VECTOR = {
    "components": [{"name": "verl", "package": "verl", "runtime_env": {"VERL_USE_UV": "0"}}],
    "packages": [],
}


def _inputs_digest(base: str) -> str:
    h = hashlib.sha256(DOCKERFILE.format(base=base).encode())
    for path in sorted([HERE / "requirements-ray.txt", *(HERE / "standin").rglob("*.py")]):
        h.update(path.relative_to(HERE).as_posix().encode() + b"\0" + path.read_bytes())
    for path in sorted(p for d in (CHECKS, RUNTIME) for p in d.glob("*") if p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(DRIVER_FACTS.encode())
    h.update(json.dumps(VECTOR, sort_keys=True).encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def ray_image(docker_host, tmp_path_factory) -> str:
    """mtp-test-ray:<inputs digest>, built once per set of inputs (a later run reuses it)."""
    base_id = docker_host.docker(
        "image", "inspect", "--format", "{{.Id}}", docker_host.base_image
    ).stdout.strip()
    tag = f"mtp-test-ray:{_inputs_digest(base_id)}"
    if docker_host.docker("image", "inspect", tag, check=False).returncode == 0:
        return tag
    ctx = tmp_path_factory.mktemp("ray-image")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    download = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--require-hashes",
        "--only-binary=:all:",
    ]
    download += ["--python-version", "3.11", "--implementation", "cp", *platforms]
    download += ["-r", str(HERE / "requirements-ray.txt"), "-d", str(ctx / "wheels")]
    got = subprocess.run(download, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    (ctx / "requirements-ray.txt").write_bytes((HERE / "requirements-ray.txt").read_bytes())
    subprocess.run(["cp", "-r", str(HERE / "standin"), str(ctx / "standin")], check=True)
    subprocess.run(["cp", "-r", str(CHECKS), str(ctx / "checks")], check=True)
    subprocess.run(["cp", "-r", str(RUNTIME), str(ctx / "runtime")], check=True)
    (ctx / "runtime" / "driver.facts").write_text(DRIVER_FACTS)
    (ctx / "version.json").write_text(json.dumps(VECTOR))
    (ctx / "Dockerfile").write_text(DOCKERFILE.format(base=docker_host.base_image))
    built = docker_host.build(ctx, tag, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return tag


class Nodes:
    """Containers standing for Slurm nodes, each on its own chosen Docker network."""

    def __init__(self, docker_host, image: str):
        self.docker_host, self.image = docker_host, image
        self.prefix = f"mtp27-{uuid.uuid4().hex[:8]}"
        self.names: list[str] = []
        self.networks: list[str] = []

    def network(self, suffix: str, *flags: str) -> str:
        name = f"{self.prefix}-{suffix}"
        self.docker_host.docker("network", "create", *flags, name)
        self.networks.append(name)
        return name

    def start(self, node: str, network: str) -> str:
        name = f"{self.prefix}-{node}"
        self.docker_host.docker(
            "run", "-d", "--name", name, "--hostname", name, "--network", network, "--shm-size=512m",
            "--init", self.image, "sleep", "infinity",
        )  # fmt: skip
        self.names.append(name)
        return name

    def remove(self) -> None:
        for name in self.names:
            self.docker_host.docker("rm", "-f", name, check=False)
        for name in self.networks:
            self.docker_host.docker("network", "rm", name, check=False)


@pytest.fixture
def nodes(docker_host, ray_image):
    world = Nodes(docker_host, ray_image)
    try:
        yield world
    finally:
        world.remove()


def _script(cluster: str, layout: Layout) -> str:
    m = manifest.load()
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-detach"))
    return job_script(plan, "rl", cluster, "127.0.0.1:5000", "mtp/mtp-verl", DIGEST, layout)


def _run_job(docker_host, tmp_path: Path, script: str, node_names: list[str], join_timeout: int):
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = dict(os.environ)
    env.update(
        PATH=f"{HERE / 'shims'}:{env['PATH']}",
        TEST_DOCKER=docker_host.cli,
        TEST_NODES=" ".join(node_names),
        SLURM_JOB_NODELIST=",".join(node_names),
        SLURM_JOB_ID="4242",
        JOIN_TIMEOUT_S=str(join_timeout),
        RAY_START_ARGS=RAY_START_ARGS,
    )
    # Output to files, not pipes: the steps the script leaves running when it exits (Slurm
    # would end them with the job) still hold its output until the containers go.
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    with out.open("w") as o, err.open("w") as e:
        rc = subprocess.run(
            ["bash", str(path)], cwd=tmp_path, env=env, stdout=o, stderr=e, timeout=600
        ).returncode
    return subprocess.CompletedProcess(path, rc, out.read_text(), err.read_text())


def _report(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("STANDIN-TRAINER ")]
    assert len(lines) == 1, stdout[-3000:]
    return json.loads(lines[0].split(" ", 1)[1])


@pytest.mark.parametrize("cluster", ["slurm", "apptainer"])
def test_two_containers_form_one_ray_cluster_and_the_trainer_sees_both(docker_host, nodes, tmp_path, cluster):
    net = nodes.network("net")
    names = [nodes.start("n1", net), nodes.start("n2", net)]
    layout = Layout(nodes=2, gpus_per_node=2)
    proc = _run_job(docker_host, tmp_path, _script(cluster, layout), names, join_timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"ray: 2 of 2 nodes joined ({', '.join(sorted(names))}); 4 GPUs" in proc.stdout
    # the driver check ran before each ray start and the trainer (no driver in these containers)
    assert proc.stderr.count("mtp driver check: no NVIDIA driver visible") == 3, proc.stderr[-3000:]
    report = _report(proc.stdout)
    assert report["node_names"] == sorted(names)
    assert report["task_hosts"] == sorted(names)  # one task ran in each container
    assert report["gpus"] == 4
    assert report["argv"][-2:] == ["trainer.nnodes=2", "trainer.n_gpus_per_node=2"]
    # the profile's mtp-only recipe (megatron-detach-heads, issue 45) reached the trainer
    assert "actor_rollout_ref.model.mtp.detach_encoder=False" in report["argv"]
    assert (
        "+actor_rollout_ref.actor.megatron.override_transformer_config.mtp_detach_heads=True"
        in report["argv"]
    )
    if cluster == "apptainer":
        assert (tmp_path / f"mtp-verl-mtp-detach-{'ab' * 6}.sif").read_text().strip() == (
            f"docker://127.0.0.1:5000/mtp/mtp-verl@{DIGEST}"
        )


def test_split_layout_runs_the_fully_async_trainer_on_the_same_cluster(docker_host, nodes, tmp_path):
    net = nodes.network("net")
    names = [nodes.start("n1", net), nodes.start("n2", net)]
    proc = _run_job(
        docker_host, tmp_path, _script("slurm", Layout(nodes=2, gpus_per_node=1, rollout_nodes=1)), names, 180
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = _report(proc.stdout)
    assert report["task_hosts"] == sorted(names)
    assert report["argv"][:2] == [
        "--config-path=config",
        "--config-name=fully_async_ppo_megatron_trainer.yaml",
    ]
    for arg in [
        "trainer.nnodes=1",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        "actor_rollout_ref.hybrid_engine=False",
    ]:
        assert arg in report["argv"]


def test_a_worker_that_cannot_reach_the_head_fails_with_the_message(docker_host, nodes, tmp_path):
    head = nodes.start("n1", nodes.network("head"))
    cut_off = nodes.start("n2", nodes.network("isolated", "--internal"))  # no route to the head's network
    proc = _run_job(
        docker_host, tmp_path, _script("slurm", Layout(nodes=2, gpus_per_node=1)), [head, cut_off], 12
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"error: Ray worker {cut_off} cannot reach the Ray head at " in proc.stderr
    assert "after 12s" in proc.stderr
    assert f"error: the Ray step on {cut_off} ended before all 2 nodes joined" in proc.stderr
    assert "STANDIN-TRAINER" not in proc.stdout
