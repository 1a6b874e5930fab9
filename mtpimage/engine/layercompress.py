"""The compressed forms of a reproducible image: one digest per format, on any machine.

A normalised layout (ocilayout.py) holds every layer as an uncompressed tar, so its layer
digests are its diff IDs. What a registry serves and a node pulls is smaller: here each layer
is compressed by the tool itself with the implementation and settings of
mtpimage/data/compression.yaml, never by whatever compressor a build engine or registry
client has (their output is not promised stable across versions: buildah#3866). The config
is the same in every form; only the layer blobs and the manifest differ, and the manifest says
how its layers were made (annotation `ANNOTATION`), so `verify` can make the same bytes again.

    layout (tar layers) --compress each layer (pinned zlib / libzstd, fixed settings)-->
        blobs beside the tars + a manifest with their media types  = the published form

A form is made once per layout and kept in it (`forms/<format>.json` names its manifest):
a second push, or a push after a tag move, uploads the same bytes without compressing again.
A build's new layout takes the compressed blob of a layer it shares with a kept layout
(`reuse_from`: the engine's other layouts) instead of compressing it again: the same tar under
the same pinned settings is the same bytes, and an incremental build of the real stack would
otherwise spend minutes compressing 14 GB of layers it did not change (issue 48). verify never
reuses: its rebuild compresses every layer itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from mtpimage.engine import ocilayout
from mtpimage.errors import EnvironmentProblem, InputError

ANNOTATION = "org.mtp-image-builder.layer-compression"
CHUNK = 1 << 20  # the read size: fixed, so every run feeds the compressor the same way
# gzip's header as RFC 1952 allows it to carry nothing of the machine: deflate, no flags, no
# name, mtime 0, no extra flags, OS 255 (unknown)
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


@dataclass(frozen=True)
class Compression:
    """One layer format of compression.yaml."""

    name: str  # none, gzip, zstd
    media_type: str
    implementation: str = ""  # zlib, libzstd ("" for none)
    versions: tuple[str, ...] = ()  # the implementation's versions measured to write these bytes
    level: int = 0
    why: str = ""

    @property
    def compresses(self) -> bool:
        return self.name != "none"

    @property
    def annotation(self) -> str:
        """What the manifest says of its layers: enough to make the same bytes again."""
        return f"{self.name} {self.implementation} level {self.level}"

    def runtime(self) -> str:
        """The version of the implementation this process would compress with."""
        if self.implementation == "zlib":
            return zlib.ZLIB_RUNTIME_VERSION
        if self.implementation == "libzstd":
            return ".".join(str(v) for v in _zstandard().ZSTD_VERSION)
        return ""

    def check(self) -> None:
        """Refuse to compress with an implementation whose bytes were not measured to be these:
        the image would get a digest no other machine gets."""
        found = self.runtime()
        if not self.compresses or found in self.versions:
            return
        raise EnvironmentProblem(
            f"--compression {self.name}: this Python's {self.implementation} is {found}, not one of "
            f"{', '.join(self.versions)} (mtpimage/data/compression.yaml), whose output is measured to "
            f"be the same everywhere; the {self.name} layers would get a digest no other machine gets "
            f"(fix: {_fix(self)})"
        )


def _fix(c: Compression) -> str:
    if c.implementation == "zlib":
        return (
            "run the tool with a Python linked to zlib " + " or ".join(c.versions) + " (Debian 12 or 13, "
            "Ubuntu 24.04; not zlib-ng), or publish with --compression zstd"
        )
    return "reinstall the pinned requirements: .venv/bin/pip install -r requirements.txt"


def _zstandard():
    # deferred: import cost: the fast path imports mtpimage.engine with the standard library alone
    import zstandard

    return zstandard


@cache
def _doc() -> dict:
    # deferred: import cost: the fast path imports mtpimage.engine with the standard library alone
    import yaml

    return yaml.safe_load(resources.files("mtpimage.data").joinpath("compression.yaml").read_text())


@cache
def formats() -> dict[str, Compression]:
    doc = _doc()
    return {
        name: Compression(
            name,
            spec["media_type"],
            spec.get("implementation", ""),
            tuple(spec.get("versions", ())),
            int(spec.get("level", 0)),
            " ".join(str(spec.get("why", "")).split()),
        )
        for name, spec in doc["formats"].items()
    }


def default_name() -> str:
    return _doc()["default"]


def named(name: str | None, where: str = "--compression") -> Compression:
    """The format called `name` (None: the default)."""
    name = name or default_name()
    if name not in formats():
        raise InputError(where, name, "unknown layer compression", f"use one of: {', '.join(formats())}")
    return formats()[name]


def of_manifest(manifest: dict) -> Compression | None:
    """The format a manifest's layers are in, when they are all in one this tool writes
    (for verify: the rebuild is compressed the same way); None for a mix or a foreign type."""
    types = {(d or {}).get("mediaType") for d in manifest.get("layers") or [] if isinstance(d, dict)}
    found = [c for c in formats().values() if {c.media_type} == types]
    if not found:
        return None
    return found[0]


# ----------------------------------------------------------------------------- one layer
def _gzip(src, out, level: int) -> None:
    z = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, 8, zlib.Z_DEFAULT_STRATEGY)
    out.write(GZIP_HEADER)
    crc = size = 0
    while chunk := src.read(CHUNK):
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)
        out.write(z.compress(chunk))
    out.write(z.flush())
    out.write(struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF))


def _zstd(src, out, level: int, threads: int) -> None:
    # threads >= 1 always: libzstd's frames are then the same for any worker count (measured,
    # tests/unit/test_layercompress.py); its single-threaded mode (0) writes other bytes
    cctx = _zstandard().ZstdCompressor(
        level=level, threads=max(1, threads), write_checksum=False, write_content_size=False
    )
    with cctx.stream_writer(out, closefd=False) as w:
        while chunk := src.read(CHUNK):
            w.write(chunk)


class _Hashing:
    """A file that hashes and counts what is written to it."""

    def __init__(self, f):
        self.f, self.h, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def compress_blob(src: Path, blobs: Path, c: Compression, threads: int = 1) -> dict:
    """Compress the tar `src` into the blob directory `blobs` (named by its digest); its
    descriptor."""
    part = blobs / f".{src.name}.{c.name}.part"
    with open(src, "rb") as f, open(part, "wb") as raw:
        out = _Hashing(raw)
        if c.name == "gzip":
            _gzip(f, out, c.level)
        elif c.name == "zstd":
            _zstd(f, out, c.level, threads)
        else:  # pragma: no cover - formats() names no other
            raise ValueError(c.name)
    digest = out.h.hexdigest()
    os.replace(part, blobs / digest)
    return {"digest": f"sha256:{digest}", "mediaType": c.media_type, "size": out.size}


# ----------------------------------------------------------------------------- one image
@dataclass(frozen=True)
class Form:
    """An image as it is published: its manifest, whose blobs are all in `layout`."""

    layout: ocilayout.Layout
    compression: Compression
    manifest_bytes: bytes

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_bytes)

    @property
    def digest(self) -> str:
        return "sha256:" + ocilayout.sha256_hex(self.manifest_bytes)

    def blob(self, digest: str) -> Path:
        return self.layout.blob(digest)


def form(
    layout: ocilayout.Layout,
    c: Compression,
    threads: int | None = None,
    say: Callable[[str], None] | None = None,
    reuse_from: Path | None = None,
) -> Form:
    """The layout in format `c`: made once and kept in the layout (`forms/<name>.json`). A
    layer whose tar a kept layout under `reuse_from` already compressed with these settings
    takes that blob (linked, else copied) instead of being compressed again."""
    if not c.compresses:
        return Form(layout, c, layout.manifest_bytes)
    record = layout.root / "forms" / f"{c.name}.json"
    kept = _kept(layout, c, record)
    if kept is not None:
        return kept
    c.check()
    threads = threads or os.cpu_count() or 1
    blobs = layout.root / "blobs" / "sha256"
    layers = layout.manifest["layers"]
    known = _compressed_elsewhere(reuse_from, layout.root, c) if reuse_from else {}
    reused = {i: _adopt(known[d["digest"]], blobs) for i, d in enumerate(layers) if d["digest"] in known}
    reused = {i: desc for i, desc in reused.items() if desc is not None}
    todo = [i for i in range(len(layers)) if i not in reused]
    tars = [layout.blob(layers[i]["digest"]) for i in todo]
    if say:
        total = sum(p.stat().st_size for p in tars)
        again = f"; {len(reused)} taken as a kept layout compressed them" if reused else ""
        say(f"compress {len(tars)} layers ({total / 1e9:.2f} GB) as {c.annotation}{again}")
    if c.name == "zstd":  # libzstd's own workers split each layer
        made = [compress_blob(p, blobs, c, threads) for p in tars]
    else:  # zlib has no workers of its own: the layers go side by side (it lets go of the GIL)
        with ThreadPoolExecutor(max_workers=threads) as pool:
            made = list(pool.map(lambda p: compress_blob(p, blobs, c), tars))
    descs = [reused[i] if i in reused else made[todo.index(i)] for i in range(len(layers))]
    manifest = {
        **layout.manifest,
        "layers": descs,
        "annotations": {ANNOTATION: c.annotation},
    }
    manifest_bytes = ocilayout.canonical(manifest)
    (blobs / ocilayout.sha256_hex(manifest_bytes)).write_bytes(manifest_bytes)
    record.parent.mkdir(exist_ok=True)
    tmp = record.with_suffix(".part")
    tmp.write_text(
        json.dumps({"compression": c.annotation, "manifest": ocilayout.sha256_hex(manifest_bytes)})
    )
    os.replace(tmp, record)
    return Form(layout, c, manifest_bytes)


def _compressed_elsewhere(layouts: Path, own: Path, c: Compression) -> dict[str, tuple[dict, Path]]:
    """diff ID -> (descriptor, blob path) of every layer a kept layout under `layouts` (other
    than `own`) compressed with `c`'s settings, its blob still there."""
    found: dict[str, tuple[dict, Path]] = {}
    if not layouts.is_dir():
        return found
    for root in sorted(layouts.iterdir()):
        if root == own or not (root / "forms" / f"{c.name}.json").is_file():
            continue
        try:
            other = ocilayout.read(root)
        except (OSError, ValueError, KeyError, TypeError):  # one being written or removed: skip it
            continue
        kept = _kept(other, c, root / "forms" / f"{c.name}.json")
        if kept is None:
            continue
        tars = other.manifest["layers"]
        for tar, desc in zip(tars, kept.manifest["layers"], strict=True):
            found.setdefault(tar["digest"], (desc, kept.blob(desc["digest"])))
    return found


