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


def _archive(layout, *args) -> dict:
    with tarfile.open(fileobj=io.BytesIO(b"".join(ocilayout.docker_archive(layout, *args)))) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())[0]
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return {"manifest": manifest, "files": files}


def test_a_load_step_carries_the_missing_layer_and_placeholders_for_those_dockerd_has(tmp_path):
    tars = [_tar({"a": b"1"}), _tar({"b": b"2"}), _tar({"c": b"3"})]
    layout = ocilayout.normalise(_layout(tmp_path / "l", tars, "FROM x"))
    config = ocilayout.prefix_config(layout, 2, "n1")
    got = _archive(layout, 2, 1, config)
    names = got["manifest"]["Layers"]
    assert len(names) == 2 and got["files"][got["manifest"]["Config"]] == config
    assert json.loads(config)["rootfs"]["diff_ids"] == layout.diff_ids[:2]
    assert got["files"][names[0]] == b""  # dockerd has it: never opened
    assert got["files"][names[1]] == tars[1]
    assert tars[2] not in got["files"].values()
    # the nonce makes each load's step image its own
    assert ocilayout.prefix_config(layout, 2, "n2") != config
    # the image's own config, every layer present: placeholders only
    whole = _archive(layout, 3, 3, None)
    assert whole["files"][whole["manifest"]["Config"]] == layout.config_bytes
    assert set(whole["files"][n] for n in whole["manifest"]["Layers"]) == {b""}


def test_a_layer_equal_to_a_present_one_is_still_carried(tmp_path):
    same = _tar({"same": b"x"})
    layout = ocilayout.normalise(_layout(tmp_path / "l", [same, _tar({"b": b"2"}), same], "FROM x"))
    got = _archive(layout, 3, 2, layout.config_bytes)
    # one file for both: the third layer (another chain) must be loaded from it
    assert got["manifest"]["Layers"][0] == got["manifest"]["Layers"][2]
    assert got["files"][got["manifest"]["Layers"][0]] == same


def test_load_steps_load_each_missing_layer_once_and_the_image_at_least_once():
    assert ocilayout.load_steps(4, 0) == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert ocilayout.load_steps(4, 2) == [(3, 2), (4, 3)]
    assert ocilayout.load_steps(4, 4) == [(4, 4)]
    assert ocilayout.load_steps(4, 9) == [(4, 4)]
