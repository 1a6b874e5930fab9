"""The registry tags an image is published under, per layer format (issue 48).

One image has one manifest digest per layer format (layercompress.py): the same config and
diff IDs, other blobs. So that a site can keep gzip for docker 20.10 nodes beside zstd for
enroot/pyxis in one namespace, each format has its own pair of tags: the default format
(compression.yaml `default`, gzip) the plain `<identity>` and `<profile>` every client and
every earlier release reads, any other `<identity>.<format>` and `<profile>.<format>`. The
suffix follows plan/model.py's one rule for a variant's tag (variant_tag: a dot, which is in
no profile name and no identity), so no format's tag is another profile's or image's; on
another platform the profile tag is already a variant (`<profile>.arm64`), and its format's
is `<profile>.arm64.zstd`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpimage.engine import layercompress
from mtpimage.plan.model import variant_tag


@dataclass(frozen=True)
class PublishedTags:
    """Where one format of an image lives in IMAGE_REPOSITORY."""

    content: str  # named by the identity: moves never (the image it names is fixed)
    profile: str  # named by the profile: moves to the newest tested image
    format: str  # the layer format (compression.yaml formats)


def for_format(identity: str, profile: str, fmt: str | None = None) -> PublishedTags:
    """The tags of `fmt` (None: the default format)."""
    fmt = fmt or layercompress.default_name()
    if fmt == layercompress.default_name():
        return PublishedTags(identity, profile, fmt)
    return PublishedTags(variant_tag(identity, fmt), variant_tag(profile, fmt), fmt)


def stale_format(manifest: dict, fmt: str) -> str | None:
    """The format of `manifest`'s layers when this tool wrote them in another than `fmt`
    (an uncompressed image pushed under the plain tags before gzip became the default), else
    None: a manifest in `fmt`, or one another tool pushed (docker's own gzip types), which
    the tag already names as this image."""
    found = layercompress.of_manifest(manifest)
    return found.name if found is not None and found.name != fmt else None
