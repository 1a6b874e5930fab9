"""Issue 37 item 4, know before the first step whether the node's driver fits: the image's
driver check (images/runtime/driver-check.sh, run for real here) with a stub `nvidia-smi` on
PATH or a stub /proc/driver/nvidia, for drivers 575, 580 and 595; the entrypoint that runs it;
and the job scripts' preflight and heads, from mtpimage/data/drivers.yaml."""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from mtpimage.assembly import driver
from mtpimage.assembly.render import IMAGES_DIR, deterministic_tar, render
from mtpimage.errors import InputError
from mtpimage.manifests import manifest
from mtpimage.outputs import preflight
from mtpimage.outputs.jobscripts import job_script
from mtpimage.outputs.multinode import Layout
from mtpimage.plan.model import build_plan

RUNTIME = IMAGES_DIR / "runtime"
CHECK = RUNTIME / "driver-check.sh"
ENTRYPOINT = RUNTIME / "entrypoint.sh"
DIGEST = "sha256:" + "ab" * 32
H200 = "NVIDIA H200"  # nvidia-smi's name on the H200 runs of docs/gpu.md (driver 580.159.04)
GEFORCE = "NVIDIA GeForce RTX 4090"
SHOW = 'echo "ran LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"'


@dataclasses.dataclass
class Node:
    """A stub node: a bin dir for nvidia-smi, a /proc/driver/nvidia, an image's compat dir."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def proc(self) -> Path:
        return self.root / "proc-driver-nvidia"

    @property
    def compat(self) -> Path:
        return self.root / "usr-local-cuda-compat"

    @property
    def facts(self) -> Path:
        return self.root / "driver.facts"

    def smi(self, version: str, *gpus: str, caps: tuple[str, ...] = ()) -> None:
        """nvidia-smi answering the driver check's query; with `caps`, also the compute
        capability query (one line per GPU, as nvidia-smi 580 prints it: "10.0")."""
        lines = "".join(f'echo "{version}, {gpu}"\n' for gpu in gpus)
        cap_lines = "".join(f'echo "{cap}"\n' for cap in caps)
        self._write_smi(
            'if [ "$*" = "--query-gpu=compute_cap --format=csv,noheader" ]; then\n'
            + (cap_lines + "exit 0\n" if caps else "exit 9\n")
            + "fi\n"
            + f'[ "$*" = "--query-gpu=driver_version,name --format=csv,noheader" ] || exit 9\n{lines}'
        )

    def broken_smi(self) -> None:
        self._write_smi('echo "Failed to initialize NVML: Driver/library version mismatch"\nexit 18\n')

    def _write_smi(self, body: str) -> None:
        self.bin.mkdir(exist_ok=True)
        path = self.bin / "nvidia-smi"
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)

    def proc_version(self, version: str, *gpus: str) -> None:
        self.proc.mkdir(exist_ok=True)
        (self.proc / "version").write_text(
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
            "(dvs-builder@U22-I3-AF03-09-1)  Sun Jul 20 2025\nGCC version:  gcc version 12.3.0\n"
        )
        for i, gpu in enumerate(gpus):
            info = self.proc / "gpus" / f"0000:{i:02x}:00.0"
            info.mkdir(parents=True)
            (info / "information").write_text(f"Model: \t\t {gpu}\nIRQ:   129\nBus Type: \t PCIe\n")

    def with_compat(self) -> None:
        self.compat.mkdir(exist_ok=True)
        (self.compat / "libcuda.so.1").write_text("")

    def run(self, *args: str, ld: str = "", script: Path = CHECK, extra_env: dict | None = None):
        need = dataclasses.replace(driver.need("13.0.2"), compat_dir=str(self.compat))
        self.facts.write_text(driver.facts_text(need))
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "MTP_DRIVER_FACTS": str(self.facts),
            "MTP_DRIVER_PROC": str(self.proc),
            "LD_LIBRARY_PATH": ld,
            **(extra_env or {}),
        }
        return subprocess.run([str(script), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def node(tmp_path) -> Node:
    n = Node(tmp_path)
    n.bin.mkdir()
    return n


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# ------------------------------------------------------------------------ the three answers
def test_575_without_compat_stops_with_one_line(node):
    node.smi("575.57.08", H200)
    proc = node.run("--", "sh", "-c", SHOW)
    assert proc.returncode == 1 and "ran" not in proc.stdout
    line = _one_line(proc.stderr)
    assert "NVIDIA driver 575.57.08 found (nvidia-smi), CUDA 13.0 needs >= 580" in line
    assert (
        "(fix: update the node's NVIDIA driver to 580 or newer; or use an image with NVIDIA's forward-compatibility libraries"
        in line
    )


def test_575_on_a_consumer_gpu_stops_even_with_compat_libraries(node):
    node.smi("575.57.08", GEFORCE)
    node.with_compat()
    proc = node.run("--", "sh", "-c", SHOW)
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert f"forward compatibility is for data-center GPUs only, and this is {GEFORCE}" in _one_line(
        proc.stderr
    )


def test_575_on_a_data_center_gpu_with_compat_enables_compat(node):
    node.smi("575.57.08", H200, H200)
    node.with_compat()
    proc = node.run("--", "sh", "-c", SHOW, ld="/usr/local/nvidia/lib64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ran LD_LIBRARY_PATH={node.compat}:/usr/local/nvidia/lib64"
    line = _one_line(proc.stderr)
    assert f"data-center GPU ({H200}), so the image's forward-compatibility libraries are used" in line


def test_a_mix_of_gpus_uses_compat_only_when_every_one_is_data_center(node):
    node.smi("575.57.08", H200, GEFORCE)
    node.with_compat()
    assert node.run("--", "true").returncode == 1


@pytest.mark.parametrize("version", ["580.159.04", "595.44.01"])
def test_580_and_595_go_on_without_compat(node, version):
    node.smi(version, H200)
    node.with_compat()  # present in the image, and still not used: on this driver it fails (803)
    proc = node.run("--", "sh", "-c", SHOW, ld="/usr/local/nvidia/lib64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ran LD_LIBRARY_PATH=/usr/local/nvidia/lib64"
    assert (
        f"driver {version} fits CUDA 13.0 (needs >= 580); forward-compatibility libraries not used"
        in proc.stderr
    )


def test_595_takes_compat_off_a_path_that_forced_it(node):
    node.smi("595.44.01", H200)
    node.with_compat()
    proc = node.run("--", "sh", "-c", SHOW, ld=f"{node.compat}:/usr/local/nvidia/lib64:{node.compat}/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ran LD_LIBRARY_PATH=/usr/local/nvidia/lib64"
    assert "took" in proc.stderr and "CUDA error 803" in proc.stderr


# ------------------------------------------------------------------------ /proc/driver/nvidia
@pytest.mark.parametrize(
    "version, compat, rc",
    [("575.57.08", True, 0), ("575.57.08", False, 1), ("580.65.06", False, 0), ("595.44.01", True, 0)],
)
def test_the_version_file_answers_where_nvidia_smi_does_not(node, version, compat, rc):
    node.broken_smi()  # present but failing, as after a driver update without a reboot
    node.proc_version(version, "NVIDIA H100 80GB HBM3")
    if compat:
        node.with_compat()
    proc = node.run("--", "sh", "-c", SHOW)
    assert proc.returncode == rc, proc.stderr
    line = _one_line(proc.stderr)
    if version.startswith("575"):
        assert f"NVIDIA driver {version} found ({node.proc}/version)" in line
    enabled = proc.stdout.strip() == f"ran LD_LIBRARY_PATH={node.compat}"
    assert enabled is (version.startswith("575") and compat)


def test_no_driver_goes_on_quietly_in_the_entrypoint_and_says_so_in_a_job(node):
    quiet = node.run("--", "sh", "-c", SHOW)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout.strip() == "ran LD_LIBRARY_PATH="
    job = node.run("--job", "--", "true")
    assert job.returncode == 0 and "no NVIDIA driver visible" in _one_line(job.stderr)


def test_without_a_command_it_only_answers(node):
    node.smi("580.159.04", H200)
    assert node.run().returncode == 0
    node.smi("575.57.08", GEFORCE)
    assert node.run().returncode == 1


def test_an_unknown_option_is_one_line_and_exit_2(node):
    proc = node.run("--force")
    assert proc.returncode == 2 and "unknown option '--force'" in _one_line(proc.stderr)


# ------------------------------------------------------------------------ the entrypoint
def _entry(node: Node, tmp_path: Path, *args: str, nvidia: bool = False, stdin: str = ""):
    stub = tmp_path / "nvidia_entrypoint.sh"
    if nvidia:
        stub.write_text('#!/bin/sh\necho "nvidia entrypoint, then: $*"\nexec "$@"\n')
        stub.chmod(0o755)
    need = driver.need("13.0.2")
    node.facts.write_text(driver.facts_text(dataclasses.replace(need, compat_dir=str(node.compat))))
    env = {
        "PATH": f"{node.bin}:/usr/bin:/bin",
        "MTP_DRIVER_FACTS": str(node.facts),
        "MTP_DRIVER_PROC": str(node.proc),
        "MTP_NVIDIA_ENTRYPOINT": str(stub),
    }
    return subprocess.run(
        [str(ENTRYPOINT), *args], capture_output=True, text=True, env=env, input=stdin, timeout=60
    )


def test_the_entrypoint_checks_then_chains_to_nvidias_then_runs_the_command(node, tmp_path):
    node.smi("595.44.01", H200)
    proc = _entry(node, tmp_path, "sh", "-c", "echo command ran", nvidia=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["nvidia entrypoint, then: sh -c echo command ran", "command ran"]
    assert "fits CUDA 13.0" in proc.stderr
    node.smi("575.57.08", GEFORCE)
    stopped = _entry(node, tmp_path, "sh", "-c", "echo command ran", nvidia=True)
    assert stopped.returncode == 1 and stopped.stdout == ""


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_the_entrypoint_without_a_command_is_bash(node, tmp_path):
    proc = _entry(node, tmp_path, stdin='echo "shell: ${BASH_VERSION:+bash}"\n')
    assert proc.returncode == 0 and proc.stdout.strip() == "shell: bash", proc.stderr


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="needs shellcheck")
def test_the_runtime_scripts_are_posix_sh_and_shellcheck_clean():
    for script in (CHECK, ENTRYPOINT):
        assert script.read_text().startswith("#!/bin/sh\n")
        proc = subprocess.run(["shellcheck", "-s", "sh", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


# ------------------------------------------------------------------------ the data and the image
def test_the_data_file_says_580_for_cuda_13_0_and_names_data_center_gpus():
    data = yaml.safe_load((Path(driver.__file__).parents[1] / "data" / "drivers.yaml").read_text())
    assert data["cuda_lines"]["13.0"]["min_driver"] == 580
    n = driver.need("13.0.2")
    assert (n.cuda_line, n.min_driver, n.compat_dir) == ("13.0", 580, "/usr/local/cuda/compat")
    assert "H200" in n.datacenter_gpus and "T4" in n.datacenter_gpus


def test_a_cuda_line_without_a_minimum_driver_is_one_line_naming_the_file():
    with pytest.raises(InputError) as err:
        driver.need("12.9.1")
    line = err.value.one_line()
    assert line.startswith(
        "mtpimage/data/drivers.yaml: cuda_lines.12.9: no minimum NVIDIA driver for CUDA 12.9"
    )
    assert "(fix: add the line" in line


def _plan(profile: str):
    m = manifest.load()
    return build_plan(m, manifest.resolve_profile(m, profile))


def test_every_image_carries_the_entrypoint_the_check_and_its_facts():
    m = manifest.load()
    r = render(build_plan(m, manifest.resolve_profile(m, "mtp-detach")), m.root)
    text = r.files["Dockerfile"].decode()
    assert 'ENTRYPOINT ["/opt/mtp/runtime/entrypoint.sh"]' in text
    facts = r.files[driver.FACTS_FILE].decode()
    assert "min_driver=580\n" in facts and "cuda_line=13.0\n" in facts
    assert r.files["mtp/runtime/driver-check.sh"] == CHECK.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(deterministic_tar(r.files))) as tar:
        for name in ("mtp/runtime/entrypoint.sh", "mtp/runtime/driver-check.sh"):
            assert tar.getmember(name).mode == 0o755  # the ENTRYPOINT must be executable
    # the facts the shell reads are the data file's
    assert f"datacenter_gpus={driver.need('13.0.2').gpu_pattern}" in facts.splitlines()


# ------------------------------------------------------------------------ the job scripts
PREREQUISITE = "# prerequisite: NVIDIA driver >= 580 (CUDA 13.0)"


@pytest.mark.parametrize("cluster", ["slurm", "apptainer"])
def test_the_single_node_scripts_state_the_driver_and_check_it_before_the_trainer(cluster):
    text = job_script(_plan("mtp-detach"), "rl", cluster, "ghcr.io", "acme/mtp-verl", DIGEST)
    assert PREREQUISITE in text
    assert text.index(PREREQUISITE) < text.index("set -euo pipefail") + 200  # in the head
    assert preflight.DRIVER_CHECK in text
    assert (
        text.index(preflight.DRIVER_CHECK)
        < text.index(preflight.LAUNCH_ENV_CHECK)
        < text.index("verl.trainer.main_ppo")
    )


def test_the_multinode_script_checks_the_driver_on_every_node():
    text = job_script(
        _plan("mtp-rollout"), "rl", "slurm", "ghcr.io", "acme/mtp-verl", DIGEST, Layout(nodes=2)
    )
    assert PREREQUISITE in text
    assert f"exec {preflight.DRIVER_CHECK} ray start --head" in text
    assert f"exec {preflight.DRIVER_CHECK} ray start --address" in text
    assert f"{preflight.DRIVER_CHECK} bash -c" in text  # and the trainer's preflight


def test_the_rayjob_states_the_driver_and_its_entrypoint_runs_the_preflight():
    text = job_script(
        _plan("mtp-rollout"), "rl", "kuberay", "ghcr.io", "acme/mtp-verl", DIGEST, Layout(nodes=2)
    )
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert any(line.startswith(PREREQUISITE) for line in head)
    entry = yaml.safe_load(text)["spec"]["entrypoint"]
    assert preflight.DRIVER_CHECK in entry and preflight.LAUNCH_ENV_CHECK in entry


def test_the_preflight_stops_the_trainer_on_a_driver_that_does_not_fit(node, monkeypatch, tmp_path):
    monkeypatch.setattr(preflight, "DRIVER_CHECK", f"{CHECK} --job --")
    monkeypatch.setattr(preflight, "LAUNCH_ENV_CHECK", "true")
    marker = tmp_path / "trainer-ran"
    cmd = preflight.preflighted(f"touch {marker}")
    need = dataclasses.replace(driver.need("13.0.2"), compat_dir=str(node.compat))
    node.facts.write_text(driver.facts_text(need))
    env = {**os.environ, "PATH": f"{node.bin}:/usr/bin:/bin", "MTP_DRIVER_FACTS": str(node.facts)}
    node.smi("575.57.08", GEFORCE)
    stopped = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env)
    assert stopped.returncode == 1 and not marker.exists()
    assert "CUDA 13.0 needs >= 580" in _one_line(stopped.stderr)
    node.smi("580.159.04", H200)
    ran = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env)
    assert ran.returncode == 0 and marker.exists(), ran.stderr
