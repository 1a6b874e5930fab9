"""What a user of a built test image sees: login shells keep the image's environment (cluster
job scripts run `bash -l`), `pip freeze` names each git component's repository and commit,
`render --with-sources` writes a directory that plain `docker build` builds, the image's
ENTRYPOINT checks the node's driver first (a stub nvidia-smi for 575, 580 and 595), and the
site checks find a planted second NCCL and a second megatron on PYTHONPATH (issue 37)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from tests.fixtures.image_fixtures import image_world, world_cli

pytestmark = pytest.mark.timeout(900)
PROFILE = "test-detach"
IMAGE = f"mtp-verl:{PROFILE}"
ASK_PYTHON = 'python -c "import sys; print(sys.prefix)"'


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    w = image_world(docker_host, git_world, tmp_path_factory, "environment")
    proc = world_cli(w, "--profile", PROFILE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return w


def _in_image(world, *argv: str, image: str = IMAGE):
    return world["host"].docker("run", "--rm", image, *argv, check=False, timeout=300)


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_a_login_shell_finds_the_venv_python(world, shell):
    proc = _in_image(world, shell, "-lc", ASK_PYTHON)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "/opt/venv"


def test_the_login_shell_check_passes_and_fails_without_the_profile_script(world):
    ok = _in_image(world, "python", "/opt/mtp/checks/run_checks.py", "--only", "login-shell")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the table: STATUS, check, its time, detail (run_checks.table)
    assert re.search(r"^PASS +login-shell +[0-9.]+s +bash -l and sh -l: python is /opt/venv", ok.stdout, re.M)
    # without /etc/profile.d/mtp-env.sh, /etc/profile's PATH hides the venv: the check says so
    bare = _in_image(
        world,
        "bash",
        "-c",
        "rm /etc/profile.d/mtp-env.sh && python /opt/mtp/checks/run_checks.py --only login-shell",
    )
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert re.search(r"^FAIL +login-shell +[0-9.]+s +bash -l: exit 127", bare.stdout, re.M), bare.stdout


def test_pip_freeze_and_inspect_name_each_git_component_by_repository_and_commit(world):
    vector = json.loads(_in_image(world, "cat", "/opt/mtp/version.json").stdout)
    git = {canonicalize_name(c["package"]): c for c in vector["components"] if c["source"] == "git"}
    catalogue = yaml.safe_load((Path(world["manifests"]) / "components.yaml").read_text())["components"]
    assert git and any("subdir" in catalogue[c["name"]] for c in git.values())
    freeze = _in_image(world, "pip", "freeze").stdout
    assert "file:///tmp" not in freeze, freeze
    lines = {canonicalize_name(line.split(" @ ")[0]): line for line in freeze.splitlines() if " @ " in line}
    for name, comp in git.items():
        subdir = catalogue[comp["name"]].get("subdir", ".")
        sub = "" if subdir == "." else f"#subdirectory={subdir}"
        assert lines.get(name, "").endswith(f" @ git+{comp['repo']}@{comp['commit']}{sub}"), (name, freeze)
    inspect = json.loads(_in_image(world, "pip", "inspect").stdout)
    origins = {canonicalize_name(d["metadata"]["name"]): d.get("direct_url") for d in inspect["installed"]}
    for name, comp in git.items():
        assert origins[name]["url"] == comp["repo"]
        assert origins[name]["vcs_info"]["commit_id"] == comp["commit"]
        assert origins[name]["vcs_info"]["vcs"] == "git"


def test_render_with_sources_is_a_context_plain_docker_builds(world, tmp_path):
    host = world["host"]
    pure = tmp_path / "pure"
    proc = world_cli(world, "render", "--profile", PROFILE, "--out", str(pure))
    assert proc.returncode == 0, proc.stderr
    assert "--with-sources" in proc.stdout  # says that this one does not build
    assert not (pure / "src").exists()
    tag = f"{host.registry}/mtp-e2e/render-with-sources:pure"
    failed = host.build(pure, tag, "--progress", "plain")
    assert failed.returncode != 0 and re.search(r'"/src/[a-z-]+" not found', failed.stderr), failed.stderr[
        -2000:
    ]

    full = tmp_path / "full"
    proc = world_cli(world, "render", "--profile", PROFILE, "--with-sources", "--json", "--out", str(full))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)  # progress went to stderr
    assert info["buildable"] is True
    assert json.loads((full / "src" / "megatron-lm" / ".mtp-source.json").read_text())["commit"]
    tag = f"{host.registry}/mtp-e2e/render-with-sources:{info['identity']}"
    built = host.build(full, tag, "--progress", "plain")
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    check = _in_image(world, "python", "/opt/mtp/checks/run_checks.py", "--only", "versions", image=tag)
    assert check.returncode == 0 and re.search(r"^PASS +versions", check.stdout, re.M), check.stdout
    host.docker("image", "rm", tag, check=False)
    # rendering again over it leaves no stale source file behind
    stale = full / "src" / "megatron-lm" / "left-from-an-older-commit.py"
    stale.write_text("x = 1\n")
    assert (
        world_cli(world, "render", "--profile", PROFILE, "--with-sources", "--out", str(full)).returncode == 0
    )
    assert not stale.exists()
    assert Path(full / "Dockerfile").read_bytes() == (pure / "Dockerfile").read_bytes()


# ------------------------------------------------------------------------ issue 37: site checks
CHECKS = "/opt/mtp/checks/run_checks.py"
# nvidia-smi as the container toolkit mounts it, answering what the test asks for
STUB_SMI = '#!/bin/sh\necho "${STUB_DRIVER:?}, ${STUB_GPU:?}"\n'


@pytest.fixture(scope="module")
def gpu_node(world, tmp_path_factory) -> str:
    """The built image, FROM which a stub nvidia-smi and the compat libraries' place
    (/usr/local/cuda/compat, as cuda-compat fills it) are added: its ENTRYPOINT is the built one."""
    host = world["host"]
    ctx = tmp_path_factory.mktemp("gpu-node")
    (ctx / "nvidia-smi").write_text(STUB_SMI)
    (ctx / "Dockerfile").write_text(
        f"FROM {IMAGE}\nCOPY --chmod=755 nvidia-smi /usr/local/bin/nvidia-smi\n"
        "RUN mkdir -p /usr/local/cuda/compat && : > /usr/local/cuda/compat/libcuda.so.1\n"
    )
    tag = f"{host.registry}/mtp-e2e/gpu-node:{PROFILE}"
    built = host.build(ctx, tag)
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    yield tag
    host.docker("image", "rm", tag, check=False)


def test_the_image_entrypoint_is_the_driver_check(world):
    entry = world["host"].docker("image", "inspect", "--format", "{{json .Config.Entrypoint}}", IMAGE)
    assert json.loads(entry.stdout) == ["/opt/mtp/runtime/entrypoint.sh"]
    facts = _in_image(world, "cat", "/opt/mtp/runtime/driver.facts")
    assert "min_driver=580" in facts.stdout and "cuda_line=13.0" in facts.stdout


@pytest.mark.parametrize(
    "version, gpu, rc, says, compat",
    [
        (
            "575.57.08",
            "NVIDIA GeForce RTX 4090",
            1,
            "forward compatibility is for data-center GPUs only",
            False,
        ),
        ("575.57.08", "NVIDIA H200", 0, "forward-compatibility libraries are used", True),
        (
            "580.159.04",
            "NVIDIA H200",
            0,
            "fits CUDA 13.0 (needs >= 580); forward-compatibility libraries not",
            False,
        ),
        (
            "595.44.01",
            "NVIDIA H200",
            0,
            "fits CUDA 13.0 (needs >= 580); forward-compatibility libraries not",
            False,
        ),
    ],
)
def test_the_entrypoint_answers_each_driver(world, gpu_node, version, gpu, rc, says, compat):
    proc = world["host"].docker(
        "run", "--rm", "-e", f"STUB_DRIVER={version}", "-e", f"STUB_GPU={gpu}", gpu_node,
        "sh", "-c", 'echo "command ran; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"',
        check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert ("command ran" in proc.stdout) is (rc == 0)
    assert ("/usr/local/cuda/compat" in proc.stdout) is compat
    if rc:
        assert f"NVIDIA driver {version} found (nvidia-smi), CUDA 13.0 needs >= 580 (fix: " in proc.stderr


def test_the_os_layer_removes_the_bases_held_nccl(world):
    """The test base holds a stand-in of the real base's libnccl2 (apt-mark hold, with its
    library file); platform.os_remove takes it out in the os layer, hold and all (issue 37)."""
    query = "dpkg-query -W -f='${Package} ${Status}\\n' libnccl2; ls /usr/lib/x86_64-linux-gnu/libnccl*"
    base = world["host"].docker("run", "--rm", "--entrypoint", "sh", world["base"], "-c", query, check=False)
    assert "libnccl2 hold ok installed" in base.stdout and "libnccl.so.2.28.3" in base.stdout, base.stdout
    image = _in_image(world, "sh", "-c", query)
    assert "ok installed" not in image.stdout and "libnccl" not in image.stdout, image.stdout + image.stderr


def test_native_libs_passes_here_and_names_a_planted_second_nccl(world):
    ok = _in_image(world, "python", CHECKS, "--only", "native-libs")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"^SKIP +native-libs:nccl ", ok.stdout, re.M), ok.stdout  # a test base: no NCCL
    plant = (
        "mkdir -p /tmp/a /tmp/b && echo a > /tmp/a/libnccl.so.2 && echo b > /tmp/b/libnccl.so.2.28.3 && "
        f"LD_LIBRARY_PATH=/tmp/a:/tmp/b exec python {CHECKS} --only native-libs"
    )
    bad = _in_image(world, "sh", "-c", plant)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    line = next(x for x in bad.stdout.splitlines() if "native-libs:nccl" in x)
    assert line.startswith("FAIL") and "/tmp/a/libnccl.so.2" in line and "/tmp/b/libnccl.so.2.28.3" in line


def test_launch_env_names_a_second_megatron_on_pythonpath(world):
    plant = (
        "mkdir -p /tmp/Megatron-LM/megatron/core && : > /tmp/Megatron-LM/megatron/core/__init__.py && "
        f"PYTHONPATH=/tmp/Megatron-LM exec python {CHECKS} --only launch-env"
    )
    bad = _in_image(world, "sh", "-c", plant)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(
        r"^FAIL +launch-env:one-copy .*megatron\.core comes first from /tmp/Megatron-LM", bad.stdout, re.M
    ), bad.stdout
