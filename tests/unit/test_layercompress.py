"""The published forms of a reproducible image (engine/layercompress.py): layers compressed by
the tool with its pinned zlib or libzstd, one digest per format; and verify reading and
comparing them (assembly/verify.py). Layouts made here: no buildah, no registry."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zlib

import pytest
import zstandard

from mtpimage.assembly import verify
from mtpimage.engine import layercompress, ocilayout
from mtpimage.errors import EnvironmentProblem, InputError

from .test_ocilayout import _layout, _tar
from .test_verify_blobs import DIGEST, REF, Blobs

GZ, ZST = layercompress.named("gzip"), layercompress.named("zstd")


def _data(n: int = 3 << 20) -> bytes:
    """Compressible, not trivial: text with a pseudo-random walk through it."""
    words = [f"w{i:05d}".encode() for i in range(5000)]
    out, x, size = [], 1, 0
    while size < n:
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(words[x % len(words)] + b" ")
        size += len(out[-1])
    return b"".join(out)[:n]


def _compress(tmp_path, c, data: bytes, threads: int = 1, name: str = "a") -> tuple[dict, bytes]:
    src = tmp_path / f"{name}.tar"
    src.write_bytes(data)
    blobs = tmp_path / f"blobs-{name}"
    blobs.mkdir()
    desc = layercompress.compress_blob(src, blobs, c, threads)
    out = (blobs / desc["digest"].split(":")[1]).read_bytes()
    assert [p.name for p in blobs.iterdir()] == [desc["digest"].split(":")[1]]  # no .part left
    return desc, out


def test_gzip_carries_nothing_of_the_machine_and_unpacks_to_the_tar(tmp_path):
    data = _data()
    desc, out = _compress(tmp_path, GZ, data)
    assert out[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no name, mtime 0, OS unknown
    assert gzip.decompress(out) == data
    assert desc == {
        "digest": "sha256:" + hashlib.sha256(out).hexdigest(),
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "size": len(out),
    }
    # zlib's own gzip writer at the same level makes the same deflate stream
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    assert (z.compress(data) + z.flush())[10:] == out[10:]
    assert _compress(tmp_path, GZ, data, name="b")[1] == out  # again: the same bytes


def test_zstd_is_the_same_for_any_worker_count_and_unpacks_to_the_tar(tmp_path):
    """libzstd's frames with 1 or 3 workers are one byte string (compression.yaml says so and
    the tool uses all cores); its single-threaded mode (0), which wrote other bytes on a 760 MB
    tar, is never used."""
    data = _data(12 << 20)  # larger than one worker's job, so the workers split it
    one = _compress(tmp_path, ZST, data, threads=1, name="one")[1]
    three = _compress(tmp_path, ZST, data, threads=3, name="three")[1]
    assert one == three
    assert zstandard.ZstdDecompressor().decompressobj().decompress(one) == data


def test_a_compressor_not_measured_to_write_these_bytes_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(zlib, "ZLIB_RUNTIME_VERSION", "1.3.0.zlib-ng")
    with pytest.raises(EnvironmentProblem) as err:
        GZ.check()
    text = str(err.value)
    assert "\n" not in text and "1.3.0.zlib-ng" in text and "mtpimage/data/compression.yaml" in text
    assert "--compression zstd" in text  # the fix
    monkeypatch.setattr(zstandard, "ZSTD_VERSION", (1, 5, 5))
    with pytest.raises(EnvironmentProblem, match="requirements.txt"):
        ZST.check()
    layercompress.named("none").check()  # nothing to compress with


def test_this_machines_compressors_are_the_measured_ones():
    """The tests' own environment (Debian 12's zlib, the pinned zstandard) compresses: a
    version outside compression.yaml here would be a pin that is not kept."""
    GZ.check()
    ZST.check()


def test_an_unknown_format_is_an_input_error():
    with pytest.raises(InputError, match="--compression: lz4: unknown layer compression"):
        layercompress.named("lz4")
    assert layercompress.named(None).name == "gzip"


def test_a_form_keeps_the_config_says_how_it_was_made_and_is_made_once(tmp_path, monkeypatch):
    layers = [_tar({"a": _data(1 << 20)}), _tar({"b": b"two"})]
    layout = ocilayout.normalise(_layout(tmp_path / "oci", layers, "FROM x"))
    form = layercompress.form(layout, GZ)
    m = form.manifest
    assert m["config"] == layout.manifest["config"]
    assert m["annotations"] == {layercompress.ANNOTATION: "gzip zlib level 6"}
    assert [d["mediaType"] for d in m["layers"]] == [GZ.media_type] * 2
    for desc, tar in zip(m["layers"], layers, strict=True):
        assert gzip.decompress(form.blob(desc["digest"]).read_bytes()) == tar
    assert form.blob(form.digest).read_bytes() == form.manifest_bytes  # the manifest is a blob too
    assert layercompress.of_manifest(m) is GZ

    def no(*a, **k):
        raise AssertionError("compressed again")

    monkeypatch.setattr(layercompress, "compress_blob", no)
    assert layercompress.form(ocilayout.read(layout.root), GZ).digest == form.digest  # kept
    monkeypatch.undo()
    zst = layercompress.form(layout, ZST)  # another format beside it
    assert zst.digest != form.digest and zst.manifest["config"] == m["config"]
    # a kept form whose blob went is made again, to the same digest
    os.unlink(form.blob(m["layers"][1]["digest"]))
    assert layercompress.form(layout, GZ).digest == form.digest
    assert layercompress.form(layout, layercompress.named("none")).manifest_bytes == layout.manifest_bytes


def test_of_manifest_names_one_format_or_none():
    def m(*types):
        return {"layers": [{"mediaType": t} for t in types]}

    assert layercompress.of_manifest(m(ZST.media_type, ZST.media_type)) is ZST
    assert layercompress.of_manifest(m(ocilayout.OCI_LAYER)).name == "none"
    assert layercompress.of_manifest(m(GZ.media_type, ocilayout.OCI_LAYER)) is None  # a mix
    assert layercompress.of_manifest(m("application/vnd.docker.image.rootfs.diff.tar.gzip")) is None


# ----------------------------------------------------------------------------- verify
def _published(tmp_path, c, tamper=None):
    layers = [_tar({"a": b"one" * 1000}), _tar({"b": b"two" * 1000})]
    layout = ocilayout.normalise(_layout(tmp_path / "built", layers, "FROM x"))
    form = layercompress.form(layout, c)
    blobs = [form.blob(d["digest"]).read_bytes() for d in form.manifest["layers"]]
    manifest = form.manifest
    if tamper:
        blobs[1] = tamper(layers[1])
        manifest["layers"][1].update(digest=verify_sha(blobs[1]), size=len(blobs[1]))
    rebuilt = ocilayout.normalise(_layout(tmp_path / "rebuilt", layers, "FROM y"))
    return Blobs(*blobs), manifest, layout.config, rebuilt


def verify_sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", ["gzip", "zstd", "none"])
def test_verify_compresses_the_rebuild_as_the_image_is_and_finds_it_identical(tmp_path, name):
    c = layercompress.named(name)
    client, manifest, config, rebuilt = _published(tmp_path, c)
    assert verify.check_blobs(client, REF, DIGEST, manifest, config, tmp_path, lambda s: None) == {}
    form = verify.published_form(rebuilt, manifest, lambda s: None)
    report = verify.compare(client, REF, DIGEST, manifest, config, form, tmp_path)
    assert report.rebuilt_digest == "sha256:" + hashlib.sha256(ocilayout.canonical(manifest)).hexdigest()
    assert all(r.same and r.blob_same for r in report.layers)
    assert report.made_here
    lines = verify.lines(report)
    if c.compresses:
        assert f"blobs          same     {c.annotation}" in lines


def test_verify_says_when_only_the_compressed_bytes_differ(tmp_path):
    """The same tar, gzip'd by another writer (a name and time in the header, level 9): every
    layer's content is the same, its blob is not, and the line says so."""

    def other(tar: bytes) -> bytes:
        return gzip.compress(tar, compresslevel=9, mtime=1)

    client, manifest, config, rebuilt = _published(tmp_path, GZ, tamper=other)
    form = verify.published_form(rebuilt, manifest, lambda s: None)
    report = verify.compare(
        client, REF, verify_sha(ocilayout.canonical(manifest)), manifest, config, form, tmp_path
    )
    assert all(r.same for r in report.layers) and not report.layers[1].blob_same
    assert any("same content, other gzip zlib level 6 bytes" in line for line in verify.lines(report))
    with pytest.raises(verify.NotIdentical, match="the compressed blobs differ \\(first: layer 2, gzip"):
        verify.verdict(report)


