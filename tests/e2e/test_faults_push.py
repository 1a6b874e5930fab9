"""Faults on push: a loopback proxy (tests/fixtures/faultproxy.py) in front of the real
registry answers 500/503 and drops connections on chosen requests while build.py pushes.

Either docker's retries carry the push through, or the run fails cleanly (exit 3, no
traceback); the human tag `<profile>` moves only after the content tag is complete in the
registry (checked with HEAD /v2/<name>/manifests/<tag> on the registry itself, not the proxy).
FAULTS counts the faults the proxy injected (printed with -s).
"""

from __future__ import annotations

import uuid

import pytest
import requests

from tests.fixtures.dockerhost import remove_session_images
from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.image_fixtures import image_world, run_build

pytestmark = pytest.mark.timeout(600)
PROFILE = "test-detach"
ACCEPT = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)
FAULTS: list = []


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    w = image_world(docker_host, git_world, tmp_path_factory, "fault")
    built = _cli(w, "--profile", PROFILE)  # builds once, or finds it up to date
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return w


@pytest.fixture
def proxy(world):
    with FaultProxy(world["host"].registry) as p:
        yield p
        FAULTS.extend(p.injected)
    remove_session_images(world["host"].cli, [f"{p.address}/"])  # tags naming the proxy


def _cli(world, *args):
    return run_build("--manifests", world["manifests"], *args, env=world["env"], timeout=500)


def _digest(world, ns, tag):
    resp = requests.head(
        f"http://{world['host'].registry}/v2/{ns}/mtp-verl/manifests/{tag}",
        headers={"Accept": ACCEPT},
        timeout=10,
    )
    if resp.status_code == 404:
        return None
    assert resp.status_code == 200, resp.status_code
    return resp.headers["Docker-Content-Digest"]


def _old_human_tag(world, ns) -> str:
    """Point <ns>/mtp-verl:<profile> at another image (the test base): the 'trusted' tag."""
    host = world["host"]
    ref = f"{host.registry}/{ns}/mtp-verl:{PROFILE}"
    host.docker("tag", world["base"], ref)
    host.docker("push", ref, timeout=300)
    host.docker("image", "rm", "--no-prune", ref, check=False)
    digest = _digest(world, ns, PROFILE)
    assert digest
    return digest


