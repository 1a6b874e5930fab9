"""The base image's platform pin: which manifest of the pinned base the build really pulls.

The base is pinned by digest. For `nvidia/cuda` that digest names a multi-arch index, from
which the engine picks the manifest of the build platform (BUILD_PLATFORM); a single-platform
base (the test bases, the stand-in) is that manifest itself. `lock` records the platform
manifest's digest beside the index digest (lock.yaml `base_image.platform_digest`, and
`manifest: index | single-platform`); the Plan carries it into the version vector; `check`
and every build read the index again at its pinned digest and refuse a lock whose platform
digest is not the one the index lists (docs/platform-pin.md says when that can happen).

Read through the registry HTTP API (registryclient.py) of the base's own registry or, where
MTP_REGISTRY_MIRROR / --registry-mirror serves it, of the mirror the build pulls from. A
registry that cannot be asked leaves the platform digest unverified, and every line says so.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from mtpimage import netpolicy
from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.imageref import ImageRef, Registry
from mtpimage.mirrors import BuildMirrors, MirroredBase, RegistryMirror
from mtpimage.plan.model import BasePlatform, Plan
from mtpimage.publish.registryclient import (
    DigestMismatch,
    RegistryClient,
    RegistryHTTPError,
    RegistryUnreachable,
    transient,
)

# The platform every image is built for: the CPU the lock resolves wheels for (pydeps.PLATFORM,
# manylinux x86_64), as OCI image indexes name it. Its one home: lock, check, the build and the
# version vector all read it here.
BUILD_PLATFORM = "linux/amd64"

INDEX = "index"
SINGLE = "single-platform"
UNRECORDED = "unrecorded"  # the version vector's word where lock.yaml has no platform record

MAX_CONFIG = 4 << 20  # an image config is kilobytes; more is not one


def _os_arch(platform: dict | None) -> str:
    platform = platform or {}
    out = f"{platform.get('os', '?')}/{platform.get('architecture', '?')}"
    return out + (f"/{platform['variant']}" if platform.get("variant") else "")


def select(index: dict, platform: str = BUILD_PLATFORM) -> str | None:
    """The digest of `platform`'s manifest in an image index (OCI or Docker manifest list),
    as the engine picks it: os and architecture equal (a variant counts only where
    `platform` names one). None when the index lists none (attestations are unknown/unknown)."""
    want = platform.split("/")
    for entry in index.get("manifests") or []:
        got = _os_arch(entry.get("platform")).split("/")
        if got[:2] == want[:2] and (len(want) < 3 or got[2:3] == want[2:3]):
            return entry.get("digest")
    return None


@dataclass(frozen=True)
class Resolved:
    """What the registry says the pinned base is, for the build platform."""

    manifest: str  # INDEX or SINGLE
    platform_digest: str  # the manifest the build pulls (a single-platform base's own digest)
    source: str  # where it was read: the registry, or "the registry mirror HOST"

    def as_plan(self) -> BasePlatform:
        return BasePlatform(BUILD_PLATFORM, self.manifest, self.platform_digest)


class BaseNotServed(EnvironmentProblem):
    """The registry answered, and what it answered cannot be the pinned base."""


@dataclass(frozen=True)
class _Where:
    """Where the build pulls the base from: its own registry, or a registry mirror."""

    image: str  # the base as the plan names it
    ref: ImageRef  # what is pulled: the mirror's reference where a mirror serves it
    mirror: RegistryMirror | None

    @property
    def source(self) -> str:
        return f"the registry mirror {self.mirror.host}" if self.mirror else f"registry {self.ref.host}"

    def refuse(self, why: str, fix: str) -> BaseNotServed:
        """One line: through a mirror in the mirror's own words (the setting, its location, its
        fix, as the engine says a pull from it failed), else naming the registry."""
        if self.mirror is not None:
            return BaseNotServed(MirroredBase(self.image, str(self.ref), self.mirror).failed(why).args[0])
        return BaseNotServed(f"base image {self.image}: {self.source} {why} (fix: {fix})")


def _where(image: str, mirrors: BuildMirrors | None) -> _Where:
    mirrored = (mirrors or BuildMirrors()).base(image)
    if mirrored is not None:
        ref, mirror = mirrored
        return _Where(image, ImageRef.parse(ref, flag="base image"), mirror)
    return _Where(image, ImageRef.parse(image, flag="base image"), None)


def _client(host: str):
    return RegistryClient(Registry(host, ""))


def resolve(
    image: str,
    mirrors: BuildMirrors | None = None,
    platform: str = BUILD_PLATFORM,
    client_for: Callable[[str], object] | None = None,
) -> Resolved:
    """Read the base `image` (NAME:TAG@sha256:...) at its pinned digest and find `platform`'s
    manifest. Raises RegistryUnreachable / RegistryHTTPError when the registry cannot be asked
    (the caller says "unverified"), BaseNotServed when its answer cannot be the pinned base,
    InputError when the base has no image for `platform`."""
    where = _where(image, mirrors)
    ref, digest = where.ref, where.ref.digest

    client = (client_for or _client)(ref.host)
    try:
        got = client.manifest(ref.path, digest)
    except DigestMismatch as exc:  # the client's own check; said here with the base's context
        if exc.source != DigestMismatch.ASKED:
            raise
        got = (b"", exc.computed)
    copy_all = "copy the base with every manifest of its index (e.g. `skopeo copy --all`)"
    if got is None:
        raise where.refuse(f"has no manifest {digest}", f"{copy_all}, or pin a digest it serves")
    body, served = got
    if served != digest:
        raise where.refuse(
            f"answered the pinned digest {digest} with other bytes (sha256 {served}): not the pinned base",
            "use a registry or mirror that serves the pinned bytes; a pull would fail on them too",
        )
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not (isinstance(doc.get("manifests"), list) or doc.get("config")):
        raise where.refuse("served neither an image index nor an image manifest", "check the registry")
    if isinstance(doc.get("manifests"), list):
        chosen = select(doc, platform)
        if chosen is None:
            listed = ", ".join(sorted({_os_arch(e.get("platform")) for e in doc["manifests"]})) or "nothing"
            raise InputError(
                "base image",
                image,
                f"its index lists no {platform} image (it lists {listed})",
                f"pin a base that is built for {platform}",
            )
        # the platform's own manifest must be there too (a partial copy of the index is not)
        if client.manifest_digest(ref.path, chosen) is None:
            raise where.refuse(
                f"lists {platform} as {chosen} in the index but has no such manifest", copy_all
            )
        return Resolved(INDEX, chosen, where.source)
    arch = _config_platform(client, where, (doc.get("config") or {}).get("digest") or "")
    if arch.split("/")[:2] != platform.split("/")[:2]:
        raise InputError(
            "base image",
            image,
            f"it is a single-platform image for {arch}, not {platform}",
            f"pin a base that is built for {platform}",
        )
    return Resolved(SINGLE, digest, where.source)


def _config_platform(client, where: _Where, config: str) -> str:
    """os/architecture of a single-platform image, from its config blob (the manifest does
    not say; the config does, and its digest is checked here)."""
    with tempfile.TemporaryFile() as f:
        got, size = client.fetch_blob(where.ref.path, config, f, MAX_CONFIG)
        if got != config or size > MAX_CONFIG:
            raise where.refuse(f"served a config that does not match {config}", "check the registry")
        f.seek(0)
        try:
            doc = json.loads(f.read())
        except ValueError:
            doc = {}
    return _os_arch(doc if isinstance(doc, dict) else {})


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` means "the registry could not be asked" (the answer is unverified),
    not "it answered no"."""
    return isinstance(exc, RegistryUnreachable | RegistryHTTPError)


