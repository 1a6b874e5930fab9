"""The Docker engine, through the docker CLI for every call.

Builds must use a CLI: the Docker SDK cannot build with BuildKit (docker/docker-py#2230).
The rest (inspect, tag, push, pull, run, copy out, remove) uses the same CLI rather than the
SDK, so one client finds the engine one way: the CLI honours `docker context` (the SDK reads
only DOCKER_HOST), its error wording is the one users see in their own shells, a no-op run
pays no SDK import, and no helper process (testcontainers' ryuk, which cannot be pulled on
air-gapped machines) is started.

A CLI is used for builds only after it proved it has a BuildKit client:
  `docker buildx version` answers           -> `docker buildx build --load`
  `DOCKER_BUILDKIT=1 docker build --help` lists --secret -> the built-in client (CLI <= 22)
A newer CLI without the buildx plugin refuses DOCKER_BUILDKIT=1: it is skipped, not trusted.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mtpimage import children, janitor, settings
from mtpimage.engine import buildlog
from mtpimage.engine.buildstream import stream_build
from mtpimage.engine.containerengine import (
    BuildFailed,
    BuildRequest,
    ContainerEngine,
    PullFailed,
    PushFailed,
    RunResult,
    StartFailed,
    build_flags,
    mirrored_bases,
    mirrored_dockerfile,
    secret_files,
)
from mtpimage.errors import EnvironmentProblem, InputError, last_words


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
        return children.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
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


# ----------------------------------------------------------------------------- errors
# What the docker CLI says when no engine answers at the address it uses.
UNREACHABLE = (
    "cannot connect to the docker daemon",
    "is the docker daemon running",
    "error during connect",
    "error while fetching server api version",
)
NO_PERMISSION = "permission denied while trying to connect to the docker daemon"
# docker push's messages for failures another attempt cannot fix.
PUSH_PERMANENT = (
    "denied",
    "unauthorized",
    "authentication required",
    "forbidden",
    "name unknown",
    "name invalid",
    "manifest invalid",
    "tag invalid",
    "no such image",
    "does not exist",
    "an image does not exist locally",
)
PULL_MISSING = ("not found", "manifest unknown", "name unknown", "does not exist")
PULL_DENIED = ("unauthorized", "denied", "authentication required")
NO_SUCH_PATH = ("could not find the file", "no such container:path")
NO_SUCH_IMAGE = ("no such image", "unable to find image")


class EngineUnreachable(EnvironmentProblem):
    """No Docker engine answers where the CLI looks for one."""

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
    """The error to raise when `detail` (CLI stderr) says no engine answered."""
    low = (detail or "").lower()
    if NO_PERMISSION in low:
        return EngineUnreachable(detail, permission=True)
    if any(p in low for p in UNREACHABLE):
        return EngineUnreachable(detail)
    return None


def docker(
    *args: str, check: bool = True, timeout: float = 600, input: bytes | None = None
) -> subprocess.CompletedProcess:
    """One docker CLI call. Any CLI talks to the daemon; BuildKit detection (three CLI calls)
    is only paid for builds, which keeps no-op runs fast. An engine that does not answer is
    an EngineUnreachable error even with check=False."""
    found = candidates()
    if not found:
        raise EnvironmentProblem(
            "no docker CLI found (fix: install docker, e.g. Debian's docker.io, or set MTP_DOCKER_CLI=PATH)"
        )
    proc = children.run([found[0], *args], capture_output=True, timeout=timeout, input=input)
    if proc.returncode != 0:
        down = unreachable(_text(proc.stderr))
        if down is not None:
            raise down
    if check and proc.returncode != 0:
        raise EnvironmentProblem(f"docker {' '.join(args[:3])} failed: {last_words(_text(proc.stderr), 400)}")
    return proc


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace")


# ----------------------------------------------------------------------------- builds
def build_argv(
    kit: BuildKitCLI, req: BuildRequest, iidfile: Path, secrets: dict[str, Path] | None = None
) -> list[str]:
    """The CLI's command line for one BuildKit build read from stdin (`secrets`:
    containerengine.secret_files)."""
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
        argv = [kit.cli, "build"]
    # a local export has no image: the CLI fails "server did not provide an image ID" after
    # the files were written when asked for one (seen with docker 20.10)
    argv += ([] if req.output_dir else ["--iidfile", str(iidfile)]) + ["--progress", req.progress]
    if req.target:
        argv += ["--target", req.target]
    if req.output_dir:
        argv += ["--output", f"type=local,dest={Path(req.output_dir).resolve()}"]
    argv += build_flags(req, secrets=secrets)
    # an index mirror on this machine's loopback (a local proxying cache) is reachable from a
    # build step only on the host's network; the layers do not depend on the network used
    network = req.network or ("host" if req.mirrors.loopback_index else None)
    if network:
        argv += ["--network", network]
    if req.no_cache:
        argv += ["--no-cache"]
    return argv + cache_argv(kit, req) + ["-"]


def cache_argv(kit: BuildKitCLI, req: BuildRequest) -> list[str]:
    """--cache-from/--cache-to in the CLI's own terms. buildx takes BuildKit's specs as they
    are. The built-in client (Debian's CLI 20.10) takes image references only (it reads
    `type=registry,ref=R` as two references and fails both) and exports only the inline
    cache, asked for with a build argument; any other export is refused."""
    if kit.mode == "buildx":
        return [a for spec in req.cache_from for a in ("--cache-from", spec)] + [
            a for spec in req.cache_to for a in ("--cache-to", spec)
        ]
    argv = []
    for spec in req.cache_from:
        fields = dict(f.split("=", 1) for f in spec.split(",") if "=" in f)
        if "=" not in spec:
            argv += ["--cache-from", spec]
        elif fields.get("type") == "registry" and fields.get("ref"):
            argv += ["--cache-from", fields["ref"]]
        else:
            raise InputError(
                "--cache-from",
                spec,
                "this docker CLI (no buildx) imports only registry caches",
                "use type=registry,ref=REF or an image reference, or install the buildx plugin",
            )
    for spec in req.cache_to:
        if spec != "type=inline":
            raise InputError(
                "--cache-to",
                spec,
                "this docker CLI (no buildx) exports only the inline cache",
                "use --cache-to type=inline, or install the buildx plugin",
            )
        argv += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    return argv


def replaced_member(context: bytes, name: str, data: bytes) -> Iterator[bytes]:
    """The tar `context` with member `name`'s bytes replaced by `data`, as chunks: every other
    member is passed on as a view of the original (a real stack's context is gigabytes of
    sources and wheels; it is not copied)."""
    view = memoryview(context)
    with tarfile.open(fileobj=io.BytesIO(context)) as tar:
        members = tar.getmembers()
    for m in members:
        if m.name != name:
            yield view[m.offset : m.offset_data + _padded(m.size if m.isfile() else 0)]
            continue
        info = tarfile.TarInfo(m.name)
        info.size, info.mode, info.mtime = len(data), m.mode, m.mtime
        info.uid, info.gid, info.uname, info.gname = m.uid, m.gid, m.uname, m.gname
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield data + b"\0" * (_padded(len(data)) - len(data))
    yield b"\0" * (2 * tarfile.BLOCKSIZE)  # the end of the archive


def _padded(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


# ----------------------------------------------------------------------------- the engine
class DockerEngine(ContainerEngine):
    name = "docker"
    needs_local_base = True  # BuildKit builds FROM the local engine's images, pulling what is missing

    def describe(self) -> str:
        return detect().describe()

    def build(self, req: BuildRequest, log_path: Path | None = None, echo: bool = True) -> str:
        """No tag is set: tags are set only after the image passed its tests. With
        `output_dir`, the target stage's files are exported there and "" is returned."""
        kit = detect()
        env = dict(os.environ)
        if kit.mode == "builtin":
            env["DOCKER_BUILDKIT"] = "1"
        context = self._mirrored_context(req)
        own_log = log_path is None  # the tool's own log of this build: kept only when it fails
        log_path = log_path or buildlog.new_log(req.target or "image")
        # guarded before they exist: a killed tool's `docker build` ends, and these go, at once
        with janitor.tempdir("mtp-build-") as tmp, secret_files(req) as secrets:
            iidfile = tmp / "iid"
            watch = buildlog.Watcher(through_mirror=bool(req.mirrors.indexes))
            code, tail = stream_build(
                build_argv(kit, req, iidfile, secrets),
                env,
                context,
                log_path,
                echo and req.on_line is None,
                watch,
                req.on_line,
            )
            if code != 0:
                # a file that changed under its locked URL, or the cause; then where the log is
                raise BuildFailed(buildlog.failure(watch, tail, log_path, req.target))
            if own_log:
                log_path.unlink(missing_ok=True)
            return "" if req.output_dir else iidfile.read_text().strip()

    def _mirrored_context(self, req: BuildRequest):
        """The context to send: as the request has it, or, where a registry mirror serves a
        base, with the Dockerfile's FROM naming the mirror's reference (by digest) and that
        image pulled from the mirror first (dockerd checks the digest). The rendered files, the
        identity and the labels keep the manifests' reference."""
        if not req.mirrors.registries:
            return req.context_tar
        with tarfile.open(fileobj=io.BytesIO(req.context_tar)) as tar:
            dockerfile = tar.extractfile("Dockerfile").read().decode()
        bases = mirrored_bases(dockerfile, req.mirrors)
        if not bases:
            return req.context_tar
        for base in bases:
            if self.image_id(base.mirror_ref) is None:
                try:
                    self.pull(base.mirror_ref)
                except PullFailed as exc:
                    raise base.failed(exc.detail) from None
        return replaced_member(req.context_tar, "Dockerfile", mirrored_dockerfile(dockerfile, bases).encode())

    def image_id(self, ref: str) -> str | None:
        proc = docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
        return _text(proc.stdout).strip() if proc.returncode == 0 else None

    def layer_lists(self) -> list[list[str]]:
        """The diff IDs of each image dockerd has (RootFS.Layers): which layers it holds, by
        chain. One that goes meanwhile is left out."""
        ids = sorted(set(_text(docker("image", "ls", "--all", "--quiet", "--no-trunc").stdout).split()))
        if not ids:
            return []
        proc = docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", *ids, check=False)
        return [json.loads(line) or [] for line in _text(proc.stdout).splitlines() if line.startswith("[")]

    def labels(self, ref: str) -> dict[str, str]:
        proc = docker("image", "inspect", "--format", "{{json .Config.Labels}}", ref)
        return json.loads(_text(proc.stdout) or "null") or {}

    def history(self, ref: str) -> list[tuple[int, str]]:
        proc = docker("history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", ref)
        rows = []
        for line in _text(proc.stdout).splitlines():
            size, _, created = line.partition("\t")
            rows.append((int(size or 0), created))
        return rows[::-1]  # docker history lists newest first

    def rootfs(self, ref: str) -> tuple[list[str], list[str]] | None:
        proc = docker("image", "inspect", "--format", "{{json .RootFS.Layers}}\t{{json .Config.Env}}", ref)
        layers, _, env = _text(proc.stdout).strip().partition("\t")
        return json.loads(layers or "null") or [], json.loads(env or "null") or []

    def tag(self, src: str, ref: str) -> None:
        docker("tag", src, ref)

    def untag(self, ref: str) -> None:
        docker("image", "rm", "--no-prune", ref, check=False)

    def push(self, ref: str) -> None:
        proc = docker("push", ref, check=False, timeout=3600)
        if proc.returncode != 0:
            err = _text(proc.stderr)
            raise PushFailed(ref, err, transient=not any(p in err.lower() for p in PUSH_PERMANENT))

    def pull(self, ref: str) -> None:
        proc = docker("pull", "--quiet", ref, check=False, timeout=3600)
        if proc.returncode == 0:
            return
        err = " ".join(_text(proc.stderr).split())
        low = err.lower()
        why = (
            "missing"
            if any(p in low for p in PULL_MISSING)
            else "denied"
            if any(p in low for p in PULL_DENIED)
            else "unreachable"
        )
        raise PullFailed(ref, why, err)

    def create(self, image: str, command: list[str], *options: str) -> str:
        # --pull never: a missing image is ensure_local's to decide, never docker.io's
        proc = docker("create", "--pull", "never", *options, image, *command, check=False)
        if proc.returncode != 0:
            err = " ".join(_text(proc.stderr).split())
            raise StartFailed(image, err, image_missing=any(p in err.lower() for p in NO_SUCH_IMAGE))
        return _text(proc.stdout).strip()

    def run(self, image: str, command: list[str], gpu: bool = False, timeout: float = 900) -> RunResult:
        options = ("--gpus", "all", "--shm-size", "2g") if gpu else ()
        container = self.create(image, command, *options)
        try:
            started = docker("start", container, check=False)
            if started.returncode != 0:
                raise StartFailed(image, " ".join(_text(started.stderr).split()))
            try:
                waited = docker("wait", container, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise EnvironmentProblem(
                    f"the container of {image} did not end within {timeout:.0f} s (it was removed)"
                ) from None
            logs = docker("logs", container)
            return RunResult(int(_text(waited.stdout).strip() or 1), _text(logs.stdout), _text(logs.stderr))
        finally:
            self.remove(container)

    def copy_out(self, container: str, path: str) -> bytes | None:
        proc = docker("cp", f"{container}:{path}", "-", check=False)
        if proc.returncode == 0:
            return proc.stdout
        err = _text(proc.stderr)
        if any(p in err.lower() for p in NO_SUCH_PATH):
            return None
        raise EnvironmentProblem(f"docker cp {container[:12]}:{path} failed: {last_words(err, 300)}")

    def export(self, container: str) -> Iterator[bytes]:
        cli = candidates()[0]
        with children.spawn(
            [cli, "export", container], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as proc:
            while chunk := proc.stdout.read(1 << 20):
                yield chunk
            err = _text(proc.stderr.read())
            if proc.wait() != 0:
                raise unreachable(err) or EnvironmentProblem(f"docker export failed: {last_words(err, 300)}")

    def remove(self, container: str) -> None:
        docker("rm", "--force", container, check=False)
