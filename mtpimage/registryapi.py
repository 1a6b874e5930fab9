"""The registry HTTP API (distribution v2) through requests: is a tag there and which digest
does it name, a repository's tags, deleting a manifest (a failed push's roll-back), and
whether a registry answers at all.

Authentication as docker does it, with docker's stored credentials (dockerauth.py): on a 401
a `Basic` challenge gets the stored login; a `Bearer` challenge sends it (or nothing, for
anonymous pulls) to the token service named in the challenge and retries with the token.
Timeouts come from the network policy (netpolicy.py).
"""

from __future__ import annotations

import base64
import re

from . import dockerauth, netpolicy
from .errors import EnvironmentProblem
from .registry import Registry, base_url

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


def network_reason(exc: BaseException) -> str:
    """What failed, in a few words, from a requests/urllib3 exception (whose own text is a
    nest of pool, retry and connection object reprs)."""
    import requests  # lazy: ~60 ms, only needed when a registry is involved

    text = str(exc)
    low = text.lower()
    if isinstance(exc, requests.exceptions.SSLError):
        m = re.search(r"\[SSL: [A-Z_]+\] ([^(\"')]+)", text)
        return f"TLS failed ({(m.group(1) if m else 'certificate or protocol error').strip()})"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "no answer to the connection attempt (timed out)"
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return "connected, but no answer in time (timed out)"
    for needles, what in (
        (
            (
                "nameresolutionerror",
                "name or service not known",
                "failed to resolve",
                "temporary failure in name resolution",
                "nodename nor servname",
            ),
            "its host name does not resolve (DNS)",
        ),
        (("connection refused",), "connection refused (nothing listens there)"),
        (("network is unreachable", "no route to host"), "no network route to it"),
        (
            ("remotedisconnected", "connection aborted", "connection reset", "broken pipe"),
            "the connection was closed without an answer",
        ),
        (("proxyerror", "unable to connect to proxy"), "the HTTP proxy refused or failed"),
    ):
        if any(n in low for n in needles):
            return what
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return m.group(1).strip() if m else type(exc).__name__


class RegistryUnreachable(EnvironmentProblem):
    def __init__(self, host: str, what: str, exc: BaseException):
        self.reason = network_reason(exc)
        super().__init__(
            f"registry {host} cannot be reached: {self.reason} ({what}) (fix: check that the "
            f"registry runs and that {base_url(host)}/v2/ answers from this machine (DNS, proxy, "
            "firewall), or use another --registry)"
        )


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = (header or "").strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


class RegistryClient:
    """Look-ups in one registry, authenticated with docker's stored login for its host."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.host = registry.host
        self.base_url = registry.base_url
        self._auth_header: dict[str, str] = {}  # what the last challenge asked for, reused

    def _credentials(self):
        return dockerauth.credentials(self.host)

    def _answer(self, challenge: str, scope: str) -> dict[str, str] | None:
        """Headers answering a 401's WWW-Authenticate, or None when there is no answer."""
        import requests  # lazy: ~60 ms, only needed when a registry is involved

        scheme, fields = _challenge(challenge)
        creds = self._credentials()
        if scheme == "basic":
            if creds is None:
                return None
            token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            return {"Authorization": f"Basic {token}"}
        if scheme != "bearer" or not fields.get("realm"):
            return None
        realm = fields["realm"]
        params = {"service": fields.get("service", ""), "scope": fields.get("scope") or scope}
        try:
            resp = requests.get(
                realm,
                params=params,
                timeout=netpolicy.http_timeout(),
                auth=(creds.username, creds.password) if creds else None,
            )
        except requests.RequestException as exc:
            raise RegistryUnreachable(self.host, f"token service {realm}", exc) from None
        if resp.status_code != 200:
            return None
        try:
            body = resp.json()
        except ValueError:
            return None
        token = body.get("token") or body.get("access_token")
        return {"Authorization": f"Bearer {token}"} if token else None

    def _request(self, method: str, path: str, what: str, scope: str, headers: dict | None = None):
        import requests  # lazy: ~60 ms, only needed when a registry is involved

        url = f"{self.base_url}{path}"
        headers = dict(headers or {})
        try:
            resp = requests.request(
                method, url, headers={**headers, **self._auth_header}, timeout=netpolicy.http_timeout()
            )
            if resp.status_code == 401:
                answer = self._answer(resp.headers.get("WWW-Authenticate", ""), scope)
                if answer:
                    self._auth_header = answer
                    resp = requests.request(
                        method, url, headers={**headers, **answer}, timeout=netpolicy.http_timeout()
                    )
        except requests.RequestException as exc:
            raise RegistryUnreachable(self.host, what, exc) from None
        return resp

    def manifest_digest(self, repository: str, tag: str) -> str | None:
        """Digest of repository:tag in the registry, or None when the tag does not exist."""
        path = self.registry.repo_path(repository)
        what = f"looking up {self.registry.ref(repository, tag)}"
        resp = self._request(
            "HEAD", f"/v2/{path}/manifests/{tag}", what, f"repository:{path}:pull", {"Accept": MANIFEST_TYPES}
        )
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._http_error(resp.status_code, what)
        return resp.headers.get("Docker-Content-Digest")

    def tags(self, repository: str) -> list[str]:
        path = self.registry.repo_path(repository)
        what = f"listing the tags of {self.registry.ref(repository)}"
        resp = self._request("GET", f"/v2/{path}/tags/list", what, f"repository:{path}:pull")
        if resp.status_code == 404:
            return []
        if resp.status_code != 200:
            raise self._http_error(resp.status_code, what)
        return sorted(resp.json().get("tags") or [])

    def delete_manifest(self, repository: str, digest: str) -> bool:
        """Delete a manifest by digest (which removes every tag naming it); True when gone."""
        path = self.registry.repo_path(repository)
        resp = self._request(
            "DELETE",
            f"/v2/{path}/manifests/{digest}",
            f"deleting {self.registry.ref(repository)}@{digest}",
            f"repository:{path}:delete",
        )
        return resp.status_code in (200, 202, 404)

    def _http_error(self, status: int, what: str) -> EnvironmentProblem:
        if status in (401, 403):
            fix = f"docker login {self.host}, or use a registry this machine may read"
        elif status >= 500:
            fix = "the registry itself failed: check its logs, or retry later"
        else:
            fix = f"check that {self.base_url} is a Docker registry (HTTP API v2)"
        return EnvironmentProblem(f"registry {self.host} answered HTTP {status} ({what}) (fix: {fix})")


def answers(host: str, timeout: float = 5) -> None:
    """Raise RegistryUnreachable unless something answers at host's /v2/ (any HTTP status:
    a 401 still means the registry is there)."""
    import requests  # lazy: ~60 ms, only needed when a registry is involved

    try:
        requests.get(f"{base_url(host)}/v2/", timeout=timeout)
    except requests.RequestException as exc:
        raise RegistryUnreachable(host, "GET /v2/", exc) from None