def test_a_gzip_image_another_tool_pushed_is_said_to_be_that(tmp_path):
    client, manifest, config, rebuilt = _published(tmp_path, GZ)
    del manifest["annotations"]  # as docker or buildah would push gzip layers: no word of how
    form = verify.published_form(rebuilt, manifest, lambda s: None)
    report = verify.compare(client, REF, DIGEST, manifest, config, form, tmp_path)
    assert not report.made_here
    with pytest.raises(verify.NotIdentical, match="not compressed by this tool"):
        verify.verdict(report)


def test_a_zstd_layer_is_read_as_what_it_is_and_a_cut_one_is_a_decode_error(tmp_path):
    tar = _tar({"etc/issue": b"hello"})
    z = zstandard.ZstdCompressor().compress(tar)
    sink = ocilayout.UncompressedDigest(ZST.media_type)
    for i in range(0, len(z), 5):
        sink.write(z[i : i + 5])
    assert sink.digest() == verify_sha(tar) and sink.mismatch is None
    assert set(ocilayout.members(io.BytesIO(z))) == {"etc/issue"}
    cut = ocilayout.UncompressedDigest(ZST.media_type)
    cut.write(z[:-3])
    with pytest.raises(ocilayout.Undecodable, match="zstd stream is cut short"):
        cut.digest()


