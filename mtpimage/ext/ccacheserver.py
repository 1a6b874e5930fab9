"""The compile cache of extension builds, kept on this machine and served to the builder
stages over loopback HTTP as ccache's remote storage (`remote_storage = http://...`).

Why not only a BuildKit cache mount: a cache mount written by a RUN that is killed with the
daemon (what a stopped session or a rebooted CI runner does) is gone when dockerd comes back
(seen here: a file written, dockerd killed, the next build's mount was empty). Every object
ccache stores through this server is a file under the tool's cache directory the moment it
is compiled, so an interrupted multi-hour build resumes with every object it had made, also
after `docker builder prune`. The builder stage keeps its cache mount as a fast first level.

ccache's HTTP storage protocol is plain GET/HEAD/PUT/DELETE of opaque keys; this serves
exactly that, from one directory, on 127.0.0.1 only (the builder runs with --network host).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from mtpimage.gitfetch import cache_root

_KEY = re.compile(r"^[A-Za-z0-9._-]{1,200}$")  # ccache's keys: hex digests and a layout prefix


def default_root() -> Path:
    return cache_root() / "ccache"


def _handler(root: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _path(self) -> Path | None:
            parts = [p for p in self.path.split("?", 1)[0].split("/") if p]
            if not parts or not all(_KEY.match(p) and p not in (".", "..") for p in parts):
                return None
            return root.joinpath(*parts)

        def _reply(self, code: int, body: bytes = b"") -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self._path()
            if path is None or not path.is_file():
                self._reply(404)
                return
            self._reply(200, path.read_bytes())

        do_HEAD = do_GET  # noqa: N815

        def do_PUT(self) -> None:  # noqa: N802
            path = self._path()
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else b""
            if path is None:
                self._reply(400)
                return
            if self.headers.get("If-None-Match") == "*" and path.exists():
                self._reply(412)
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            # atomic: a reader never sees half an object, a killed writer leaves none
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            self._reply(201)

        def do_DELETE(self) -> None:  # noqa: N802
            path = self._path()
            if path is not None and path.is_file():
                path.unlink()
            self._reply(204)

        def log_message(self, *args) -> None:  # the build log has ccache's own statistics
            pass

    return Handler


@contextlib.contextmanager
def serve(root: Path | None = None) -> Iterator[str]:
    """Serve `root` (default: the tool's cache) on a free loopback port; yields the URL for
    ccache's remote_storage. Stops when the block ends."""
    root = Path(root or default_root())
    root.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
