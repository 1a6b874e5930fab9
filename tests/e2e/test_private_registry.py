"""End to end: a registry that requires a login (distribution with htpasswd auth, on
loopback). After `docker login` into a private DOCKER_CONFIG, the tool pushes, and a second
run is up to date without building: its registry look-ups log in with what docker stored.
Without the login the first look-up stops the run with one line saying `docker login`."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
import warnings

import pytest
import requests

from mtpimage.demo.registry import registry_binary
from tests.fixtures.dockerhost import remove_session_images
from tests.fixtures.image_fixtures import image_world, world_cli

pytestmark = pytest.mark.timeout(900)
PROFILE = "test-detach"
USER, PASSWORD = "mtp-e2e", "pw-" + uuid.uuid4().hex[:12]


def _bcrypt(password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # libxcrypt's bcrypt; distribution's htpasswd wants bcrypt
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def locked_registry(tmp_path_factory, docker_host):
    binary = registry_binary()
    if binary is None:
        pytest.skip("no registry binary")
    root = tmp_path_factory.mktemp("locked-registry")
    (root / "htpasswd").write_text(f"{USER}:{_bcrypt(PASSWORD)}\n")
    address = f"127.0.0.1:{_free_port()}"
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'storage'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: {address}\n"
        f"auth:\n  htpasswd:\n    realm: mtp-e2e\n    path: {root / 'htpasswd'}\n"
    )
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen(
        [binary, "serve", str(root / "config.yml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://{address}/v2/", timeout=1).status_code == 401:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (root / "registry.log").read_text()
            time.sleep(0.1)
        yield address
    finally:
        remove_session_images(docker_host.cli, [f"{address}/"])
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    return image_world(docker_host, git_world, tmp_path_factory, "private-registry")


def test_push_and_up_to_date_with_docker_login(world, locked_registry, tmp_path):
    reg = f"{locked_registry}/ns-{uuid.uuid4().hex[:8]}"
    logged_out = tmp_path / "no-login"
    logged_out.mkdir()
    refused = world_cli(
        {**world, "env": {**world["env"], "DOCKER_CONFIG": str(logged_out)}},
        "--profile",
        PROFILE,
        "--push",
        "--registry",
        reg,
    )
    assert refused.returncode == 4, refused.stdout[-2000:] + refused.stderr[-2000:]  # authentication
    assert f"docker login {locked_registry}" in refused.stderr
    assert [line for line in refused.stderr.splitlines() if line.startswith("error:")] == [
        refused.stderr.splitlines()[-1]
    ], refused.stderr  # one error line, no traceback
    assert "Traceback" not in refused.stderr

    config = tmp_path / "docker-config"
    login = subprocess.run(
        [
            world["host"].cli,
            "--config",
            str(config),
            "login",
            locked_registry,
            "--username",
            USER,
            "--password-stdin",
        ],
        input=PASSWORD,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert login.returncode == 0, login.stderr
    env = {**world["env"], "DOCKER_CONFIG": str(config)}
    first = world_cli({**world, "env": env}, "--profile", PROFILE, "--push", "--registry", reg)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"pushed  {reg}/mtp-verl:" in first.stdout
    second = world_cli({**world, "env": env}, "--profile", PROFILE, "--push", "--registry", reg)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "up to date" in second.stdout and locked_registry in second.stdout
    assert not any(line.startswith(("build ", "push ")) for line in second.stdout.splitlines())
    assert PASSWORD not in first.stdout + first.stderr + second.stdout + second.stderr