def test_a_new_layout_takes_the_blobs_a_kept_layout_compressed_and_gets_the_same_form(tmp_path, monkeypatch):
    """An incremental build's layout shares its lower layers with the last build's: those are
    not compressed again (issue 48), and the form is the one compressing them all would give."""
    shared, old_top, new_top = _tar({"a": _data(1 << 20)}), _tar({"b": b"old"}), _tar({"b": b"new"})
    layouts = tmp_path / "oci"
    layouts.mkdir()
    first = ocilayout.normalise(_layout(layouts / "first", [shared, old_top], "FROM x"))
    layercompress.form(first, GZ, reuse_from=layouts)
    cold = layercompress.form(
        ocilayout.normalise(_layout(tmp_path / "cold", [shared, new_top], "FROM x")), GZ
    )

    compressed = []
    real = layercompress.compress_blob
    monkeypatch.setattr(
        layercompress, "compress_blob", lambda src, *a, **k: compressed.append(src.name) or real(src, *a, **k)
    )
    second = ocilayout.normalise(_layout(layouts / "second", [shared, new_top], "FROM x"))
    said = []
    form = layercompress.form(second, GZ, say=said.append, reuse_from=layouts)
    assert compressed == [second.manifest["layers"][1]["digest"].split(":")[1]]  # the new layer only
    assert "1 taken as a kept layout compressed them" in said[0]
    assert form.digest == cold.digest  # the same bytes as a build that compressed every layer
    shared_blob = form.blob(form.manifest["layers"][0]["digest"])
    assert shared_blob.parent == second.root / "blobs" / "sha256" and shared_blob.stat().st_nlink == 2
    # without reuse_from (verify's rebuild) every layer is compressed, whatever is kept beside it
    compressed.clear()
    third = ocilayout.normalise(_layout(layouts / "third", [shared, new_top], "FROM x"))
    assert layercompress.form(third, GZ).digest == cold.digest and len(compressed) == 2
    # a kept blob that went (or was cut) is compressed again, not taken
    compressed.clear()
    os.unlink(first.blob(layercompress.form(first, GZ).manifest["layers"][0]["digest"]))
    for d in ("second", "third"):
        for f in (layouts / d / "forms").iterdir():
            f.unlink()
    fourth = ocilayout.normalise(_layout(layouts / "fourth", [shared, old_top], "FROM x"))
    assert layercompress.form(fourth, GZ, reuse_from=layouts).digest != cold.digest
    assert len(compressed) == 2
    compressed.clear()
    layercompress.form(fourth, ZST, reuse_from=layouts)  # another format takes nothing of gzip's
    assert len(compressed) == 2
