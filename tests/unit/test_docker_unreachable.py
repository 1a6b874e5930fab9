"""No Docker engine where DOCKER_HOST points: every command that needs one says so in one
line (where it looked, and the fix), exit 3, through the docker CLI (inspect, tag, pull) and
the Docker SDK (testcontainers, diff, export) alike; never "image not present locally".

The engine is absent for real: DOCKER_HOST names a socket path nothing listens on, or a
closed loopback port.
"""

from __future__ import annotations

import pytest

from .helpers import assert_one_line_error, run_cli

COMMANDS = {
    "main job": ["--profile", "mtp-detach", "--no-frozen"],
    "test --image": ["test", "--profile", "mtp-detach", "--image", "mtp-verl:some-tag"],
    "diff with an image": ["diff", "mtp-detach", "mtp-verl:some-tag"],
    "export": ["export", "--profile", "mtp-detach", "--format", "enroot", "--image", "mtp-verl:some-tag"],
}


@pytest.fixture(params=["unix", "tcp"])
def docker_host(request, tmp_path):
    if request.param == "unix":
        return f"unix://{tmp_path / 'no-engine.sock'}"
    return "tcp://127.0.0.1:9"  # discard port: connection refused


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_engine_is_named_with_where_and_fix(name, docker_host, tmp_path):
    args = COMMANDS[name]
    if name == "export":
        args = [*args, "--out", str(tmp_path / "x.sqsh")]
    proc = run_cli(*args, env={"DOCKER_HOST": docker_host})
    err = assert_one_line_error(
        proc,
        "the Docker engine cannot be reached at",
        f"{docker_host} (from DOCKER_HOST)",
        "(fix: start dockerd",
        code=3,
    )
    assert "not present locally" not in err and "not found locally" not in err
    assert not (tmp_path / "x.sqsh").exists()