def reason(exc: BaseException) -> str:
    if isinstance(exc, RegistryUnreachable):
        return f"cannot be reached: {exc.reason}"
    return " ".join(str(exc).split("(fix:")[0].split())


# ----------------------------------------------------------------------------- the check
def short(image: str) -> str:
    """NAME:TAG@sha256:<12 hex>, for lines that name a base beside other text."""
    name, at, digest = image.partition("@")
    return f"{name}{at}{digest[:19]}" if at else name


@dataclass(frozen=True)
class Verdict:
    """What `check` and a build say about the base's platform manifest."""

    image: str  # the base, NAME:TAG@sha256:...
    status: str  # verified | unrecorded | unverified | unpinned
    detail: str

    @property
    def verified(self) -> bool:
        return self.status == "verified"

    @property
    def line(self) -> str:
        """`NAME:TAG@sha256:<12 hex>: <detail>`; callers put `base image ` or `base    ` before it."""
        return f"{short(self.image)}: {self.detail}"

    def to_dict(self) -> dict:
        return {"image": self.image, "status": self.status, "detail": self.detail}


def verify(
    plan: Plan,
    lock_where: str,
    relock: str,
    mirrors: BuildMirrors | None = None,
    client_for: Callable[[str], object] | None = None,
) -> Verdict:
    """Read the plan's base again at its pinned digest and compare the platform manifest with
    the one lock.yaml recorded (the Plan carries it: plan.base_platform). A different one is
    refused (InputError naming `lock_where`'s field and the fix `relock`); a registry that
    cannot be asked gives "unverified", never a pass."""
    if not plan.base_digest:
        return Verdict(plan.base_image, "unpinned", "no digest: no platform manifest to check")
    recorded = plan.base_platform
    # the manifest the build pulls is the plan's platform's (builds.platform, issue 49)
    platform = plan.platform
    try:
        got = resolve(plan.base_image, mirrors, platform, client_for)
    except Exception as exc:
        if not unreachable(exc):
            raise
        source = _where(plan.base_image, mirrors).source
        kept = f"lock.yaml's {recorded.digest} " if recorded is not None else ""
        return Verdict(
            plan.base_image,
            "unverified",
            f"{platform} manifest {kept}unverified: {source} {reason(exc)}",
        )
    if recorded is None:
        why = (
            "a substituted base is not locked"
            if any(w == "base_image" for w, _d in plan.substitutions)
            else f"not recorded in {lock_where} (fix: `{relock}` where the registry answers)"
        )
        return Verdict(
            plan.base_image,
            "unrecorded",
            f"{platform} manifest {got.platform_digest} ({got.manifest}, read from {got.source}): {why}",
        )
    if (recorded.manifest, recorded.digest) != (got.manifest, got.platform_digest):
        raise InputError(
            lock_where,
            "base_image.platform_digest",
            f"records {recorded.digest} ({recorded.manifest}) as the {platform} manifest of "
            f"{plan.base_image}, but {got.source} lists {got.platform_digest} ({got.manifest}) at "
            "that pinned digest: the lock was edited or merged by hand, or made from another base",
            f"run `{relock}` and review the diff",
        )
    return Verdict(
        plan.base_image,
        "verified",
        f"{platform} manifest {got.platform_digest} ({got.manifest}): verified in "
        f"{got.source}, as {lock_where} records",
    )


