"""End to end (issue #46): what a registry says is checked against the bytes. A loopback proxy
(tests/fixtures/faultproxy.py) in front of the session's real registry lies in
`Docker-Content-Digest`, or serves a manifest whose config digest holds path characters; a
wheel cache entry rewritten together with its records is pushed. Each run ends with exit 3,
one error line, nothing tagged, pinned, pushed or printed as a digest, and no traceback.

The image is the test profile built once by docker (the default engine), as the push fault
tests build it."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import pytest
import requests

from tests.fixtures.dockerhost import remove_session_images
from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.image_fixtures import image_world, run_build

pytestmark = pytest.mark.timeout(900)
PROFILE = "test-detach"
LIE = "sha256:" + "0" * 64
ACCEPT = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    w = image_world(docker_host, git_world, tmp_path_factory, "trust")
    w["env"] = {**w["env"], "MTP_FASTPATH": "0"}
    built = _cli(w, "--profile", PROFILE)  # builds once, or finds it up to date
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return w


@pytest.fixture(scope="module")
def published(world) -> str:
    """The namespace where the test image was pushed straight to the real registry."""
    ns = f"trust-{uuid.uuid4().hex[:8]}"
    proc = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{world['host'].registry}/{ns}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return ns


@pytest.fixture
def proxy(world):
    with FaultProxy(world["host"].registry) as p:
        yield p
    remove_session_images(world["host"].cli, [f"{p.address}/"])  # tags naming the proxy


def _cli(world, *args):
    return run_build("--manifests", world["manifests"], *args, env=world["env"], timeout=800)


def _digest(world, ns, tag):
    """What the real registry (not the proxy) holds under ns/mtp-verl:tag, from its bytes."""
    resp = requests.get(
        f"http://{world['host'].registry}/v2/{ns}/mtp-verl/manifests/{tag}",
        headers={"Accept": ACCEPT},
        timeout=10,
    )
    if resp.status_code == 404:
        return None
    assert resp.status_code == 200, resp.status_code
    return "sha256:" + hashlib.sha256(resp.content).hexdigest()


def _identity(world, tmp_path):
    proc = _cli(world, "render", "--profile", PROFILE, "--json", "--out", str(tmp_path / "render"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["identity"]


def _lie(headers: dict, body: bytes) -> tuple[dict, bytes]:
    for k in [k for k in headers if k.lower() == "docker-content-digest"]:
        del headers[k]
    return {**headers, "Docker-Content-Digest": LIE}, body


def _one_error_line(proc, code: int = 3) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
    return errors[0]


def test_a_push_through_a_registry_that_lies_in_docker_content_digest(world, proxy, tmp_path):
    """The issue's case: the main job's --push printed `digest sha256:0000...` and exit 0."""
    ns = f"lie-{uuid.uuid4().hex[:8]}"
    identity = _identity(world, tmp_path)
    proxy.rewrite("GET HEAD", r"/manifests/", _lie)
    summary = tmp_path / "summary.json"
    proc = _cli(
        world,
        "--profile",
        PROFILE,
        "--push",
        "--registry",
        f"{proxy.address}/{ns}",
        "--summary-file",
        str(summary),
    )
    line = _one_error_line(proc)
    assert LIE in line and "Docker-Content-Digest" in line and "the sha256 of its bytes" in line, line
    assert "digest  " not in proc.stdout and LIE not in proc.stdout
    # nothing tagged: not in the registry (the content tag the push made is rolled back), not locally
    assert _digest(world, ns, identity) is None and _digest(world, ns, PROFILE) is None
    for tag in (identity, PROFILE):
        local = world["host"].docker("image", "inspect", f"{proxy.address}/{ns}/mtp-verl:{tag}", check=False)
        assert local.returncode != 0, f"the run left the local tag {tag} behind"
    written = json.loads(summary.read_text())  # written on failure too: how far the run got
    assert written["digest"] is None and written["pushed"] is False and written["references"] == []


def test_no_job_script_and_no_up_to_date_digest_from_a_lying_registry(world, published, proxy, tmp_path):
    """An image already published: `explain --cluster slurm` wrote a job script "pinned by
    digest" to the lie; the main job's up-to-date answer printed it."""
    proxy.rewrite("GET HEAD", r"/manifests/", _lie)
    reg = f"{proxy.address}/{published}"
    script = _cli(
        world, "explain", "--profile", PROFILE, "--target", "rl", "--cluster", "slurm", "--registry", reg
    )
    line = _one_error_line(script)
    assert LIE in line and script.stdout == ""
    true = _digest(world, published, PROFILE)
    assert true and true in line
    summary = tmp_path / "summary.json"
    again = _cli(world, "--profile", PROFILE, "--push", "--registry", reg, "--summary-file", str(summary))
    line = _one_error_line(again)
    assert LIE in line and true in line and "digest  " not in again.stdout
    assert json.loads(summary.read_text())["digest"] is None
    assert _digest(world, published, PROFILE) == true  # the real registry untouched


