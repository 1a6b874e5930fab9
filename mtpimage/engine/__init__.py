"""The engine seam: every call to a container engine (docker, or buildah for builds) goes
through the ContainerEngine that `current()` returns; no other module runs the docker CLI,
imports the Docker SDK or opens the engine's socket (tests/unit/test_imports.py holds to that).

    containerengine.py  the interface (build, inspect, tag, push, pull, run, copy out, remove),
                        its requests, results and errors, and the rules written once on top
                        (a missing image is pulled only from the registry it names)
    dockerengine.py     the Docker engine, through the docker CLI
    buildahengine.py    the reproducible engine: buildah builds bit for bit, dockerd runs
    ocilayout.py        its image form: a normalised OCI layout (and `docker load`'s tar)
    dockersocket.py     the fast path's one stdlib-only question on the engine's socket

Which engine builds: `--engine NAME` (or `--reproducible`) for one command, else
MTP_ENGINE (settings.py), else docker. The flag is scoped with `using(name)` around the
command, so every module below keeps asking `current()`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

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

ENGINES = ("docker", "buildah")
_chosen: contextvars.ContextVar[str | None] = contextvars.ContextVar("mtp_engine", default=None)


def name() -> str:
    """The engine this run builds with: the command's --engine, else MTP_ENGINE, else docker."""
    from mtpimage import settings
    from mtpimage.errors import InputError

    chosen = _chosen.get() or settings.current().engine
    if chosen not in ENGINES:
        raise InputError("MTP_ENGINE", chosen, "unknown engine", f"use one of: {', '.join(ENGINES)}")
    return chosen


@contextlib.contextmanager
def using(chosen: str | None) -> Iterator[None]:
    """Within this block, current() is `chosen` (None: as the environment says)."""
    token = _chosen.set(chosen)
    try:
        yield
    finally:
        _chosen.reset(token)


def current() -> ContainerEngine:
    """The engine this run uses (see name())."""
    if name() == "buildah":
        from mtpimage.engine.buildahengine import BuildahEngine

        return BuildahEngine()
    from mtpimage.engine.dockerengine import DockerEngine

    return DockerEngine()


def reproducible() -> ContainerEngine:
    """The engine that builds bit for bit (verify's clean rebuild), whatever builds otherwise."""
    from mtpimage.engine.buildahengine import BuildahEngine

    return BuildahEngine()
