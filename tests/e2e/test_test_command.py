"""`build.py test` against the real dockerd: an --image that is not in the local engine is
named as such (a bare name is never looked up on docker.io, a registry-qualified one is
pulled from its registry only), and --gpu on a host whose Docker cannot give a GPU fails in
one line, exit 3, leaving no container behind.
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.fixtures.image_fixtures import run_build
from tests.unit.helpers import assert_one_line_error

pytestmark = pytest.mark.timeout(300)


def _containers(host, image: str) -> set[str]:
    out = host.docker("ps", "-aq", "--no-trunc", "--filter", f"ancestor={image}").stdout
    return set(out.split())


def test_bare_image_name_missing_locally_is_not_looked_up_on_docker_io(docker_host):
    ref = f"mtp-verl:absent-{uuid.uuid4().hex[:8]}"
    proc = run_build("test", "--profile", "mtp-detach", "--image", ref)
    err = assert_one_line_error(proc, f"--image: {ref}: no such image in the local Docker engine", "(fix:")
    for dns in ("registry-1.docker.io", "no such host", "lookup ", "Temporary failure"):
        assert dns not in err, err


def test_registry_image_missing_there_names_the_registry(docker_host, registry):
    ref = f"{registry}/mtp-test/absent-{uuid.uuid4().hex[:8]}:v1"
    proc = run_build("test", "--profile", "mtp-detach", "--image", ref)
    assert_one_line_error(proc, f"--image: {ref}: not in the local Docker engine, nor in registry {registry}")


def test_gpu_without_a_gpu_fails_cleanly_and_leaves_no_container(docker_host):
    runtimes = json.loads(docker_host.docker("info", "--format", "{{json .Runtimes}}").stdout or "{}")
    if "nvidia" in runtimes:
        pytest.skip("this dockerd has the NVIDIA runtime: the no-GPU failure cannot be produced here")
    image = docker_host.base_image  # present locally; the container fails at start, before exec
    before = _containers(docker_host, image)
    proc = run_build("test", "--profile", "mtp-detach", "--image", image, "--gpu")
    err = assert_one_line_error(
        proc, "--gpu: Docker cannot give the container a GPU on this host", "(fix:", "without --gpu", code=3
    )
    assert "500 Server Error" not in err and "http+docker://" not in err, err
    assert _containers(docker_host, image) - before == set(), "a Created container was left behind"
