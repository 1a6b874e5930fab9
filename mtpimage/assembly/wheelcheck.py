"""`wheels pin` and `wheels verify`: a profile's extension wheels into the committed pins
(wheelpins.py), and a key's wheel rebuilt and compared with its pin and its cache entry.

    wheels pin --profile P [--package NAME]
        the wheel cache's entry for each of P's keys (verified against its meta.json) becomes
        the key's pin; a key already pinned to other bytes is refused (PinMismatch), a key
        with no entry is refused before anything is written
    wheels verify KEY [--profile P]
        the profile whose plan has KEY (every profile is looked at without --profile); its
        builder stage runs again, without BuildKit's cache or the host's compile cache, into a
        temporary folder; the fresh wheel's sha256 against the pin and the cache entry
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtpimage.assembly.extbuild import compile_wheel
from mtpimage.assembly.render import Rendered, render
from mtpimage.errors import EXIT_RULES, BuilderError, InputError
from mtpimage.ext import extensions, wheelpins
from mtpimage.ext.wheelcache import CorruptEntry, WheelCache, file_sha256
from mtpimage.ext.wheelpins import Pin
from mtpimage.plan.model import Package

Say = Callable[[str], None]


class WheelNotReproduced(BuilderError):
    exit_code = EXIT_RULES


@dataclass(frozen=True)
class Pinned:
    key: str
    pin: Pin
    added: bool  # False: the key was pinned to these bytes already


def _profile_keys(rendered: Rendered) -> list[tuple[Package, str]]:
    return [(b.package, b.key) for b in rendered.recipe.builders]


def pin(m, plan, cache: WheelCache, package: str | None = None) -> tuple[list[Pinned], Path]:
    rendered = render(plan, m.root)
    keys = _profile_keys(rendered)
    if package is not None:
        keys = [(p, k) for p, k in keys if p.name == package]
    if not keys:
        built = ", ".join(p.name for p in extensions.built(plan)) or "none"
        raise InputError(
            "--package" if package else "--profile",
            package or plan.profile,
            f"profile {plan.profile} compiles no such extension (it compiles: {built})",
            "give a profile and package it compiles",
        )
    pins = wheelpins.load(m.root)
    out = []
    for pkg, key in keys:  # every key checked before the file is written
        entry = cache.get(key)
        if entry is None:
            raise InputError(
                "wheels pin",
                pkg.name,
                f"the wheel cache {cache.root} has no wheel for key {key[:12]}; nothing was pinned",
                f"build profile {plan.profile} first (or `wheels pull` the key), review it, then pin",
            )
        there = wheelpins.check(
            pins,
            key,
            entry.sha256,
            f"wheel cache entry {cache.root / key}",
            "a pin is never replaced by the tool: find out which wheel is right (`wheels verify "
            f"{key[:12]}`), then change {wheelpins.PINS_NAME} in a reviewed commit",
        )
        if there is not None:
            out.append(Pinned(key, there, False))
            continue
        origin = "site" if entry.meta.get("provided_by") == "site" else "built"
        pins[key] = Pin(pkg.name, pkg.version, entry.filename, entry.sha256, origin)
        out.append(Pinned(key, pins[key], True))
    return out, wheelpins.write(m.root, pins) if any(p.added for p in out) else wheelpins.pins_path(m.root)


def locate(m, key: str, profiles: list[str], plan_for) -> tuple[Rendered, Package, str]:
    """(rendered plan, package, full key) of the one extension whose key is `key` (or starts
    with it, 8+ hex digits) among the profiles."""
    found: dict[str, tuple[Rendered, Package]] = {}
    for name in profiles:
        rendered = render(plan_for(m, name), m.root)
        for pkg, k in _profile_keys(rendered):
            if k.startswith(key) and len(key) >= 8:
                found.setdefault(k, (rendered, pkg))
    if len(found) != 1:
        raise InputError(
            "wheel key",
            key,
            f"names {len(found)} extension builds of profile(s) {', '.join(profiles)}",
            "give 8+ hex digits of a key that `render` or a build prints (with --profile for another profile)",
        )
    (full, (rendered, pkg)), *_ = found.items()
    return rendered, pkg, full


@dataclass(frozen=True)
class Verdict:
    key: str
    name: str
    rebuilt: str  # sha256 of the wheel the builder stage made now
    pin: Pin | None
    cached: str | None  # sha256 of the cache entry's wheel; None: no entry

    def lines(self) -> list[str]:
        out = [f"rebuilt  {self.name} key {self.key[:12]}: sha256 {self.rebuilt}"]
        out.append(f"pin      {self.pin.sha256 if self.pin else 'none'} ({wheelpins.PINS_NAME})")
        out.append(f"cache    {self.cached or 'no entry'}")
        return out

    def problem(self) -> str | None:
        if self.pin is not None and self.pin.sha256 != self.rebuilt:
            return (
                f"the rebuilt {self.name} wheel (key {self.key[:12]}) has sha256 {self.rebuilt}, "
                f"{wheelpins.PINS_NAME} pins {self.pin.sha256} (fix: the build is not reproducible here or "
                "the pin is wrong: rebuild on another machine before changing the pin)"
            )
        if self.cached is not None and self.cached != self.rebuilt:
            return (
                f"wheel cache entry {self.key[:12]} ({self.name}) has sha256 {self.cached}, its rebuild "
                f"{self.rebuilt}{' (= the pin)' if self.pin else ''} (fix: the cache entry is not what "
                f"this key builds: `build.py wheels remove {self.key[:12]}`)"
            )
        return None


def something_to_compare(manifests_root: Path, key: str, cache: WheelCache) -> None:
    """Refuse, before anything compiles, a key with neither a pin nor a cache entry."""
    if key in wheelpins.load(manifests_root) or (cache.root / key).is_dir():
        return
    raise InputError(
        "wheel key",
        key[:12],
        f"has no pin in {wheelpins.PINS_NAME} and no entry in {cache.root}: a rebuild would be compared "
        "with nothing",
        "build the profile (or `wheels pull` the key), then `wheels pin` it",
    )


def rebuild(rendered: Rendered, pkg: Package, key: str, builder, jobs: int, cache: WheelCache) -> Verdict:
    """Run the builder stage again (`builder`: pipeline.extension_builder's pair, made with
    no_cache) and compare. No compile cache is served: the compiler runs."""
    context_for, request_for = builder
    with tempfile.TemporaryDirectory(prefix="mtp-ext-verify-") as tmp:
        wheel, _meta = compile_wheel(rendered, pkg, context_for, request_for, jobs, "", Path(tmp))
        rebuilt = file_sha256(wheel)
    try:
        entry = cache.get(key)
        cached = entry.sha256 if entry else None
    except CorruptEntry as exc:  # bytes changed under an unchanged meta.json: say what they are
        cached = file_sha256(exc.path) if exc.path.is_file() else None
    pin = wheelpins.load(rendered.manifests_root).get(key)
    return Verdict(key, pkg.name, rebuilt, pin, cached)
