"""Which client versions read a published image's layers, per pull line the tool prints
(imageref.pull_strings: docker, pyxis, enroot, apptainer), as data (data/runtimes.yaml
`pull_lines` and each runtime's `layers`).

The main job and the workflow's summary say it beside a line whose client must be a given
version for the image's layer format (docker 23.0.0 for zstd), so a zstd image is never
offered to Debian 12's docker 20.10 without a word; the job scripts check the node's runtime
against the same table (outputs/runtimes.Pull). Here, below assembly, so the main job can
read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml


@dataclass(frozen=True)
class LayerSupport:
    """A client and one registry layer format: the oldest version that reads it ("": every)."""

    since: str
    note: str


@dataclass(frozen=True)
class PullNeed:
    """What the client of one printed pull line must be for the image's layers."""

    reader: str  # the title of what reads the layers: docker, enroot, Apptainer
    since: str
    layer_format: str

    def __str__(self) -> str:
        return f"needs {self.reader} {self.since} or later ({self.layer_format} layers)"


@dataclass(frozen=True)
class LineReader:
    """What reads the layers behind one pull line: a runtime of runtimes.yaml, or docker."""

    title: str
    layers: dict[str, LayerSupport]  # layer format (gzip, zstd) -> support
    source: str


@cache
def runtimes_doc() -> dict:
    return yaml.safe_load(resources.files("mtpimage.data").joinpath("runtimes.yaml").read_text())


def unfold(text: str) -> str:
    return " ".join(str(text).split())


def layer_support(layers: dict) -> dict[str, LayerSupport]:
    """A `layers:` table: format -> the oldest version that reads it (its `source` is not one)."""
    return {
        fmt: LayerSupport(str(v["since"]), unfold(v["note"]))
        for fmt, v in layers.items()
        if isinstance(v, dict)
    }


@cache
def line_readers() -> dict[str, LineReader]:
    """Per pull line (imageref.pull_strings' keys): what reads its layers."""
    doc = runtimes_doc()
    out = {}
    for line, spec in doc["pull_lines"].items():
        if "runtime" in spec:
            rt = doc["runtimes"][spec["runtime"]]
            out[line] = LineReader(rt["title"], layer_support(rt["layers"]), rt["layers"]["source"])
        else:
            out[line] = LineReader(spec["title"], layer_support(spec["layers"]), spec["layers"]["source"])
    return out


def pull_needs(layer_format: str | None) -> dict[str, PullNeed]:
    """The pull lines whose client must be a given version or later to read `layer_format`
    layers; a line any version pulls, or an unknown format, is left out."""
    needs = {}
    for line, reader in line_readers().items():
        support = reader.layers.get(layer_format or "")
        if support is not None and support.since:
            needs[line] = PullNeed(reader.title, support.since, layer_format or "")
    return needs
