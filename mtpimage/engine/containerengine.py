"""What a container engine must do for the tool: the ContainerEngine interface, its requests,
results and errors (engine/__init__.py's `named()` picks one by name; callers pass it on).

Like repo2docker's ContainerEngine, the interface names what the tool needs from an engine
(build, inspect, tag, push, pull, run, copy out, remove) and nothing of how an engine is
reached. Two implement it: DockerEngine (dockerengine.py, the default: the docker CLI for all
of it, since BuildKit builds must go through a CLI, see there) and BuildahEngine
(buildahengine.py, `--engine buildah`/`--reproducible`), which implements this interface on
its own and holds a DockerEngine: buildah builds bit for bit (a compiled extension's builder
stage stays the Docker engine's), the image is loaded into dockerd untagged, and running,
tagging and inspecting it are handed to that Docker engine. Neither engine inherits the
other: what they share is here or in buildstream.py.

The rule that a missing image is pulled only from a registry its reference names, never
looked up on docker.io, is written once here (`ensure_local`) on top of the primitives.

The fast path cannot afford this module's imports; its one question ("which image does this
tag name?") is dockersocket.quick_image_id, one standard-library request on the engine's socket.
"""

from __future__ import annotations

import contextlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from mtpimage import invocation, janitor
from mtpimage.errors import BuilderError, EnvironmentProblem, InputError, last_words
from mtpimage.imageref import ImageRef
from mtpimage.manifests import inputfile
from mtpimage.mirrors import INDEX_SECRET, BuildMirrors, MirroredBase


class BuildFailed(BuilderError):
    exit_code = 1


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
    # Reads every output line instead of the terminal (a compile's progress: compileprogress.py);
    # the full output then goes only to the build's log.
    on_line: Callable[[str], None] | None = None
    # the site's index and registry mirrors (mirrors.py): given to the build as a secret and as
    # the FROM of the context sent, never in the rendered text, so never in the identity
    mirrors: BuildMirrors = field(default_factory=BuildMirrors)
    # the os/architecture to build for (builds.platform, issue 49); None: the engine's own,
    # the host's (the lock's platform, linux/amd64, is never named, so its builds are as before)
    platform: str | None = None


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: str
    stderr: str


class PullFailed(EnvironmentProblem):
    """A pull the registry answered with no (`missing`, `denied`) or did not answer."""

    def __init__(self, ref: str, why: str, detail: str):
        self.ref, self.why, self.detail = ref, why, detail  # why: missing | denied | unreachable
        super().__init__(f"pull of {ref} failed ({why}): {detail}")


DETAIL_WIDTH = 300  # characters of a push tool's own message kept in the error line


class PushFailed(EnvironmentProblem):
    """A push that failed; `transient` says whether another attempt may pass."""

    def __init__(self, ref: str, detail: str, transient: bool, tool: str = "docker push"):
        text = " ".join(detail.split())
        # a detail that is one of the tool's own errors brings its fix: that one, said once
        own = re.search(r" \(fix: (.*)\)$", text)
        if own:
            text = text[: own.start()]
        text = last_words(text, DETAIL_WIDTH)  # the end says why
        self.stderr = text
        self.transient = transient
        host = ref.split("/")[0]
        fix = (
            own.group(1)
            if own
            else f"check that registry {host} runs and answers, then run again"
            if transient
            else f"docker login {host} with a user that may push there, or use another --registry"
        )
        super().__init__(f"{tool} {ref} failed: {text} (fix: {fix}; no tag was moved)")


class StartFailed(EnvironmentProblem):
    """A container was created but could not start (no GPU, no such runtime, no image)."""

    def __init__(self, image: str, detail: str, image_missing: bool = False):
        self.image, self.detail, self.image_missing = image, detail, image_missing
        super().__init__(f"cannot start a container of {image}: {last_words(detail, 400)}")