def test_verify_refuses_a_config_digest_with_path_characters(world, published, proxy):
    """A manifest (served with a header that agrees with it: a consistent liar) whose config
    digest would make verify request another path on the registry."""
    evil = f"sha256:../../../v2/{published}/mtp-verl/manifests/{PROFILE}"

    def path_digest(headers: dict, body: bytes) -> tuple[dict, bytes]:
        manifest = json.loads(body)
        manifest["config"]["digest"] = evil
        body = json.dumps(manifest).encode()
        headers = {k: v for k, v in headers.items() if k.lower() != "docker-content-digest"}
        return {**headers, "Docker-Content-Digest": "sha256:" + hashlib.sha256(body).hexdigest()}, body

    proxy.rewrite("GET", r"/manifests/", path_digest)
    proc = _cli(
        world, "verify", "--profile", PROFILE, "--image", f"{proxy.address}/{published}/mtp-verl:{PROFILE}"
    )
    line = _one_error_line(proc)
    assert "the config digest" in line and "not a digest" in line and "nothing was requested" in line, line
    assert "layer " not in proc.stdout and "rebuilding" not in proc.stderr
    asked = [path for _method, path, _status in proxy.requests]
    assert all(".." not in p and "/blobs/" not in p for p in asked), asked
    assert len([p for p in asked if "/manifests/" in p]) == 1, asked  # the one read, nothing else


def test_wheels_push_refuses_a_tampered_cache_entry(world, registry, tmp_path):
    """A wheel cache entry rewritten together with its meta.json (the cache's own check sees
    nothing) is refused against the committed pin, and the registry gets nothing."""
    from mtpimage.ext import wheelpins
    from mtpimage.ext.wheelcache import WheelCache, cache_key, file_sha256
    from tests.fixtures.wheels import make_wheel

    inputs = {"schema": 1, "name": "tiny-ext", "version": "0.1", "test": uuid.uuid4().hex}
    key = cache_key(inputs)
    cache = WheelCache(tmp_path / "cache" / "ext-wheels")
    entry = cache.put(key, make_wheel(tmp_path / "good"), {"inputs": inputs, "built_by": "test"})
    manifests = Path(world["manifests"])
    pins_before = (
        (manifests / wheelpins.PINS_NAME).read_bytes() if (manifests / wheelpins.PINS_NAME).exists() else None
    )
    mine = tmp_path / "manifests"
    shutil.copytree(manifests, mine)
    wheelpins.write(mine, {key: wheelpins.Pin("tiny-ext", "0.1", entry.filename, entry.sha256, "built")})

    evil = make_wheel(tmp_path / "evil", payload="import os  # evil\n")
    shutil.copy(evil, entry.path)
    meta = json.loads((entry.path.parent / "meta.json").read_text())
    meta.update(sha256=file_sha256(entry.path), size=entry.path.stat().st_size)
    (entry.path.parent / "meta.json").write_text(json.dumps(meta))
    assert cache.get(key).sha256 == meta["sha256"] != entry.sha256

    ns = f"wheels-{uuid.uuid4().hex[:8]}"
    proc = run_build(
        "wheels",
        "push",
        "--registry",
        f"{registry}/{ns}",
        "--manifests",
        str(mine),
        key,
        env={"MTP_CACHE_DIR": str(tmp_path / "cache"), "MTP_WHEEL_CACHE_REPO": ""},
    )
    line = _one_error_line(proc)
    assert meta["sha256"] in line and entry.sha256 in line and "nothing was pushed" in line, line
    assert proc.stdout == ""
    tags = requests.get(f"http://{registry}/v2/{ns}/ext-wheels/tags/list", timeout=10)
    assert tags.status_code == 404 or not (tags.json().get("tags") or []), tags.text
    blob = requests.head(f"http://{registry}/v2/{ns}/ext-wheels/blobs/sha256:{meta['sha256']}", timeout=10)
    assert blob.status_code == 404
    now = (
        (manifests / wheelpins.PINS_NAME).read_bytes() if (manifests / wheelpins.PINS_NAME).exists() else None
    )
    assert now == pins_before  # the world's manifests untouched
