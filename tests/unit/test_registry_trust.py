"""What a registry says about content is checked against the bytes (issue #46, docs/trust.md):
a stand-in registry on loopback that lies in Docker-Content-Digest, serves other bytes for a
digest, or names digests with path characters; and the blob download's failures said as what
they are (network, disk, the sink's own decode error)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mtpimage.errors import EXIT_DISK, EXIT_ENV, DiskProblem
from mtpimage.imageref import Registry
from mtpimage.publish import digests
from mtpimage.publish.registryclient import DigestMismatch, RegistryClient, RegistryUnreachable

from .helpers import run_main

MANIFEST = json.dumps({"schemaVersion": 2, "layers": []}).encode()
TRUE = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
LIE = "sha256:" + "0" * 64
BLOB = b"x" * 5000


class _Stand(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    header = LIE  # what Docker-Content-Digest says for the manifest
    body = MANIFEST
    seen: list = []
    cut = False  # close the blob's connection half way

    def log_message(self, *args):
        pass

    def _send(self, status, headers=None, body=b""):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        type(self).seen.append(self.path)
        if "/manifests/" in self.path:
            return self._send(200, {"Docker-Content-Digest": type(self).header}, type(self).body)
        if "/blobs/" in self.path:
            if type(self).cut:
                self.send_response(200)
                self.send_header("Content-Length", str(len(BLOB)))
                self.end_headers()
                self.wfile.write(BLOB[:100])
                self.wfile.flush()
                self.close_connection = True
                return
            return self._send(200, {}, BLOB)
        return self._send(404)

    do_HEAD = do_GET


@pytest.fixture
def stand():
    handler = type("Handler", (_Stand,), {"seen": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()
    srv.server_close()


def _client(host: str) -> RegistryClient:
    return RegistryClient(Registry.parse(f"{host}/ns"))


def test_a_lying_header_is_refused_naming_both_digests(stand):
    host, _ = stand
    with pytest.raises(DigestMismatch) as exc:
        _client(host).manifest_digest("mtp-verl", "p")
    line = exc.value.one_line()
    assert exc.value.exit_code == EXIT_ENV
    assert LIE in line and TRUE in line and "Docker-Content-Digest" in line


def test_an_honest_header_or_none_gives_the_digest_of_the_bytes(stand):
    host, handler = stand
    handler.header = TRUE
    assert _client(host).manifest_digest("mtp-verl", "p") == TRUE
    handler.header = ""
    assert _client(host).manifest_digest("mtp-verl", "p") == TRUE


def test_a_header_that_is_not_a_digest_is_refused_escaped(stand):
    host, handler = stand
    handler.header = "sha256:../../evil\x1b[31m"
    with pytest.raises(DigestMismatch) as exc:
        _client(host).manifest_digest("mtp-verl", "p")
    assert "\x1b" not in exc.value.one_line() and TRUE in exc.value.one_line()


def test_a_manifest_asked_for_by_digest_must_hash_to_it(stand):
    host, handler = stand
    handler.header = ""
    asked = "sha256:" + "a" * 64
    with pytest.raises(DigestMismatch) as exc:
        _client(host).manifest("mtp-verl", asked)
    assert asked in exc.value.one_line() and TRUE in exc.value.one_line()


@pytest.mark.parametrize(
    "bad",
    [
        "sha256:../../../v2/other/manifests/x",
        "sha256:" + "A" * 64,
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 64 + "/x",
        "sha256:" + "a" * 64 + "\n",
        "md5:" + "a" * 32,
        None,
        12,
    ],
)
def test_digests_with_path_characters_never_reach_a_url(stand, bad):
    host, handler = stand
    client = _client(host)
    for call in (
        lambda: client.fetch_blob("mtp-verl", bad, io.BytesIO(), 1 << 20),
        lambda: client.blob_exists("mtp-verl", bad),
        lambda: client.delete_manifest("mtp-verl", bad),
    ):
        with pytest.raises(digests.BadDigest) as exc:
            call()
        assert "\n" not in exc.value.one_line() and "not a digest" in exc.value.one_line()
    if isinstance(bad, str) and ":" in bad:
        with pytest.raises(digests.BadDigest):
            client.manifest("mtp-verl", bad)
    assert handler.seen == []  # nothing was requested with it


def test_known_algorithms():
    assert digests.valid("sha256:" + "a" * 64) and digests.valid("sha512:" + "b" * 128)
    assert not digests.valid("sha512:" + "b" * 64)
    assert digests.of(b"x", "sha512:") == "sha512:" + hashlib.sha512(b"x").hexdigest()


def test_a_full_disk_is_the_disk_not_the_network(stand):
    host, _ = stand

    class Full(io.BytesIO):
        name = "/scratch/blob"

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    digest = "sha256:" + hashlib.sha256(BLOB).hexdigest()
    with pytest.raises(DiskProblem) as exc:
        _client(host).fetch_blob("mtp-verl", digest, Full(), 1 << 20)
    assert exc.value.exit_code == EXIT_DISK
    line = exc.value.one_line()
    assert "No space left on device" in line and "cannot be reached" not in line and "free space" in line


def test_a_decode_error_of_the_sink_is_not_the_network(stand):
    host, _ = stand

    class Refuses(io.BytesIO):
        def write(self, data):
            raise ValueError("not a gzip stream")

    digest = "sha256:" + hashlib.sha256(BLOB).hexdigest()
    with pytest.raises(ValueError, match="not a gzip stream"):
        _client(host).fetch_blob("mtp-verl", digest, Refuses(), 1 << 20)


def test_a_cut_transfer_is_the_network(stand):
    host, handler = stand
    handler.cut = True
    digest = "sha256:" + hashlib.sha256(BLOB).hexdigest()
    with pytest.raises(RegistryUnreachable):
        _client(host).fetch_blob("mtp-verl", digest, io.BytesIO(), 1 << 20)


def test_explain_cluster_writes_no_script_pinned_to_a_lying_digest(stand):
    host, _ = stand
    proc = run_main(
        "explain",
        "--profile",
        "mtp-detach",
        "--target",
        "rl",
        "--cluster",
        "slurm",
        "--registry",
        f"{host}/ns",
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "" and LIE not in proc.stdout
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and LIE in errors[0] and TRUE in errors[0], proc.stderr