# ----------------------------------------------------------------------------- lock
def lock_entry(image: str, previous: dict | None, mirrors: BuildMirrors | None = None, client_for=None):
    """(lock.yaml's platform fields for the base `image`, a line for the unverified list or
    None). Unreachable: the previous lock's record of the same pinned base is kept, marked
    unverified; without one, none is recorded."""
    ref = ImageRef.parse(image, flag="base image")
    if not ref.digest:
        why = "no digest pinned: no platform manifest to record"
        return {"platform": BUILD_PLATFORM, "verified": False, "reason": why}, why
    try:
        got = netpolicy.retrying(transient)(resolve, image, mirrors, BUILD_PLATFORM, client_for)
    except Exception as exc:
        if not unreachable(exc):
            raise
        why = f"{_where(image, mirrors).source} {reason(exc)}"
        entry: dict = {"platform": BUILD_PLATFORM}
        prev = previous or {}
        if prev.get("digest") == ref.digest and prev.get("platform_digest"):
            entry.update(manifest=prev.get("manifest"), platform_digest=prev["platform_digest"])
            why += "; platform_digest kept as the previous lock recorded it, not read again"
        else:
            why += "; no platform manifest digest recorded (lock again where the registry answers)"
        entry.update(verified=False, reason=why)
        return entry, f"{BUILD_PLATFORM} manifest not verified: {why}"
    return {
        "platform": BUILD_PLATFORM,
        "manifest": got.manifest,
        "platform_digest": got.platform_digest,
        "verified": True,
    }, None


def from_lock(entry: dict | None) -> BasePlatform | None:
    """The Plan's record of a lock.yaml `base_image` entry, or None when it records none."""
    entry = entry or {}
    if not entry.get("platform_digest") or entry.get("manifest") not in (INDEX, SINGLE):
        return None
    return BasePlatform(
        str(entry.get("platform") or BUILD_PLATFORM), entry["manifest"], entry["platform_digest"]
    )


def tag_moved(image: str, mirrors: BuildMirrors | None = None, client_for=None) -> str | None:
    """A note when the pinned base's tag now names another digest (a rebuilt upstream image):
    the pin stays what it is; None when the tag still names it or cannot be asked."""
    where = _where(image, mirrors)
    ref, source = where.ref, where.source
    tagged = ImageRef.parse(image, flag="base image")
    if not tagged.tag or not ref.digest:
        return None
    try:
        now = (client_for or _client)(ref.host).manifest_digest(ref.path, tagged.tag)
    except Exception as exc:
        if unreachable(exc):
            return None
        raise
    if now is None or now == ref.digest:
        return None
    return (
        f"base image {tagged.repository}:{tagged.tag} now names {now} in {source}; the pin stays "
        f"{ref.digest} (to move it, edit platform.base_image.digest in components.yaml and lock)"
    )
