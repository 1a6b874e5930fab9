"""End to end: `build.py demo` as a user runs it (issue #38 item 1), on real dockerd, buildah,
git daemon and registry: every step passes in order, and nothing the demo made is left (its
tags, registry, git daemon, directory), also when it is stopped with SIGTERM mid-build."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtpimage.demo.run import STEPS

REPO = Path(__file__).resolve().parents[2]
BASE_LABEL = "org.opencontainers.image.base.name"

pytestmark = pytest.mark.timeout(1200)


def _argv(docker_host) -> list[str]:
    return [sys.executable, str(REPO / "build.py"), "demo", "--base", docker_host.base_image]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MTP_DEBUG", None)
    return env


def _made(out: str) -> dict[str, str]:
    """What the run said it made: its directory, registry and git daemon."""
    found = {
        "work": re.search(r"work directory (\S+) \(removed at the end\)", out),
        "registry": re.search(
            r"^\s+ok\s+[\d.]+ s  (127\.0\.0\.1:\d+) \(storage in the work directory\)", out, re.M
        ),
        "git": re.search(r"at git://(127\.0\.0\.1:\d+)/; github\.com rewritten there", out),
    }
    return {k: m.group(1) for k, m in found.items() if m}


def _answers(address: str) -> bool:
    host, port = address.split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def _left(docker_host, made: dict[str, str]) -> list[str]:
    """Everything of this run still there: a port that answers, the directory, a local tag
    under its registry's address, an image built FROM its base."""
    left = [f"{what} {addr} answers" for what, addr in made.items() if what != "work" and _answers(addr)]
    if Path(made["work"]).exists():
        left.append(f"directory {made['work']}")
    if "registry" in made:
        prefix = made["registry"] + "/"
        refs = docker_host.docker(
            "image", "ls", "--digests", "--format", "{{.Repository}} {{.Tag}} {{.Digest}}"
        )
        left += [line for line in refs.stdout.splitlines() if line.startswith(prefix)]
        ids = docker_host.docker(
            "image", "ls", "-q", "--no-trunc", "--filter", f"label={BASE_LABEL}"
        ).stdout.split()
        for image_id in dict.fromkeys(ids):
            base = docker_host.docker(
                "image",
                "inspect",
                "--format",
                f'{{{{index .Config.Labels "{BASE_LABEL}"}}}}',
                image_id,
                check=False,
            ).stdout.strip()
            if base.startswith(prefix):
                left.append(f"image {image_id[:19]} built FROM {base}")
    return left


def test_the_demo_runs_every_step_and_leaves_nothing(docker_host):
    started = time.monotonic()
    proc = subprocess.run(
        _argv(docker_host), capture_output=True, text=True, env=_env(), cwd=REPO, timeout=1100
    )
    wall = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, (out[-6000:], proc.stderr[-3000:])
    # every step, in order, each with its time
    headers = re.findall(r"^\[\s*(\d+)/(\d+)\] (\S+)", out, re.M)
    assert [name for _, _, name in headers] == list(STEPS), headers
    assert len(re.findall(r"^\s+ok\s+\d+\.\d s", out, re.M)) == len(STEPS)
    # what each real CLI step says when it did its job
    assert "wrote manifests/lock.yaml: 1 profile(s), 5 components" in out
    assert "demo: ok (" in out  # check, after the lock decided the probe rules
    assert re.search(r"^\s+built\s+sha256:\w+ in", out, re.M) and re.search(
        r"^\s+tagged\s+mtp-verl:demo-", out, re.M
    )
    assert re.search(r"^\s+pushed\s+127\.0\.0\.1:\d+/demo/mtp-verl:demo-", out, re.M)
    assert re.search(r"image sha256:\w+: the one built and tested", out)
    assert (
        len(re.findall(r"^\s+\d+ passed, 0 failed", out, re.M)) == 2
    )  # checks at build, on the pulled image
    assert re.search(r"^\s+identical: 127\.0\.0\.1:\d+/demo/mtp-verl@sha256:\w+ is bit for bit", out, re.M)
    assert re.search(r"^demo passed in \d+ s:", out, re.M)
    assert "Traceback" not in proc.stderr
    made = _made(out)
    assert set(made) == {"work", "registry", "git"}, made
    assert _left(docker_host, made) == []
    print(f"\ndemo wall time {wall:.0f} s\n" + "\n".join(out.splitlines()[-16:]))


def test_sigterm_mid_build_tears_down_what_the_demo_made(docker_host):
    """SIGTERM reaches the demo alone (a cancelled CI job): the running step is ended, then
    the teardown runs, as for Ctrl-C or a failed step."""
    proc = subprocess.Popen(
        _argv(docker_host), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.match(r"\[\s*\d+/\d+\] build ", line):
                break
        time.sleep(5)  # into the build: buildah (or the sources' fetch) runs under the step
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGTERM, (out[-4000:], err[-3000:])
    assert err.strip().splitlines()[-1] == "terminated", err[-3000:]
    assert "teardown: removed registry 127.0.0.1:" in out and "git daemon git://" in out, out[-3000:]
    assert "demo passed" not in out
    made = _made(out)
    assert set(made) == {"work", "registry", "git"}, made
    assert _left(docker_host, made) == []
