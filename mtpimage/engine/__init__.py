"""The engine seam: every call to a container engine (dockerd today) goes through the
ContainerEngine that `current()` returns; no other module runs the docker CLI, imports the
Docker SDK or opens the engine's socket (tests/unit/test_imports.py holds to that).

    containerengine.py  the interface (build, inspect, tag, push, pull, run, copy out, remove),
                        its requests, results and errors, and the rules written once on top
                        (a missing image is pulled only from the registry it names)
    dockerengine.py     the Docker engine, through the docker CLI
    dockersocket.py     the fast path's one stdlib-only question on the engine's socket

A second engine (buildah, for reproducible builds) is one more ContainerEngine subclass and
one more entry here.
"""

from __future__ import annotations

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


def current() -> ContainerEngine:
    """The engine this run uses. One today; a second (buildah) is chosen here."""
    from mtpimage.engine.dockerengine import DockerEngine

    return DockerEngine()
