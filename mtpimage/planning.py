"""From manifests to the Plan a command works on: load the manifests directory and build a
profile's Plan with lock.yaml's resolved versions and the recorded substitutions.

Every command and the main job start here; it lives outside the CLI so that command
modules and domain modules can use it without importing the CLI back.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from . import manifest
from .plan import Plan, build_plan


def load(manifests_dir: Path | None = None) -> manifest.Manifests:
    """The manifests directory given by --manifests, else this checkout's manifests/."""
    return manifest.load(manifests_dir)


def load_for(args) -> manifest.Manifests:
    """The manifests of a parsed command line (its --manifests, when the command has one)."""
    return load(getattr(args, "manifests", None))


def plan_for(m: manifest.Manifests, name: str, sets) -> Plan:
    """The profile's Plan, carrying lock.yaml's resolved dependency versions when the lock
    matches it: they are part of what the image is, so of its identity too."""
    from .lockfile import locked_requirements
    from .substitute import apply as substitute

    plan = build_plan(m, manifest.resolve_profile(m, name, sets))
    locked = locked_requirements(m, plan)
    return substitute(dataclasses.replace(plan, locked=locked) if locked else plan)
