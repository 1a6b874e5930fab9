"""A wheel a site built itself, taken into the extension wheel cache by sha256 (`wheels add`).

A site that already has a compiled flash-attn (its own builder, a vendor's wheel) gives its
file and sha256; the tool files it under the key the plan's build would look up, so the next
build installs it instead of compiling. Only by what can be checked here: the bytes hash to
the sha256 the user states (the pin), the wheel IS the plan's package at the plan's version
(its file name and its own METADATA), it is for the plan's Python, and it holds every
compiled module the catalogue says the package `produces`. What it was compiled against
cannot be checked from the file: that is the site's word, recorded as provided_by "site".
The stated sha256 becomes the key's pin in manifests/wheels.lock.yaml (origin "site"), for
review with the manifests; a key pinned to another wheel is refused.
"""

from __future__ import annotations

import re
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from mtpimage.assembly.render import render
from mtpimage.errors import InputError
from mtpimage.ext import extensions, wheelpins
from mtpimage.ext.wheelcache import CachedWheel, WheelCache, file_sha256, valid_filename
from mtpimage.plan.model import Package, Plan

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def compiled_modules(wheel: zipfile.ZipFile) -> set[str]:
    """Dotted and last-part names of the wheel's compiled modules (`pkg/x.cpython-312-...so`
    is `pkg.x` and `x`), as the builder stage's check reads them (images/lib/mtp_extension.py)."""
    out = set()
    for name in wheel.namelist():
        if name.endswith(".so") and ".dist-info/" not in name:
            stem = name[: -len(".so")].split(".")[0]
            out.add(stem.replace("/", "."))
            out.add(stem.rsplit("/", 1)[-1])
    return out


def _metadata(wheel: zipfile.ZipFile, where: str) -> tuple[str, str]:
    names = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
    if len(names) != 1:
        raise InputError(where, None, f"holds {len(names)} .dist-info/METADATA files, a wheel has one")
    meta = HeaderParser().parsestr(wheel.read(names[0]).decode("utf-8", errors="replace"))
    return meta.get("Name") or "", meta.get("Version") or ""


def _python_tags_fit(tags, python: str) -> bool:
    """cpXY / pyX / abi3 wheels that this plan's Python (X.Y) can install."""
    want = "cp" + python.replace(".", "")
    for t in tags:
        if t.interpreter in (want, "py3", "py" + python.replace(".", "")):
            return True
        if t.abi == "abi3" and t.interpreter.startswith("cp3") and int(t.interpreter[3:]) <= int(want[3:]):
            return True
    return False


def check_wheel(path: Path, sha256: str, plan: Plan, pkg: Package) -> None:
    """Every check of the module docstring; the first that fails is one InputError."""
    where = str(path)
    if not SHA256_RE.match(sha256 or ""):
        raise InputError("--sha256", sha256, "expected 64 lower-case hex digits", "give the file's sha256")
    if not path.is_file():
        raise InputError(where, None, "no such file", "give the path of the .whl file")
    actual = file_sha256(path)
    if actual != sha256:
        raise InputError(
            where,
            None,
            f"has sha256 {actual}, --sha256 says {sha256}",
            "check that this is the file the site pinned; never copy the hash from the file itself",
        )
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise InputError(
            where, None, f"is not a wheel file name ({exc})", "keep the wheel's own name"
        ) from None
    if not valid_filename(path.name):
        raise InputError(
            where, None, "is not a wheel file name the cache accepts", "keep the wheel's own name"
        )
    if canonicalize_name(name) != canonicalize_name(pkg.name) or version != Version(pkg.version):
        raise InputError(
            where,
            None,
            f"is {name} {version}, profile {plan.profile} builds {pkg.name} {pkg.version}",
            f"give a wheel of {pkg.name} {pkg.version}",
        )
    if not _python_tags_fit(tags, plan.python):
        raise InputError(
            where,
            None,
            f"is for {', '.join(sorted(str(t) for t in tags))}, profile {plan.profile} installs Python {plan.python}",
            f"give a wheel built for Python {plan.python}",
        )
    try:
        with zipfile.ZipFile(path) as z:
            meta_name, meta_version = _metadata(z, where)
            have = compiled_modules(z)
    except zipfile.BadZipFile:
        raise InputError(where, None, "is not a zip archive", "give the .whl file itself") from None
    if canonicalize_name(meta_name) != canonicalize_name(pkg.name) or meta_version != str(version):
        raise InputError(
            where,
            None,
            f"its METADATA says {meta_name} {meta_version}, its file name {name} {version}",
            "give the wheel as it was built (a renamed file is not that package)",
        )
    missing = [m for m in pkg.build.produces if m not in have]
    if missing:
        raise InputError(
            where,
            None,
            f"lacks compiled module(s) {', '.join(missing)} that {pkg.name} produces "
            f"(has: {', '.join(sorted(have)) or 'none'})",
            "give a wheel built with the package's extensions enabled (components.yaml build.env)",
        )


def add(
    m, plan: Plan, name: str, path: Path, sha256: str, cache: WheelCache | None = None
) -> tuple[CachedWheel, bool]:
    """Check the site's wheel and file it under the plan's key for `name`; -> (entry, added).
    added is False when the key already held exactly these bytes."""
    pkg = plan.package(name)
    if pkg is None or pkg.build is None:
        built = ", ".join(p.name for p in extensions.built(plan)) or "none"
        raise InputError(
            "--package",
            name,
            f"profile {plan.profile} does not compile {name} (it compiles: {built})",
            "give one of the packages it compiles",
        )
    path = Path(path)
    check_wheel(path, sha256, plan, pkg)
    rendered = render(plan, m.root)
    stage = rendered.recipe.builder(pkg.name)
    key = stage.key
    pins = wheelpins.load(m.root)
    pinned = pins.get(key)
    if pinned is not None and pinned.sha256 != sha256:
        raise InputError(
            "--sha256",
            sha256,
            f"key {key[:12]} ({pkg.name}) is pinned in {wheelpins.PINS_NAME} to {pinned.filename} sha256 "
            f"{pinned.sha256} ({pinned.origin})",
            "remove that pin in a reviewed commit to use the site's wheel instead",
        )
    cache = cache or WheelCache()
    there = cache.get(key)
    if there is not None:
        if there.sha256 == sha256:
            return there, False
        raise InputError(
            "--package",
            name,
            f"the wheel cache already holds {there.filename} sha256 {there.sha256} under key {key} "
            f"({there.meta.get('provided_by') or there.meta.get('built_by') or 'unknown origin'})",
            f"remove it first (`build.py wheels remove {key[:12]}`) to use the site's wheel",
        )
    meta = {
        "inputs": stage.key_inputs,
        "provided_by": "site",
        "original_filename": path.name,
        "added_at": int(time.time()),
    }
    entry = cache.put(key, path, meta)
    if key not in pins:  # the site stated the sha256: its pin, for review with the manifests
        pins[key] = wheelpins.Pin(pkg.name, pkg.version, entry.filename, entry.sha256, "site")
        wheelpins.write(m.root, pins)
    return entry, True
