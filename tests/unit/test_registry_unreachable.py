"""A registry that is down, does not resolve, drops the connection or fails: one line naming
the registry, what failed and the fix, exit 3; never urllib3's pool/retry text.

Real sockets on loopback: a closed port (refused), a listener that closes every connection
without an answer, an HTTP server that answers 503, and a name under .invalid (RFC 6761:
never resolves). `explain --cluster` looks the digest up in the registry (no Docker needed).
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .helpers import assert_one_line_error, run_cli

RAW = (
    "HTTPConnectionPool",
    "HTTPSConnectionPool",
    "Max retries exceeded",
    "NewConnectionError",
    "urllib3",
    "object at 0x",
)


@pytest.fixture
def dropping_server():
    """Accepts connections and closes them at once, never answering."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def loop():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.recv(65536)
            conn.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(timeout=5)
    srv.close()


@pytest.fixture
def failing_server():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_HEAD(self):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _explain(registry: str):
    return run_cli(
        "explain",
        "--profile",
        "mtp-detach",
        "--target",
        "rl",
        "--cluster",
        "slurm",
        "--registry",
        f"{registry}/my-org",
    )


def _no_raw_text(err: str) -> None:
    for raw in RAW:
        assert raw not in err, err


def test_registry_down_connection_refused():
    err = assert_one_line_error(
        _explain("127.0.0.1:9"),
        "registry 127.0.0.1:9 cannot be reached: connection refused",
        "http://127.0.0.1:9/v2/",
        "(fix:",
        code=3,
    )
    _no_raw_text(err)


def test_registry_name_does_not_resolve():
    err = assert_one_line_error(
        _explain("registry.invalid"),
        "registry registry.invalid cannot be reached: its host name does not resolve (DNS)",
        "(fix:",
        code=3,
    )
    _no_raw_text(err)


def test_registry_closes_the_connection(dropping_server):
    err = assert_one_line_error(
        _explain(dropping_server),
        f"registry {dropping_server} cannot be reached: the connection was closed without an answer",
        "(fix:",
        code=3,
    )
    _no_raw_text(err)


def test_registry_answers_503(failing_server):
    err = assert_one_line_error(
        _explain(failing_server),
        f"registry {failing_server} answered HTTP 503",
        "(fix: the registry itself failed",
        code=3,
    )
    _no_raw_text(err)


def test_the_buildah_push_error_is_whole_words_and_one_fix(tmp_path, monkeypatch):
    """The reproducible engine's push (the registry API, not `docker push`) to a registry that
    refuses connections: the reason uncut and one `(fix: ...)`, the registry client's own."""
    from mtpimage.engine import buildahengine, dockerengine, ocilayout
    from mtpimage.engine.containerengine import PushFailed

    from .test_ocilayout import _layout, _tar

    layout = ocilayout.normalise(_layout(tmp_path / "l", [_tar({"a": b"1"})], "FROM x"))
    eng = buildahengine.BuildahEngine()
    monkeypatch.setattr(dockerengine.DockerEngine, "image_id", lambda self, ref: layout.image_id)
    monkeypatch.setattr(buildahengine.BuildahEngine, "layout_of", lambda self, image_id: layout.root)
    ref = "127.0.0.1:9/some-long-namespace-name/mtp-verl:test-detach-0123456789ab"
    with pytest.raises(PushFailed) as info:
        eng.push(ref)
    line = info.value.one_line()
    assert line.count("(fix: ") == 1, line
    assert line.startswith(
        f"push {ref} failed: registry 127.0.0.1:9 cannot be reached: connection refused"
    ), line
    assert line.endswith("or use another --registry; no tag was moved)"), line
    _no_raw_text(line)
