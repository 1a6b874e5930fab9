"""scripts/setup-test-host.sh keeps the registry's storage under its state directory: a
registry that is stopped and started again by the script still serves what was pushed.

The script runs for real (as root, on the prepared host: its package, dockerd and base-image
steps find their results already there) with its own state directory and a registry on a
free loopback port, so the host's registry on 127.0.0.1:5000 is not touched.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
ACCEPT = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(state: Path, registry: str, base_image: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "MTP_TEST_STATE_DIR": str(state),
        "MTP_TEST_REGISTRY": registry,
        "MTP_TEST_BASE_IMAGE": base_image,
    }
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup-test-host.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )


def _stop(pid_file: Path) -> None:
    """Stop the registry the script started (its pid file names it) and wait until it is gone."""
    if not pid_file.is_file():
        return
    pid = int(pid_file.read_text().strip())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _tiny_image(host, ref: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"survives a registry restart\n"
        info = tarfile.TarInfo("probe.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    proc = subprocess.run(
        [host.cli, "import", "-", ref], input=buf.getvalue(), capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_registry_keeps_pushed_images_across_a_restart(docker_host, tmp_path):
    if os.geteuid() != 0:
        pytest.fail(
            "scripts/setup-test-host.sh runs as root; so do the tests (scripts/test.sh)", pytrace=False
        )
    state = tmp_path / "state"
    registry = f"127.0.0.1:{_free_port()}"
    ref = f"{registry}/persist/probe:v1"
    try:
        first = _setup(state, registry, docker_host.base_image)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
        _tiny_image(docker_host, ref)
        docker_host.docker("push", ref)
        url = f"http://{registry}/v2/persist/probe/manifests/v1"
        pushed = requests.head(url, headers={"Accept": ACCEPT}, timeout=10)
        assert pushed.status_code == 200

        _stop(state / "registry.pid")
        with pytest.raises(requests.ConnectionError):
            requests.head(url, headers={"Accept": ACCEPT}, timeout=10)
        again = _setup(state, registry, docker_host.base_image)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        assert "starting registry" in again.stdout, "the script did not start the registry again"
        after = requests.head(url, headers={"Accept": ACCEPT}, timeout=10)
        assert after.status_code == 200, "the restarted registry lost what was pushed to it"
        assert after.headers["Docker-Content-Digest"] == pushed.headers["Docker-Content-Digest"]
        assert str(state) in (state / "registry.yml").read_text()
    finally:
        _stop(state / "registry.pid")
        docker_host.docker("image", "rm", ref, check=False)
