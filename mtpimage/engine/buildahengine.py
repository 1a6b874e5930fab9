"""The reproducible engine: buildah builds, dockerd runs the checks.

Debian 12's docker 20.10 embeds a BuildKit without `rewrite-timestamp` or SOURCE_DATE_EPOCH
handling, so its layers carry the build's file times. buildah (Debian 12: 1.28) builds the
same rendered Dockerfile bit for bit when:
  - every build starts on a clean builder: a throwaway storage root (no layer cache; the
    base is pulled by its digest into it) at one fixed place, /var/tmp/mtp-image-builder-UID
    (buildah 1.28's RUN mount targets leave traces that depend on where the root is), the
    context unpacked fresh (buildah's rw bind mounts write through to the context directory);
  - `bud --format docker --timestamp 0 --layers --no-cache`: one layer per instruction as
    the Docker engine makes them, every file time and `created` at 0 (`--format docker`:
    the OCI format drops SHELL, and RUN would run without bash's pipefail);
  - build args SOURCE_DATE_EPOCH=0 and PYTHONDONTWRITEBYTECODE=1 (declared by ARG in the
    template, unset in Docker builds): pip writes hash-checked .pyc files, and imports during
    the build write no timestamped ones;
  - the result exported uncompressed and normalised (ocilayout.py).
RUN steps use the host's network (`--network host`): buildah's default (CNI) would create a
bridge and NAT rules on the host, beside dockerd's.
Through a site's mirrors (mirrors.py) the build is the same: every secret is given (empty when
the run has none), and a base a registry mirror serves is pulled from there by its digest and
named so in the unpacked context's FROM only (buildah records nothing of the name: the same
digest FROM either reference, measured with a one-step Dockerfile).
The normalised layout is kept in the cache (`$MTP_CACHE_DIR/oci/<image id>`) and loaded into
dockerd untagged, so the in-image checks, tags, history and labels are the Docker engine's
(this class hands them to its DockerEngine); a push uploads exactly the layout's bytes through the registry
API, so the registry's digest is the layout's. A compiled extension's builder stage
(`output_dir`) runs on the Docker engine: its wheel is cached and installed by sha256, and
that wheel, not its build, is what the image's bytes depend on.
This engine implements the seam's interface itself (containerengine.ContainerEngine) and
holds a DockerEngine for what dockerd does here (load, run, tag, inspect, pull): it is not a
kind of Docker engine, it uses one, and it shares the build CLI's streaming (buildstream.py)
rather than reaching into dockerengine.py's internals.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from secrets import token_hex

from mtpimage import children, janitor, settings
from mtpimage.engine import bindkeys, buildlog, emulation, layercompress, ocilayout
from mtpimage.engine.buildstream import stream_build
from mtpimage.engine.containerengine import (
    BuildFailed,
    BuildRequest,
    ContainerEngine,
    PushFailed,
    RunResult,
    base_images,
    build_flags,
    mirrored_bases,
    mirrored_dockerfile,
    secret_files,
)
from mtpimage.engine.dockerengine import DockerEngine, candidates
from mtpimage.errors import DiskProblem, EnvironmentProblem, InputError, full_disk, last_words
from mtpimage.imageref import ImageRef, Registry, is_loopback
from mtpimage.publish.registryclient import RegistryClient, RegistryHTTPError, RegistryUnreachable, answers

# What makes a build reproducible; docs/reproducible-builds-and-verify.md explains each. A cold
# build adds --no-cache; a build on the layer cache (Storage.cached) reuses the layers of
# earlier builds whose instruction and everything under it are the same.
BUD_OPTIONS = ("--format", "docker", "--timestamp", "0", "--layers", "--pull=never")
CACHE_NAME = "cache"  # the layer cache's storage root, beside the throwaway ones
CACHE_LOCK = "cache.lock"
CACHE_LIMIT_GB = 60.0  # a cache larger than this is emptied before the next build uses it
BUILD_ARGS = (("SOURCE_DATE_EPOCH", "0"), ("PYTHONDONTWRITEBYTECODE", "1"))
SCRATCH_PARENT = Path("/var/tmp")  # the storage roots' fixed place (BuildahEngine._scratch says why)


@cache
def buildah_cli() -> tuple[str, str]:
    """(path, version) of the buildah CLI."""
    path = shutil.which("buildah")
    if not path:
        raise EnvironmentProblem(
            "buildah not found: the reproducible engine builds with it (fix: apt-get install buildah, "
            "as scripts/setup-test-host.sh does, or build with --engine docker)"
        )
    proc = children.run([path, "--version"], capture_output=True, text=True, timeout=60)
    found = re.search(r"version (\S+)", proc.stdout)
    return path, found.group(1) if found else "?"


class Storage:
    """A buildah storage root for one build: a throwaway one (a clean builder, the default for
    a cold build and for verify), or, with `cached`, the layer cache: one root at a fixed place
    that keeps every build's layers, so the next build reuses those whose instruction and
    everything under it did not change (buildah's --layers cache; the layers are the same
    bytes a cold build makes: tests/e2e/test_reproducible_e2e.py). One build at a time holds
    the cache (a lock); another build meanwhile gets a throwaway root. A throwaway root's name
    carries the building process's ID, so a later build removes the roots of builds that were
    killed before they could (a stopped CI job, a session's end: 13 GB each for the real stack)."""

    def __init__(self, parent: Path, cached: bool = False, say=None):
        parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(parent)
        self._lock = _take_cache(parent) if cached else None
        self.cached = self._lock is not None
        if cached and not self.cached and say:
            say("cache   the layer cache is in use by another build: building cold on a clean builder")
        if self.cached:
            self.root = parent / CACHE_NAME
            if _size_gb(self.root) > CACHE_LIMIT_GB:
                if say:
                    say(
                        f"cache   emptying the layer cache (over {CACHE_LIMIT_GB:.0f} GB): this build is cold"
                    )
                remove_root(self.root)
            self.root.mkdir(exist_ok=True, mode=0o700)
            # what a killed build leaves in it (containers, mounts, its work folder) goes; its layers stay
            janitor.guard(self.root, "buildah-cache")
            release_cache(self.root, self, locked=True)
            # this build's context and image ID file: beside the cache's storage, its own
            self.work = Path(tempfile.mkdtemp(prefix="build-", dir=self.root))
        else:
            # named and guarded before it exists: removed at once should this process be killed
            self.root = parent / f"root-{os.getpid()}-{token_hex(6)}"
            janitor.guard(self.root, "buildah-root")
            self.root.mkdir(mode=0o700)
            self.work = self.root

    def argv(self, *args: str) -> list[str]:
        cli, _ = buildah_cli()
        return [cli, "--root", str(self.root / "storage"), "--runroot", str(self.root / "run"), *args]

    def run(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
        return children.run(self.argv(*args), capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        if self.cached:
            release_cache(self.root, self, locked=True)
            self._lock.close()
            return
        remove_root(self.root, self)


def _take_cache(parent: Path, wait_s: float = 0.0):
    """The layer cache's lock (an open file holding flock), or None when another holds it for
    longer than `wait_s`."""
    f = open(parent / CACHE_LOCK, "a")  # noqa: SIM115 - held for the build, closed by Storage.close
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except OSError:
            if time.monotonic() >= deadline:
                f.close()
                return None
            time.sleep(0.2)


def _size_gb(root: Path) -> float:
    if not root.is_dir():
        return 0.0
    proc = children.run(
        ["du", "-sx", "--block-size=1", str(root)], capture_output=True, text=True, timeout=600
    )
    try:
        return int(proc.stdout.split()[0]) / 1e9
    except (IndexError, ValueError):
        return 0.0


def release_cache(root: Path, store: Storage | None = None, locked: bool = False) -> None:
    """The layer cache without what one build left in it: its working containers and their
    mounts. Its images stay: they are the cache. Without `locked` (the janitor, after a killed
    build) only when no other build takes the cache within a few seconds: a build that does
    empties it the same way when it starts."""
    lock = None if locked else _take_cache(root.parent, wait_s=10)
    if not locked and lock is None:
        return
    try:
        if not locked:  # the killed build's buildah, still running (no other build holds the cache)
            janitor.end_naming(str(root))
        if (root / "storage").is_dir():
            if store is None:
                store = Storage.__new__(Storage)
                store.root = root
            store.run("rm", "--all", timeout=300)
        for point in sorted(_mounts_under(root), reverse=True):
            if "/overlay/" in point and point.endswith("/merged"):
                children.run(["umount", "-l", point], capture_output=True, timeout=60)
        for work in root.glob("build-*"):  # the builds' work folders (contexts): this one's too
            shutil.rmtree(work, ignore_errors=True)
    finally:
        if lock is not None:
            lock.close()


def remove_root(root: Path, store: Storage | None = None) -> None:
    """Remove a storage root: buildah's containers and images, then what is still mounted
    under it (a build killed mid-step leaves its overlay mounted), then the files."""
    if (root / "storage").is_dir():
        if store is None:
            store = Storage.__new__(Storage)
            store.root = root
        store.run("rm", "--all", timeout=300)
        store.run("rmi", "--all", "--force", timeout=300)
    for point in sorted(_mounts_under(root), reverse=True):
        children.run(["umount", "-l", point], capture_output=True, timeout=60)
    shutil.rmtree(root, ignore_errors=True)


def _mounts_under(root: Path) -> list[str]:
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    prefix = str(root) + "/"
    return [f.split()[1] for f in lines if len(f.split()) > 1 and f.split()[1].startswith(prefix)]


def owner_alive(name: str) -> bool:
    """Whether the process named in a scratch entry (`root-<pid>-...`, `mtp-oci-<pid>-...`)
    still runs; an entry without a process ID is an older tool's and counts as gone."""
    found = re.match(r"(?:root|mtp-oci)-(\d+)-", name)
    if not found:
        return False
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(parent: Path) -> list[str]:
    """Remove the storage roots and layout scratch of builds whose process is gone."""
    gone = []
    for entry in sorted(parent.iterdir()):
        if entry.name.startswith(("root-", "mtp-oci-")) and not owner_alive(entry.name):
            remove_root(entry)
            gone.append(entry.name)
    return gone


# A layout younger than this is never pruned: another build may have moved it in and not yet
# loaded its image into dockerd (build(): os.replace, then _load).
LAYOUT_GRACE_S = 3600


def prune_layouts(layouts: Path, has_image, now: float, grace_s: float = LAYOUT_GRACE_S) -> list[str]:
    """Remove the kept layouts whose image dockerd no longer has. A layout is what this
    engine pushes and what makes a local image count as its own (image_id, push, history);
    without the image in dockerd it serves nothing, and one of a real-stack image is 14 GB
    (they piled up under MTP_CACHE_DIR/oci until the disk ran out). `has_image(image_id)`
    asks dockerd. Returns the names removed."""
    if not layouts.is_dir():
        return []
    gone = []
    for entry in sorted(layouts.iterdir()):
        if not (entry.is_dir() and re.fullmatch(r"[0-9a-f]{64}", entry.name)):
            continue  # not a layout this engine kept
        if now - entry.stat().st_mtime < grace_s or has_image(f"sha256:{entry.name}"):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        gone.append(entry.name)
    return gone


def held_prefix(diff_ids: list[str], images: list[list[str]]) -> int:
    """How many of `diff_ids`' leading layers dockerd holds: the longest prefix any of its
    images' layer lists shares (a layer is held by its chain, the layers under it included)."""
    best = 0
    for layers in images:
        n = 0
        for a, b in zip(diff_ids, layers):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best


def _pull_base(store: Storage, ref: str, mirrored=None, platform: str | None = None) -> None:
    """Pull a base by its digest into the clean builder (`mirrored`: a MirroredBase, when a
    registry mirror serves it: `ref` is then the mirror's reference, and a failure names the
    setting). `platform`: that platform's manifest of a multi-arch base (the bud that follows
    names the same platform, so it finds this one, never the host's)."""
    host = ref.split("/", 1)[0]
    tls = "--tls-verify=false" if is_loopback(host) else "--tls-verify=true"
    proc = store.run("pull", "--quiet", tls, *(("--platform", platform) if platform else ()), ref)
    if proc.returncode == 0:
        return
    if mirrored is not None:
        raise mirrored.failed(proc.stderr)
    try:
        answers(host)
        why = last_words(proc.stderr, 300)
    except RegistryUnreachable as exc:
        why = f"registry {host} cannot be reached ({exc.reason})"
    raise EnvironmentProblem(
        f"buildah cannot pull base image {ref}: {why} (fix: the reproducible engine pulls the base "
        "by its digest from its registry; make it reachable, or push the base to a registry "
        "that is and pin that with --substitute-base)"
    )


def _cache_repository(ref: ImageRef) -> str:
    return ref.repository + (f"-{ref.tag}" if ref.tag else "")


def registry_cache_argv(req: BuildRequest) -> list[str]:
    """--cache-from/--cache-to as buildah 1.28 takes them: one repository each, where the
    layer cache's steps are pushed (tagged by their cache key) and looked up, so a machine
    whose own layer cache is empty reuses another's steps ("Cache pulled from remote"; the
    layers are the same bytes: e2e). The same specs as the docker engine's registry cache:
    `type=registry,ref=REPO` or a plain repository; `type=inline`, BuildKit's, is not
    buildah's and is left out (the workflow's stack jobs pass it)."""
    argv: list[str] = []
    loopback = False
    for flag, specs in (("--cache-from", req.cache_from), ("--cache-to", req.cache_to)):
        repos = []
        for spec in specs:
            fields = dict(f.split("=", 1) for f in spec.split(",") if "=" in f)
            if "=" not in spec:
                repos.append(spec)
            elif fields.get("type") == "registry" and fields.get("ref"):
                repos.append(fields["ref"])
            elif fields.get("type") != "inline":
                raise InputError(
                    flag,
                    spec,
                    "the reproducible engine's layer cache goes to a registry repository only",
                    "use type=registry,ref=REG/REPO or REG/REPO",
                )
        # buildah tags its cache repository by cache key, one tag per step: a tagged spec
        # (REG/mtp-verl:buildcache, the docker engine's cache image) becomes a repository of its
        # own (REG/mtp-verl-buildcache), so the image repository gets no cache tags
        repos = sorted({_cache_repository(ImageRef.parse(r, flag=flag)) for r in repos})
        if len(repos) > 1:
            raise InputError(flag, " ".join(repos), "buildah takes one cache repository", f"give {flag} once")
        if repos:
            argv += [flag, repos[0]]
            loopback = loopback or is_loopback(repos[0].split("/", 1)[0])
    if loopback:  # the loopback registries of tests and local mirrors speak plain HTTP
        argv.append("--tls-verify=false")
    return argv


class BuildahEngine(ContainerEngine):
    """Builds with buildah (bit-for-bit), runs, tags and inspects with dockerd."""

    name = "buildah"
    # the base is pulled by its digest into each clean builder: no local base is needed, and a
    # pull that fails says why itself (_pull_base)
    needs_local_base = False

    def __init__(
        self,
        docker: DockerEngine | None = None,
        compression: layercompress.Compression | None = None,
        cached: bool = True,
    ):
        self.docker = docker or DockerEngine()  # dockerd: where the built image is loaded and run
        # builds reuse the layer cache's unchanged layers (Storage); verify's rebuild does not
        self.cached = cached
        # how pushed layers are compressed (--compression; layercompress.py): the layout keeps
        # tars, a push uploads the form in this format
        self.compression = compression or layercompress.named(None)

    @property
    def publish_format(self) -> str:
        return self.compression.name

    def describe(self) -> str:
        cli, version = buildah_cli()
        where = "on the layer cache" if self.cached else "on a clean builder"
        return f"{cli} (buildah {version}, reproducible: bud --timestamp 0 --layers {where})"

    @property
    def layouts(self) -> Path:
        return settings.current().cache_root / "oci"

    def layout_of(self, image_id: str) -> Path:
        return self.layouts / image_id.split(":", 1)[-1]

    def build(self, req: BuildRequest, log_path: Path | None = None, echo: bool = True) -> str:
        if req.output_dir:  # a compiled extension's builder stage: its wheel is what counts
            return self.docker.build(req, log_path, echo)
        # the space of layouts whose image is gone from dockerd, before this build needs it
        for name in prune_layouts(self.layouts, lambda i: self.docker.image_id(i) == i, time.time()):
            if echo:
                print(
                    f"pruned  the kept layout of sha256:{name[:12]} (its image is gone from dockerd)",
                    file=sys.stderr,  # stdout may be a --json document
                )
        with janitor.tempdir(f"mtp-oci-{os.getpid()}-", self._scratch()) as tmp:
            layout = self.build_layout(req, tmp / "oci", log_path, echo)
            dest = self.layout_of(layout.image_id)
            if not dest.is_dir():
                self.layouts.mkdir(parents=True, exist_ok=True)
                os.replace(layout.root, dest)
            layout = ocilayout.read(dest)
        self._load(layout)
        return layout.image_id

    def _scratch(self) -> Path:
        """Where the throwaway storage roots live: one fixed path on every machine, never under
        MTP_CACHE_DIR. buildah 1.28 writes into a RUN step's layer, or not, depending on where its
        storage root is: with the root under /tmp a created mount target (`/tmp/mtp-src/x`) stays
        as an empty directory; under /opt, /srv or ~/.cache an existing one (`/var/cache/apt` of
        the base) is whited out; under /var neither (seen with a three-line Dockerfile; it
        follows the root's first path component, not the build's context or runroot). So the
        root is under /var/tmp, the same for every user and cache location."""
        path = SCRATCH_PARENT / f"mtp-image-builder-{os.getuid()}" / "buildah"
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def build_layout(
        self, req: BuildRequest, dest: Path, log_path: Path | None = None, echo: bool = True
    ) -> ocilayout.Layout:
        """Build (on the layer cache, or cold on a clean builder: `self.cached`, --no-cache) and
        write the normalised OCI layout to `dest`."""
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if echo else None
        if req.platform:  # another CPU's RUN steps need qemu here: said before anything is pulled
            emulated = emulation.handler(req.platform)
            if emulated and say:
                say(f"platform {req.platform}: RUN steps under {emulated} (binfmt_misc), not natively")
        store = Storage(self._scratch(), cached=self.cached and not req.no_cache, say=say)
        try:
            ctx = store.work / "context"
            ctx.mkdir()
            with tarfile.open(fileobj=io.BytesIO(req.context_tar), mode="r:*") as tar:
                # the tool's own context tar (git sources may hold links that point outside)
                kwargs = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
                tar.extractall(ctx, **kwargs)  # noqa: S202
            dockerfile = (ctx / "Dockerfile").read_text()
            bases = mirrored_bases(dockerfile, req.mirrors)
            if bases:  # in the unpacked context only: FROM the mirror's reference, same digest
                (ctx / "Dockerfile").write_text(mirrored_dockerfile(dockerfile, bases))
            # buildah's layer cache keys a RUN by its text alone: what its bind mounts hold goes
            # into the text (bindkeys.py), or a bumped source reuses the old layer
            (ctx / "Dockerfile").write_text(bindkeys.keyed((ctx / "Dockerfile").read_text(), ctx))
            through = {b.mirror_ref: b for b in bases}
            for ref in base_images((ctx / "Dockerfile").read_text()):
                _pull_base(store, ref, through.get(ref), req.platform)
            iidfile = store.work / "iid"
            watch = buildlog.Watcher(through_mirror=bool(req.mirrors.indexes))
            own_log = log_path is None  # the tool's own log of this build: kept only when it fails
            log_path = log_path or buildlog.new_log(req.target or "image")
            with secret_files(req) as secrets:
                code, tail = stream_build(
                    store.argv("bud", *self._bud_argv(req, iidfile, secrets, store.cached), str(ctx)),
                    dict(os.environ),
                    b"",
                    log_path,
                    echo,
                    watch,
                )
            if code != 0:
                raise BuildFailed(buildlog.failure(watch, tail, log_path, req.target))
            if own_log:
                log_path.unlink(missing_ok=True)
            built = iidfile.read_text().strip()
            proc = store.run("push", "--quiet", "--disable-compression", built, f"oci:{dest}")
            if proc.returncode != 0:
                if full := full_disk(proc.stderr):  # the layout is the image's whole size
                    raise DiskProblem(
                        f"writing the image's layout (buildah push {built[:19]})",
                        str(dest),
                        full,
                        room=f"{SCRATCH_PARENT} and MTP_CACHE_DIR (the image's uncompressed size, each)",
                    )
                raise EnvironmentProblem(
                    f"buildah push {built[:19]} oci:{dest} failed: {last_words(proc.stderr, 300)}"
                )
            return ocilayout.normalise(dest)
        finally:
            store.close()

    def _bud_argv(
        self, req: BuildRequest, iidfile: Path, secrets: dict[str, Path] | None = None, cached: bool = False
    ) -> list[str]:
        argv = [
            *BUD_OPTIONS,
            *(() if cached else ("--no-cache",)),
            "--iidfile",
            str(iidfile),
            "-f",
            "Dockerfile",
        ]
        argv += build_flags(req, BUILD_ARGS, secrets)
        # the host's network: buildah's own (CNI) would add a bridge and NAT rules to the host
        argv += ["--network", req.network or "host"]
        if req.target:
            argv += ["--target", req.target]
        if req.builder:
            raise InputError(
                "--builder",
                req.builder,
                "the reproducible engine builds with buildah, not a BuildKit builder",
                "drop --builder, or build with --engine docker",
            )
        if cached:  # a cold build (--no-cache, verify) takes no cache, the registry's neither
            argv += registry_cache_argv(req)
        return argv

    def _load(self, layout: ocilayout.Layout) -> None:
        """Hand the image to dockerd, untagged (its ID there is the layout's config digest): the
        layers dockerd lacks one at a time (ocilayout.load_steps: docker 20.10 unpacks a whole
        load archive into its tmp directory first), the ones it has as empty placeholders (an
        incremental build streams its new layers only, not the 14 GB of the real stack). Each
        step before the last is an image of the layers up to it, removed once the image is in."""
        if self.docker.image_id(layout.image_id) == layout.image_id:
            return
        present = held_prefix(layout.diff_ids, self.docker.layer_lists())
        nonce = f"{os.getpid()}-{token_hex(6)}"
        steps = ocilayout.load_steps(len(layout.diff_ids), present)
        made = []
        try:
            for upto, have in steps:
                last = upto == len(layout.diff_ids)
                config = layout.config_bytes if last else ocilayout.prefix_config(layout, upto, nonce)
                self._docker_load(ocilayout.docker_archive(layout, upto, have, config), layout.image_id)
                if not last:
                    made.append("sha256:" + ocilayout.sha256_hex(config))
        finally:
            for step in made:  # its layers stay: the image holds them
                self.docker.untag(step)
        if self.docker.image_id(layout.image_id) != layout.image_id:
            raise EnvironmentProblem(f"dockerd did not keep {layout.image_id} as loaded (fix: report it)")

    def _docker_load(self, chunks: Iterator[bytes], image_id: str) -> None:
        with children.spawn(
            [candidates()[0], "load", "--quiet"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as proc:
            for chunk in chunks:
                proc.stdin.write(chunk)
            proc.stdin.close()
            err = proc.stderr.read().decode(errors="replace")
            if proc.wait() != 0:
                if full := full_disk(err):
                    raise DiskProblem(
                        f"loading {image_id[:19]} into dockerd", None, full, room="dockerd's data root"
                    )
                raise EnvironmentProblem(f"docker load of {image_id[:19]} failed: {last_words(err, 300)}")

    def history(self, ref: str) -> list[tuple[int, str]]:
        """(bytes, created_by) per history entry, from this engine's layout: a layer's size is
        its uncompressed tar's, as pushed (dockerd counts file contents only, so a layer of
        directories alone, such as the `os` layer where apt had nothing to do, showed as 0 and
        lost its row); metadata entries 0."""
        found = self.docker.image_id(ref)
        if found is None or not self.layout_of(found).is_dir():
            return self.docker.history(ref)
        layout = ocilayout.read(self.layout_of(found))
        sizes = iter(d["size"] for d in layout.manifest["layers"])
        return [
            (0 if h.get("empty_layer") else next(sizes, 0), h.get("created_by", ""))
            for h in layout.config.get("history", [])
        ]

    def image_id(self, ref: str) -> str | None:
        """A local image counts only when this engine built it (its normalised layout is kept):
        an image of the same identity built by the Docker engine is not bit-for-bit this one."""
        found = self.docker.image_id(ref)
        return found if found and self.layout_of(found).is_dir() else None

    def published_form(self, ref: str) -> layercompress.Form | None:
        """The image `ref` names as this engine publishes it (its layers in this engine's
        compression, made once and kept in the layout), or None when it is not this engine's."""
        found = self.docker.image_id(ref)
        if found is None or not self.layout_of(found).is_dir():
            return None
        return layercompress.form(
            ocilayout.read(self.layout_of(found)),
            self.compression,
            say=lambda line: print(f"{line}", file=sys.stderr, flush=True),
            reuse_from=self.layouts,  # the layers an earlier build here compressed already
        )

    def push(self, ref: str) -> None:
        """Upload the published form's blobs and manifest as they are: the registry's digest is
        the form's, made by the tool's pinned compressor (layercompress.py), whatever compressor
        or blob cache another tool would have used."""
        published = self.published_form(ref)
        if published is None:
            raise PushFailed(
                ref,
                "no reproducible build of this image here (fix: build it with --engine buildah)",
                False,
                "push",
            )
        manifest = published.manifest
        target = ImageRef.parse(ref)
        client = RegistryClient(Registry(target.host, ""))
        try:
            for desc in [*manifest["layers"], manifest["config"]]:
                if not client.blob_exists(target.path, desc["digest"]):
                    client.upload_blob(target.path, desc["digest"], published.blob(desc["digest"]))
            client.put_manifest(
                target.path, target.tag or "latest", published.manifest_bytes, ocilayout.OCI_MANIFEST
            )
        except RegistryUnreachable as exc:
            raise PushFailed(ref, str(exc), True, "push") from None
        except RegistryHTTPError as exc:
            raise PushFailed(ref, str(exc), exc.status >= 500 or exc.status == 429, "push") from None

    # -- what dockerd does for this engine: the image is loaded there untagged (_load)
    def labels(self, ref: str) -> dict[str, str]:
        return self.docker.labels(ref)

    def rootfs(self, ref: str) -> tuple[list[str], list[str]] | None:
        return self.docker.rootfs(ref)

    def tag(self, src: str, ref: str) -> None:
        self.docker.tag(src, ref)

    def untag(self, ref: str) -> None:
        self.docker.untag(ref)

    def pull(self, ref: str) -> None:
        self.docker.pull(ref)

    def run(self, image: str, command: list[str], gpu: bool = False, timeout: float = 900) -> RunResult:
        return self.docker.run(image, command, gpu=gpu, timeout=timeout)

    def create(self, image: str, command: list[str]) -> str:
        return self.docker.create(image, command)

    def copy_out(self, container: str, path: str) -> bytes | None:
        return self.docker.copy_out(container, path)

    def export(self, container: str) -> Iterator[bytes]:
        return self.docker.export(container)

    def remove(self, container: str) -> None:
        self.docker.remove(container)


if __name__ == "__main__":  # `python -m mtpimage.engine.buildahengine remove-root PATH`: the janitor's
    import sys

    if sys.argv[1:2] == ["remove-root"] and len(sys.argv) == 3:
        remove_root(Path(sys.argv[2]))
    if sys.argv[1:2] == ["release-cache"] and len(sys.argv) == 3:
        release_cache(Path(sys.argv[2]))
