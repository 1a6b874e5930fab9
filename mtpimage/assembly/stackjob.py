"""`build.py stack`: build each distinct shared stack of the given profiles once and, with a
registry, push it there as `REG/mtp-verl:stack-<key>` (and move `stack`, the cache source of
the next stack). A stack already in the registry is not built again ("up to date"). What a
stack is and why inline cache: stack.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mtpimage.assembly import release, sizes, stack
from mtpimage.assembly.buildctx import build_context
from mtpimage.assembly.pipeline import (
    base_platform,
    base_preflight,
    extension_labels,
    extension_wheels,
    index_preflight,
)
from mtpimage.assembly.render import Rendered
from mtpimage.imageref import Registry
from mtpimage.plan.model import IMAGE_REPOSITORY
from mtpimage.publish.registryclient import RegistryClient
from mtpimage.settings import local_image

Say = Callable[[str], None]


@dataclass(frozen=True)
class StackResult:
    tag: str  # stack-<16 hex>
    profiles: tuple[str, ...]
    state: str  # "built" or "up to date"
    ref: str  # REG/mtp-verl:stack-... or, without a registry, mtp-verl:stack-...
    digest: str | None = None  # in the registry


def group(rendered: list[Rendered]) -> dict[str, list[Rendered]]:
    """Profiles by stack tag, in the order given (equal pins: one group)."""
    out: dict[str, list[Rendered]] = {}
    for r in rendered:
        out.setdefault(stack.stack_tag(r), []).append(r)
    return out


def build_stack(rendered: Rendered, options, registry: Registry | None, say: Say) -> str:
    """BuildKit build of the stack with its cache inside the image; the untagged image id."""
    plan, eng = rendered.plan, options.engine
    mirrors = options.mirrors_for(plan)
    base_preflight(plan, eng, mirrors)
    say(f"base    {base_platform(plan, rendered.manifests_root, mirrors).line}")
    index_preflight(plan, mirrors)
    t0 = time.monotonic()
    cut = stack.stack_rendered(rendered)
    wheels = extension_wheels(plan, cut, options, say)
    context = build_context(cut, progress=say, wheels=wheels)
    cache_from = tuple(options.cache_from)
    if registry is not None:
        cache_from += (f"type=registry,ref={registry.ref(IMAGE_REPOSITORY, stack.LATEST_STACK_TAG)}",)
    say(f"build   {stack.stack_tag(rendered)} (the layers below the mode layer) with {eng.describe()}")
    labels = {stack.STACK_LABEL: stack.stack_key(rendered), **extension_labels(wheels)}
    image_id = eng.build(
        options.request(context, labels, plan, cache_from=cache_from, cache_to=(stack.INLINE_CACHE,))
    )
    say(f"built   {image_id[:19]} in {time.monotonic() - t0:.1f}s")
    sizes.after_build(plan, image_id, eng, say)
    return image_id


def run(rendered: list[Rendered], options, registry: Registry | None, say: Say = print) -> list[StackResult]:
    """Each distinct stack of `rendered` once: up to date in the registry, or built (and pushed)."""
    client = None
    if registry is not None:
        client = RegistryClient(registry)
    results = []
    for tag, members in group(rendered).items():
        names = tuple(r.plan.profile for r in members)
        say(f"stack   {tag} shared by {len(names)} profile(s): {', '.join(names)}")
        ref = registry.ref(IMAGE_REPOSITORY, tag) if registry else local_image(tag)
        there = client.manifest_digest(IMAGE_REPOSITORY, tag) if client else None
        if there is not None:
            say(f"up to date: {ref} exists in {registry.host}; nothing to build")
            results.append(StackResult(tag, names, "up to date", ref, there))
            continue
        image_id = build_stack(members[0], options, registry, say)
        eng = options.engine
        eng.tag(image_id, ref)
        digest = None
        if registry is not None:
            release.push(eng, ref, say)
            latest = registry.ref(IMAGE_REPOSITORY, stack.LATEST_STACK_TAG)
            eng.tag(image_id, latest)
            release.push(eng, latest, say)
            digest = client.manifest_digest(IMAGE_REPOSITORY, tag)
            say(f"pushed  {ref}@{digest} and moved {latest}")
        results.append(StackResult(tag, names, "built", ref, digest))
    return results
