"""Registries and image references: one model for parsing, printing and pulling.

    Registry   HOST[:PORT][/NAMESPACE], where images are published (`--registry`)
    ImageRef   a full image reference, [HOST[:PORT]/]PATH[:TAG][@sha256:...], normalised as
               docker does: no host means docker.io, a one-part path on docker.io is library/X

Pure: no network. The HTTP API is registryclient.py's; both take hosts from here, so the
Docker Hub API host (registry-1.docker.io) and plain http for loopback registries are
decided in one place. Grammar as in docker's reference package (distribution/reference):
host components may hold upper case, path components only lower case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from mtpimage.errors import InputError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's HTTP API answers
OWNER = "{owner}"  # a generated workflow's repository owner

_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
HOST = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]{{1,5}})?"
PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"sha256:[0-9a-f]{64}"

_REGISTRY_RE = re.compile(rf"(?P<host>{HOST})(?:/(?P<ns>{PATH_PART}(?:/{PATH_PART})*))?/?")
_REGISTRY_OWNER_RE = re.compile(
    rf"(?P<host>{HOST})(?:/(?P<ns>(?:{PATH_PART}|\{{owner\}})(?:/(?:{PATH_PART}|\{{owner\}}))*))?/?"
)
_IMAGE_RE = re.compile(
    rf"(?:(?P<host>{HOST})/)?(?P<path>{PATH_PART}(?:/{PATH_PART})*)"
    rf"(?::(?P<tag>{TAG}))?(?:@(?P<digest>{DIGEST}))?"
)


def names_a_host(first: str) -> bool:
    """Whether the first part of a reference is a registry host, as docker decides it:
    a dot, a port, or `localhost`; anything else is a path on docker.io."""
    return "." in first or ":" in first or first == "localhost"


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in ("localhost", "::1", "[::1]") or name.startswith("127.")


def api_host(host: str) -> str:
    """The host whose /v2/ API serves `host`'s images (docker.io's is registry-1.docker.io)."""
    return DOCKER_HUB_API if host in (DOCKER_HUB, "index.docker.io") else host


def base_url(host: str) -> str:
    """http for loopback registries (as docker treats them: insecure by default), else https."""
    return f"{'http' if is_loopback(host) else 'https'}://{api_host(host)}"


@dataclass(frozen=True)
class Registry:
    host: str  # host[:port]
    namespace: str  # may be empty

    @classmethod
    def parse(cls, text: str, *, owner_placeholder: bool = False, flag: str = "--registry") -> Registry:
        """HOST[:PORT][/NAMESPACE] (a trailing / is tolerated). With owner_placeholder, a
        namespace part may be `{owner}` (generated workflows fill it in at run time)."""
        pattern = _REGISTRY_OWNER_RE if owner_placeholder else _REGISTRY_RE
        m = pattern.fullmatch(text or "")
        if not m or not names_a_host(m.group("host")):
            raise InputError(
                flag,
                text,
                "expected HOST[:PORT]/NAMESPACE",
                "for example --registry 127.0.0.1:5000/mtp or ghcr.io/my-org",
            )
        return cls(m.group("host"), m.group("ns") or "")

    @property
    def insecure(self) -> bool:
        return is_loopback(self.host)

    @property
    def base_url(self) -> str:
        return base_url(self.host)

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}" if self.namespace else self.host

    def repo_path(self, repository: str) -> str:
        return f"{self.namespace}/{repository}" if self.namespace else repository

    def image(self, repository: str, tag: str | None = None, digest: str | None = None) -> ImageRef:
        return ImageRef(self.host, self.repo_path(repository), tag, digest)

    def ref(self, repository: str, tag: str | None = None) -> str:
        return str(self.image(repository, tag))


@dataclass(frozen=True)
class ImageRef:
    host: str  # docker.io when the reference names no registry
    path: str  # namespace/name; library/NAME for docker.io's official images
    tag: str | None = None
    digest: str | None = None
    explicit_host: bool = True  # False when docker.io was implied

    @classmethod
    def parse(cls, text: str, *, flag: str = "image") -> ImageRef:
        first, sep, _ = (text or "").partition("/")
        explicit = bool(sep) and names_a_host(first)
        m = _IMAGE_RE.fullmatch(text or "" if explicit else f"{DOCKER_HUB}/{text or ''}")
        if not m:
            raise InputError(
                flag,
                text,
                "expected an image reference [HOST[:PORT]/]NAME[:TAG][@sha256:...]",
                "for example ghcr.io/my-org/mtp-verl:mtp-detach",
            )
        host, path = m.group("host"), m.group("path")
        if host == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        return cls(host, path, m.group("tag"), m.group("digest"), explicit)

    @property
    def repository(self) -> str:
        """HOST/PATH without tag or digest."""
        return f"{self.host}/{self.path}"

    @property
    def base_url(self) -> str:
        return base_url(self.host)

    def __str__(self) -> str:
        return (
            self.repository
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )

    def pinned(self, digest: str) -> ImageRef:
        """This repository at `digest` (the tag dropped: a digest names the image alone)."""
        return replace(self, tag=None, digest=digest)

    # -- how clusters name it ----------------------------------------------------------------
    def _enroot_name(self) -> str:
        """enroot/pyxis spell a registry `HOST#PATH`; docker.io is their default and goes
        unnamed (enroot would look for docker.io's API on docker.io itself)."""
        at = f"@{self.digest}" if self.digest else (f":{self.tag}" if self.tag else "")
        if self.host == DOCKER_HUB:
            return f"{self.path}{at}"
        return f"{self.host}#{self.path}{at}"

    @property
    def pyxis(self) -> str:
        """The value of srun --container-image=..."""
        return self._enroot_name()

    @property
    def docker_uri(self) -> str:
        """docker://HOST/PATH@DIGEST, as apptainer and skopeo take it."""
        return f"docker://{self}"

    def pull_strings(self) -> dict[str, str]:
        """The commands that pull exactly this image: docker, pyxis (srun), enroot, apptainer."""
        return {
            "docker": f"docker pull {self}",
            "pyxis": f"srun --container-image={self.pyxis}",
            "enroot": f"enroot import docker://{self._enroot_name()}",
            "apptainer": f"apptainer pull {self.docker_uri}",
        }
