"""From manifests to the Plan a command works on: load the manifests directory and build a
profile's Plan with lock.yaml's resolved versions and the recorded substitutions.

Every command and the main job start here; it lives outside the CLI so that command
modules and domain modules can use it without importing the CLI back.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mtpimage.lock import lockfile
from mtpimage.manifests import manifest
from mtpimage.plan.model import Plan, build_plan
from mtpimage.plan.substitute import apply as substitute
from mtpimage.settings import split_list


def load(manifests_dir: Path | None = None, keep_going: bool = False) -> manifest.Manifests:
    """The manifests directory given by --manifests, else this checkout's manifests/
    (`keep_going`: see manifest.load)."""
    return manifest.load(manifests_dir, keep_going=keep_going)


def load_for(args, keep_going: bool = False) -> manifest.Manifests:
    """The manifests of a parsed command line (its --manifests, when the command has one)."""
    return load(getattr(args, "manifests", None), keep_going=keep_going)


def plan_for(
    m: manifest.Manifests,
    name: str,
    sets,
    base: str | None = None,
    omit: tuple[str, ...] | None = None,
) -> Plan:
    """The profile's Plan, carrying lock.yaml's resolved dependency versions when the lock
    matches it: they are part of what the image is, so of its identity too. `base` and
    `omit` are the substitutions' flags (None: their MTP_* variables; see substitute.py)."""
    plan = build_plan(m, manifest.resolve_profile(m, name, sets))
    lock = lockfile.read(lockfile.lock_path(Path(m.root)))
    changes = {
        "locked": lockfile.locked_requirements(m, plan, lock),
        # the pins its platform's set has no wheel for (rule platform-wheels names them)
        "platform_gaps": lockfile.platform_gaps(m, plan, lock),
        # the manifest the build pulls from the pinned base: it is what the image starts from
        "base_platform": lockfile.locked_base_platform(lock, plan),
    }
    changes = {k: v for k, v in changes.items() if v}
    return substitute(dataclasses.replace(plan, **changes) if changes else plan, base, omit)


def substitutions_of(args) -> dict:
    """A parsed command line's --substitute-base and --omit-packages, as plan_for's keywords."""
    omit = getattr(args, "omit_packages", None)
    return {
        "base": getattr(args, "substitute_base", None),
        "omit": None if omit is None else split_list(omit),
    }
