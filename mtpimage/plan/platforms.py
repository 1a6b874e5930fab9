"""mtpimage/data/platforms.yaml, read once and typed: what is known of each platform beside the
one lock.yaml is made for (issue 49 item 3: linux/arm64 for GH200/GB200), and what a plan's
locked set lacks there. Rule `platform-wheels` (rules.py) judges a plan with it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml
from packaging.utils import canonicalize_name as canonical

from mtpimage.plan.model import LockedRow, Plan

NONE = "none"  # platforms.yaml's word for "no wheel of that version for this platform"


@dataclass(frozen=True)
class Added:
    """A package the platform's resolution adds to lock.yaml's set (its markers)."""

    name: str
    version: str
    file: str
    via: str
    why: str


@dataclass(frozen=True)
class PlatformFacts:
    platform: str  # os/architecture, as OCI indexes and builds.platform name it
    wheel_platform: str  # the manylinux tag its wheels carry, e.g. manylinux_2_39_aarch64
    locked: bool  # whether lock.yaml holds files for it
    source: str  # the file list each row was read from, with {name}
    surveyed: str  # python set, cutoff and day of the survey, in words
    wheels: dict[tuple[str, str], str]  # (canonical name, version) -> its wheel here, or NONE
    adds: tuple[Added, ...]

    def source_of(self, name: str) -> str:
        return self.source.format(name=canonical(name))


def _pin(pin: str) -> tuple[str, str]:
    name, _, version = pin.partition("==")
    return canonical(name), version


@cache
def known() -> dict[str, PlatformFacts]:
    data = yaml.safe_load(resources.files("mtpimage.data").joinpath("platforms.yaml").read_text())
    out = {}
    for platform, p in data["platforms"].items():
        s = p["surveyed"]
        out[platform] = PlatformFacts(
            platform=platform,
            wheel_platform=p["wheel_platform"],
            locked=bool(p["locked"]),
            source=p["source"],
            surveyed=f"python set {s['python_set']} at cutoff {s['cutoff']}, read {s['read']}",
            wheels={_pin(pin): file for pin, file in p["wheels"].items()},
            adds=tuple(
                Added(canonical(n), str(a["version"]), a["file"], a["via"], " ".join(a["why"].split()))
                for n, a in (p.get("adds") or {}).items()
            ),
        )
    return out


def same_everywhere(row: LockedRow) -> bool:
    """A locked file any CPU installs: a pure-Python wheel or an sdist."""
    return row.file.endswith("-none-any.whl") or row.file.endswith((".tar.gz", ".zip"))


@dataclass(frozen=True)
class Gaps:
    """What a plan's locked set lacks on a platform: pins without its wheel, and pins the
    survey never read (a bump since, or another python set)."""

    no_wheel: tuple[LockedRow, ...]
    unsurveyed: tuple[LockedRow, ...]


def gaps(plan: Plan, facts: PlatformFacts) -> Gaps:
    no_wheel, unsurveyed = [], []
    for row in plan.locked:
        if not row.file or same_everywhere(row):
            continue  # built on the platform (no file), or one file for any CPU
        wheel = facts.wheels.get((canonical(row.name), row.version))
        if wheel is None:
            unsurveyed.append(row)
        elif wheel == NONE:
            no_wheel.append(row)
    return Gaps(tuple(no_wheel), tuple(unsurveyed))
