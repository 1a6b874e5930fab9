"""`verify`: is a published image bit for bit what this lock builds?

    published image (registry) --manifest, config--> plan match? --no--> PlanMismatch (exit 1)
    every layer blob --download, decompress--> its config's diff ID? --no--> NotDescribed (exit 1)
    plan --render, clean rebuild (engine.reproducible())--> normalised OCI layout
        --compress as the published layers are (layercompress.py)--> the rebuild's published form
    compare: every layer (its diff ID, then its compressed blob), the config, the manifest

One line per layer; for a layer that differs, the files that differ and why (`explain`).
The rebuild takes the published image's provenance labels (PROVENANCE: who built it, from
which checkout of this tool, when) so that a site can verify an image built elsewhere; every
other byte must come out the same.
"""

from __future__ import annotations

import json
import re
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtpimage import engine
from mtpimage.assembly.pipeline import BuildOptions, build_request
from mtpimage.assembly.render import render
from mtpimage.assembly.versionvector import LABEL_NS
from mtpimage.engine import layercompress, ocilayout
from mtpimage.errors import EXIT_RULES, BuilderError, DecodeProblem, EnvironmentProblem, InputError
from mtpimage.imageref import ImageRef, Registry
from mtpimage.plan.model import Plan
from mtpimage.publish import digests, imageindex
from mtpimage.publish.registryclient import RegistryClient

Say = Callable[[str], None]
PROVENANCE = (
    "org.opencontainers.image.source",
    "org.opencontainers.image.url",
    "org.opencontainers.image.documentation",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.created",
)
MAX_CONFIG = 16 << 20
MAX_FILES = 8  # files named per differing layer
ON_TOP = "a layer on top of the image this lock builds (docker commit, or another tool, after the build)"


class NotIdentical(BuilderError):
    exit_code = EXIT_RULES


class PlanMismatch(BuilderError):
    exit_code = EXIT_RULES


class NotDescribed(BuilderError):
    """The registry's manifest names layer blobs that are not the layers its config lists:
    what a pull installs is not the image the config (labels, diff IDs) describes. Found
    before anything is rebuilt; `details` are the report lines (the layers, their files)."""

    exit_code = EXIT_RULES

    def __init__(self, message: str, details: list[str]):
        self.details = details
        super().__init__(message)


@dataclass
class BlobCheck:
    index: int  # 1-based, as the report counts layers
    blob: str  # the digest the manifest names
    unpacked: str  # the sha256 of the blob's uncompressed tar
    diff_id: str  # what the config's rootfs.diff_ids say at the same index
    files: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return self.unpacked == self.diff_id


@dataclass
class LayerResult:
    index: int
    instruction: str
    published: str  # the layer's diff ID in the image
    rebuilt: str | None  # None: the rebuild has fewer layers
    files: list[tuple[str, str, str]] = field(default_factory=list)  # (path, what, why)
    media: str | None = None  # "media type X does not match the bytes (...)"
    # the compressed blob: the published one and the rebuild's in the same format (None: the
    # rebuild was not compressed, the published layers being in no format this tool writes)
    blob: str = ""
    rebuilt_blob: str | None = None

    @property
    def same(self) -> bool:
        return self.published == self.rebuilt

    @property
    def blob_same(self) -> bool:
        return self.rebuilt_blob is None or self.blob == self.rebuilt_blob


@dataclass
class Report:
    image: str
    published_digest: str
    rebuilt_digest: str
    config_same: bool
    layers: list[LayerResult]
    extra_layers: int  # layers only the rebuild has
    # how the published layers are compressed, as the manifest says (its annotation) or, with
    # none, as their media types say ("" when in no format this tool writes)
    compression: str = ""
    made_here: bool = True  # the manifest says this tool compressed its layers (or none are)

    @property
    def media(self) -> list[LayerResult]:
        """The layers whose media type does not say what their bytes are."""
        return [r for r in self.layers if r.media]

    @property
    def ok(self) -> bool:
        return self.published_digest == self.rebuilt_digest


