"""End to end, issue 49 item 3: a multi-arch image of a test profile, with real buildah, real
qemu (Debian's qemu-user-static, binfmt_misc), dockerd and the session's registry.

The test profile is built and published by the reproducible engine for linux/amd64 and for
linux/arm64 (its RUN steps and in-image checks under qemu-aarch64), on a multi-arch test base
(mtpimage/demo/testbase.py: the debootstrapped bookworm for each platform under one index).
`index` lists both images in one OCI index under the profile's tag (made twice: the same
digest). dockerd pulls each platform from that tag, and the arm64 image's python3 is an aarch64
ELF that runs (under qemu) and says aarch64. `verify` of the index's arm64 entry rebuilds it on a
clean builder and finds it bit for bit the same.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
import uuid

import pytest

from mtpimage.demo.testbase import ARM64_BASE_IMAGE, push_multiarch_base
from mtpimage.engine import emulation
from mtpimage.errors import EnvironmentProblem
from mtpimage.imageref import Registry
from mtpimage.publish import imageindex
from mtpimage.publish.registryclient import RegistryClient
from tests.fixtures.image_fixtures import copy_manifests, world_cli


def _emulated() -> str | None:
    try:
        emulation.handler("linux/arm64")
    except EnvironmentProblem as exc:
        return str(exc)
    return None


pytestmark = [
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        shutil.which("buildah") is None, reason="buildah not installed (scripts/setup-test-host.sh)"
    ),
    pytest.mark.skipif(_emulated() is not None, reason=f"no arm64 emulation: {_emulated()}"),
]

PROFILE = "test-detach"
# e_machine of an ELF header (offset 18, little endian): what CPU a binary is for
EM = {62: "x86-64", 183: "aarch64"}


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    if docker_host.docker("image", "inspect", ARM64_BASE_IMAGE, check=False).returncode != 0:
        pytest.skip(f"no {ARM64_BASE_IMAGE} (scripts/setup-test-host.sh debootstraps it)")
    base = push_multiarch_base(docker_host.registry, docker_host.base_image)
    manifests = copy_manifests(tmp_path_factory.mktemp("multiarch-manifests") / "manifests", base.ref)
    env = {
        **git_world.env,
        "MTP_CACHE_DIR": str(tmp_path_factory.mktemp("multiarch-cache")),
        "MTP_DOCKER_CLI": docker_host.cli,
        "MTP_ENGINE": "buildah",
        "MTP_FASTPATH": "0",
    }
    return {"host": docker_host, "manifests": str(manifests), "env": env, "base": base}


def _publish(world, registry: str, platform: str, tmp_path) -> tuple[dict, float]:
    """The main job for `platform`, pushed: (its summary, the build's own seconds)."""
    summary = tmp_path / f"{platform.replace('/', '-')}.json"
    proc = world_cli(
        world,
        "--profile",
        PROFILE,
        "--set",
        f"builds.platform={platform}",
        "--push",
        "--registry",
        registry,
        "--summary-file",
        str(summary),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "PASS   versions" in proc.stdout, out[-4000:]
    built = re.search(r"^built\s+\S+ in ([0-9.]+)s", proc.stdout, re.M)
    assert built, out[-3000:]
    return json.loads(summary.read_text()), float(built.group(1))


def _index(world, registry: str) -> str:
    proc = world_cli(world, "index", "--profile", PROFILE, "--registry", registry)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())["digest"]


def _elf_machine(host, image: str, platform: str, path: str) -> str:
    """The CPU the image's `path` (after symlinks) is built for, from its ELF header."""
    ctr = host.docker("create", "--platform", platform, image, "true").stdout.strip()
    try:
        real = host.docker(
            "run", "--rm", "--platform", platform, "--entrypoint", "readlink", image, "-f", path
        )
        proc = subprocess.run(  # binary: the file as a tar stream
            [host.cli, "cp", f"{ctr}:{real.stdout.strip()}", "-"],
            capture_output=True,
            timeout=120,
            check=True,
        )
    finally:
        host.docker("rm", "-f", ctr, check=False)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
        data = tar.extractfile(tar.getmembers()[0]).read(20)
    assert data[:4] == b"\x7fELF", data
    return EM.get(int.from_bytes(data[18:20], "little"), str(data[18:20]))


def test_both_platforms_one_index_pulled_per_platform_and_verified(world, tmp_path):
    host = world["host"]
    registry = f"{host.registry}/multiarch-{uuid.uuid4().hex[:6]}"
    amd64, amd64_s = _publish(world, registry, "linux/amd64", tmp_path)
    arm64, arm64_s = _publish(world, registry, "linux/arm64", tmp_path)
    print(f"build seconds: linux/amd64 {amd64_s:.1f}, linux/arm64 under qemu {arm64_s:.1f}")
    # each platform's tag is its own: the profile's tag is left to the index
    assert arm64["references"][1].endswith(f"/mtp-verl:{PROFILE}.arm64"), arm64["references"]
    assert amd64["digest"] != arm64["digest"]

    # one index under the profile's tag, the same bytes when made again
    digest = _index(world, registry)
    assert _index(world, registry) == digest
    reg = Registry.parse(registry)
    client = RegistryClient(reg)
    body, served = client.manifest("mtp-verl", PROFILE)
    assert served == digest
    assert imageindex.platforms_of(body) == {"linux/amd64": amd64["digest"], "linux/arm64": arm64["digest"]}
    # a publish job run again finds its image up to date under the index
    again = world_cli(
        world, "--profile", PROFILE, "--set", "builds.platform=linux/arm64", "--push", "--registry", registry
    )
    assert again.returncode == 0 and "up to date" in again.stdout, (again.stdout + again.stderr)[-3000:]
    assert client.manifest("mtp-verl", PROFILE)[1] == digest

    # a client pulls each platform from the one tag
    tag = reg.ref("mtp-verl", PROFILE)
    for platform, arch, machine, elf in (
        ("linux/amd64", "amd64", "x86_64", "x86-64"),
        ("linux/arm64", "arm64", "aarch64", "aarch64"),
    ):
        host.docker("pull", "--platform", platform, tag, timeout=600)
        got = host.docker("image", "inspect", "-f", "{{.Os}}/{{.Architecture}}", tag).stdout.strip()
        assert got == f"linux/{arch}", (platform, got)
        ran = host.docker(
            "run",
            "--rm",
            "--platform",
            platform,
            tag,
            "python3",
            "-c",
            "import platform; print(platform.machine())",
        )
        assert ran.stdout.strip() == machine, ran.stdout + ran.stderr
        assert _elf_machine(host, tag, platform, "/usr/bin/python3") == elf
    host.docker("image", "rm", tag, check=False)

    # a platform the index does not list: one line, nothing rebuilt
    ref = f"{registry}/mtp-verl@{digest}"
    proc = world_cli(world, "verify", "--profile", PROFILE, "--image", ref, "--platform", "linux/s390x")
    assert proc.returncode == 2 and "does not list it" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr

    # verify of the index, its arm64 entry: rebuilt on a clean builder (under qemu), bit for bit
    # the same. The amd64 rebuild is every other verify test's; walking every entry of an index
    # is tests/unit/test_verify_platforms.py's (one rebuild less here: CI time)
    proc = world_cli(world, "verify", "--profile", PROFILE, "--image", ref, "--platform", "linux/arm64")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"platform linux/arm64: {registry}/mtp-verl@{arm64['digest']}" in proc.stdout, proc.stdout
    assert f"manifest       same     {arm64['digest']}" in proc.stdout, proc.stdout
    assert "(linux/arm64) builds from this lock" in proc.stdout, proc.stdout
    assert "platform linux/amd64" not in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith(f"identical: linux/arm64 of {ref}"), proc.stdout