def _identity(world, tmp_path):
    import json

    proc = _cli(world, "render", "--profile", PROFILE, "--json", "--out", str(tmp_path / "render"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["identity"]


def _clean_failure(proc):
    assert proc.returncode == 3, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: "), proc.stderr[-1000:]


def test_transient_faults_are_retried_and_both_tags_agree(world, proxy, tmp_path):
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    old = _old_human_tag(world, ns)
    identity = _identity(world, tmp_path)
    proxy.add("POST", r"/blobs/uploads/", "503", times=1)
    proxy.add("PATCH", r"/blobs/uploads/", "drop", times=1)
    proxy.add("PUT", r"/blobs/uploads/", "500", times=1)
    proxy.add("HEAD", r"/blobs/sha256:", "503", times=1)
    proc = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{proxy.address}/{ns}")
    assert len(proxy.injected) >= 2, (proxy.injected, proxy.requests)
    assert proc.returncode == 0, (proxy.injected, proc.stdout[-3000:], proc.stderr[-3000:])
    content = _digest(world, ns, identity)
    assert content and _digest(world, ns, PROFILE) == content != old
    assert f"digest  {content}" in proc.stdout


@pytest.mark.parametrize("fault", ["500", "503", "drop"])
def test_content_tag_push_failing_leaves_the_human_tag(world, proxy, tmp_path, fault):
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    old = _old_human_tag(world, ns)
    identity = _identity(world, tmp_path)
    proxy.add("PUT", rf"/manifests/{identity}$", fault, times=-1)
    proc = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{proxy.address}/{ns}")
    assert proxy.injected, proxy.requests
    _clean_failure(proc)
    assert _digest(world, ns, PROFILE) == old
    assert _digest(world, ns, identity) is None
    assert not [r for r in proxy.requests if r[0] == "PUT" and r[1].endswith(f"/manifests/{PROFILE}")]


@pytest.mark.parametrize("fault", ["500", "drop"])
def test_human_tag_push_failing_keeps_the_old_human_tag(world, proxy, tmp_path, fault):
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    old = _old_human_tag(world, ns)
    identity = _identity(world, tmp_path)
    proxy.add("PUT", rf"/manifests/{PROFILE}$", fault, times=-1)
    proc = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{proxy.address}/{ns}")
    assert proxy.injected, proxy.requests
    _clean_failure(proc)
    assert _digest(world, ns, PROFILE) == old
    local = world["host"].docker("image", "inspect", f"{proxy.address}/{ns}/mtp-verl:{PROFILE}", check=False)
    assert local.returncode != 0, "the run left a registry-prefixed local tag behind"
    # a clean retry, faults gone, finishes the job
    proxy.clear()
    again = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{proxy.address}/{ns}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _digest(world, ns, PROFILE) == _digest(world, ns, identity) != old


def test_transient_manifest_put_faults_are_retried_by_the_tool(world, proxy, tmp_path):
    """docker push does not retry a failed manifest PUT; the tool re-runs the push (bounded,
    with backoff): one 500 on the content tag's manifest and one dropped connection on the
    human tag's manifest, then the run succeeds and both tags agree."""
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    old = _old_human_tag(world, ns)
    identity = _identity(world, tmp_path)
    proxy.add("PUT", rf"/manifests/{identity}$", "500", times=1)
    proxy.add("PUT", rf"/manifests/{PROFILE}$", "drop", times=1)
    proc = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{proxy.address}/{ns}")
    assert len(proxy.injected) == 2, (proxy.injected, proxy.requests)
    assert proc.returncode == 0, (proxy.injected, proc.stdout[-3000:], proc.stderr[-3000:])
    content = _digest(world, ns, identity)
    assert content and _digest(world, ns, PROFILE) == content != old
    puts = [r for r in proxy.requests if r[0] == "PUT" and "/manifests/" in r[1]]
    # the human tag's manifest PUT came only after a successful content-tag PUT
    first_ok = next(i for i, r in enumerate(puts) if r[1].endswith(identity) and r[2] in (200, 201))
    assert all(i > first_ok for i, r in enumerate(puts) if r[1].endswith(f"/manifests/{PROFILE}")), puts
    assert "retry" in proc.stdout + proc.stderr


def test_registry_lookup_failing_fails_before_any_push(world, proxy, tmp_path):
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    old = _old_human_tag(world, ns)
    # the look-up reads the manifest (GET: its digest comes from its bytes, issue #46), HEAD too
    proxy.add("GET", r"/manifests/", "503", times=-1)
    proxy.add("HEAD", r"/manifests/", "503", times=-1)
    proc = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{proxy.address}/{ns}")
    _clean_failure(proc)
    assert not [r for r in proxy.requests if r[0] in ("PUT", "PATCH", "POST")], proxy.requests
    assert _digest(world, ns, PROFILE) == old


def _local(world, ref):
    proc = world["host"].docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def test_registry_killed_mid_push_leaves_no_new_tag_anywhere(world, proxy, tmp_path):
    """docs/build-test-publish.md: a failed push leaves no new tag anywhere. The run builds, tests and tags
    (mtp-verl:<identity> new, mtp-verl:<profile> moved), then the registry dies at the first
    blob upload: afterwards the content tag is gone again, the profile tag points where it
    pointed before, no registry-prefixed tag is left, and the registry's tags are unchanged."""
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    old = _old_human_tag(world, ns)
    identity = _identity(world, tmp_path)
    host = world["host"]
    for ref in (f"mtp-verl:{identity}", f"mtp-verl:{PROFILE}"):
        host.docker("image", "rm", "--no-prune", ref, check=False)
    host.docker("tag", world["base"], f"mtp-verl:{PROFILE}")  # yesterday's local profile tag
    before = _local(world, f"mtp-verl:{PROFILE}")
    proxy.add("POST", rf"/{ns}/mtp-verl/blobs/uploads/", "kill")
    proc = run_build(
        "--manifests",
        world["manifests"],
        "--profile",
        PROFILE,
        "--push",
        "--registry",
        f"{proxy.address}/{ns}",
        env={**world["env"], "MTP_NET_RETRIES": "1"},
        timeout=500,
    )
    assert proxy.dead, (proxy.requests, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "tagged  " in proc.stdout, "the run must have tagged before it pushed"
    _clean_failure(proc)
    assert _local(world, f"mtp-verl:{identity}") is None, "the new content tag was left"
    assert _local(world, f"mtp-verl:{PROFILE}") == before, "the profile tag was left moved"
    for tag in (identity, PROFILE):
        assert _local(world, f"{proxy.address}/{ns}/mtp-verl:{tag}") is None
    assert _digest(world, ns, PROFILE) == old
    assert _digest(world, ns, identity) is None
    assert f"docker push {proxy.address}/{ns}/mtp-verl:{identity} failed" in proc.stderr
    assert "(fix: check that registry" in proc.stderr
    host.docker("image", "rm", "--no-prune", f"mtp-verl:{PROFILE}", check=False)
    again = _cli(world, "--profile", PROFILE)  # leave the module's image as the fixture made it
    assert again.returncode == 0, again.stderr[-3000:]


def test_registry_down_is_one_line_naming_it(world, proxy):
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    proxy.kill()
    proc = _cli(world, "--profile", PROFILE, "--push", "--registry", f"{proxy.address}/{ns}")
    _clean_failure(proc)
    err = proc.stderr.strip().splitlines()[-1]
    assert f"registry {proxy.address} cannot be reached: connection refused" in err, err
    assert "(fix:" in err and "HTTPConnectionPool" not in err and "Max retries" not in err, err


def test_zz_report_faults(capsys):
    with capsys.disabled():
        print(f"\nfaults injected on push: {len(FAULTS)}")
    assert FAULTS
