"""Attaching the SBOM (sbom.py) to a pushed image in its registry, as OCI 1.1 describes it.

The SBOM is an OCI artifact in the image's own repository:
    manifest  application/vnd.oci.image.manifest.v1+json, artifactType MEDIA_TYPE,
              `subject` = the image manifest (the referrers relation)
    config    the empty descriptor (application/vnd.oci.empty.v1+json, `{}`)
    layer     the CycloneDX JSON (MEDIA_TYPE), titled `<profile>.sbom.cdx.json`
tagged `sha256-<image digest hex>.sbom`: the tag scheme cosign and oras read when a registry
has no referrers API. Where the registry lacks that API (Debian's distribution 2.8 does), the
artifact is also listed in the OCI referrers tag `sha256-<image digest hex>` (an image index
of the image's referrers, OCI distribution spec 1.1), which `oras discover` reads there; a
registry with the API indexes the `subject` itself. Every request goes through registryclient's
one client and retries under the network policy.
"""

from __future__ import annotations

import hashlib
import json

from mtpimage import netpolicy
from mtpimage.errors import EnvironmentProblem
from mtpimage.publish.registryclient import RegistryClient, transient

MEDIA_TYPE = "application/vnd.cyclonedx+json"  # IANA-registered for CycloneDX JSON

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"  # OCI 1.1's empty config for artifacts
TITLE = "org.opencontainers.image.title"


def _net(fn, *args):
    return netpolicy.retrying(transient)(fn, *args)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sbom_tag(image_digest: str) -> str:
    """`sha256:HEX` -> `sha256-HEX.sbom` (cosign's and oras' tag for an image's SBOM)."""
    return image_digest.replace(":", "-", 1) + ".sbom"


def referrers_tag(image_digest: str) -> str:
    """`sha256:HEX` -> `sha256-HEX`: the OCI referrers tag schema's index."""
    return image_digest.replace(":", "-", 1)


def artifact_manifest(sbom: bytes, subject: dict, title: str) -> bytes:
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": MEDIA_TYPE,
        "config": {"mediaType": EMPTY_TYPE, "digest": _sha(EMPTY), "size": len(EMPTY), "data": "e30="},
        "layers": [
            {"mediaType": MEDIA_TYPE, "digest": _sha(sbom), "size": len(sbom), "annotations": {TITLE: title}}
        ],
        "subject": subject,
    }
    return json.dumps(manifest, indent=2, sort_keys=True).encode()


def attached(client: RegistryClient, repository: str, image_digest: str) -> str | None:
    """The digest of the SBOM artifact tagged for this image, or None."""
    return _net(client.manifest_digest, repository, sbom_tag(image_digest))


def attach(client: RegistryClient, repository: str, image_digest: str, sbom: bytes, title: str) -> str:
    """Push `sbom` as the artifact whose subject is `repository@image_digest`; -> REF@DIGEST of
    the artifact (REF: its `.sbom` tag). Blobs already there are not sent again."""
    got = _net(client.manifest, repository, image_digest)
    if got is None:
        raise EnvironmentProblem(
            f"{client.registry.ref(repository)}@{image_digest} is not in the registry, so no SBOM "
            "can name it as its subject (fix: push the image first)"
        )
    body, digest = got
    media_type = json.loads(body).get("mediaType") or OCI_MANIFEST
    subject = {"mediaType": media_type, "digest": digest, "size": len(body)}
    for blob in (EMPTY, sbom):
        if not _net(client.blob_exists, repository, _sha(blob)):
            _net(client.upload_blob, repository, _sha(blob), blob)
    manifest = artifact_manifest(sbom, subject, title)
    tag = sbom_tag(image_digest)
    artifact = _net(client.put_manifest, repository, tag, manifest, OCI_MANIFEST)
    if _net(client.referrers, repository, image_digest) is None:
        _list_in_referrers_tag(client, repository, image_digest, artifact, len(manifest))
    return f"{client.registry.ref(repository, tag)}@{artifact}"


def _list_in_referrers_tag(client, repository: str, image_digest: str, artifact: str, size: int) -> None:
    """Add the artifact to the image's referrers index (the tag schema), keeping the other
    referrers (signatures, attestations) that index lists."""
    tag = referrers_tag(image_digest)
    got = _net(client.manifest, repository, tag, OCI_INDEX)
    index = json.loads(got[0]) if got else {}
    if not (isinstance(index, dict) and index.get("mediaType") == OCI_INDEX):
        index = {}  # not an index (or none yet): start one
    others = [m for m in index.get("manifests") or [] if isinstance(m, dict) and m.get("digest") != artifact]
    mine = {"mediaType": OCI_MANIFEST, "digest": artifact, "size": size, "artifactType": MEDIA_TYPE}
    body = json.dumps(
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*others, mine]}, indent=2, sort_keys=True
    ).encode()
    if got is None or got[0] != body:
        _net(client.put_manifest, repository, tag, body, OCI_INDEX)


def detach(client: RegistryClient, repository: str, image_digest: str, artifact: str) -> None:
    """Remove an SBOM artifact this run attached (a failed push's roll-back: its image is
    gone, so its tags would name nothing): the artifact, and its entry in the referrers tag.
    Best effort: never raises (the push's own error matters)."""
    try:
        client.delete_manifest(repository, artifact)
        got = client.manifest(repository, referrers_tag(image_digest), OCI_INDEX)
        if got is None:
            return
        index = json.loads(got[0])
        rest = [
            m for m in index.get("manifests") or [] if isinstance(m, dict) and m.get("digest") != artifact
        ]
        if not rest:
            client.delete_manifest(repository, got[1])
        elif len(rest) != len(index.get("manifests") or []):
            body = json.dumps({**index, "manifests": rest}, indent=2, sort_keys=True).encode()
            client.put_manifest(repository, referrers_tag(image_digest), body, OCI_INDEX)
    except Exception:  # noqa: BLE001 - best effort; the original error matters
        pass
