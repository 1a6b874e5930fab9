"""What the demo needs on this machine, checked before it makes anything.

git (the stand-ins and their daemon), dockerd with a BuildKit-capable docker CLI (the base
image and the in-image checks), buildah (the reproducible engine: `verify` compares a
published image with a clean rebuild, which only a bit-for-bit build can pass), the
registry binary (the demo's own registry) and the local Debian base that
scripts/setup-test-host.sh makes. Everything missing is said in one line with one fix, so
a first run does not stop at the first missing piece, then at the next.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mtpimage import engine
from mtpimage.demo.registry import REGISTRY_BINARIES, registry_binary
from mtpimage.demo.testbase import DOCKER_ENGINE
from mtpimage.errors import BuilderError, EnvironmentProblem

SETUP_FIX = (
    "run `sudo bash scripts/setup-test-host.sh` from a checkout of this tool (Debian 12: it installs "
    "docker.io, docker-registry, buildah and git, starts dockerd and makes mtp-test-base:bookworm), "
    "then run the demo again"
)


@dataclass(frozen=True)
class Host:
    """What was found, for the demo's first line."""

    docker: str  # how builds run (the docker engine's describe())
    buildah: str
    registry_binary: str
    base: str  # the local image the demo's base is made from

    def line(self) -> str:
        return (
            f"docker {self.docker}; buildah {self.buildah}; registry binary {self.registry_binary}; "
            f"base {self.base}"
        )


def _without_fix(exc: BuilderError) -> str:
    """An error's text without its own `(fix: ...)`: the demo says one fix for all of them."""
    return re.sub(r"\s*\(fix: .*\)\s*$", "", exc.one_line())


def _git_daemon() -> str | None:
    """Why `git daemon` cannot run here, or None."""
    if shutil.which("git") is None:
        return "git not found"
    try:
        exec_path = subprocess.run(
            ["git", "--exec-path"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"git does not run: {exc}"
    if not (Path(exec_path) / "git-daemon").exists():
        return f"git has no daemon ({exec_path}/git-daemon missing)"
    return None


def check(base: str) -> Host:
    """Everything the demo needs, or one EnvironmentProblem naming all that is missing."""
    problems: list[str] = []
    why = _git_daemon()
    if why:
        problems.append(why)
    binary = registry_binary()
    if binary is None:
        problems.append(f"no registry binary ({' or '.join(REGISTRY_BINARIES)}) on PATH")
    docker = buildah = ""
    eng = engine.named(DOCKER_ENGINE)
    try:
        if eng.image_id(base) is None:  # also: is dockerd there (EngineUnreachable otherwise)
            problems.append(f"the local base image {base} is missing")
        docker = eng.describe()  # a CLI that builds with BuildKit
    except BuilderError as exc:
        problems.append(_without_fix(exc))
    try:
        buildah = engine.reproducible().describe()
    except BuilderError as exc:
        problems.append(_without_fix(exc))
    if problems:
        raise EnvironmentProblem(
            f"demo: this machine lacks what the demo needs: {'; '.join(problems)} (fix: {SETUP_FIX})"
        )
    return Host(docker=docker, buildah=buildah, registry_binary=binary or "", base=base)