class ContainerEngine(ABC):
    """What the tool asks of a container engine. Implementations raise the engine's own
    "not reachable" error (an EnvironmentProblem, exit 3) from every call: "no such image"
    must never be concluded from an engine that is not there."""

    name: ClassVar[str]  # engine.ENGINES: what --engine calls it
    # Whether a build needs its base in the local engine (or its registry reachable) before it
    # starts: the pipeline's base preflight says so in one line before anything is built.
    needs_local_base: ClassVar[bool] = True

    @property
    def publish_format(self) -> str:
        """The layer format this engine pushes (compression.yaml formats): gzip, the layers
        the engine's own push compresses, unless the engine compresses with the tool's."""
        return "gzip"

    # -- build
    @abstractmethod
    def describe(self) -> str:
        """How builds run here, for the `build` line (e.g. the CLI and its BuildKit client)."""

    @abstractmethod
    def build(self, req: BuildRequest, log_path: Path | None = None, echo: bool = True) -> str:
        """Build the context tar; return the image ID, untagged ("" with req.output_dir)."""

    def build_layout(self, req: BuildRequest, dest: Path, log_path: Path | None = None, echo: bool = True):
        """Build on a clean builder into a normalised OCI layout at `dest` (engine/ocilayout.py)
        and return it: only an engine that builds bit for bit can (verify's rebuild)."""
        raise EnvironmentProblem(
            f"the {self.name} engine cannot build bit for bit here (fix: use --engine buildah)"
        )

    # -- images
    @abstractmethod
    def image_id(self, ref: str) -> str | None:
        """The ID of a local image, or None when there is none."""

    @abstractmethod
    def labels(self, ref: str) -> dict[str, str]:
        """The labels of a local image."""

    @abstractmethod
    def history(self, ref: str) -> list[tuple[int, str]]:
        """(bytes, the instruction that made it) per layer of a local image, oldest first."""

    def rootfs(self, ref: str) -> tuple[list[str], list[str]] | None:
        """(the diff IDs of its layers, oldest first; its config's Env) of a local image, for
        the reuse of in-image checks (checkreuse.py). None: this engine cannot tell, and the
        checks run in full."""
        return None

    @abstractmethod
    def tag(self, src: str, ref: str) -> None: ...

    @abstractmethod
    def untag(self, ref: str) -> None:
        """Remove the tag `ref` (never the layers another tag still uses); a missing tag is fine."""

    @abstractmethod
    def push(self, ref: str) -> None:
        """Push `ref` once; raise PushFailed (its `transient` decides a retry)."""

    @abstractmethod
    def pull(self, ref: str) -> None:
        """Pull exactly `ref`; raise PullFailed."""

    # -- containers
    @abstractmethod
    def run(self, image: str, command: list[str], gpu: bool = False, timeout: float = 900) -> RunResult:
        """Run `command` in a new container of a local image, wait, collect both streams and
        remove the container whatever happened; raise StartFailed when it cannot start."""

    @abstractmethod
    def create(self, image: str, command: list[str]) -> str:
        """A created, never started container of a local image; returns its ID."""

    @abstractmethod
    def copy_out(self, container: str, path: str) -> bytes | None:
        """A tar of `path` in the container; None when the path does not exist there."""

    @abstractmethod
    def export(self, container: str) -> Iterator[bytes]:
        """The container's filesystem as a tar stream."""

    @abstractmethod
    def remove(self, container: str) -> None:
        """Remove a container (forced); a missing one is fine."""

    # -- written once, on the primitives
    def ensure_local(self, ref: str, flag: str | None = "--image") -> None:
        """The image must be in the local engine. A bare name is never looked up on docker.io
        (from air-gapped machines that only ends in a DNS error); a reference that names its
        registry is pulled from there once. `flag`: what the error names (None: the ref)."""
        if self.image_id(ref) is not None:
            return
        where, key = (flag, ref) if flag else (ref, None)
        host = registry_host(ref)
        if host is None:
            raise InputError(
                where,
                key,
                "no such image in the local Docker engine (a name without a "
                "registry host is not looked up on docker.io)",
                f"build it with {invocation.command()} --profile NAME, `docker load` or `docker pull` "
                "it, or give the registry: HOST[:PORT]/NAME:TAG",
            )
        try:
            self.pull(ref)
        except PullFailed as exc:
            err = exc.detail
            if exc.why == "missing":
                raise InputError(
                    where,
                    key,
                    f"not in the local Docker engine, nor in registry {host}",
                    "check the name and tag, or push it there first",
                ) from None
            if exc.why == "denied":
                raise EnvironmentProblem(
                    f"{ref} is not in the local Docker engine and registry {host} "
                    f"refuses to serve it: {last_words(err, 200)} (fix: docker login {host})"
                ) from None
            raise EnvironmentProblem(
                f"{ref} is not in the local Docker engine and registry {host} cannot "
                f"be reached: {last_words(err, 200)} (fix: check that the registry runs and is "
                f"reachable from this machine, or docker load the image)"
            ) from None


