"""The reproducible engine's image form: an OCI image layout, normalised so that its bytes
depend on the image's content alone (the standard library, and zstandard to read zstd layers).

buildah writes the layout (`buildah push --disable-compression IMAGE oci:DIR`); `normalise`
then makes the config and manifest canonical:
  - history comments `FROM <id>` are dropped: buildah 1.28 writes there the ID of the
    previous step's intermediate image, which carries the build container's random
    hostname and ID (the only config bytes that differ between two clean builds here);
  - layers are uncompressed (a base layer buildah kept as its registry's gzip is unpacked) (`application/vnd.oci.image.layer.v1.tar`), so a layer's digest
    is its diff ID and the manifest digest is a function of the config and the layers' bytes,
    never of a compressor's version or a blob cache that re-used another push's gzip;
  - config and manifest are written as canonical JSON (sorted keys, no spaces), without the
    manifest annotations buildah adds (the base image is named in the config's labels).

`docker_archive` streams the same image as `docker load` takes it, so dockerd gets an image
whose ID is this config's digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
WHITEOUT, WHITEOUT_OPAQUE = ".wh.", ".wh..wh..opq"
GZIP_TYPES = (
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
)


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Layout:
    """One image in an OCI layout directory."""

    root: Path
    manifest_bytes: bytes
    config_bytes: bytes

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_bytes)

    @property
    def config(self) -> dict:
        return json.loads(self.config_bytes)

    @property
    def digest(self) -> str:
        """The manifest digest: what a registry names this image by."""
        return "sha256:" + sha256_hex(self.manifest_bytes)

    @property
    def image_id(self) -> str:
        """The config digest: the image ID docker and buildah give it."""
        return "sha256:" + sha256_hex(self.config_bytes)

    @property
    def diff_ids(self) -> list[str]:
        return list(self.config.get("rootfs", {}).get("diff_ids", []))

    def blob(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.split(":", 1)[1]


def read(root: Path) -> Layout:
    root = Path(root)
    index = json.loads((root / "index.json").read_text())
    (desc,) = index["manifests"]
    blobs = root / "blobs" / "sha256"
    manifest_bytes = (blobs / desc["digest"].split(":", 1)[1]).read_bytes()
    config_digest = json.loads(manifest_bytes)["config"]["digest"]
    return Layout(root, manifest_bytes, (blobs / config_digest.split(":", 1)[1]).read_bytes())


def normalise(root: Path) -> Layout:
    """Rewrite the layout's config and manifest into their canonical form (idempotent)."""
    layout = read(root)
    config = layout.config
    for entry in config.get("history", []):
        if str(entry.get("comment", "")).startswith("FROM "):
            del entry["comment"]
    layers = []
    for desc, diff_id in zip(layout.manifest["layers"], layout.diff_ids, strict=True):
        if desc["digest"] != diff_id:  # buildah keeps a pulled base layer as its registry's gzip
            size = _decompress(layout.blob(desc["digest"]), layout.blob(diff_id), diff_id)
            desc = {"digest": diff_id, "size": size}
        layers.append({"digest": desc["digest"], "mediaType": OCI_LAYER, "size": desc["size"]})
    config_bytes = canonical(config)
    manifest = {
        "config": {
            "digest": "sha256:" + sha256_hex(config_bytes),
            "mediaType": OCI_CONFIG,
            "size": len(config_bytes),
        },
        "layers": layers,
        "mediaType": OCI_MANIFEST,
        "schemaVersion": 2,
    }
    manifest_bytes = canonical(manifest)
    blobs = Path(root) / "blobs" / "sha256"
    for data in (config_bytes, manifest_bytes):
        (blobs / sha256_hex(data)).write_bytes(data)
    index = {
        "manifests": [
            {
                "digest": "sha256:" + sha256_hex(manifest_bytes),
                "mediaType": OCI_MANIFEST,
                "size": len(manifest_bytes),
            }
        ],
        "schemaVersion": 2,
    }
    (Path(root) / "index.json").write_bytes(canonical(index))
    referenced = {sha256_hex(config_bytes), sha256_hex(manifest_bytes)} | {
        d["digest"].split(":", 1)[1] for d in layers
    }
    for blob in blobs.iterdir():  # the un-normalised config and manifest
        if blob.name not in referenced:
            blob.unlink()
    return read(root)


