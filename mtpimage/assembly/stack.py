"""The shared stack: every layer of an image below its mode layer, built once and shared
through the registry (`build.py stack`, the image workflow's `stack` job).

Profiles with equal pins render the same Dockerfile up to the mode layer (the last part,
images/partials/mode.j2, starting at MODE_MARKER), so BuildKit gives their lower layers the
same cache keys. The stack job builds that part alone, with its cache metadata inside the
image (BuildKit's inline cache), and pushes it as `REG/mtp-verl:stack-<key>`; each profile
job then names it as a cache source (`--stack-from REG`) and builds only its mode layer: the
lower layers are taken from the registry, never rebuilt, and its push uploads only the new
layer. Inline cache rather than a registry cache export: the docker driver (dockerd's own
BuildKit, the default builder of GitHub's runners and the only one of Debian's docker 20.10)
cannot export a registry cache, and with it the image is built straight into the engine's
store, so testing it needs no `--load` of a second copy. The compiled extensions' builder
stages are not part of the image and so not of its cache: their wheels go through the wheel
cache and its registry share (extbuild.py).

The key names exactly what the stack's layers are made of: the Dockerfile up to the mode
layer without its comment lines (the first comment names the profile; BuildKit ignores
comments), every rendered file but the mode layer's (`mtp/`), and each git component's
commit and patches (their sources are added to the context at build time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from mtpimage.assembly.render import Rendered
from mtpimage.errors import BuilderError
from mtpimage.imageref import Registry
from mtpimage.plan.model import IMAGE_REPOSITORY

MODE_MARKER = "# ---- layer: mode ("  # images/partials/mode.j2's first line
MODE_DIR = "mtp/"  # the mode layer's `COPY mtp/ /opt/mtp/`
STACK_TAG_PREFIX = "stack-"
LATEST_STACK_TAG = "stack"  # the last stack pushed: a cache source for the next one
STACK_LABEL = "io.mtp-image-builder.stack"


class NoModeLayer(BuilderError):
    """The rendered Dockerfile does not end with one mode layer (a template change)."""


def stack_dockerfile(rendered: Rendered) -> str:
    """The Dockerfile up to (without) the mode layer."""
    text = rendered.dockerfile
    if text.count(MODE_MARKER) != 1:
        raise NoModeLayer(
            f"the rendered Dockerfile of {rendered.plan.profile} has {text.count(MODE_MARKER)} "
            f"'{MODE_MARKER}' lines, expected one (fix: keep images/partials/mode.j2 the last part)"
        )
    head, _, tail = text.partition(MODE_MARKER)
    if any(line.startswith("FROM ") for line in tail.splitlines()):
        raise NoModeLayer("a stage starts after the mode layer (fix: keep the mode layer last)")
    return head


def stack_key(rendered: Rendered) -> str:
    """sha256 hex of what the stack's layers are made of (module docstring)."""
    lines = [ln for ln in stack_dockerfile(rendered).splitlines() if not ln.lstrip().startswith("#")]
    files = {
        path: hashlib.sha256(data).hexdigest()
        for path, data in sorted(rendered.files.items())
        if path != "Dockerfile" and not path.startswith(MODE_DIR)
    }
    doc = {"dockerfile": "\n".join(lines), "files": files, "sources": rendered.recipe.added_sources()}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def stack_tag(rendered: Rendered) -> str:
    return STACK_TAG_PREFIX + stack_key(rendered)[:16]


def stack_ref(registry: Registry, rendered: Rendered) -> str:
    return registry.ref(IMAGE_REPOSITORY, stack_tag(rendered))


def stack_rendered(rendered: Rendered) -> Rendered:
    """The same build context with the Dockerfile cut before the mode layer."""
    files = {**rendered.files, "Dockerfile": stack_dockerfile(rendered).encode()}
    return dataclasses.replace(rendered, files=files)


def cache_sources(registry: Registry, rendered: Rendered) -> tuple[str, ...]:
    """BuildKit cache sources of a build that reuses the stack: this plan's stack, then the
    last stack pushed (after a pin bump only the layers from the bumped one on are rebuilt)."""
    return (
        f"type=registry,ref={stack_ref(registry, rendered)}",
        f"type=registry,ref={registry.ref(IMAGE_REPOSITORY, LATEST_STACK_TAG)}",
    )


INLINE_CACHE = "type=inline"  # the cache metadata inside the image (dockerengine translates it)
