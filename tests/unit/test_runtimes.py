"""data/runtimes.yaml: the squashfs compressions export offers, what each runtime reads since
which version, the layer format of a manifest, and what a job script says and needs for it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from mtpimage.errors import InputError
from mtpimage.outputs import runtimes
from mtpimage.publish import pullneeds

VERSION = re.compile(r"\d+(\.\d+)+")


def test_every_runtime_says_who_reads_every_compression_it_may_be_given():
    comps = set(runtimes.compressions())
    assert {"gzip", "lzo", "zstd"} <= comps
    for rt in runtimes.runtimes().values():
        assert rt.export_default in comps, rt.name
        assert set(rt.reads) == comps, f"{rt.name}: reads names {sorted(rt.reads)}, not {sorted(comps)}"
        assert rt.sources and all(s.startswith("https://") for s in rt.sources), rt.name
        assert rt.layers_source.startswith("https://"), rt.name
        for fmt, support in rt.layers.items():
            assert support.since == "" or VERSION.fullmatch(support.since), (rt.name, fmt)


def test_zstd_is_the_default_and_its_readers_are_named_with_versions():
    enroot, apptainer = runtimes.runtime("enroot"), runtimes.runtime("apptainer")
    assert enroot.export_default == apptainer.export_default == "zstd"
    assert "squashfs-tools >= 4.4" in enroot.reads_line("zstd")
    assert "Apptainer >= 1.4.0" in apptainer.reads_line("zstd")
    assert enroot.layers["zstd"].since == "4.0.0" and enroot.layers["gzip"].since == ""
    assert apptainer.layers["zstd"].since == "1.4.0" and apptainer.sif_build().since == "1.4.0"


@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="needs squashfs-tools")
def test_each_compression_is_one_this_mksquashfs_has():
    # the compressors mksquashfs lists (Debian 12's 4.5.1: gzip, lzo, lz4, xz, zstd, lzma)
    usage = subprocess.run(["mksquashfs"], capture_output=True, text=True)
    listed = usage.stdout + usage.stderr
    block = listed.split("Compressors available", 1)[1].split("-b <block_size>", 1)[0]
    for name, comp in runtimes.compressions().items():
        assert re.search(rf"^\s+{name}\b", block, re.M), f"{name} not offered by this mksquashfs"
        assert comp.args[:2] == ("-comp", name)


def test_an_unknown_compression_is_one_input_error_naming_the_choices():
    with pytest.raises(InputError) as exc:
        runtimes.compression("brotli", runtimes.runtime("enroot"))
    assert (
        "--squash-compression: brotli: unknown squashfs compression (fix: use one of: "
        in exc.value.one_line()
    )
    assert runtimes.compression(None, runtimes.runtime("apptainer")).name == "zstd"


def _manifest(*types: str) -> bytes:
    return json.dumps({"schemaVersion": 2, "layers": [{"mediaType": t} for t in types]}).encode()


OCI = "application/vnd.oci.image.layer.v1.tar"
DOCKER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


@pytest.mark.parametrize(
    "manifest,want",
    [
        (_manifest(OCI + "+zstd", OCI + "+zstd"), "zstd"),
        (_manifest(OCI + "+gzip"), "gzip"),
        (_manifest(DOCKER_GZIP, DOCKER_GZIP), "gzip"),  # what the docker engine pushes
        (_manifest(OCI + "+gzip", OCI + "+zstd"), None),  # a mix: no one format
        (_manifest("application/x-unknown"), None),
        (json.dumps({"manifests": []}).encode(), None),  # an index
    ],
)
def test_layer_format_of_a_manifest(manifest, want):
    assert runtimes.layer_format(manifest) == want


def test_a_pull_of_zstd_layers_needs_the_version_and_says_the_fix():
    pull = runtimes.Pull(runtimes.runtime("enroot"), "reg#img@sha256:x", "zstd", "the registry's manifest")
    assert pull.minimum == "4.0.0"
    assert pull.comments()[0].startswith("Layers: zstd (from the registry's manifest): enroot 4.0.0 or later")
    assert pull.fix() == (
        "install enroot 4.0.0 or later on the nodes, or publish the image with --compression gzip "
        "and generate this script again"
    )
    gzip = runtimes.Pull(runtimes.runtime("apptainer"), "docker://img", "gzip", "--compression")
    assert gzip.minimum == "" and "any Apptainer pulls them" in gzip.comments()[0]
    unknown = runtimes.Pull(runtimes.runtime("apptainer"), "docker://img", None)
    assert unknown.minimum == ""
    assert "zstd: Apptainer 1.4.0+" in unknown.comments()[0]


def test_every_pull_line_the_tool_prints_has_a_reader_with_a_layer_table():
    from mtpimage.imageref import ImageRef

    lines = set(ImageRef.parse("reg.example/ns/mtp-verl").pinned("sha256:" + "0" * 64).pull_strings())
    readers = pullneeds.line_readers()
    assert set(readers) == lines
    for line, reader in readers.items():
        assert reader.title and reader.source.startswith("https://"), line
        assert {"gzip", "zstd"} <= set(reader.layers), line
        assert all(s.since == "" or VERSION.fullmatch(s.since) for s in reader.layers.values()), line


def test_zstd_pull_lines_name_the_client_version_that_reads_them_and_gzip_ones_none():
    needs = pullneeds.pull_needs("zstd")
    # docker 20.10 (Debian 12's) cannot pull zstd layers: measured, and moby#41759 is in 23.0.0
    assert str(needs["docker"]) == "needs docker 23.0.0 or later (zstd layers)"
    assert needs["pyxis"].reader == needs["enroot"].reader == "enroot" and needs["enroot"].since == "4.0.0"
    assert needs["apptainer"].since == "1.4.0"
    assert pullneeds.pull_needs("gzip") == {}
    assert pullneeds.pull_needs(None) == {} and pullneeds.pull_needs("lz4") == {}