def _decompress(src: Path, dest: Path, diff_id: str) -> int:
    """Write the uncompressed layer `src` to `dest`, checked against its diff ID; its size."""
    tmp = dest.with_name(dest.name + ".part")
    h, size = hashlib.sha256(), 0
    with gzip.open(src, "rb") as f, open(tmp, "wb") as out:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
            out.write(chunk)
    if "sha256:" + h.hexdigest() != diff_id:
        tmp.unlink()
        raise ValueError(f"layer {src.name[:12]} does not decompress to its diff ID {diff_id}")
    os.replace(tmp, dest)
    return size


def prefix_config(layout: Layout, upto: int, nonce: str) -> bytes:
    """The config of an image of the layout's first `upto` layers alone: what a load of one
    layer at a time hands dockerd before the image's own config (load_steps). `nonce` (a label)
    makes its ID this load's own, so removing it never removes another build's."""
    config = layout.config
    return canonical(
        {
            "architecture": config.get("architecture", "amd64"),
            "os": config.get("os", "linux"),
            "config": {"Labels": {"io.mtp-image-builder.load-step": nonce}},
            "rootfs": {"type": "layers", "diff_ids": layout.diff_ids[:upto]},
        }
    )


def load_steps(n: int, present: int) -> list[tuple[int, int]]:
    """(upto, present) per `docker load` of an image of `n` layers whose first `present`
    dockerd already has: one load per missing layer, each of the layers up to it, the earlier
    ones already there. docker 20.10 unpacks a whole load archive into its tmp directory before
    it registers a layer, so one archive of every layer needs the image's size free twice (14 GB
    more for the real stack); one layer at a time needs the largest layer's. At least one load
    (the image's own config) even when every layer is there."""
    present = min(present, n)
    return [(upto, upto - 1) for upto in range(present + 1, n + 1)] or [(n, n)]


