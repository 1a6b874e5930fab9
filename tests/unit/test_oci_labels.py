"""OCI labels (issue 13 item 12): `version` is the packaged software's version (verl's), not the
tag; `source`/`revision` say where the image's definition lives (this project), verl's origin
stays in the project's namespace; `created` only from SOURCE_DATE_EPOCH; none of the build-time
labels is in the rendered Dockerfile, so the identity does not move with them."""

from __future__ import annotations

from mtpimage.assembly import versionvector
from mtpimage.assembly.render import render
from mtpimage.cli import plan_for
from mtpimage.manifests import manifest
from tests.unit.helpers import pin


def test_static_labels_name_the_packaged_software_and_keep_verl_in_the_namespace():
    m = manifest.load()
    labels = versionvector.labels(plan_for(m, "mtp-detach", None), "mtp-verl")
    assert labels["org.opencontainers.image.version"] == pin("verl", "version")
    assert (
        "org.opencontainers.image.source" not in labels and "org.opencontainers.image.revision" not in labels
    )
    assert labels["io.mtp-image-builder.verl.revision"] == pin("verl")
    assert labels["org.opencontainers.image.licenses"]


def test_build_time_labels(monkeypatch):
    monkeypatch.setenv("MTP_PROJECT_URL", "https://git.example/org/mtp-image-builder")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    out = versionvector.identity_labels("mtp-detach-0123456789ab")
    assert out["org.opencontainers.image.source"] == "https://git.example/org/mtp-image-builder"
    assert len(out.get("org.opencontainers.image.revision", "")) == 40
    assert "org.opencontainers.image.created" not in out  # no clock without SOURCE_DATE_EPOCH
    assert "org.opencontainers.image.version" not in out  # not the tag
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764460800")
    assert versionvector.identity_labels("x")["org.opencontainers.image.created"] == "2025-11-30T00:00:00Z"
    monkeypatch.delenv("MTP_PROJECT_URL")
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    assert "org.opencontainers.image.source" not in versionvector.identity_labels(
        "x"
    )  # none known: none said


def test_build_time_labels_do_not_change_the_identity(monkeypatch):
    m = manifest.load()
    plan = plan_for(m, "mtp-detach", None)
    a = render(plan, m.root).identity
    monkeypatch.setenv("MTP_PROJECT_URL", "https://git.example/other")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1")
    assert render(plan, m.root).identity == a
