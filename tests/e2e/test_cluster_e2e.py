"""End to end: export a built test image as an enroot squashfs; a Slurm script pinned to
the digest the loopback registry reports."""

from __future__ import annotations

import json
import re
import subprocess
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
