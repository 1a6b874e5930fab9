"""An index behind a certificate no CA setting here vouches for (issue #35): what uv and
requests say is read as a TLS failure that names the CA setting, never as "the stack does
not resolve" (which `lock` records and writes). A real HTTPS server with a self-signed
certificate on loopback; real uv."""

from __future__ import annotations

import functools
import shutil
import ssl
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mtpimage.lock import pydeps, resolver


@pytest.fixture
def bad_tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "2", "-subj", "/CN=127.0.0.1"],
        check=True,
        capture_output=True,
    )
    (tmp_path / "www" / "simple" / "tiny").mkdir(parents=True)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "www"))
    handler.log_message = lambda *a: None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{srv.server_address[1]}/simple"
    srv.shutdown()
    srv.server_close()


def test_uvs_certificate_failure_is_read_as_tls(bad_tls, tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    for var in ("MTP_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(resolver.ResolutionFailed) as info:
        resolver.resolve(["tiny==0.1"], {}, [], [], [bad_tls], "3.12")
    said = pydeps.tls_failure(str(info.value))
    assert said is not None and said.startswith("TLS failed (invalid peer certificate"), str(info.value)
    assert bad_tls in said


def test_requests_certificate_failure_is_read_as_tls(bad_tls, monkeypatch):
    monkeypatch.setenv("MTP_NET_RETRIES", "1")
    for var in ("MTP_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)
    reason = pydeps.probe_index(bad_tls, "tiny")
    assert reason == f"{bad_tls}/tiny/: TLS failed (certificate verify failed: self-signed certificate)"


def test_a_resolution_conflict_is_not_tls():
    text = "Because tiny==0.1 depends on other>=2 and other==1 is pinned, we can conclude ... unsatisfiable"
    assert pydeps.tls_failure(text) is None
