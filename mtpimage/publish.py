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
        resp = requests.get(realm, params=params, timeout=20)
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
            raise EnvironmentProblem(f"registry {self.host} does not answer: {exc}")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise EnvironmentProblem(f"registry {self.host}: HEAD {url} -> HTTP {resp.status_code}")
        return resp.headers.get("Docker-Content-Digest")

    def tags(self, repository: str) -> list[str]:
        import requests  # lazy: ~60 ms, only needed when a registry is involved
        url = f"{self.base_url}/v2/{self.repo_path(repository)}/tags/list"
        resp = requests.get(url, timeout=20)
        if resp.status_code == 404:
            return []
        resp.raise_for_status()
        return sorted(resp.json().get("tags") or [])


def pull_strings(reg: Registry, repository: str, digest: str) -> dict[str, str]:
    path = reg.repo_path(repository)
    return {
        "docker": f"docker pull {reg.host}/{path}@{digest}",
        "pyxis": f"srun --container-image={reg.host}#{path}@{digest} ...",
        "enroot": f"enroot import docker://{reg.host}#{path}@{digest}",
        "apptainer": f"apptainer pull docker://{reg.host}/{path}@{digest}",
    }
