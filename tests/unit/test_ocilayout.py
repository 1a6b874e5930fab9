"""The reproducible engine's layout normalisation and layer diffs (engine/ocilayout.py),
on layouts and tars made here: no buildah needed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

from mtpimage.assembly import verify
from mtpimage.engine import ocilayout


def _tar(files: dict[str, bytes], mode: int = 0o644) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _layout(root, layers: list[bytes], comment: str, gzip_first: bool = False):
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return "sha256:" + h

    diff_ids = [put(layer) for layer in layers]
    descs = [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": len(x)}
        for d, x in zip(diff_ids, layers)
    ]
    if gzip_first:
        z = gzip.compress(layers[0], mtime=0)
        descs[0] = {
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": put(z),
            "size": len(z),
        }
    config = {
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [
            {"created_by": "RUN x", "comment": comment},
            {"created_by": "RUN y", "comment": "Imported from -"},
        ],
    }
    config_bytes = json.dumps(config, indent=1).encode()
    manifest = {
        "schemaVersion": 2,
        "config": {"digest": put(config_bytes), "size": len(config_bytes)},
        "layers": descs,
        "annotations": {"org.opencontainers.image.base.name": "x"},
    }
    m = json.dumps(manifest, indent=2).encode()
    (root / "index.json").write_text(
        json.dumps({"schemaVersion": 2, "manifests": [{"digest": put(m), "size": len(m)}]})
    )
    return root


def test_two_builds_that_differ_only_in_buildahs_intermediate_ids_normalise_to_one_digest(tmp_path):
    layers = [_tar({"a": b"1"}), _tar({"b": b"2"})]
    one = ocilayout.normalise(_layout(tmp_path / "one", layers, "FROM 0123456789ab", gzip_first=True))
    two = ocilayout.normalise(_layout(tmp_path / "two", layers, "FROM ba9876543210"))
    assert one.digest == two.digest and one.image_id == two.image_id
    assert [d["digest"] for d in one.manifest["layers"]] == one.diff_ids  # uncompressed: digest = diff ID
    assert (
        "comment" not in one.config["history"][0] and one.config["history"][1]["comment"] == "Imported from -"
    )
    assert ocilayout.normalise(one.root).digest == one.digest  # idempotent
    assert len(list((one.root / "blobs" / "sha256").iterdir())) == 4  # 2 layers, config, manifest


def test_a_different_layer_gives_another_digest(tmp_path):
    one = ocilayout.normalise(_layout(tmp_path / "one", [_tar({"a": b"1"})], "FROM x"))
    two = ocilayout.normalise(_layout(tmp_path / "two", [_tar({"a": b"2"})], "FROM x"))
    assert one.digest != two.digest


def test_a_changed_file_is_named_first_with_its_reason():
    image = ocilayout.members(
        io.BytesIO(_tar({"opt/verl/__init__.py": b"evil", "x.pyc": b"1", "same": b"s"}, 0o40644))
    )
    rebuilt = ocilayout.members(
        io.BytesIO(_tar({"opt/verl/__init__.py": b"good", "x.pyc": b"2", "same": b"s", "new": b""}))
    )
    diffs = ocilayout.differences(image, rebuilt)
    assert diffs == [
        ("new", "only in the rebuild"),
        ("opt/verl/__init__.py", "content"),
        ("x.pyc", "content"),
    ]
    assert "bytecode" in verify.why("x.pyc", "content", "RUN pip")
    assert "changed after the build" in verify.why("opt/verl/__init__.py", "content", "RUN pip")


def test_docker_archive_names_the_config_and_layers(tmp_path):
    layout = ocilayout.normalise(_layout(tmp_path / "l", [_tar({"a": b"1"})], "FROM x"))
    with tarfile.open(fileobj=io.BytesIO(b"".join(ocilayout.docker_archive(layout)))) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        assert manifest[0]["Config"] == layout.image_id.split(":")[1] + ".json"
        assert tar.extractfile(manifest[0]["Config"]).read() == layout.config_bytes
        assert [hashlib.sha256(tar.extractfile(n).read()).hexdigest() for n in manifest[0]["Layers"]] == [
            d.split(":")[1] for d in layout.diff_ids
        ]