def registry_host(ref: str) -> str | None:
    """The registry a reference names explicitly (`host[:port]/...`), or None for a bare name
    (which docker would look up on docker.io)."""
    try:
        parsed = ImageRef.parse(ref)
    except InputError:
        return None  # not a reference docker could pull either: reported as not found
    return parsed.host if parsed.explicit_host else None


# Every secret a template mounts. Each is always given, as an empty file when the run has
# none: buildah 1.28 leaves an empty /run/secrets/ in a step's layer only when a secret was
# given (seen with a one-step Dockerfile), so a build with a CA bundle or through mirrors
# would otherwise differ from one without in every layer that runs pip.
SECRETS = ("ca-bundle", "netrc", INDEX_SECRET)
# the largest file each may be: a CA bundle (Debian's ca-certificates: ~220 kB) or a netrc
SECRET_LIMITS = {"--ca-bundle": 16 << 20, "--netrc": 1 << 20}


@contextlib.contextmanager
def secret_files(req: BuildRequest) -> Iterator[dict[str, Path]]:
    """{secret id: file} for one build: the request's CA bundle and netrc (checked to exist),
    the mirrors' index table, empty files for the rest; the written ones are removed after
    the build (mode 0600: the table may hold a mirror's token)."""
    given = {"ca-bundle": req.ca_bundle, "netrc": req.netrc}
    for sid, path in given.items():
        if path is not None:  # a device or FIFO handed to the build would hang or fill it
            inputfile.check(Path(path), SECRET_LIMITS[f"--{sid}"], f"--{sid}'s file", f"--{sid} {path}")

    # guarded before it exists: removed at once should the tool be killed (a token may be in it)
    with janitor.tempdir("mtp-secrets-") as tmp:
        out: dict[str, Path] = {}
        for sid in SECRETS:
            if given.get(sid) is not None:
                out[sid] = Path(given[sid]).resolve()
                continue
            path = tmp / sid
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(req.mirrors.secret() if sid == INDEX_SECRET else b"")
            out[sid] = path
        yield out


def build_flags(
    req: BuildRequest, build_args: tuple = (), secrets: dict[str, Path] | None = None
) -> list[str]:
    """--build-arg, --label and --secret as `docker build` and `buildah bud` both spell them
    (build_args first, then the request's); `secrets` from secret_files(); --platform, both
    spell it os/arch too."""
    argv: list[str] = ["--platform", req.platform] if req.platform else []
    for key, value in (*build_args, *req.build_args):
        argv += ["--build-arg", f"{key}={value}"]
    for key, value in sorted(req.labels.items()):
        argv += ["--label", f"{key}={value}"]
    for sid, path in (secrets or {}).items():
        argv += ["--secret", f"id={sid},src={path}"]
    return argv


# ----------------------------------------------------------------------------- base images
_FROM = re.compile(r"^(?P<head>FROM\s+)(?P<ref>\S+)(?P<tail>(?:\s+AS\s+\S+)?\s*)$", re.M | re.I)


def base_images(dockerfile: str) -> list[str]:
    """The images the Dockerfile's stages start FROM (not its own stages, not scratch)."""
    stages, bases = set(), []
    for m in re.finditer(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", dockerfile, re.M | re.I):
        ref, name = m.group(1), m.group(2)
        if ref.lower() != "scratch" and ref not in stages and ref not in bases:
            bases.append(ref)
        if name:
            stages.add(name)
    return bases


def mirrored_bases(dockerfile: str, mirrors: BuildMirrors) -> list[MirroredBase]:
    """The Dockerfile's base images that a registry mirror serves."""
    out = []
    for ref in base_images(dockerfile):
        found = mirrors.base(ref)
        if found is not None:
            out.append(MirroredBase(ref, found[0], found[1]))
    return out


def mirrored_dockerfile(dockerfile: str, bases: list[MirroredBase]) -> str:
    """The Dockerfile the engine builds: each mirrored base's FROM names the mirror's reference
    (the same digest, so the same bytes); stage names and every other line unchanged."""
    table = {b.ref: b.mirror_ref for b in bases}
    return _FROM.sub(lambda m: f"{m['head']}{table.get(m['ref'], m['ref'])}{m['tail']}", dockerfile)