# ----------------------------------------------------------------------------- why a file differs
def why(path: str, what: str, layer: str) -> str:
    """The likely reason a file of a layer differs between the image and its rebuild."""
    name = path.rsplit("/", 1)[-1]
    if what.startswith("only in"):
        return "added or removed after the build, or written by a step that is not deterministic"
    if name.endswith(".pyc"):
        return "Python bytecode with the source's timestamp (compiled at import time in the build)"
    if re.search(r"\.so(\.|$)", name) and "extensions" in layer:
        return (
            "compiled code: the extension wheel was built again, not taken by sha256 (fix: wheels pull KEY)"
        )
    if path.startswith(("var/log/", "var/lib/apt/", "var/cache/")) or name == "aux-cache":
        return "OS package manager state written at build time"
    if what == "mtime":
        return "file time only"
    return "content not made by building this lock (changed after the build, or another input)"


def explain(published_tar, rebuilt_tar, layer: str) -> list[tuple[str, str, str]]:
    a = ocilayout.members(published_tar)
    b = ocilayout.members(rebuilt_tar)
    return [(path, what, why(path, what, layer)) for path, what in ocilayout.differences(a, b)]


def instructions(config: dict) -> list[str]:
    """A short name per layer from the config's history (base layers: `base`)."""
    out = []
    for entry in config.get("history", []):
        if entry.get("empty_layer"):
            continue
        text = entry.get("created_by", "")
        text = re.sub(r"^\|\d+ (\S+=\S* )*", "", text)
        text = re.sub(r"/bin/(ba)?sh (-o pipefail )?-\w*c |#\(nop\) |--mount=\S+\s*|# buildkit", "", text)
        out.append(" ".join(text.split())[:72] or "base")
    return out


# ----------------------------------------------------------------------------- the steps
def _json(data: bytes, what: str, ref: ImageRef) -> dict:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise DecodeProblem(
            f"registry {ref.host} served {what} of {ref} that is not JSON ({str(exc)[:80]}) "
            "(fix: the registry's copy is damaged: push the image again, or use another registry)"
        ) from None
    if not isinstance(doc, dict):
        raise DecodeProblem(
            f"registry {ref.host} served {what} of {ref} that is not a JSON object (fix: push the image again)"
        )
    return doc


def _checked_digests(manifest: dict, ref: ImageRef, what: str) -> None:
    """Every digest the registry's manifest names, checked before it reaches a URL, a file
    name or a line of the report (digests.checked)."""
    where = f"registry {ref.host}: {what} of {ref}"
    digests.checked((manifest.get("config") or {}).get("digest"), f"{where}: the config digest")
    for i, desc in enumerate(manifest.get("layers") or [], 1):
        digests.checked((desc or {}).get("digest") if isinstance(desc, dict) else desc, f"{where}: layer {i}")


@dataclass(frozen=True)
class ManifestRead:
    """The manifest `--image` names, read once: whether it is an index and the image verify
    compares are judged on the same bytes (a second read could be answered differently)."""

    ref: ImageRef
    body: bytes
    digest: str  # of these bytes (registryclient.manifest checks it)


def read_manifest(client: RegistryClient, ref: ImageRef) -> ManifestRead:
    got = client.manifest(ref.path, ref.digest or ref.tag or "latest")
    if got is None:
        raise InputError(
            "--image", str(ref), "no such image in its registry", "check the reference and digest"
        )
    body, digest = got
    return ManifestRead(ref, body, digest)


def published(
    client: RegistryClient, ref: ImageRef, tmp: Path, read: ManifestRead | None = None
) -> tuple[str, dict, dict]:
    """(manifest digest, manifest, config) of the image in its registry, every digest in
    them checked (digests.checked). `read`: the manifest already read for `ref` (per_platform)."""
    read = read if read is not None and read.ref == ref else read_manifest(client, ref)
    body, digest = read.body, read.digest
    if ref.digest and digest != ref.digest:
        raise EnvironmentProblem(f"registry {ref.host} served {digest} for {ref} (fix: use another registry)")
    manifest = _json(body, "a manifest", ref)
    if "layers" not in manifest:
        raise InputError(
            "--image",
            str(ref),
            "names an image index, not one image",
            "verify the index itself (each platform in turn) or give --platform",
        )
    _checked_digests(manifest, ref, "the manifest")
    with open(tmp / "config", "w+b") as f:
        got_digest, size = client.fetch_blob(ref.path, manifest["config"]["digest"], f, MAX_CONFIG)
        if got_digest != manifest["config"]["digest"]:
            raise EnvironmentProblem(f"registry {ref.host} served a config that does not match its digest")
        f.seek(0)
        config = _json(f.read(), "a config", ref)
    for i, diff_id in enumerate((config.get("rootfs") or {}).get("diff_ids") or [], 1):
        digests.checked(diff_id, f"registry {ref.host}: the config of {ref}: rootfs.diff_ids[{i}]")
    return digest, manifest, config


