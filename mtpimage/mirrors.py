"""A site's mirrors of the package indexes and of the base image's registry, in one place.

Air-gapped sites reach PyPI and Docker Hub only through mirrors. Every file the image
installs is pinned by sha256 and the base by its digest, so a mirror changes where the bytes
come from, never which bytes: it is a build-time input, like the CA bundle, and stays out of
everything that names the image (the rendered files, the identity, the version vector, the
compiled extensions' wheel keys, labels and layers).

    MTP_INDEX_REWRITE    `FROM=TO` pairs (spaces or `;` between them), the longest FROM that
                         starts a URL wins: the index URLs of lock.yaml and of the rendered
                         Dockerfile stay the manifests' own. `lock` and every host-side
                         download rewrite through `index_url()`; a build gets, as the BuildKit
                         secret `index-mirrors` (INDEX_SECRET), the exact table of the plan's
                         index URLs and their mirrors (BuildMirrors.secret), which
                         images/lib/mtp_pip.py applies to pip's command lines inside the step.
    MTP_REGISTRY_MIRROR  `REGISTRY=HOST[:PORT][/PREFIX]` pairs (flag: --registry-mirror, which
                         wins): a base image of REGISTRY is pulled by its digest from
                         HOST[:PORT]/PREFIX/<its path>@sha256:... and the engine builds FROM
                         that reference in the build context it sends, never in the rendered
                         Dockerfile (engine/containerengine.py mirrored_dockerfile).

Credentials may sit in a mirror URL (`https://user:token@host/simple`); `redact()` (errors.py's,
imported here) takes them out of every line the tool prints or logs, and the build steps'
own output too.
Settings are read by settings.py; this module only parses and applies them (no network).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from mtpimage import settings
from mtpimage.errors import EnvironmentProblem, InputError, last_words, redact
from mtpimage.imageref import DOCKER_HUB, ImageRef, Registry, is_loopback, names_a_host

INDEX_SETTING = "MTP_INDEX_REWRITE"
REGISTRY_SETTING = "MTP_REGISTRY_MIRROR"
REGISTRY_FLAG = "--registry-mirror"
# the BuildKit secret that carries the index table into a build step (images/lib/mtp_pip.py
# reads it at /run/secrets/<id>; the templates mount it in every step that runs pip)
INDEX_SECRET = "index-mirrors"


def split_pairs(text: str) -> list[str]:
    """`A=B;C=D E=F` -> ['A=B', 'C=D', 'E=F']: the list form of both settings."""
    return [p for p in re.split(r"[;\s]+", text or "") if p]


@dataclass(frozen=True)
class IndexMirror:
    origin: str  # a URL prefix as the manifests write it (https://pypi.org/simple)
    mirror: str  # what replaces that prefix (https://pypi.mirror.example/simple)


@dataclass(frozen=True)
class RegistryMirror:
    registry: str  # the registry the references name (docker.io, nvcr.io, 127.0.0.1:5000)
    host: str  # where its images are pulled from instead: HOST[:PORT]
    prefix: str = ""  # a path in front of the image's own (a pull-through cache's project)

    def ref(self, image_ref: str) -> str | None:
        """The mirror's reference of `image_ref` by its digest, or None when it names another
        registry. A reference without a digest is refused: only a digest makes the mirror's
        bytes the ones the plan pinned."""
        parsed = ImageRef.parse(image_ref, flag="base image")
        if _registry_name(parsed.host) != self.registry:
            return None
        if not parsed.digest:
            raise InputError(
                REGISTRY_SETTING,
                f"{self.registry}={self.location}",
                f"{image_ref} names no digest: a mirror serves a base only by its digest",
                "pin the base by digest (platform.base_image.digest, or --substitute-base NAME:TAG@sha256:...)",
            )
        path = f"{self.prefix}/{parsed.path}" if self.prefix else parsed.path
        return f"{self.host}/{path}@{parsed.digest}"

    @property
    def location(self) -> str:
        return f"{self.host}/{self.prefix}" if self.prefix else self.host


def _registry_name(host: str) -> str:
    return DOCKER_HUB if host in (DOCKER_HUB, "index.docker.io", "registry-1.docker.io") else host


def parse_index(text: str) -> tuple[IndexMirror, ...]:
    out = []
    for pair in split_pairs(text):
        origin, eq, mirror = pair.partition("=")
        if not eq or not origin or not mirror:
            raise InputError(
                INDEX_SETTING,
                redact(pair),
                "expected FROM=TO",
                "for example https://pypi.org/simple=https://pypi.mirror.example/simple",
            )
        out.append(IndexMirror(origin, mirror))
    return tuple(out)


def parse_registry(values, where: str = REGISTRY_SETTING) -> tuple[RegistryMirror, ...]:
    """`REGISTRY=HOST[:PORT][/PREFIX]` pairs (a text of the setting, or the flag's values)."""
    pairs = split_pairs(values) if isinstance(values, str) else [p for v in values for p in split_pairs(v)]
    out: dict[str, RegistryMirror] = {}
    for pair in pairs:
        registry, eq, location = pair.partition("=")
        registry = registry.rstrip("/")
        if not eq or not names_a_host(registry) or "/" in registry:
            raise InputError(
                where,
                pair,
                "expected REGISTRY=HOST[:PORT][/PREFIX]",
                "for example docker.io=registry.mirror.example:5000/dockerhub",
            )
        reg = Registry.parse(location, flag=where)
        out[_registry_name(registry)] = RegistryMirror(_registry_name(registry), reg.host, reg.namespace)
    return tuple(out.values())


@dataclass(frozen=True)
class BuildMirrors:
    """What one build gets: the exact index table of its plan and the registry mirrors its
    FROM lines may use. Empty (the default): the build reaches the manifests' own hosts."""

    indexes: tuple[tuple[str, str], ...] = ()  # (index URL as rendered, the mirror's URL)
    registries: tuple[RegistryMirror, ...] = ()

    def secret(self) -> bytes:
        """The `index-mirrors` secret's bytes (empty when no index is mirrored)."""
        if not self.indexes:
            return b""
        return (json.dumps(dict(self.indexes), indent=2, sort_keys=True) + "\n").encode()

    def base(self, image_ref: str) -> tuple[str, RegistryMirror] | None:
        """(the mirror's reference, its mirror) for a base image the mirrors serve, or None."""
        for m in self.registries:
            ref = m.ref(image_ref)
            if ref is not None:
                return ref, m
        return None

    @property
    def loopback_index(self) -> bool:
        """Whether a mirrored index is on this machine's loopback (a local proxying cache):
        build steps then need the host's network to reach it."""
        from urllib.parse import urlsplit

        return any(is_loopback(urlsplit(url).hostname or "") for _o, url in self.indexes)

    def describe(self) -> str | None:
        """The `mirrors` line of a build (credentials redacted), or None when there are none."""
        parts = [f"{o} -> {redact(u)}" for o, u in self.indexes]
        parts += [f"{m.registry} -> {m.location}" for m in self.registries]
        return "; ".join(parts) or None


@dataclass(frozen=True)
class MirroredBase:
    ref: str  # as the rendered Dockerfile names it
    mirror_ref: str  # what the build pulls and starts FROM: the mirror's, by digest
    mirror: RegistryMirror

    def failed(self, why: str) -> EnvironmentProblem:
        """The one line for a base the mirror could not give."""
        return EnvironmentProblem(
            f"base image {self.ref} through its registry mirror ({REGISTRY_SETTING} / --registry-mirror "
            f"{self.mirror.registry}={self.mirror.location}): {self.mirror_ref} could not be pulled: "
            f"{last_words(why, 300)} (fix: make the mirror serve {self.mirror.registry}'s image by "
            f"its digest at {self.mirror.location}, e.g. push or proxy it there, or correct the setting)"
        )


@dataclass(frozen=True)
class Mirrors:
    """The configured mirrors: MTP_INDEX_REWRITE, and --registry-mirror or MTP_REGISTRY_MIRROR."""

    indexes: tuple[IndexMirror, ...] = ()
    registries: tuple[RegistryMirror, ...] = field(default=())

    @classmethod
    def configured(cls, registry_flags=None) -> Mirrors:
        """The mirrors of this run: the flag's values win over the variable, as every flag
        does over its variable."""
        s = settings.current()
        if registry_flags:
            registries = parse_registry(registry_flags, REGISTRY_FLAG)
        else:
            registries = parse_registry(s.get(REGISTRY_SETTING))
        return cls(parse_index(s.get(INDEX_SETTING)), registries)

    def index_url(self, url: str) -> str:
        """Where a URL of the manifests (an index, or a file on it) is fetched from: the
        mirror of the longest FROM that starts it, else the URL itself."""
        for m in sorted(self.indexes, key=lambda m: -len(m.origin)):
            if url.startswith(m.origin):
                return m.mirror + url[len(m.origin) :]
        return url

    def for_build(self, index_urls) -> BuildMirrors:
        """The table a build of a plan with these index URLs gets (each mirrored one)."""
        table = {u: self.index_url(u) for u in index_urls}
        return BuildMirrors(
            tuple(sorted((u, m) for u, m in table.items() if m != u)),
            self.registries,
        )


def current() -> Mirrors:
    """The mirrors the environment configures (no flag)."""
    return Mirrors.configured()


def index_url(url: str) -> str:
    """`url` through MTP_INDEX_REWRITE (lock, index probes, host-side downloads)."""
    return current().index_url(url)