def _adopt(known: tuple[dict, Path], blobs: Path) -> dict | None:
    """The kept blob in this layout's blob folder (a hard link; a copy across file systems);
    None when it went meanwhile."""
    desc, src = known
    dest = blobs / desc["digest"].split(":", 1)[1]
    if dest.is_file():
        return dict(desc)
    part = blobs / f".{dest.name}.adopt.part"
    try:
        try:
            os.link(src, part)
        except OSError:
            shutil.copyfile(src, part)
        if part.stat().st_size != desc["size"]:
            part.unlink()
            return None
        os.replace(part, dest)
    except OSError:
        part.unlink(missing_ok=True)
        return None
    return dict(desc)


def _kept(layout: ocilayout.Layout, c: Compression, record: Path) -> Form | None:
    """The form an earlier push made, when it was made with these settings and its blobs are
    all still there (and the manifest's bytes are still its digest)."""
    try:
        made = json.loads(record.read_text())
        manifest_bytes = layout.blob("sha256:" + made["manifest"]).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if made.get("compression") != c.annotation or ocilayout.sha256_hex(manifest_bytes) != made["manifest"]:
        return None
    kept = Form(layout, c, manifest_bytes)
    if not all(kept.blob(d["digest"]).is_file() for d in kept.manifest["layers"]):
        return None
    return kept
