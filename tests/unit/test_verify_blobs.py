"""`verify` against images changed in their registry (assembly/verify.py, engine/ocilayout.py),
with a registry of blobs kept here: no buildah, no network.

A layer blob swapped under an untouched config is refused as what it is, before anything
is rebuilt; a layer added on top names the files it adds, changes and removes."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from mtpimage.assembly import verify
from mtpimage.engine import ocilayout
from mtpimage.imageref import ImageRef

from .test_ocilayout import _layout, _tar

TAR = ocilayout.OCI_LAYER


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Blobs:
    """The part of RegistryClient that verify uses, over a dict of blobs."""

    def __init__(self, *blobs: bytes):
        self.blobs = {_sha(b): b for b in blobs}

    def blob_exists(self, repository, digest):
        return digest in self.blobs

    def fetch_blob(self, repository, digest, out, max_bytes):
        out.seek(0)
        out.truncate()
        data = self.blobs[digest]
        for i in range(0, len(data), 7):  # in small chunks, as a download streams
            out.write(data[i : i + 7])
        return _sha(data), len(data)


REF = ImageRef.parse("127.0.0.1:5000/ns/mtp-verl:t", flag="--image")
DIGEST = "sha256:" + "d" * 64


def _image(layers: list[bytes], blobs: list[tuple[bytes, str]]) -> tuple[dict, dict]:
    """(manifest naming `blobs` (data, media type), config whose diff IDs are `layers`')."""
    manifest = {
        "config": {"digest": "sha256:" + "c" * 64},
        "layers": [{"digest": _sha(b), "mediaType": t, "size": len(b)} for b, t in blobs],
    }
    config = {"rootfs": {"diff_ids": [_sha(x) for x in layers]}, "history": []}
    return manifest, config


def test_a_swapped_layer_blob_under_an_untouched_config_is_refused_as_such(tmp_path):
    base, good = _tar({"etc/os": b"x"}), _tar({"opt/verl/__init__.py": b"good"})
    evil = _tar({"opt/verl/__init__.py": b"evil"})
    manifest, config = _image(
        [base, good], [(base, TAR), (gzip.compress(evil, mtime=0), ocilayout.GZIP_TYPES[0])]
    )
    client = Blobs(base, good, gzip.compress(evil, mtime=0))
    said = []
    with pytest.raises(verify.NotDescribed) as info:
        verify.check_blobs(client, REF, DIGEST, manifest, config, tmp_path, said.append)
    line = info.value.one_line()
    assert "the image in the registry is not the one its config describes" in line
    assert f"layer 2 (blob {_sha(gzip.compress(evil, mtime=0))}) unpacks to {_sha(evil)}" in line
    assert f"the config's diff ID for layer 2 is {_sha(good)}" in line
    assert "opt/verl/__init__.py (content)" in line and "nothing was rebuilt" in line
    assert info.value.exit_code == 1
    assert info.value.details[0].startswith("layer  2/2  NOT DESCRIBED")
    assert info.value.details[1].startswith("    opt/verl/__init__.py: content")


def test_blobs_that_unpack_to_their_diff_ids_pass_gzip_or_not(tmp_path):
    base, top = _tar({"a": b"1"}), _tar({"b": b"2"})
    z = gzip.compress(top, mtime=0) + gzip.compress(b"", mtime=0)  # two gzip members: one stream
    manifest, config = _image([base, top], [(base, TAR), (z, ocilayout.GZIP_TYPES[1])])
    verify.check_blobs(Blobs(base, z), REF, DIGEST, manifest, config, tmp_path, lambda _: None)


def test_a_manifest_naming_more_layers_than_its_config_is_refused(tmp_path):
    base = _tar({"a": b"1"})
    manifest, config = _image([base], [(base, TAR), (base, TAR)])
    with pytest.raises(verify.NotDescribed, match="names 2 layers, its config's rootfs.diff_ids 1"):
        verify.check_blobs(Blobs(base), REF, DIGEST, manifest, config, tmp_path, lambda _: None)


def test_a_layer_added_on_top_names_the_files_it_adds_changes_and_removes(tmp_path):
    layers = [_tar({"etc/os": b"x", "opt/a.py": b"a", "opt/b.py": b"b"}), _tar({"opt/c.py": b"c"})]
    layout = ocilayout.normalise(_layout(tmp_path / "rebuilt", layers, "FROM x"))
    out = io.BytesIO()  # what `docker commit` makes: a gzip tar with a whiteout
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in {"opt/a.py": b"tampered", "usr/bin/evil": b"#!", "opt/.wh.b.py": b""}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    top = out.getvalue()
    z = gzip.compress(top, mtime=0)
    manifest, config = _image(
        [*layers, top], [(layers[0], TAR), (layers[1], TAR), (z, ocilayout.GZIP_TYPES[1])]
    )
    config["history"] = [{"created_by": "RUN x"}, {"created_by": "RUN y"}, {"created_by": "bash"}]
    client = Blobs(*layers, z)
    verify.check_blobs(client, REF, DIGEST, manifest, config, tmp_path, lambda _: None)
    report = verify.compare(client, REF, DIGEST, manifest, config, layout, tmp_path)
    assert [r.same for r in report.layers] == [True, True, False]
    assert [(p, w) for p, w, _ in report.layers[2].files] == [
        ("opt/a.py", "changed: content"),
        ("opt/b.py", "removed"),
        ("usr/bin/evil", "added"),
    ]
    text = "\n".join(verify.lines(report))
    assert "    usr/bin/evil: added: a layer on top of the image this lock builds" in text
    with pytest.raises(verify.NotIdentical) as info:
        verify.verdict(report)
    assert "layer 3 (bash): not in the rebuild, on top of it: opt/a.py (changed: content)" in str(info.value)


def _docker_commit_top(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_docker_2010s_uncompressed_layers_under_a_gzip_media_type_are_read_and_named(tmp_path):
    """What docker 20.10 pushes after `docker pull` of an image with uncompressed layers,
    `docker run` + `docker commit`: the pulled layers' blobs reused as they are, under
    a gzip media type, and a gzip layer on top. Issue #46: verify took the decode error for
    a network error ("registry cannot be reached"); it reads the bytes as what they are,
    says which media types do not match them, and names the file the commit changed."""
    layers = [_tar({"etc/os": b"x", "opt/a.py": b"a"}), _tar({"opt/c.py": b"c"})]
    layout = ocilayout.normalise(_layout(tmp_path / "rebuilt", layers, "FROM x"))
    top = _docker_commit_top("opt/a.py", b"changed by docker commit")
    z = gzip.compress(top, mtime=0)
    gz = ocilayout.GZIP_TYPES[1]
    manifest, config = _image([*layers, top], [(layers[0], gz), (layers[1], gz), (z, gz)])
    config["history"] = [{"created_by": "RUN x"}, {"created_by": "RUN y"}, {"created_by": "bash"}]
    client = Blobs(*layers, z)
    media = verify.check_blobs(client, REF, DIGEST, manifest, config, tmp_path, lambda _: None)
    assert sorted(media) == [1, 2]
    assert media[1] == f"media type {gz} does not match the bytes (an uncompressed tar)"
    report = verify.compare(client, REF, DIGEST, manifest, config, layout, tmp_path, media)
    assert [r.same for r in report.layers] == [True, True, False]
    text = "\n".join(verify.lines(report))
    assert f"    media type {gz} does not match the bytes (an uncompressed tar)" in text
    assert "    opt/a.py: changed: content" in text
    with pytest.raises(verify.NotIdentical) as info:
        verify.verdict(report)
    line = info.value.one_line()
    assert "layer 3 (bash): not in the rebuild, on top of it: opt/a.py (changed: content)" in line
    assert f"layer 1's media type {gz} does not match the bytes (an uncompressed tar) (2 such layers)" in line


def test_a_gzip_blob_under_a_tar_media_type_is_named_too(tmp_path):
    base = _tar({"a": b"1"})
    z = gzip.compress(base, mtime=0)
    manifest, config = _image([base], [(z, TAR)])
    media = verify.check_blobs(Blobs(z), REF, DIGEST, manifest, config, tmp_path, lambda _: None)
    assert media == {1: f"media type {TAR} does not match the bytes (a gzip stream)"}


def test_a_corrupt_gzip_layer_is_a_decode_error_not_the_network(tmp_path):
    base = _tar({"a": b"1"})
    z = bytearray(gzip.compress(base, mtime=0))
    z[20:40] = b"\xff" * 20  # the deflate stream broken, the gzip header intact
    manifest, config = _image([base], [(bytes(z), ocilayout.GZIP_TYPES[0])])
    with pytest.raises(verify.DecodeProblem) as info:
        verify.check_blobs(Blobs(bytes(z)), REF, DIGEST, manifest, config, tmp_path, lambda _: None)
    line = info.value.one_line()
    assert info.value.exit_code == 6
    assert "layer 1" in line and "cannot be decoded" in line and "cannot be reached" not in line


def test_digests_with_path_characters_in_the_manifest_are_refused_before_any_request(tmp_path):
    from mtpimage.publish import digests

    class Registry(Blobs):
        def __init__(self, manifest: bytes):
            super().__init__()
            self.body, self.asked = manifest, []

        def manifest(self, path, reference):
            return self.body, _sha(self.body)

        def fetch_blob(self, repository, digest, out, max_bytes):
            self.asked.append(digest)
            raise AssertionError("a blob was requested")

    bad = {"config": {"digest": "sha256:../../../v2/other/manifests/x"}, "layers": []}
    client = Registry(json.dumps(bad).encode())
    with pytest.raises(digests.BadDigest) as info:
        verify.published(client, REF, tmp_path)
    assert "the config digest" in info.value.one_line() and client.asked == []
    assert info.value.exit_code == 3
