"""`verify` against images changed in their registry (assembly/verify.py, engine/ocilayout.py),
with a registry of blobs kept here: no buildah, no network.

A layer blob swapped under an untouched config is refused as what it is, before anything
is rebuilt; a layer added on top names the files it adds, changes and removes."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import pytest

from mtpimage.assembly import verify
from mtpimage.engine import ocilayout
from mtpimage.publish.imageref import ImageRef

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
