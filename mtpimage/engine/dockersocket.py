"""The fast path's one question to the Docker engine, in one request on its unix socket.

`build.py` answers a remembered no-op before it imports anything but the standard library
(fastpath.py); a docker CLI start alone would cost more than the whole hit. This is the engine
seam's stdlib-only corner: one GET of the Engine API, and any doubt (another kind of
DOCKER_HOST, a docker context, no answer) is None, so the full path, through engine.py,
decides.
"""

from __future__ import annotations

import json
import os
import socket


def _socket_path() -> str | None:
    """The Docker engine's unix socket when that is unambiguous; None = let the full path ask."""
    if os.environ.get("DOCKER_CONTEXT"):
        return None
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host[len("unix://") :] if host.startswith("unix://") else None


def quick_image_id(ref: str, timeout: float = 5.0) -> str | None:
    """The ID of a local image in one Docker Engine API request on its socket
    (GET /images/{ref}/json), for the fast path, which cannot afford a CLI start; None when
    it does not exist or the engine cannot be asked this way: the full path then decides."""
    path = _socket_path()
    if path is None:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(f"GET /images/{ref}/json HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
        return None
    try:
        return json.loads(body).get("Id")
    except ValueError:
        return None
