"""BuildKit through the docker CLI.

The Docker SDK cannot build with BuildKit (docker/docker-py#2230), so builds go through
a docker CLI; everything else (inspect, tag, push, run) uses the SDK or the CLI plainly.
A CLI is used only after it proved it has a BuildKit client:
  `docker buildx version` answers           -> `docker buildx build --load`
  `DOCKER_BUILDKIT=1 docker build --help` lists --secret -> the built-in client (CLI <= 22)
A newer CLI without the buildx plugin refuses DOCKER_BUILDKIT=1: it is skipped, not trusted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import settings
from .errors import BuilderError, EnvironmentProblem, InputError


class BuildFailed(BuilderError):
    exit_code = 1


@dataclass(frozen=True)
class BuildKitCLI:
    cli: str
    mode: str  # "buildx" | "builtin"
    version: str

    def describe(self) -> str:
        how = "docker buildx build" if self.mode == "buildx" else "DOCKER_BUILDKIT=1 docker build"
        return f"{self.cli} (CLI {self.version}, {how})"


def candidates() -> list[str]:
    found: list[str] = []
    explicit = settings.current().docker_cli
    paths = [explicit] if explicit else []
    paths += [shutil.which("docker") or "", "/usr/bin/docker", "/usr/local/bin/docker"]
    for p in paths:
        if p and os.access(p, os.X_OK):
            real = os.path.realpath(p)
            if real not in found:
                found.append(real)
    return found


def _run(argv, env=None, timeout=60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


@cache
def detect() -> BuildKitCLI:
    report = []
    for cli in candidates():
        ver = _run([cli, "version", "--format", "{{.Client.Version}}"]).stdout.strip() or "?"
        if _run([cli, "buildx", "version"]).returncode == 0:
            return BuildKitCLI(cli, "buildx", ver)
        proc = _run([cli, "build", "--help"], env={**os.environ, "DOCKER_BUILDKIT": "1"})
        if proc.returncode == 0 and "--secret" in proc.stdout:
            return BuildKitCLI(cli, "builtin", ver)
        why = (proc.stderr or proc.stdout).strip().splitlines()
        report.append(f"{cli} (CLI {ver}): {why[0] if why else 'no BuildKit client'}")
    if not report:
        raise EnvironmentProblem("no docker CLI found (fix: install docker, e.g. Debian's docker.io)")
    raise EnvironmentProblem(
        "no docker CLI here can build with BuildKit: "
        + "; ".join(report)
        + " (fix: install the buildx plugin, or use a CLI with the built-in BuildKit client such as "
        "Debian's docker.io; MTP_DOCKER_CLI=PATH selects one)"
    )


# What the docker CLI and the Docker SDK say when no engine answers at the address they use.
UNREACHABLE = (
    "cannot connect to the docker daemon",
    "is the docker daemon running",
    "error during connect",
    "error while fetching server api version",
)
NO_PERMISSION = "permission denied while trying to connect to the docker daemon"


class EngineUnreachable(EnvironmentProblem):
    """No Docker engine answers where the CLI and the SDK look for one."""

    def __init__(self, detail: str = "", permission: bool = False):
        host = os.environ.get("DOCKER_HOST")
        found = re.search(r"daemon(?: socket)? at (\S+?)[.:]?(?:\s|$)", detail or "")
        if host:
            where, source = host, "from DOCKER_HOST"
        elif os.environ.get("DOCKER_CONTEXT"):
            where = found.group(1) if found else "?"
            source = f"from docker context {os.environ['DOCKER_CONTEXT']!r} (DOCKER_CONTEXT)"
        else:
            where = found.group(1) if found else "unix:///var/run/docker.sock"
            source = "DOCKER_HOST is not set"
        if permission:
            super().__init__(
                f"the Docker engine at {where} ({source}) refuses this user: permission denied on its "
                "socket (fix: add the user to the docker group and log in again, run as root, or set "
                "DOCKER_HOST to an engine this user may use)"
            )
        else:
            super().__init__(
                f"the Docker engine cannot be reached at {where} ({source}) (fix: start dockerd, e.g. "
                "`sudo systemctl start docker` or `sudo dockerd &`, or set DOCKER_HOST to a running "
                "engine)"
            )


def unreachable(detail: str) -> EngineUnreachable | None:
    """The error to raise when `detail` (CLI stderr or an SDK exception) says no engine answered."""
    low = (detail or "").lower()
    if NO_PERMISSION in low:
        return EngineUnreachable(detail, permission=True)
    if any(p in low for p in UNREACHABLE):
        return EngineUnreachable(detail)
    return None


def docker(
    *args: str, check: bool = True, timeout: float = 600, input: bytes | None = None
) -> subprocess.CompletedProcess:
    """A plain docker CLI call (inspect, tag, push). Any CLI talks to the daemon; BuildKit
    detection (three CLI calls) is only paid for builds, which keeps no-op runs fast.
    An engine that does not answer is an EngineUnreachable error even with check=False:
    "no such image" must never be concluded from a daemon that is not there."""
    found = candidates()
    if not found:
        raise EnvironmentProblem(
            "no docker CLI found (fix: install docker, e.g. Debian's docker.io, or set MTP_DOCKER_CLI=PATH)"
        )
    proc = subprocess.run([found[0], *args], capture_output=True, timeout=timeout, input=input)
    if proc.returncode != 0:
        down = unreachable(proc.stderr.decode(errors="replace"))
        if down is not None:
            raise down
    if check and proc.returncode != 0:
        raise EnvironmentProblem(
            f"docker {' '.join(args[:3])} failed: {proc.stderr.decode(errors='replace').strip()[-400:]}"
        )
    return proc


@dataclass
class BuildRequest:
    context_tar: bytes
    labels: dict
    ca_bundle: Path | None = None
    netrc: Path | None = None
    builder: str | None = None
    progress: str = "auto"
    network: str | None = None
    no_cache: bool = False
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    target: str | None = None  # a stage of the Dockerfile (a compiled extension's builder)
    output_dir: Path | None = None  # export the target's files here instead of an image
    build_args: tuple[tuple[str, str], ...] = ()  # not in the Dockerfile text: not in the identity


def build(req: BuildRequest, log_path: Path | None = None, echo=True) -> str:
    """Build an image from a context tar on stdin; return its image ID. No tag is set:
    tags are set only after the image passed its tests. With `output_dir`, the target
    stage's files are exported there (`--output type=local`) and "" is returned."""
    kit = detect()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="mtp-build-") as tmp:
        iidfile = Path(tmp) / "iid"
        if kit.mode == "buildx":
            argv = [kit.cli, "buildx", "build"] + ([] if req.output_dir else ["--load"])
            if req.builder:
                argv += ["--builder", req.builder]
        else:
            if req.builder:
                raise InputError(
                    "--builder",
                    req.builder,
                    "this docker CLI has no buildx: it builds on the local daemon only",
                    "install the buildx plugin or drop --builder",
                )
            env["DOCKER_BUILDKIT"] = "1"
            argv = [kit.cli, "build"]
        argv += ["--iidfile", str(iidfile), "--progress", req.progress]
        if req.target:
            argv += ["--target", req.target]
        if req.output_dir:
            argv += ["--output", f"type=local,dest={Path(req.output_dir).resolve()}"]
        for key, value in req.build_args:
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in sorted(req.labels.items()):
            argv += ["--label", f"{key}={value}"]
        for sid, path in (("ca-bundle", req.ca_bundle), ("netrc", req.netrc)):
            if path is not None:
                p = Path(path)
                if not p.is_file():
                    raise InputError(f"--{sid}", str(path), "file not found", "pass a readable file")
                argv += ["--secret", f"id={sid},src={p.resolve()}"]
        if req.network:
            argv += ["--network", req.network]
        if req.no_cache:
            argv += ["--no-cache"]
        if req.cache_to and kit.mode != "buildx":
            raise InputError(
                "--cache-to",
                req.cache_to[0],
                "exporting a build cache needs docker buildx",
                "install the buildx plugin or drop --cache-to",
            )
        for spec in req.cache_from:
            argv += ["--cache-from", spec]
        for spec in req.cache_to:
            argv += ["--cache-to", spec]
        argv += ["-"]
        log = open(log_path, "wb") if log_path else None
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
            )
            import threading

            def feed():
                try:
                    proc.stdin.write(req.context_tar)
                finally:
                    proc.stdin.close()

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            tail: list[str] = []
            for raw in proc.stdout:
                if log:
                    log.write(raw)
                line = raw.decode(errors="replace")
                tail = (tail + [line.rstrip()])[-25:]
                if echo:
                    sys.stderr.write(line)
                    sys.stderr.flush()
            proc.wait()
            feeder.join(timeout=5)
        finally:
            if log:
                log.close()
        if proc.returncode != 0:
            raise BuildFailed("build failed: " + " | ".join(t for t in tail[-6:] if t.strip()))
        if req.output_dir:
            return ""
        return iidfile.read_text().strip()