def docker_archive(
    layout: Layout, upto: int | None = None, present: int = 0, config_bytes: bytes | None = None
) -> Iterator[bytes]:
    """The image as a `docker load` tar (untagged: dockerd keeps it by its ID). With `upto`:
    an image of the first `upto` layers, whose config is `config_bytes` (prefix_config; the
    layout's own for all of them). The first `present` layers are empty files: dockerd has them
    (it looks a layer up by its chain ID before it opens the file, and never opens these); were
    one gone meanwhile, its load fails on the diff ID, loudly, rather than loading another."""
    n = len(layout.manifest["layers"])
    upto = n if upto is None else upto
    config_bytes = layout.config_bytes if config_bytes is None else config_bytes
    buf = io.BytesIO()
    config_name = f"{sha256_hex(config_bytes)}.json"
    descs = layout.manifest["layers"][:upto]
    layers = [f"{d['digest'].split(':', 1)[1]}/layer.tar" for d in descs]
    manifest = [{"Config": config_name, "RepoTags": None, "Layers": layers}]
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((config_name, config_bytes), ("manifest.json", canonical(manifest))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        # a file is named by its diff ID: one a loaded layer shares with a present one is real
        real = {name for name in layers[present:]}
        seen = set()
        for name, desc in zip(layers, descs, strict=True):
            if name in seen:
                continue
            seen.add(name)
            if name not in real:  # dockerd has it: an empty placeholder
                tar.addfile(tarfile.TarInfo(name))
                continue
            path = layout.blob(desc["digest"])
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


# ----------------------------------------------------------------------------- layer contents
Member = tuple  # (type, mode, uid, gid, size, sha256 of the content, link target, mtime)


def _zstandard():
    # deferred: import cost: the fast path imports mtpimage.engine with the standard library alone
    import zstandard

    return zstandard


def layer_stream(fileobj):
    """The uncompressed tar stream of a layer blob, whatever its form (read from its first
    bytes): tarfile reads tar and gzip itself, not zstd."""
    head = fileobj.read(len(ZSTD_MAGIC))
    fileobj.seek(-len(head), 1)
    if head == ZSTD_MAGIC:
        return _zstandard().ZstdDecompressor().stream_reader(fileobj, read_across_frames=True, closefd=False)
    return fileobj


def members(fileobj) -> dict[str, Member]:
    """Every entry of a layer tar with what makes it differ: metadata and content hash."""
    out: dict[str, Member] = {}
    with tarfile.open(fileobj=layer_stream(fileobj), mode="r|*") as tar:
        for m in tar:
            digest = ""
            if m.isfile():
                f = tar.extractfile(m)
                h = hashlib.sha256()
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                digest = h.hexdigest()
            # mode bits above 0o7777 repeat the entry's type (some writers set them, some not)
            out[m.name.lstrip("./") or "."] = (
                m.type,
                m.mode & 0o7777,
                m.uid,
                m.gid,
                m.size,
                digest,
                m.linkname,
                m.mtime,
            )
    return out


FIELDS = ("type", "mode", "uid", "gid", "size", "content", "link", "mtime")


def differences(a: dict[str, Member], b: dict[str, Member]) -> list[tuple[str, str]]:
    """(path, what differs) for each entry that is not the same in both: changed content
    and entries on one side first (what a container would see), then metadata; by path."""
    out = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x == y:
            continue
        if x is None or y is None:
            out.append((name, "only in the rebuild" if x is None else "only in the image"))
            continue
        what = [f for f, u, v in zip(FIELDS, x, y, strict=True) if u != v]
        out.append((name, ", ".join(w for w in what if w != "size" or "content" not in what)))
    return sorted(out, key=lambda e: (not e[1].startswith(("content", "only")), e[0]))


# ----------------------------------------------------------------------------- what a blob unpacks to
ZSTD_TYPES = ("application/vnd.oci.image.layer.v1.tar+zstd",)
GZIP_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
FORMS = {"tar": "an uncompressed tar", "gzip": "a gzip stream", "zstd": "a zstd stream"}


def declared_form(media_type: str) -> str | None:
    """What a layer's media type says its bytes are: "tar", "gzip", "zstd", or None (not a
    layer media type the tool knows)."""
    if media_type in (OCI_LAYER, DOCKER_LAYER):
        return "tar"
    if media_type in GZIP_TYPES:
        return "gzip"
    if media_type in ZSTD_TYPES:
        return "zstd"
    return None


class Undecodable(ValueError):
    """A blob's bytes cannot be read as a layer: a corrupt gzip or zstd stream."""


class UncompressedDigest:
    """A binary file object that hashes what is written to it after decompression: the layer's
    diff ID. What the bytes are is read from the bytes themselves (gzip and zstd by their
    magic numbers, else an uncompressed tar), not from the media type: docker 20.10 pushes
    uncompressed layers it pulled under a gzip media type, and a registry may rewrite media
    types. `mismatch` then says so, for the report. Optionally keeps the raw bytes in `keep`
    (a file). `seek(0)`/`truncate()` start over, as a retried download does."""

    def __init__(self, media_type: str, keep=None):
        self.media_type = media_type
        self.keep = keep
        self.seek(0)

    def seek(self, pos: int, whence: int = 0) -> int:
        self._hash = hashlib.sha256()
        self._z = None
        self._head = b""  # the first bytes, until there are enough to tell the form
        self.form: str | None = None
        if self.keep is not None:
            self.keep.seek(0)
            self.keep.truncate()
        return 0

    def truncate(self, size: int | None = None) -> int:
        return 0

    def _decide(self) -> None:
        head, self._head = self._head, b""
        if head.startswith(GZIP_MAGIC):
            self.form, self._z = "gzip", zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif head.startswith(ZSTD_MAGIC):
            self.form = "zstd"
            self._z = _zstandard().ZstdDecompressor().decompressobj()
        else:
            self.form = "tar"
        self._feed(head)

    def _feed(self, data: bytes) -> None:
        if self._z is None:
            self._hash.update(data)
            return
        try:
            while data:  # a stream of several gzip members or zstd frames: each one after the last
                if self._z.eof:
                    self._z = (
                        _zstandard().ZstdDecompressor().decompressobj()
                        if self.form == "zstd"
                        else zlib.decompressobj(16 + zlib.MAX_WBITS)
                    )
                self._hash.update(self._z.decompress(data))
                data = self._z.unused_data if self._z.eof else b""
        except (zlib.error, _zstandard().ZstdError) as exc:
            raise Undecodable(f"the {self.form} stream is corrupt ({exc})") from None

    def write(self, data: bytes) -> int:
        n = len(data)
        if self.keep is not None:
            self.keep.write(data)
        if self.form is None:
            self._head += data
            if len(self._head) >= len(ZSTD_MAGIC):
                self._decide()
            return n
        self._feed(data)
        return n

    def digest(self) -> str:
        if self.form is None:  # fewer bytes than a magic number: whatever they are, as they are
            self._decide()
        if self._z is not None:
            try:
                self._hash.update(self._z.flush())
            except (zlib.error, _zstandard().ZstdError) as exc:
                raise Undecodable(f"the {self.form} stream is corrupt ({exc})") from None
            if self.form == "zstd" and not self._z.eof:
                raise Undecodable("the zstd stream is cut short (its last frame does not end)")
        return "sha256:" + self._hash.hexdigest()

    @property
    def mismatch(self) -> str | None:
        """'media type X does not match the bytes (...)', or None when it does."""
        if self.form is None or declared_form(self.media_type) == self.form:
            return None
        return f"media type {self.media_type or '(none)'} does not match the bytes ({FORMS[self.form]})"


def merged(layers: list[dict[str, Member]]) -> dict[str, Member]:
    """The file system a stack of layers gives (lowest first), whiteouts applied."""
    out: dict[str, Member] = {}
    for layer in layers:
        for name, member in layer.items():
            parent, _, base = name.rpartition("/")
            prefix = f"{parent}/" if parent else ""
            if base == WHITEOUT_OPAQUE:
                for old in [n for n in out if n.startswith(prefix) and n != parent]:
                    del out[old]
            elif base.startswith(WHITEOUT):
                target = prefix + base[len(WHITEOUT) :]
                for old in [n for n in out if n == target or n.startswith(target + "/")]:
                    del out[old]
            else:
                out[name] = member
    return out


def changes(lower: dict[str, Member], layer: dict[str, Member]) -> list[tuple[str, str]]:
    """(path, what) for each entry of `layer` on top of the file system `lower`: added,
    changed (and which fields), removed (a whiteout), emptied (an opaque directory); what a
    container would see first, then metadata, by path."""
    out = []
    for name, member in layer.items():
        parent, _, base = name.rpartition("/")
        prefix = f"{parent}/" if parent else ""
        if base == WHITEOUT_OPAQUE:
            out.append((parent or ".", "emptied (opaque directory)"))
        elif base.startswith(WHITEOUT):
            out.append((prefix + base[len(WHITEOUT) :], "removed"))
        elif name not in lower:
            out.append((name, "added"))
        elif lower[name] != member:
            what = [f for f, u, v in zip(FIELDS, lower[name], member, strict=True) if u != v]
            what = sorted(
                (w for w in what if w != "size" or "content" not in what), key=lambda w: w != "content"
            )
            out.append((name, "changed: " + ", ".join(what)))
    seen = ("added", "removed", "emptied")
    return sorted(out, key=lambda e: (not (e[1].startswith(seen) or "content" in e[1]), e[0]))
