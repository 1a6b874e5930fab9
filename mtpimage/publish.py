"""Publish: registry look-ups (HTTP API through requests), tag, push, pull strings.

A tag a user pulls (`<profile>`) moves only after the content tag (`<profile>-<hash>`)
is in the registry, and the content tag is pushed only after the image passed its tests.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


from .errors import EnvironmentProblem, InputError

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])


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
            (("nameresolutionerror", "name or service not known", "failed to resolve",
              "temporary failure in name resolution", "nodename nor servname"),
             "its host name does not resolve (DNS)"),
            (("connection refused",), "connection refused (nothing listens there)"),
            (("network is unreachable", "no route to host"), "no network route to it"),
            (("remotedisconnected", "connection aborted", "connection reset", "broken pipe"),
             "the connection was closed without an answer"),
            (("proxyerror", "unable to connect to proxy"), "the HTTP proxy refused or failed")):
        if any(n in low for n in needles):
            return what
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return m.group(1).strip() if m else type(exc).__name__


class RegistryUnreachable(EnvironmentProblem):
    def __init__(self, reg: "Registry", what: str, exc: BaseException):
        self.reason = network_reason(exc)
        super().__init__(
            f"registry {reg.host} cannot be reached: {self.reason} ({what}) (fix: check that the "
            f"registry runs and that {reg.base_url}/v2/ answers from this machine (DNS, proxy, "
            "firewall), or use another --registry)")


@dataclass(frozen=True)
class Registry:
    host: str          # host[:port]
    namespace: str     # may be empty

    @classmethod
    def parse(cls, text: str) -> "Registry":
        m = re.fullmatch(r"([A-Za-z0-9.-]+(?::[0-9]+)?)(?:/([a-z0-9._/-]+))?/?", text or "")
        if not m or ("." not in m.group(1) and ":" not in m.group(1) and m.group(1) != "localhost"):
            raise InputError("--registry", text, "expected HOST[:PORT]/NAMESPACE",
                             "for example --registry 127.0.0.1:5000/mtp or ghcr.io/my-org")
        return cls(m.group(1), (m.group(2) or "").strip("/"))

    @property
    def insecure(self) -> bool:
        h = self.host.split(":")[0]
        return h in ("localhost", "::1") or h.startswith("127.")

    @property
    def base_url(self) -> str:
        return f"{'http' if self.insecure else 'https'}://{self.host}"

    def repo_path(self, repository: str) -> str:
        return f"{self.namespace}/{repository}" if self.namespace else repository

    def ref(self, repository: str, tag: str | None = None) -> str:
        base = f"{self.host}/{self.repo_path(repository)}"
        return f"{base}:{tag}" if tag else base

    # -- HTTP API ------------------------------------------------------------------------
    def _get_token(self, challenge: str, repository: str) -> str | None:
        import requests  # lazy: ~60 ms, only needed when a registry is involved
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = fields.get("realm")
        if not realm:
            return None
        params = {"service": fields.get("service", ""),
                  "scope": f"repository:{self.repo_path(repository)}:pull"}
        try:
            resp = requests.get(realm, params=params, timeout=20)
        except requests.RequestException as exc:
            raise RegistryUnreachable(self, f"token service {realm}", exc) from None
        if resp.status_code != 200:
            return None
        body = resp.json()
        return body.get("token") or body.get("access_token")

    def manifest_digest(self, repository: str, tag: str) -> str | None:
        """Digest of repository:tag in the registry, or None when the tag does not exist."""
        import requests  # lazy: ~60 ms, only needed when a registry is involved
        url = f"{self.base_url}/v2/{self.repo_path(repository)}/manifests/{tag}"
        headers = {"Accept": MANIFEST_TYPES}
        try:
            resp = requests.head(url, headers=headers, timeout=20)
            if resp.status_code == 401:
                token = self._get_token(resp.headers.get("WWW-Authenticate", ""), repository)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    resp = requests.head(url, headers=headers, timeout=20)
        except requests.RequestException as exc:
            raise RegistryUnreachable(self, f"looking up {self.ref(repository, tag)}", exc) from None
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._http_error(resp.status_code, f"looking up {self.ref(repository, tag)}")
        return resp.headers.get("Docker-Content-Digest")

    def _http_error(self, status: int, what: str) -> EnvironmentProblem:
        if status in (401, 403):
            fix = f"docker login {self.host}, or use a registry this machine may read"
        elif status >= 500:
            fix = "the registry itself failed: check its logs, or retry later"
        else:
            fix = f"check that {self.base_url} is a Docker registry (HTTP API v2)"
        return EnvironmentProblem(f"registry {self.host} answered HTTP {status} ({what}) (fix: {fix})")

    def tags(self, repository: str) -> list[str]:
        import requests  # lazy: ~60 ms, only needed when a registry is involved
        url = f"{self.base_url}/v2/{self.repo_path(repository)}/tags/list"
        try:
            resp = requests.get(url, timeout=20)
        except requests.RequestException as exc:
            raise RegistryUnreachable(self, f"listing the tags of {self.ref(repository)}", exc) from None
        if resp.status_code == 404:
            return []
        if resp.status_code != 200:
            raise self._http_error(resp.status_code, f"listing the tags of {self.ref(repository)}")
        return sorted(resp.json().get("tags") or [])


def pull_strings(reg: Registry, repository: str, digest: str) -> dict[str, str]:
    path = reg.repo_path(repository)
    return {
        "docker": f"docker pull {reg.host}/{path}@{digest}",
        "pyxis": f"srun --container-image={reg.host}#{path}@{digest} ...",
        "enroot": f"enroot import docker://{reg.host}#{path}@{digest}",
        "apptainer": f"apptainer pull docker://{reg.host}/{path}@{digest}",
    }
