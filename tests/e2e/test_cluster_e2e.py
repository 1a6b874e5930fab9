"""End to end: export a built test image as a squashfs for enroot and Apptainer (real
dockerd, real mksquashfs/unsquashfs: zstd by default, the image's files, the same bytes twice);
a Slurm script pinned to the digest the loopback registry reports, stating its layers."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
import requests

from tests.fixtures.image_fixtures import image_world, world_cli

pytestmark = pytest.mark.timeout(900)
PROFILE = "test-detach"


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    return image_world(docker_host, git_world, tmp_path_factory, "cluster")


_cli = world_cli


def test_export_enroot_squashfs_contains_the_version_vector(world, tmp_path):
    built = _cli(world, "--profile", PROFILE)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    out = tmp_path / "image.sqsh"
    proc = _cli(world, "export", "--profile", PROFILE, "--format", "enroot", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    listing = subprocess.run(
        ["unsquashfs", "-l", str(out)], capture_output=True, text=True, check=True
    ).stdout
    assert "squashfs-root/opt/mtp/version.json" in listing
    vector = json.loads(Path(str(out) + ".version.json").read_text())
    assert vector["profile"] == PROFILE
    assert not Path(str(out) + ".partial").exists()


def test_slurm_script_is_pinned_to_the_pushed_digest(world):
    ns = f"mtp-cluster-{uuid.uuid4().hex[:8]}"
    reg = f"{world['host'].registry}/{ns}"
    missing = _cli(
        world, "explain", "--profile", PROFILE, "--target", "rl", "--cluster", "slurm", "--registry", reg
    )
    assert missing.returncode == 2 and "is not published" in missing.stderr
    pushed = _cli(world, "--profile", PROFILE, "--push", "--registry", reg)
    assert pushed.returncode == 0, pushed.stdout[-3000:] + pushed.stderr[-3000:]
    digest = requests.head(
        f"http://{world['host'].registry}/v2/{ns}/mtp-verl/manifests/{PROFILE}",
        timeout=10,
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    ).headers["Docker-Content-Digest"]
    script = _cli(
        world, "explain", "--profile", PROFILE, "--target", "rl", "--cluster", "slurm", "--registry", reg
    )
    assert script.returncode == 0, script.stderr
    assert f"IMAGE='{world['host'].registry}#{ns}/mtp-verl@{digest}'" in script.stdout
    # the docker engine pushed Docker's gzip layers: any enroot pulls them, nothing to check
    assert "# Layers: gzip (from the registry's manifest): any enroot pulls them" in script.stdout
    assert "at_least" not in script.stdout
    assert re.search(r"actor_rollout_ref\.model\.mtp\.detach_encoder=True", script.stdout)


def test_diff_reads_the_version_vector_of_a_built_image(world):
    built = _cli(world, "--profile", PROFILE)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    same = _cli(world, "diff", PROFILE, f"mtp-verl:{PROFILE}", "--json")
    assert same.returncode == 0, same.stderr
    report = json.loads(same.stdout)
    assert report["b"]["kind"] == "image"
    assert report["differences"] == [], report["differences"]
    other = _cli(world, "diff", "test-cp-recompute", f"mtp-verl:{PROFILE}", "--json")
    fields = {d["field"] for d in json.loads(other.stdout)["differences"]}
    assert "context_parallel_size" in fields or any("recompute" in f for f in fields), fields


def _tree_of_tar(stream) -> dict[str, tuple]:
    """path -> (kind, mode, uid, gid, content sha256 or link target) of a tar stream."""
    tree: dict[str, tuple] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            path = m.name.removeprefix("./").rstrip("/")
            if not path:
                continue
            if m.islnk():  # a hard link: the content of what it links to
                tree[path] = ("file", m.mode & 0o7777, m.uid, m.gid, tree[m.linkname.removeprefix("./")][4])
            elif m.isfile():
                tree[path] = (
                    "file",
                    m.mode & 0o7777,
                    m.uid,
                    m.gid,
                    hashlib.sha256(tar.extractfile(m).read()).hexdigest(),
                )
            elif m.issym():
                tree[path] = ("link", 0, m.uid, m.gid, m.linkname)
            elif m.isdir():
                tree[path] = ("dir", m.mode & 0o7777, m.uid, m.gid, "")
            else:
                tree[path] = ("other", m.mode & 0o7777, m.uid, m.gid, "")
    return tree


def _tree_of_dir(root: Path) -> dict[str, tuple]:
    tree: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                tree[rel] = ("link", 0, st.st_uid, st.st_gid, os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                tree[rel] = ("file", st.st_mode & 0o7777, st.st_uid, st.st_gid, digest)
            elif stat.S_ISDIR(st.st_mode):
                tree[rel] = ("dir", st.st_mode & 0o7777, st.st_uid, st.st_gid, "")
            else:
                tree[rel] = ("other", st.st_mode & 0o7777, st.st_uid, st.st_gid, "")
    return tree


def _superblock(path: Path) -> str:
    return subprocess.run(["unsquashfs", "-s", str(path)], capture_output=True, text=True, check=True).stdout


def test_export_writes_a_reproducible_zstd_squashfs_holding_the_images_files(world, tmp_path):
    built = _cli(world, "--profile", PROFILE)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    image = f"mtp-verl:{PROFILE}"
    first, second = tmp_path / "a.sqsh", tmp_path / "b.sqsh"
    runs = [
        _cli(world, "export", "--profile", PROFILE, "--format", "enroot", "--out", str(p))
        for p in (first, second)
    ]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^Compression zstd$", _superblock(first), re.M), _superblock(first)
    assert "Block size 1048576" in _superblock(first)  # runtimes.yaml's zstd settings reached mksquashfs
    # reproducible: the same bytes twice, and the sha256 the output line names is theirs
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    assert digest == hashlib.sha256(second.read_bytes()).hexdigest()
    assert "zstd (the default for this runtime), " in runs[0].stdout and f"sha256 {digest}" in runs[0].stdout
    assert (
        "read by         enroot: every enroot, where the node's unsquashfs is squashfs-tools >= 4.4"
        in runs[0].stdout
    )

    # its files are the image's: every path, kind, mode, owner and content, as docker exports it
    host = world["host"]
    container = host.docker("create", image, "true").stdout.strip()
    try:
        exported = subprocess.Popen([host.cli, "export", container], stdout=subprocess.PIPE)
        want = _tree_of_tar(exported.stdout)
        assert exported.wait() == 0
    finally:
        host.docker("rm", "-f", container, check=False)
    unpacked = tmp_path / "unpacked"
    subprocess.run(
        ["unsquashfs", "-no-progress", "-d", str(unpacked), str(first)], check=True, capture_output=True
    )
    got = _tree_of_dir(unpacked)
    env = json.loads(host.docker("image", "inspect", "--format", "{{json .Config.Env}}", image).stdout)
    environment = got.pop("etc/environment")  # enroot's: the image's ENV, as enroot import writes it
    assert environment[4] == hashlib.sha256("".join(f"{e}\n" for e in env).encode()).hexdigest()
    assert (unpacked / "etc/environment").read_text().splitlines() == env
    assert any(e.startswith("MTP_PROFILE=") for e in env) and any(
        e.startswith("PATH=/opt/venv/bin") for e in env
    )
    want.pop("etc/environment", None)
    # not a vacuous comparison: thousands of entries, the tool's own files, owners other than root
    assert len(want) > 1000 and want["opt/mtp/version.json"][0] == "file"
    assert any(v[3] != 0 for v in want.values()), "no file of another group: owners untested"
    if os.geteuid() != 0:  # unsquashfs sets owners only as root
        got = {k: v[:2] + v[4:] for k, v in got.items()}
        want = {k: v[:2] + v[4:] for k, v in want.items()}
    assert sorted(set(want) ^ set(got)) == []
    assert [p for p in want if want[p] != got[p]] == []


def test_export_for_apptainer_carries_its_env_script_and_takes_another_compression(world, tmp_path):
    built = _cli(world, "--profile", PROFILE)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    out = tmp_path / "image.sqsh"
    proc = _cli(
        world,
        "export",
        "--profile",
        PROFILE,
        "--format",
        "apptainer",
        "--squash-compression",
        "gzip",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^Compression gzip$", _superblock(out), re.M)
    assert "read by         Apptainer: every Apptainer and Singularity" in proc.stdout
    script = subprocess.run(
        ["unsquashfs", "-cat", str(out), ".singularity.d/env/10-docker2singularity.sh"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        script.startswith("#!/bin/sh\n") and f'export MTP_PROFILE="${{MTP_PROFILE:-"{PROFILE}"}}"' in script
    )
    assert 'export PATH="/opt/venv/bin:' in script
