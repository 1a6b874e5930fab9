"""The engine seam: every call to a container engine (docker, or buildah for builds) goes
through a ContainerEngine object; no other module runs the docker CLI, imports the Docker SDK
or opens the engine's socket (tests/unit/test_imports.py holds to that).

    containerengine.py  the interface (build, inspect, tag, push, pull, run, copy out, remove),
                        its requests, results and errors, and the rules written once on top
                        (a missing image is pulled only from the registry it names)
    dockerengine.py     the Docker engine, through the docker CLI
    buildahengine.py    the reproducible engine: buildah builds bit for bit, dockerd runs
    buildstream.py      a build CLI's run with the context on stdin, its output read line by line
    ocilayout.py        its image form: a normalised OCI layout (and `docker load`'s tar)
    layercompress.py    the layout's published forms: layers compressed by the tool (gzip, zstd)
    dockersocket.py     the fast path's one stdlib-only question on the engine's socket

Which engine builds is picked by name once, where the command line is read: `named(flag)`
with the command's `--engine` (or `--reproducible`), else MTP_ENGINE (settings.py), else
docker. The object is then passed on (in BuildOptions, or as an argument), as repo2docker
picks its engine by name and hands the object to the build, and cibuildwheel carries its
container engine inside its build options: no module below asks an ambient "current" engine,
so what a function builds with is in its signature.
"""

from __future__ import annotations

from mtpimage import settings
from mtpimage.engine import layercompress

# SCRATCH_PARENT: where the clean builders write, for the CI disk check (assembly/diskcheck.py)
from mtpimage.engine.buildahengine import SCRATCH_PARENT, BuildahEngine  # noqa: F401
from mtpimage.engine.containerengine import (  # noqa: F401 - the seam's names, imported from here by its users
    BuildFailed,
    BuildRequest,
    ContainerEngine,
    PullFailed,
    PushFailed,
    RunResult,
    StartFailed,
    registry_host,
)
from mtpimage.engine.dockerengine import DockerEngine
from mtpimage.errors import InputError

ENGINES = ("docker", "buildah")


def name(flag: str | None = None) -> str:
    """The engine's name: `flag` (a command's --engine), else MTP_ENGINE, else docker."""
    chosen = flag or settings.current().engine
    if chosen not in ENGINES:
        raise InputError("MTP_ENGINE", chosen, "unknown engine", f"use one of: {', '.join(ENGINES)}")
    return chosen


def named(
    flag: str | None = None, compression: str | None = None, where: str = "--compression"
) -> ContainerEngine:
    """The engine called name(flag), publishing layers in `compression` (--compression, or
    the profile's builds.compression, named by `where`; None: compression.yaml's default).
    The Docker engine pushes its own gzip layers: another format is refused there in one line
    (only the reproducible engine compresses with the tool's pinned compressor, layercompress.py)."""
    if name(flag) == "buildah":
        return BuildahEngine(compression=layercompress.named(compression, where))
    if compression is not None and compression != "gzip":
        other = "" if where == "--compression" else ", or --compression gzip for this run"
        raise InputError(
            where,
            compression,
            "the docker engine pushes the gzip layers dockerd makes",
            f"build with --reproducible (--engine buildah) to publish zstd or uncompressed layers{other}",
        )
    return DockerEngine()


def reproducible() -> ContainerEngine:
    """The engine that builds bit for bit (verify's clean rebuild: cold, never on the layer
    cache), whatever builds otherwise."""
    return BuildahEngine(cached=False)
