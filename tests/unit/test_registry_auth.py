"""Registry look-ups with docker's stored credentials (dockerauth.py, registryclient.py), against
a small registry stand-in on loopback that requires a login: HTTP Basic, or a Bearer token
from a token service that itself wants the login (as GHCR, Docker Hub and distribution's
token auth do). The credentials come from $DOCKER_CONFIG/config.json as `docker login`
writes them: inline `auths`, a `credHelpers` entry, or `credsStore`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mtpimage.errors import EnvironmentProblem
from mtpimage.imageref import Registry
from mtpimage.publish import dockerauth
from mtpimage.publish.registryclient import RegistryClient

from .helpers import run_cli

USER, PASSWORD = "mtp-user", "s3cret-pw"
TOKEN = "tok-123"
MANIFEST = b'{"schemaVersion":2,"layers":[]}'
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()  # the client computes it from the bytes
GOOD_BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


class _Registry(BaseHTTPRequestHandler):
    scheme = "basic"  # or "bearer"
    seen: list = []

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

    def _authorised(self) -> bool:
        got = self.headers.get("Authorization", "")
        return got == (GOOD_BASIC if self.scheme == "basic" else f"Bearer {TOKEN}")

    def _challenge(self):
        host = f"127.0.0.1:{self.server.server_address[1]}"
        if self.scheme == "basic":
            return {"WWW-Authenticate": 'Basic realm="registry"'}
        return {
            "WWW-Authenticate": f'Bearer realm="http://{host}/token",service="stand-in",'
            'scope="repository:ns/mtp-verl:pull"'
        }

    def do_GET(self):
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        if self.path.startswith("/token"):
            if self.headers.get("Authorization") == GOOD_BASIC:
                return self._send(
                    200, {"Content-Type": "application/json"}, json.dumps({"token": TOKEN}).encode()
                )
            return self._send(401)
        if not self._authorised():
            return self._send(401, self._challenge())
        if self.path.startswith("/v2/ns/mtp-verl/manifests/"):
            return self._send(200, {"Docker-Content-Digest": DIGEST}, MANIFEST)
        if self.path == "/v2/ns/mtp-verl/tags/list":
            return self._send(
                200,
                {"Content-Type": "application/json"},
                json.dumps({"name": "ns/mtp-verl", "tags": ["b", "a"]}).encode(),
            )
        return self._send(404)

    def do_HEAD(self):
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        if not self._authorised():
            return self._send(401, self._challenge())
        if self.path.startswith("/v2/ns/mtp-verl/manifests/"):
            return self._send(200, {"Docker-Content-Digest": DIGEST})
        return self._send(404)


@pytest.fixture(params=["basic", "bearer"])
def private_registry(request):
    handler = type("Handler", (_Registry,), {"scheme": request.param, "seen": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()
    srv.server_close()


def _config(tmp_path, monkeypatch, doc: dict):
    (tmp_path / "config.json").write_text(json.dumps(doc))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))


def _inline(host: str) -> dict:
    return {"auths": {host: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}


def test_lookup_uses_docker_login(private_registry, tmp_path, monkeypatch):
    host, handler = private_registry
    _config(tmp_path, monkeypatch, _inline(host))
    client = RegistryClient(Registry.parse(f"{host}/ns"))
    assert client.manifest_digest("mtp-verl", "mtp-detach") == DIGEST
    assert client.tags("mtp-verl") == ["a", "b"]
    if handler.scheme == "bearer":
        assert any(
            p.startswith("/token") and "scope=repository%3Ans%2Fmtp-verl%3Apull" in p
            for _, p, _ in handler.seen
        )


def test_without_a_login_the_error_says_docker_login(private_registry, tmp_path, monkeypatch):
    host, _ = private_registry
    _config(tmp_path, monkeypatch, {"auths": {}})
    with pytest.raises(EnvironmentProblem) as exc:
        RegistryClient(Registry.parse(f"{host}/ns")).manifest_digest("mtp-verl", "x")
    assert "HTTP 401" in exc.value.one_line() and f"docker login {host}" in exc.value.one_line()


def test_wrong_password_is_refused_and_never_printed(private_registry, tmp_path, monkeypatch):
    host, _ = private_registry
    wrong = base64.b64encode(f"{USER}:not-it".encode()).decode()
    _config(tmp_path, monkeypatch, {"auths": {f"https://{host}": {"auth": wrong}}})
    with pytest.raises(EnvironmentProblem) as exc:
        RegistryClient(Registry.parse(f"{host}/ns")).manifest_digest("mtp-verl", "x")
    assert "not-it" not in exc.value.one_line() and wrong not in exc.value.one_line()


def _helper(tmp_path, monkeypatch, name: str, host: str) -> None:
    """A docker-credential-NAME on PATH that knows `host` only (the protocol: server on
    stdin, JSON with Username and Secret on stdout, exit 1 when unknown)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / f"docker-credential-{name}"
    script.write_text(
        "#!/bin/sh\nread server\n"
        f'[ "$1" = get ] && [ "$server" = "{host}" ] || {{ echo "credentials not found" >&2; exit 1; }}\n'
        f"printf '%s' '{json.dumps({'ServerURL': host, 'Username': USER, 'Secret': PASSWORD})}'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("where", ["credHelpers", "credsStore"])
def test_credential_helpers_are_asked(private_registry, tmp_path, monkeypatch, where):
    host, _ = private_registry
    _helper(tmp_path, monkeypatch, "fake", host)
    doc = (
        {"credHelpers": {host: "fake"}}
        if where == "credHelpers"
        else {"credsStore": "fake", "auths": {host: {}}}
    )
    _config(tmp_path, monkeypatch, doc)
    assert RegistryClient(Registry.parse(f"{host}/ns")).manifest_digest("mtp-verl", "t") == DIGEST


def test_credentials_lookup_table(tmp_path, monkeypatch):
    pw = base64.b64encode(b"u:p:with:colons").decode()
    _config(
        tmp_path,
        monkeypatch,
        {
            "auths": {
                "https://index.docker.io/v1/": {"auth": base64.b64encode(b"hub:pw").decode()},
                "ghcr.io": {"auth": pw},
                "registry.example.com:5000": {"username": "plain", "password": "pw"},
                "broken.example.com": {"auth": "%%%"},
                "token.example.com": {"identitytoken": "refresh"},
            }
        },
    )
    assert dockerauth.credentials("docker.io") == dockerauth.Credentials("hub", "pw")
    assert dockerauth.credentials("ghcr.io") == dockerauth.Credentials("u", "p:with:colons")
    assert dockerauth.credentials("registry.example.com:5000") == dockerauth.Credentials("plain", "pw")
    assert dockerauth.credentials("broken.example.com") is None
    assert dockerauth.credentials("token.example.com") is None  # identity tokens: not used
    assert dockerauth.credentials("elsewhere.example.com") is None
    assert "p:with:colons" not in repr(dockerauth.credentials("ghcr.io"))


def test_no_config_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "absent"))
    assert dockerauth.credentials("ghcr.io") is None
    (tmp_path / "config.json").write_text("{not json")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert dockerauth.credentials("ghcr.io") is None


def test_cluster_script_finds_the_digest_in_a_private_registry(private_registry, tmp_path):
    """The CLI's registry look-up (`explain --cluster`, the same client as the main job's
    up-to-date check) logs in with what `docker login` stored."""
    host, _ = private_registry
    (tmp_path / "config.json").write_text(json.dumps(_inline(host)))
    args = (
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
    ok = run_cli(*args, env={"DOCKER_CONFIG": str(tmp_path)})
    assert ok.returncode == 0, ok.stderr
    assert f"IMAGE='{host}#ns/mtp-verl@{DIGEST}'" in ok.stdout
    (tmp_path / "config.json").write_text("{}")
    refused = run_cli(*args, env={"DOCKER_CONFIG": str(tmp_path)})
    assert (
        refused.returncode == 4 and f"docker login {host}" in refused.stderr
    )  # authentication: its own code
    assert len(refused.stderr.strip().splitlines()) == 1