def _ref_of(image: str) -> ImageRef:
    ref = ImageRef.parse(image, flag="--image")
    if not ref.explicit_host:
        raise InputError("--image", image, "names no registry", "give HOST[:PORT]/NAME@sha256:...")
    return ref


def per_platform(image: str, platform: str | None) -> tuple[str, list[tuple[str, str]]] | ManifestRead:
    """When `image` names a multi-arch index: (the index, [(platform, HOST/NAME@sha256:...)]),
    the entry of `platform` or else every entry, read from the index's bytes (their digest is
    the one asked for: registryclient.manifest). When it names one image: its manifest as
    read, for `run` to use (the one read of it)."""
    ref = _ref_of(image)
    read = read_manifest(RegistryClient(Registry(ref.host, "")), ref)
    body, digest = read.body, read.digest
    listed = imageindex.platforms_of(body)
    if listed is None:
        return read
    if platform is not None and platform not in listed:
        raise InputError(
            "--platform",
            platform,
            f"the index {ref.pinned(digest)} does not list it",
            f"use one of: {', '.join(sorted(listed))}",
        )
    chosen = [platform] if platform else sorted(listed)
    name = ref.repository
    return str(ref.pinned(digest)), [(p, f"{name}@{listed[p]}") for p in chosen]


def check_plan(config: dict, plan: Plan, identity: str, ref: str) -> None:
    """The image's own labels must name this plan: else nothing is rebuilt."""
    labels = (config.get("config") or {}).get("Labels") or {}
    theirs = labels.get(f"{LABEL_NS}.identity"), labels.get(f"{LABEL_NS}.plan-digest")
    if theirs == (identity, plan.digest):
        return
    profile = labels.get(f"{LABEL_NS}.profile", "?")
    raise PlanMismatch(
        f"--image {ref}: built from {theirs[0] or 'no identity label'} (profile {profile}, plan "
        f"{(theirs[1] or '?')[:12]}), but profile {plan.profile} with these manifests and lock is "
        f"{identity} (plan {plan.digest[:12]}); nothing was rebuilt (fix: verify with the profile, "
        "manifests and lock.yaml the image was built from, or --set the pins it names)"
    )


