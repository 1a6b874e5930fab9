"""End to end: real dockerd, BuildKit, registry on loopback, real containers.

Images are built from the real templates with tests/manifests/ (a small Debian base,
loopback stand-ins of every component). Builds share the BuildKit cache across tests.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import uuid
from pathlib import Path

import pytest
import requests

from tests.fixtures.image_fixtures import image_world, world_cli

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    return image_world(docker_host, git_world, tmp_path_factory, "image")


_cli = world_cli


def _identity(world, profile, *sets):
    extra = [a for s in sets for a in ("--set", s)]
    proc = _cli(
        world,
        *extra,
        "render",
        "--profile",
        profile,
        "--json",
        "--out",
        str(Path(world["manifests"]).parent / f"render-{profile}"),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["identity"]


def _image_id(world, ref):
    proc = world["host"].docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _forget(world, profile, identity):
    for ref in (f"mtp-verl:{identity}", f"mtp-verl:{profile}"):
        world["host"].docker("image", "rm", "--no-prune", ref, check=False)


def _ensure_built(world, profile):
    proc = _cli(world, "--profile", profile)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_push_builds_tests_pushes_and_second_run_is_up_to_date(world):
    profile = "test-detach"
    identity = _identity(world, profile)
    _forget(world, profile, identity)
    ns = f"mtp-e2e-{uuid.uuid4().hex[:8]}"
    reg = f"{world['host'].registry}/{ns}"
    first = _cli(world, "--profile", profile, "--push", "--registry", reg)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert re.search(r"^built ", first.stdout, re.M), "the first run must build"
    assert re.search(r"^PASS +versions", first.stdout, re.M)
    tags = requests.get(f"http://{world['host'].registry}/v2/{ns}/mtp-verl/tags/list", timeout=10).json()[
        "tags"
    ]
    # besides the image's two tags: its SBOM's (sha256-<hex>.sbom) and the referrers index
    # (sha256-<hex>), tests/e2e/test_sbom_e2e.py
    assert sorted(t for t in tags if not t.startswith("sha256-")) == sorted([identity, profile])
    assert len(tags) == 4, tags
    digests = {
        t: requests.head(
            f"http://{world['host'].registry}/v2/{ns}/mtp-verl/manifests/{t}",
            timeout=10,
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        ).headers["Docker-Content-Digest"]
        for t in (identity, profile)
    }
    assert digests[identity] == digests[profile]
    d = digests[identity]
    for line in (
        f"docker pull {reg}/mtp-verl@{d}",
        f"--container-image={world['host'].registry}#{ns}/mtp-verl@{d}",
        f"enroot import docker://{world['host'].registry}#{ns}/mtp-verl@{d}",
        f"apptainer pull docker://{reg}/mtp-verl@{d}",
    ):
        assert line in first.stdout
    second = _cli(world, "--profile", profile, "--push", "--registry", reg)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "up to date" in second.stdout
    assert not re.search(r"^(built|build|push) ", second.stdout, re.M)
    assert "#1 " not in second.stderr  # no BuildKit output at all


def test_equal_pins_differ_only_in_the_mode_layer(world):
    # Sharing comes from one builder's cache. Start that cache empty: with several cached
    # results for one step (left by earlier runs) BuildKit may pick any, and layers are not
    # bit-reproducible across independent builds (see docs/reproducible-builds-and-verify.md).
    layers = {}
    for profile in ("test-detach", "test-load-only"):
        _forget(world, profile, _identity(world, profile))
    world["host"].docker("builder", "prune", "-af", timeout=300)
    for profile in ("test-detach", "test-load-only"):
        _ensure_built(world, profile)
        layers[profile] = json.loads(
            world["host"]
            .docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", f"mtp-verl:{profile}")
            .stdout
        )
    a, b = layers["test-detach"], layers["test-load-only"]
    assert len(a) == len(b) and len(a) >= 6
    assert a[:-1] == b[:-1]
    assert a[-1] != b[-1]


def test_broken_megatron_fails_test_and_leaves_the_profile_tag(world):
    profile = "test-cp-recompute"
    _ensure_built(world, profile)
    before = _image_id(world, f"mtp-verl:{profile}")
    assert before
    broken = world["repos"].megatron.commits["broken"]
    sets = [f"megatron-lm.commit={broken}"]
    bad_identity = _identity(world, profile, *sets)
    proc = _cli(world, "--set", sets[0], "test", "--profile", profile)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^FAIL +probe:recompute-padding-mask .*padding_mask", proc.stdout, re.M)
    assert "padding_mask" in proc.stderr
    main = _cli(world, "--set", sets[0], "--profile", profile)
    assert main.returncode != 0
    assert "no tag was set or moved" in main.stderr
    assert _image_id(world, f"mtp-verl:{profile}") == before
    assert _image_id(world, f"mtp-verl:{bad_identity}") is None


def test_ca_bundle_appears_in_no_layer_history_label_or_log(world, tmp_path):
    profile = "test-load-only"
    identity = _identity(world, profile)
    _forget(world, profile, identity)
    marker = f"MTP-SECRET-{uuid.uuid4().hex}"
    bundle = tmp_path / "corp-ca.pem"
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    bundle.write_text((system.read_text() if system.is_file() else "") + f"\n# {marker}\n")
    proc = _cli(world, "--profile", profile, "--ca-bundle", str(bundle), "--no-cache")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "trusts the CA bundle given with --ca-bundle" in log  # it did reach the RUN steps
    assert marker not in log and str(bundle) not in log
    ref = f"mtp-verl:{identity}"
    host = world["host"]
    history = host.docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", ref).stdout
    assert marker not in history and "corp-ca" not in history
    inspect = host.docker("image", "inspect", ref).stdout
    assert marker not in inspect and "corp-ca" not in inspect
    saved = tmp_path / "image.tar"
    host.docker("save", "-o", str(saved), ref, timeout=600)
    scanned = 0
    with tarfile.open(saved) as outer:
        for member in outer.getmembers():
            if not member.isfile():
                continue
            data = outer.extractfile(member).read()
            assert marker.encode() not in data, member.name
            if member.name.endswith("layer.tar"):
                scanned += 1
                with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                    for f in layer.getmembers():
                        assert "secrets" not in f.name.split("/")[:2] or not f.isfile(), f.name
    assert scanned >= 6
