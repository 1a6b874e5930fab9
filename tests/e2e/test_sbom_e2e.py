"""End to end: the main job pushes a test image to the session's registry (Debian's
distribution, no referrers API) and attaches its SBOM. Read back as a user would, with no
code of this tool: curl lists the tags and reads the artifact by its `sha256-<hex>.sbom`
tag (its `subject` is the image), the referrers tag's index lists it, its blob is CycloneDX
1.5 by the official schema, and oras (an OCI client) pulls the same bytes."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import uuid

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from tests.fixtures.image_fixtures import image_world, world_cli

pytestmark = pytest.mark.timeout(900)

PROFILE = "test-detach"
CDX = "application/vnd.cyclonedx+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    return image_world(docker_host, git_world, tmp_path_factory, "sbom")


def _curl(url: str, accept: str | None = None) -> bytes:
    argv = ["curl", "-fsS", "--max-time", "30", *(["-H", f"Accept: {accept}"] if accept else []), url]
    proc = subprocess.run(argv, capture_output=True, timeout=60)
    assert proc.returncode == 0, (url, proc.stderr.decode())
    return proc.stdout


def test_a_pushed_image_carries_its_sbom(world, tmp_path):
    host = world["host"].registry
    ns = f"mtp-sbom-{uuid.uuid4().hex[:8]}"
    summary = tmp_path / "ci" / "summary.json"
    first = world_cli(
        world, "--profile", PROFILE, "--push", "--registry", f"{host}/{ns}", "--summary-file", str(summary)
    )
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    base = f"http://{host}/v2/{ns}/mtp-verl"
    digest = json.loads(summary.read_text())["digest"]
    hexdigest = digest.split(":", 1)[1]

    # by the tag scheme: the repository's tags name it, the tag's manifest is the artifact
    tags = json.loads(_curl(f"{base}/tags/list"))["tags"]
    assert f"sha256-{hexdigest}.sbom" in tags and f"sha256-{hexdigest}" in tags, tags
    raw = _curl(f"{base}/manifests/sha256-{hexdigest}.sbom", OCI_MANIFEST)
    artifact = "sha256:" + hashlib.sha256(raw).hexdigest()
    manifest = json.loads(raw)
    assert manifest["artifactType"] == CDX
    assert manifest["subject"]["digest"] == digest  # the subject relation names the image
    image = _curl(f"{base}/manifests/{digest}", manifest["subject"]["mediaType"])
    assert manifest["subject"]["size"] == len(image)
    # ...and the referrers tag's index lists the artifact (what `oras discover` reads here)
    index = json.loads(_curl(f"{base}/manifests/sha256-{hexdigest}", OCI_INDEX))
    assert [(m["digest"], m["artifactType"]) for m in index["manifests"]] == [(artifact, CDX)]

    # the blob is the SBOM: valid CycloneDX, of this image, with the test stack's sources
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == CDX
    data = _curl(f"{base}/blobs/{layer['digest']}")
    assert "sha256:" + hashlib.sha256(data).hexdigest() == layer["digest"]
    error = JsonStrictValidator(SchemaVersion.V1_5).validate_str(data.decode())
    assert error is None, str(error)[:2000]
    doc = json.loads(data)
    identity = json.loads(summary.read_text())["references"][0].rsplit(":", 1)[1]
    assert doc["metadata"]["component"]["version"] == identity
    commits = {
        p["value"]
        for c in doc["components"]
        for p in c.get("properties", [])
        if p["name"].endswith(":git:commit")
    }
    assert commits and all(re.fullmatch(r"[0-9a-f]{40}", c) for c in commits)

    # what the run said, the summary and the file beside it
    ref = f"{host}/{ns}/mtp-verl:sha256-{hexdigest}.sbom@{artifact}"
    assert f"sbom    {ref}" in first.stdout
    assert json.loads(summary.read_text())["sbom"] == ref
    assert (summary.parent / f"{PROFILE}.sbom.cdx.json").read_bytes() == data

    # a standard OCI client pulls the same bytes
    import oras.client

    pulled = oras.client.OrasClient(hostname=host, insecure=True).pull(
        target=f"{host}/{ns}/mtp-verl:sha256-{hexdigest}.sbom", outdir=str(tmp_path / "oras")
    )
    assert [open(p, "rb").read() for p in pulled] == [data]

    # up to date: the SBOM already there stays, and the run names it
    again = world_cli(world, "--profile", PROFILE, "--push", "--registry", f"{host}/{ns}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "up to date" in again.stdout and f"sbom    {ref}" in again.stdout