def check_blobs(
    client: RegistryClient, ref: ImageRef, digest: str, manifest: dict, config: dict, tmp: Path, say: Say
) -> dict[int, str]:
    """Each layer blob the manifest names must unpack to the config's diff ID at its index
    (what `docker pull` and `buildah pull` do not all check): else NotDescribed, before the
    rebuild. Every blob is downloaded once and hashed as it streams; a mismatching one is kept
    and compared with the layer its config names, where the registry still has that one.
    Returns {layer index: what its media type gets wrong} for layers whose bytes are not what
    their media type says (docker 20.10 pushes uncompressed layers it pulled as gzip): read
    as what they are, and reported, not taken for a network error. Bytes that cannot be
    decoded at all are DecodeProblem (exit 6)."""
    pinned = str(ref.pinned(digest))
    descs = manifest.get("layers") or []
    diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
    if len(descs) != len(diff_ids):
        raise NotDescribed(
            f"--image {pinned}: the image in the registry is not the one its config describes: its "
            f"manifest names {len(descs)} layers, its config's rootfs.diff_ids {len(diff_ids)} (fix: "
            "the manifest was changed after the build; do not use this image, push it again from a build)",
            [],
        )
    say(f"verify  checking that the {len(descs)} layer blobs are the layers the config lists")
    bad: list[BlobCheck] = []
    media: dict[int, str] = {}
    for i, (desc, diff_id) in enumerate(zip(descs, diff_ids), 1):
        with open(tmp / "blob", "w+b") as keep:
            sink = ocilayout.UncompressedDigest(desc.get("mediaType", ""), keep)
            try:
                got, _size = client.fetch_blob(ref.path, desc["digest"], sink, 1 << 42)
                unpacked = sink.digest()
            except ocilayout.Undecodable as exc:
                raise DecodeProblem(
                    f"--image {pinned}: layer {i} (blob {desc['digest']}, media type "
                    f"{desc.get('mediaType') or '(none)'}) cannot be decoded: {exc}; nothing was rebuilt "
                    "(fix: the image's layer is damaged: push it again from a build with --engine buildah)"
                ) from None
            if got != desc["digest"]:
                raise EnvironmentProblem(
                    f"registry {ref.host} served blob {got} when asked for {desc['digest']} (layer {i} of "
                    f"{pinned}) (fix: use another registry)"
                )
            if sink.mismatch:
                media[i] = sink.mismatch
                say(f"verify  layer {i}: {sink.mismatch}")
            check = BlobCheck(i, desc["digest"], unpacked, diff_id)
            if not check.same:
                check.files = _against_original(client, ref, check, keep, tmp, manifest, config)
                bad.append(check)
    if not bad:
        return media
    details = []
    for c in bad:
        details.append(
            f"layer {c.index:>2}/{len(descs)}  NOT DESCRIBED  blob {c.blob[:19]} unpacks to "
            f"{c.unpacked[:19]}, the config says {c.diff_id[:19]}"
        )
        details += [f"    {p}: {w}: {r}" for p, w, r in c.files[:MAX_FILES]]
        if len(c.files) > MAX_FILES:
            details.append(f"    ... {len(c.files) - MAX_FILES} more files")
    first = bad[0]
    files = ", ".join(f"{p} ({w})" for p, w, _ in first.files[:3])
    raise NotDescribed(
        f"--image {pinned}: the image in the registry is not the one its config describes: layer "
        f"{first.index} (blob {first.blob}) unpacks to {first.unpacked}, but the config's diff ID "
        f"for layer {first.index} is {first.diff_id}"
        + (f"; files: {files}" if files else "")
        + (f"; {len(bad)} such layers" if len(bad) > 1 else "")
        + " (fix: a layer blob was swapped after the build; do not use this image, push it again "
        "from a build); nothing was rebuilt",
        details,
    )


