"""The cluster runtimes (enroot/pyxis, Apptainer) as data: which squashfs compressions and
which registry layer formats each reads, since which version (mtpimage/data/runtimes.yaml).

`export` picks its squashfs compression and says who reads it from here; the job scripts of
`explain --cluster` say which layer format they pull and check the node's runtime version
against what that format needs (`Pull`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from mtpimage.engine import layercompress
from mtpimage.errors import InputError
from mtpimage.publish import pullneeds
from mtpimage.publish.pullneeds import LayerSupport


@dataclass(frozen=True)
class SquashCompression:
    """One mksquashfs compression of runtimes.yaml `squashfs.compressions`."""

    name: str
    args: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Runtime:
    name: str  # enroot, apptainer: export --format and the job scripts' runtime
    title: str
    export_default: str  # the squashfs compression export writes for it
    reads: dict[str, str]  # squashfs compression -> which versions read it, in words
    sources: tuple[str, ...]
    layers: dict[str, LayerSupport]  # layer format (gzip, zstd) -> support
    layers_source: str
    version_command: str
    sif_compression: str = ""  # apptainer: the SIF's squashfs compression the job builds
    sif_since: str = ""  # ... from this version on (gzip before it)

    def reads_line(self, compression: str) -> str:
        return f"{self.title}: {self.reads[compression]}"

    def sif_build(self) -> SifBuild | None:
        """How the job script makes its SIF (Apptainer), None for a runtime without one."""
        if not self.sif_compression:
            return None
        args = " ".join(compressions()[self.sif_compression].args)
        return SifBuild(self.sif_compression, self.sif_since, args)


@dataclass(frozen=True)
class SifBuild:
    """An Apptainer job's SIF: squashfs `compression` (mksquashfs `args`) from `since` on."""

    compression: str
    since: str
    args: str


# runtimes.yaml is read once, in pullneeds (below assembly, where the main job reads it too)
_unfold = pullneeds.unfold
_doc = pullneeds.runtimes_doc


@cache
def reproducible_args() -> tuple[str, ...]:
    return tuple(str(a) for a in _doc()["squashfs"]["reproducible"])


@cache
def compressions() -> dict[str, SquashCompression]:
    return {
        name: SquashCompression(name, tuple(str(a) for a in spec["args"]), _unfold(spec["why"]))
        for name, spec in _doc()["squashfs"]["compressions"].items()
    }


@cache
def runtimes() -> dict[str, Runtime]:
    out = {}
    for name, spec in _doc()["runtimes"].items():
        layers = spec["layers"]
        sif = spec.get("sif") or {}
        out[name] = Runtime(
            name=name,
            title=spec["title"],
            export_default=spec["export"]["default"],
            reads={comp: _unfold(text) for comp, text in spec["export"]["reads"].items()},
            sources=tuple(spec["export"]["sources"]),
            layers=pullneeds.layer_support(layers),
            layers_source=layers["source"],
            version_command=spec["version_command"],
            sif_compression=sif.get("compression", ""),
            sif_since=str(sif.get("since", "")),
        )
    return out


def runtime(name: str) -> Runtime:
    return runtimes()[name]


def compression(name: str | None, rt: Runtime, flag: str = "--squash-compression") -> SquashCompression:
    """The squashfs compression called `name`, or the runtime's default when None."""
    name = name or rt.export_default
    if name not in compressions():
        raise InputError(
            flag, name, "unknown squashfs compression", f"use one of: {', '.join(compressions())}"
        )
    return compressions()[name]


def layer_format(manifest: bytes | dict) -> str | None:
    """The format of an image manifest's layers (gzip, zstd, none), when they are all one
    this table or compression.yaml knows; None otherwise (a mix, an index, a foreign type)."""
    doc = json.loads(manifest) if isinstance(manifest, bytes | str) else manifest
    if not isinstance(doc, dict):
        return None
    ours = layercompress.of_manifest(doc)
    if ours is not None:
        return ours.name
    docker = _doc()["docker_layer_types"]
    found = {docker.get((d or {}).get("mediaType")) for d in doc.get("layers") or [] if isinstance(d, dict)}
    return found.pop() if len(found) == 1 and None not in found else None


@dataclass(frozen=True)
class Pull:
    """What a job script pulls and what its node's runtime must be for it: the layer format
    (None: not known when the script was written) and where that was learned."""

    runtime: Runtime
    image: str  # the reference the runtime pulls
    layer_format: str | None
    known_from: str = ""  # "the registry's manifest", "--compression"

    @property
    def minimum(self) -> str:
        """The oldest runtime version that reads these layers ("": any)."""
        support = self.runtime.layers.get(self.layer_format or "")
        return support.since if support else ""

    @property
    def layers(self) -> str:
        """The layers in words, for the script's comments and its echo line."""
        if self.layer_format is None:
            return "layer format not known when this script was written"
        return f"{self.layer_format} layers"

    def comments(self) -> list[str]:
        rt = self.runtime
        if self.layer_format is None:
            needs = "; ".join(
                f"{fmt}: {rt.title} {s.since}+" if s.since else f"{fmt}: any {rt.title}"
                for fmt, s in rt.layers.items()
            )
            why = (
                f"{self.known_from} names none of them"
                if self.known_from
                else "--digest without --compression"
            )
            return [
                f"Layers: not known when this script was written ({why}); {needs}",
                f"  ({rt.layers_source})",
            ]
        support = rt.layers.get(self.layer_format)
        if support is None:
            return [
                f"Layers: {self.layer_format} (from {self.known_from}); runtimes.yaml has no fact about it"
            ]
        need = f"{rt.title} {support.since} or later" if support.since else f"any {rt.title}"
        note = f"; {support.note}" if support.note else ""
        return [
            f"Layers: {self.layer_format} (from {self.known_from}): {need} pulls them{note}",
            f"  ({rt.layers_source})",
        ]

    def fix(self) -> str:
        """What to do on a node whose runtime is older than `minimum`."""
        older = [f for f, s in self.runtime.layers.items() if not s.since]
        other = (
            f"publish the image with --compression {older[0]} and generate this script again" if older else ""
        )
        return f"install {self.runtime.title} {self.minimum} or later on the nodes" + (
            f", or {other}" if other else ""
        )
