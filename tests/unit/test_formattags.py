"""The registry tags per layer format (assembly/formattags.py, issue 48)."""

from __future__ import annotations

import json
import re

from mtpimage.assembly import formattags
from mtpimage.engine import layercompress
from mtpimage.schemas import __path__ as schemas_path

IDENTITY = "0123456789abcdef0123"


def test_the_default_format_has_the_plain_tags_every_client_reads():
    t = formattags.for_format(IDENTITY, "mtp-detach", None)
    assert (t.content, t.profile, t.format) == (IDENTITY, "mtp-detach", layercompress.default_name())
    assert formattags.for_format(IDENTITY, "mtp-detach", "gzip") == t


def test_every_other_format_has_its_own_tags_that_no_profile_or_image_can_have():
    name = json.loads(open(f"{schemas_path[0]}/profile.v1.json").read())["$defs"]["name"]["pattern"]
    seen = set()
    for fmt in layercompress.formats():
        t = formattags.for_format(IDENTITY, "mtp-detach", fmt)
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", t.content)  # a valid tag
        if fmt != layercompress.default_name():
            assert t.content == f"{IDENTITY}.{fmt}" and t.profile == f"mtp-detach.{fmt}"
            assert not re.fullmatch(name, t.profile)  # no profile is called this
        seen.add((t.content, t.profile))
    assert len(seen) == len(layercompress.formats())


def test_stale_format_names_only_layers_this_tool_wrote_in_another_format():
    def manifest(media: str) -> dict:
        return {"layers": [{"mediaType": media}, {"mediaType": media}]}

    oci = {c.name: c.media_type for c in layercompress.formats().values()}
    assert formattags.stale_format(manifest(oci["none"]), "gzip") == "none"
    assert formattags.stale_format(manifest(oci["gzip"]), "gzip") is None
    assert formattags.stale_format(manifest(oci["gzip"]), "zstd") == "gzip"
    docker_gzip = "application/vnd.docker.image.rootfs.diff.tar.gzip"  # the docker engine's push
    assert formattags.stale_format(manifest(docker_gzip), "gzip") is None


def test_the_schemas_formats_are_compression_yamls():
    """One home for the formats: the manifest field's enum (both schemas) lists exactly
    compression.yaml's formats."""
    for schema, path in (
        ("profile.v1.json", ("properties", "builds", "properties", "compression", "enum")),
        ("components.v1.json", ("properties", "builds", "properties", "compression", "enum")),
    ):
        node = json.loads(open(f"{schemas_path[0]}/{schema}").read())
        for key in path:
            node = node[key]
        assert sorted(node) == sorted(layercompress.formats()), schema


class _Client:
    """The registry calls release.publish makes: the content tag names an uncompressed image
    of the same content (`old`); a push moves a tag to `new` unless `fail`."""

    def __init__(self, old: str):
        self.tags = {IDENTITY: old}
        self.deleted: list[str] = []

    def manifest_digest(self, repository, tag):
        return self.tags.get(tag)

    def manifest(self, repository, tag, check_header=True):
        return (b"{}", self.tags[tag]) if tag in self.tags else None

    def delete_manifest(self, repository, digest):
        self.deleted.append(digest)


class _Engine:
    def tag(self, src, ref):
        pass

    def image_id(self, ref):
        return None

    def untag(self, ref):
        pass


def test_replace_pushes_over_another_format_and_never_deletes_it_on_a_roll_back(monkeypatch):
    import pytest

    from mtpimage.assembly import release
    from mtpimage.errors import EnvironmentProblem
    from mtpimage.imageref import Registry

    old, new = "sha256:" + "0" * 64, "sha256:" + "1" * 64
    reg = Registry.parse("127.0.0.1:5000/ns")
    pushed: list[str] = []

    def push(eng, ref, say=print):
        pushed.append(ref)
        client.tags[ref.rsplit(":", 1)[1]] = new

    monkeypatch.setattr(release, "push", push)
    client = _Client(old)
    got = release.publish(
        _Engine(), "local", "mtp-verl", IDENTITY, "p", reg, client, say=lambda _: None, replace=True
    )
    assert got == new and pushed[0] == f"127.0.0.1:5000/ns/mtp-verl:{IDENTITY}"

    def broken(d):
        raise EnvironmentProblem("the SBOM could not be attached")

    client = _Client(old)
    with pytest.raises(EnvironmentProblem):
        release.publish(
            _Engine(),
            "local",
            "mtp-verl",
            IDENTITY,
            "p",
            reg,
            client,
            say=lambda _: None,
            before_move=broken,
            replace=True,
        )
    assert client.deleted == []  # the other format's image stays
    client = _Client(old)
    del client.tags[IDENTITY]  # a content tag this call creates is rolled back
    with pytest.raises(EnvironmentProblem):
        release.publish(
            _Engine(), "local", "mtp-verl", IDENTITY, "p", reg, client, say=lambda _: None, before_move=broken
        )
    assert client.deleted == [new]