def _originals(client, ref: ImageRef, check: BlobCheck, manifest: dict, config: dict) -> list[str]:
    """Where the registry may still hold the layer the config names (blobs are addressed by
    content, so a blob that unpacks to the diff ID is the original): its uncompressed tar (an
    image published with --compression none), and the blob at the same index of the image's
    content tag or profile tag (the tags its build pushed, named by its identity and profile
    labels) when that manifest has the same config (a compressed image, a tag of which now
    names a changed manifest)."""
    out = [check.diff_id] if client.blob_exists(ref.path, check.diff_id) else []
    labels = (config.get("config") or {}).get("Labels") or {}
    for tag in (labels.get(f"{LABEL_NS}.identity"), labels.get(f"{LABEL_NS}.profile")):
        if not (isinstance(tag, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)):
            continue
        got = client.manifest(ref.path, tag)
        try:
            theirs = json.loads(got[0]) if got else {}
            if theirs.get("config", {}).get("digest") == manifest["config"]["digest"]:
                blob = theirs["layers"][check.index - 1]["digest"]
                if blob != check.blob and blob not in out:
                    out.append(digests.checked(blob, f"registry {ref.host}: {ref.path}:{tag}"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue  # not a manifest this tool pushed: no original there
    return out


def _against_original(
    client, ref: ImageRef, check: BlobCheck, blob, tmp: Path, manifest: dict, config: dict
) -> list[tuple[str, str, str]]:
    """The files of a swapped blob that differ from the layer its config names, when the
    registry still holds that layer (_originals); [] when it does not."""
    for candidate in _originals(client, ref, check, manifest, config):
        with open(tmp / "original", "w+b") as f:
            sink = ocilayout.UncompressedDigest("", f)
            try:
                got, _ = client.fetch_blob(ref.path, candidate, sink, 1 << 42)
                if got != candidate or sink.digest() != check.diff_id:
                    continue
            except ocilayout.Undecodable:
                continue
            f.seek(0)
            blob.seek(0)
            return [
                (path, what.replace("the rebuild", "the config's layer"), reason)
                for path, what, reason in explain(blob, f, "swapped")
            ]
    return []


def run(
    manifests_root: Path,
    plan: Plan,
    image: str,
    options: BuildOptions,
    say: Say,
    scratch: Path | None = None,
    read: ManifestRead | None = None,
) -> Report:
    ref = _ref_of(image)
    client = RegistryClient(Registry(ref.host, ""))
    rendered = render(plan, manifests_root)
    with tempfile.TemporaryDirectory(prefix="mtp-verify-", dir=scratch) as tmp:
        tmpdir = Path(tmp)
        digest, manifest, config = published(client, ref, tmpdir, read)
        check_plan(config, plan, rendered.identity, str(ref))
        media = check_blobs(client, ref, digest, manifest, config, tmpdir, say)
        say(f"verify  {ref.pinned(digest)}: rebuilding {rendered.identity} on a clean builder")
        labels = (config.get("config") or {}).get("Labels") or {}
        keep = {k: labels[k] for k in PROVENANCE if k in labels}
        req = build_request(
            plan, rendered, options, say, labels={f"{LABEL_NS}.identity": rendered.identity, **keep}
        )
        layout = engine.reproducible().build_layout(req, tmpdir / "rebuilt", echo=False)
        return compare(
            client, ref, digest, manifest, config, published_form(layout, manifest, say), tmpdir, media
        )


def published_form(layout, manifest: dict, say: Say) -> layercompress.Form | ocilayout.Layout:
    """The rebuild in the published image's layer format (layercompress.py, with this
    checkout's settings for that format), so that blobs and manifest compare byte for byte; the
    layout as it is when the published layers are in no format this tool writes."""
    c = layercompress.of_manifest(manifest)
    if c is None:
        return layout
    return layercompress.form(layout, c, say=say)


def compare(
    client, ref: ImageRef, digest: str, manifest: dict, config: dict, rebuilt, tmp: Path, media=None
) -> Report:
    """`rebuilt`: the rebuild's Form in the published format, or its bare Layout."""
    layout = rebuilt.layout if isinstance(rebuilt, layercompress.Form) else rebuilt
    blobs = [d["digest"] for d in rebuilt.manifest["layers"]] if rebuilt is not layout else []
    mine = layout.diff_ids
    theirs = list((config.get("rootfs") or {}).get("diff_ids") or [])
    names = instructions(config)
    rows = []
    lower = None  # the rebuild's file system, for layers on top of it
    for i, diff_id in enumerate(theirs):
        row = LayerResult(
            i + 1,
            names[i] if i < len(names) else "?",
            diff_id,
            mine[i] if i < len(mine) else None,
            media=(media or {}).get(i + 1),
            blob=manifest["layers"][i]["digest"],
            rebuilt_blob=blobs[i] if i < len(blobs) else None,
        )
        if not row.same:
            with open(tmp / "layer", "w+b") as f:
                blob = manifest["layers"][i]["digest"]
                client.fetch_blob(ref.path, blob, f, 1 << 42)
                f.seek(0)
                try:  # tarfile's "r|*" reads the bytes as what they are, whatever the media type
                    if row.rebuilt is not None:
                        with open(layout.blob(layout.manifest["layers"][i]["digest"]), "rb") as g:
                            row.files = explain(f, g, row.instruction)
                    else:  # a layer on top of everything the lock builds (docker commit, ...)
                        if lower is None:
                            lower = ocilayout.merged(
                                [_members(layout.blob(d["digest"])) for d in layout.manifest["layers"]]
                            )
                        top = ocilayout.members(f)
                        row.files = [(path, what, ON_TOP) for path, what in ocilayout.changes(lower, top)]
                        lower = ocilayout.merged([lower, top])
                except (tarfile.TarError, EOFError, zlib.error) as exc:
                    raise DecodeProblem(
                        f"--image {ref.pinned(digest)}: layer {i + 1} (blob {blob}) is not a readable tar "
                        f"({exc}), so its files cannot be named (fix: the image's layer is damaged: push "
                        "it again from a build)"
                    ) from None
        rows.append(row)
    config_same = manifest["config"]["digest"] == layout.image_id
    said = (manifest.get("annotations") or {}).get(layercompress.ANNOTATION)
    c = layercompress.of_manifest(manifest)
    return Report(
        str(ref.pinned(digest)),
        digest,
        rebuilt.digest if isinstance(rebuilt, layercompress.Form) else layout.digest,
        config_same,
        rows,
        max(0, len(mine) - len(theirs)),
        compression=said or (c.name if c else ""),
        made_here=c is None or not c.compresses or said is not None,
    )


def _members(path: Path) -> dict:
    with open(path, "rb") as f:
        return ocilayout.members(f)


# ----------------------------------------------------------------------------- output
def lines(report: Report) -> list[str]:
    total = len(report.layers)
    out = []
    for row in report.layers:
        state = "same   " if row.same else "DIFFERS"
        text = f"layer {row.index:>2}/{total}  {state}  {row.published[:19]}"
        if not row.same:
            text += f" != {(row.rebuilt or 'missing')[:19]}"
        out.append(f"{text}  {row.instruction}")
        if row.media:
            out.append(f"    {row.media}")
        if row.same and not row.blob_same:
            out.append(
                f"    same content, other {report.compression} bytes: blob {row.blob[:19]} != {row.rebuilt_blob[:19]}"
            )
        for path, what, reason in row.files[:MAX_FILES]:
            out.append(f"    {path}: {what}: {reason}")
        if len(row.files) > MAX_FILES:
            out.append(f"    ... {len(row.files) - MAX_FILES} more files")
    if report.extra_layers:
        out.append(
            f"layer  +{report.extra_layers}  DIFFERS  the rebuild has {report.extra_layers} more layers"
        )
    out.append(f"config         {'same   ' if report.config_same else 'DIFFERS'}")
    if report.compression:
        blobs = [r for r in report.layers if r.rebuilt_blob is not None]
        state = "same   " if all(r.blob_same for r in blobs) else "DIFFERS"
        out.append(
            f"blobs          {state}  {report.compression}"
            + ("" if report.made_here else " (not compressed by this tool)")
        )
    state = "same   " if report.ok else "DIFFERS"
    out.append(f"manifest       {state}  {report.published_digest}  rebuilt {report.rebuilt_digest}")
    return out


def verdict(report: Report) -> None:
    """Raise NotIdentical with the one line that says what differs."""
    if report.ok:
        return
    bad = [r for r in report.layers if not r.same]
    if bad:
        first = bad[0]
        files = ", ".join(f"{p} ({w})" for p, w, _ in first.files[:3]) or "no file differs"
        if first.rebuilt is None:
            files = f"not in the rebuild, on top of it: {files}"
        what = f"{len(bad)} of {len(report.layers)} layers differ; first: layer {first.index} ({first.instruction[:40]}): {files}"
    elif report.extra_layers:
        what = f"the rebuild has {report.extra_layers} more layers"
    elif not report.config_same:
        what = "every layer is the same but the config differs (labels, environment or history)"
    elif report.media:
        what = "every layer and the config are the same but the manifest differs"
    elif not report.made_here:
        what = (
            f"every layer's content and the config are the same, but its {report.compression} layers were "
            "not compressed by this tool (pushed by another engine or client), so their bytes and the "
            "manifest differ"
        )
    elif any(not r.blob_same for r in report.layers):
        first = next(r for r in report.layers if not r.blob_same)
        what = (
            f"every layer's content and the config are the same, but the compressed blobs differ (first: "
            f"layer {first.index}, {report.compression}: this machine's compressor writes other bytes)"
        )
    else:
        what = "every layer, blob and the config are the same but the manifest differs (its annotations or media types)"
    if report.media:
        first = report.media[0]
        what += f"; layer {first.index}'s {first.media}" + (
            f" ({len(report.media)} such layers)" if len(report.media) > 1 else ""
        )
    raise NotIdentical(
        f"--image {report.image} is not bit for bit what this lock builds: {what} (fix: it was changed "
        "after the build or built from other inputs; rebuild and push it with --engine buildah)"
    )
