"""One multi-arch image index over the platforms' published images (issue 49 item 3).

Each platform's publish job pushes its own image (the content tag of its plan, whose
builds.platform is in the identity); the index job then reads each image back from the
registry, checks what it is from its bytes (the manifest's digest is the sha256 of the bytes
served, never a header; the config's os/architecture is the platform's), and puts one OCI image
index that lists them under the profile's tag. The index is canonical JSON with its entries in
platform order, so the same images give the same bytes, hence the same digest, wherever and
however often it is made (`docker buildx imagetools create` and `buildah manifest` write their
own field order and annotations, so their digests are theirs).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.publish import digests
from mtpimage.publish.baseplatform import select
from mtpimage.publish.registryclient import RegistryClient

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MAX_CONFIG = 4 << 20  # an image config is kilobytes; more is not one
INDEX_TYPES = (OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")


@dataclass(frozen=True)
class Member:
    """One platform's image as the index lists it (read from the registry, checked)."""

    platform: str  # os/architecture
    digest: str  # the sha256 of its manifest's bytes
    size: int
    media_type: str

    def entry(self) -> dict:
        os_name, arch = self.platform.split("/", 1)
        return {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
            "platform": {"architecture": arch, "os": os_name},
        }


def _json(body: bytes, what: str) -> dict:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise EnvironmentProblem(f"{what} is not a JSON object (fix: push the image again)")
    return doc


def member(client: RegistryClient, repository: str, reference: str, platform: str) -> Member:
    """The image `repository:reference` (a tag or digest) for `platform`: its manifest's bytes
    and digest, and its config's os/architecture, which must be `platform`'s."""
    named = client.registry.ref(repository) + ("@" if ":" in reference else ":") + reference
    got = client.manifest(repository, reference)
    if got is None:
        raise InputError(
            "--platform",
            platform,
            f"{named} is not in the registry",
            "run that platform's publish job first (the main job with --set builds.platform="
            f"{platform} --push)",
        )
    body, digest = got
    manifest = _json(body, f"manifest {named}")
    if "layers" not in manifest or not isinstance(manifest.get("config"), dict):
        raise EnvironmentProblem(f"{named} ({digest}) is not one image (an index?): an index lists images")
    config_digest = digests.checked(manifest["config"].get("digest"), f"{named}: its config digest")
    out = io.BytesIO()
    served, _ = client.fetch_blob(repository, config_digest, out, MAX_CONFIG)
    if served != config_digest:
        raise EnvironmentProblem(
            f"registry {client.host} served {served} for the config {config_digest} of {named}"
        )
    config = _json(out.getvalue(), f"the config of {named}")
    got_platform = f"{config.get('os', '?')}/{config.get('architecture', '?')}"
    if got_platform != platform:
        raise EnvironmentProblem(
            f"{named} ({digest}) is a {got_platform} image, not {platform} "
            "(fix: publish the image built with builds.platform=" + platform + ")"
        )
    return Member(platform, digest, len(body), manifest.get("mediaType") or OCI_MANIFEST)


def canonical(obj) -> bytes:
    """Sorted keys, no spaces: the one serialisation (as engine/ocilayout.py writes manifests)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def index_bytes(members: list[Member]) -> bytes:
    """The index: canonical JSON, entries in platform order (the same members, the same bytes)."""
    platforms = [m.platform for m in members]
    if len(set(platforms)) != len(platforms):
        raise InputError("--platform", " ".join(platforms), "a platform is named twice", "name each once")
    entries = [m.entry() for m in sorted(members, key=lambda m: m.platform)]
    return canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})


def publish(client: RegistryClient, repository: str, tag: str, members: list[Member]) -> str:
    """PUT the index under `tag`, then read it back: the registry must serve these bytes
    (their digest is the index's). Returns the digest."""
    body = index_bytes(members)
    digest = client.put_manifest(repository, tag, body, OCI_INDEX)
    got = client.manifest(repository, tag)
    if got is None or got[1] != digest:
        raise EnvironmentProblem(
            f"{client.registry.ref(repository)}:{tag} names {got[1] if got else 'nothing'} after the "
            f"index {digest} was pushed (another push moved it meanwhile? fix: run the index job again)"
        )
    return digest


def platforms_of(body: bytes) -> dict[str, str] | None:
    """{os/architecture: manifest digest} of an index's bytes, or None when they are one image.
    Every digest checked (digests.checked) before it is used."""
    doc = _json(body, "a manifest")
    if "manifests" not in doc or doc.get("mediaType", OCI_INDEX) not in INDEX_TYPES:
        return None
    out = {}
    for i, entry in enumerate(doc.get("manifests") or [], 1):
        p = (entry or {}).get("platform") or {}
        key = f"{p.get('os', '?')}/{p.get('architecture', '?')}"
        if key == "unknown/unknown":  # an attestation, not an image
            continue
        out[key] = digests.checked((entry or {}).get("digest"), f"index entry {i}")
    return out


def lists(client: RegistryClient, repository: str, tag: str, platform: str, digest: str) -> bool:
    """Whether `repository:tag` is an index whose `platform` entry is `digest` (the profile's
    tag after the index job: each platform's image is up to date under it)."""
    got = client.manifest(repository, tag)
    if got is None:
        return False
    doc = _json(got[0], f"{client.registry.ref(repository)}:{tag}")
    return "manifests" in doc and select(doc, platform) == digest
