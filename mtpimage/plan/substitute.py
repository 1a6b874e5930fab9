"""Substitutions: what a local build replaces because it cannot reach it, said out loud.

A site (or this project's real-stack build) that cannot pull the real base image or reach
verl's wheelhouse may still build every other part of a profile for real:

    --substitute-base NAME:TAG@sha256:...   build on this base instead of platform.base_image
    --omit-packages transformer-engine,flash-attn,apex   leave these pinned packages out

Each flag has its variable (MTP_SUBSTITUTE_BASE, MTP_OMIT_PACKAGES, read by settings.py),
used when the flag is not given, so scripts that set them keep working.

The Plan keeps the manifests' pins and the lock (so --frozen still holds), carries each
substitution in `substitutions`, and so in its digest, the image identity, the version
vector and a label: a substituted image can never pass for the real one.
"""

from __future__ import annotations

import dataclasses
import re

from mtpimage import settings
from mtpimage.errors import InputError
from mtpimage.plan.model import Plan

_DIGESTED = re.compile(r"^[a-z0-9][a-z0-9._/:-]*:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$")


def apply(plan: Plan, base: str | None = None, omit: tuple[str, ...] | list[str] | None = None) -> Plan:
    """`plan` with the substitutions recorded in it. None: the variable's value (a flag, when
    given, wins; the error names whichever said it)."""
    base_from = "--substitute-base" if base is not None else "MTP_SUBSTITUTE_BASE"
    omit_from = "--omit-packages" if omit is not None else "MTP_OMIT_PACKAGES"
    base = base if base is not None else settings.current().substitute_base
    omit = list(omit if omit is not None else settings.current().omit_packages)
    subs: list[tuple[str, str]] = []
    changes: dict = {}
    if base:
        if not _DIGESTED.match(base):
            raise InputError(
                base_from,
                None,
                f"{base!r} is not NAME:TAG@sha256:<64 hex>",
                "pin the substitute base by digest (push it to a registry to get one)",
            )
        subs.append(("base_image", f"{plan.base_image} -> {base}"))
        # lock.yaml's platform manifest is the manifests' base's, not this one's
        changes.update(base_image=base, base_digest=base.split("@", 1)[1], base_platform=None)
    if omit:
        names = {p.name for p in plan.packages}
        unknown = sorted(set(omit) - names)
        if unknown:
            raise InputError(
                omit_from,
                None,
                f"not a package of {plan.profile}: {', '.join(unknown)}",
                f"use some of: {', '.join(sorted(names))}",
            )
        for name in sorted(set(omit)):
            p = plan.package(name)
            subs.append(("omitted", f"{name}=={p.version} ({p.index})"))
        changes.update(
            packages=tuple(p for p in plan.packages if p.name not in omit),
            layers=tuple(
                dataclasses.replace(layer, items=tuple(i for i in layer.items if i not in omit))
                for layer in plan.layers
            ),
            locked=tuple(r for r in plan.locked if r.name not in omit),
        )
    if not subs:
        return plan
    return dataclasses.replace(plan, substitutions=tuple(subs), **changes)
