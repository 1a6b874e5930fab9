"""The lock domain: verify every pin, resolve the whole image once, probe the sources and
write manifests/lock.yaml (the command line is commands/lock.py's).

What cannot be checked from this machine (a host git cannot resolve, an index that does
not answer, the base image's registry) is recorded as `verified: false` with the reason;
anything that answered and said no (a commit missing upstream, a refused connection, a
transfer cut off) fails the lock, and neither lock.yaml nor the source cache is changed.
A package whose index does not answer fails it too (pythonset.HashlessPackage): with no file there is
no sha256, and the image never installs by version alone (rule hash-pinned).
Two runs on one manifests directory serialise on a file lock (`exclusive`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from mtpimage.errors import BuilderError, InputError
from mtpimage.lock import lockfile, pydeps, sources
from mtpimage.lock.probes import PROBED_RULES, patch_dry_run, probe_plan
from mtpimage.lock.pythonset import PythonSets
from mtpimage.lock.sources import SourceSet
from mtpimage.manifests import manifest, rules
from mtpimage.manifests.patches import PatchUnavailable
from mtpimage.manifests.patches import as_files as patch_files
from mtpimage.plan.model import Component, Plan, build_plan

# `now` as a cutoff is an hour ago: an upload takes minutes to reach every index page and
# mirror, and uv answers from a page it fetched up to 10 minutes before; a cutoff that recent
# could resolve differently on the next machine.
SETTLE = timedelta(hours=1)

BASE_UNVERIFIED = (
    "lock does not query container registries; the digest is kept as written "
    "in components.yaml (verify with `docker buildx imagetools inspect NAME:TAG`)"
)


@dataclass
class LockOutcome:
    """What a lock run did, for the command to print."""

    written: bool  # False: refused (--require-verified), nothing written
    changed: bool = False  # lock.yaml's bytes changed
    moved: list[str] = field(default_factory=list)  # --upgrade: pins moved
    profiles: int = 0
    components: int = 0
    packages: int = 0  # Python packages resolved in this run
    resolve_seconds: float = 0.0
    elapsed: float = 0.0
    unverified: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    cutoff: str = ""  # the resolution cutoff this run resolved at
    cutoff_was: str | None = None  # the recorded one, when this run moved it ("" when none was)
    notes: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # resolved versions that moved


# ----------------------------------------------------------------------------- upgrade


def upgrade(m: manifest.Manifests, names: list[str], target: str) -> list[str]:
    """Re-resolve refs; rewrite components.yaml in place. Returns lines describing moves."""
    comps: dict[str, dict] = {}
    for name in names:
        rp = manifest.resolve_profile(m, name)
        for cname, c in rp.components.items():
            if "commit" in rp.overridden.get(cname, []) and (target in ("*", cname)):
                raise InputError(
                    m.profiles[name].file,
                    f"stack.overrides.{cname}.commit",
                    f"profile {name} overrides the commit of {cname}",
                    "edit that override by hand; --upgrade rewrites components.yaml only",
                )
            comps.setdefault(cname, c)
    if target != "*":
        if target not in comps:
            raise InputError(
                "--upgrade",
                target,
                f"'{target}' is not a component of the locked profiles",
                f"use one of: {', '.join(sorted(comps))}",
            )
        if comps[target]["source"] != "git":
            raise InputError(
                "--upgrade",
                target,
                f"{target} comes from PyPI, pinned by version",
                "edit its version in manifests/components.yaml",
            )
        comps = {target: comps[target]}
    cat_path = m.root / "components.yaml"
    text = cat_path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    moved = []
    for cname, c in sorted(comps.items()):
        if c["source"] != "git" or not c.get("ref") or sources.SHA_RE.match(c["ref"]):
            continue
        new = sources.ls_remote(c["repo"], c["ref"])
        if new == c.get("commit"):
            continue
        loc = m.catalogue.where("components", cname, "commit")
        lineno = int(loc.rsplit(":", 1)[1]) - 1 if ":" in loc else -1
        if lineno < 0 or c.get("commit", "") not in lines[lineno]:
            raise InputError(
                loc,
                f"components.{cname}.commit",
                "cannot find the commit line to rewrite",
                "set the commit by hand",
            )
        lines[lineno] = lines[lineno].replace(c["commit"], new, 1)
        note = f"{cname}: {c['ref']} {c['commit'][:12]} -> {new[:12]}"
        if c.get("version"):
            note += f" (check `version: {c['version']}`: it described the old commit)"
        moved.append(note)
    if moved:
        tmp = cat_path.with_name(".components.yaml.tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        tmp.replace(cat_path)
    return moved


# ----------------------------------------------------------------------------- verification


def _source_root(tree: Path, c: Component) -> Path:
    """A git source's patches apply at its repository root (the diff's paths), not its subdir."""
    if c.source != "git" or c.subdir in ("", "."):
        return tree
    return tree.parents[len(Path(c.subdir).parts) - 1]


class Locker(PythonSets):
    def __init__(self, m: manifest.Manifests, cutoff: dict | None = None):
        self.m = m
        self.cutoff = cutoff or {}
        self.ss = SourceSet()
        self.unverified: list[str] = []
        self.failures: list[str] = []
        self.sets: dict[str, dict] = {}
        self.resolve_seconds = 0.0

    # compiled extensions ----------------------------------------------------
    def extension_source(self, p) -> dict:
        """A compiled extension's source pin, checked: the sdist's sha256 as its index lists
        it, or the git commit fetched. Unreachable is recorded; a mismatch is a failure."""
        from mtpimage.ext.extensions import verify_source

        ok, detail = verify_source(p)
        if ok is None:
            self.unverified.append(f"{p.name}: source {detail}")
            return {"verified": False, "reason": detail}
        if not ok:
            self.failures.append(f"{p.name}: {detail}")
            return {"verified": False, "error": detail}
        return {"verified": True}

    # components -------------------------------------------------------------
    def component_entry(self, plan: Plan, c) -> dict:
        self.ss.indexes = dict(plan.indexes)
        entry = lockfile.component_pin(c)
        tree = self.ss.tree(c)  # raises GitError on anything but "offline"
        if tree is None:
            reason = self.ss.unavailable.get(c.name, "not fetched")
            entry.update(verified=False, reason=reason)
            what = f"commit {c.commit}" if c.source == "git" else f"{c.package}=={c.version}"
            self.unverified.append(f"{c.name}: {what}: {reason}")
        else:
            entry["verified"] = True
            if c.source == "git" and sources.missing_paths(tree):
                # the commit is verified by hash; these files were absent from the mirror
                entry["missing_from_mirror"] = sources.missing_paths(tree)
            if c.source == "pypi":
                wheel = next(iter(sorted(tree.parent.glob("*.whl"))), None)
                if wheel is not None:
                    entry.update(file=wheel.name, sha256=pydeps.sha256_file(wheel))
        patches = []
        where = self.patch_where(plan, c.name)
        src_root = _source_root(tree, c) if tree is not None else None
        for p in c.patches:
            pe = lockfile.patch_pin(p)
            if p.repo:
                pe["made_with"] = sources.diff_command(p.base, p.head, p.paths)
            try:
                with patch_files(c.name, (p,), self.m.root, where) as [(path, _strip)]:
                    if tree is None:
                        pe.update(applies=None, verified=False, reason="source not available to apply it to")
                        self.unverified.append(
                            f"{c.name}: patch {p.describe()}: not checked (source unavailable)"
                        )
                        patches.append(pe)
                        continue
                    if c.source == "git":
                        ok, err = sources.apply_check(src_root, path, p.strip)
                        pe["checked_with"] = f"git apply --check -p{p.strip} at the repository root"
                    else:
                        ok, err = patch_dry_run(tree, path, p.strip)
                        pe["checked_with"] = (
                            f"patch --dry-run -p{p.strip} on the {c.package} {c.version} wheel"
                        )
            except PatchUnavailable as exc:
                if not exc.offline:
                    raise
                pe.update(applies=None, verified=False, reason=f"patch source unreachable: {exc.reason}")
                self.unverified.append(f"{c.name}: patch {p.describe()}: not made ({exc.reason})")
                patches.append(pe)
                continue
            pe.update(applies=ok, verified=True)
            if not ok:
                pe["error"] = err
                self.failures.append(f"{c.name}: patch {p.describe()} does not apply: {err}")
            patches.append(pe)
        entry["patches"] = patches
        return entry

    def patch_where(self, plan: Plan, comp: str) -> str:
        """file:line of a component's patch list: its profile's override, or components.yaml."""
        if "patches" in dict(plan.overridden).get(comp, ()):
            return self.m.profiles[plan.profile].file
        return self.m.catalogue.where("components", comp, "patches")

    # python -----------------------------------------------------------------


def _plans(m, names) -> list[Plan]:
    return [build_plan(m, manifest.resolve_profile(m, n)) for n in names]


@contextlib.contextmanager
def exclusive(manifests_root: Path, waiting: Callable[[str], None] = lambda _msg: None):
    """One `lock` run at a time per manifests directory: an exclusive flock on a file in
    the cache (keyed by the manifests path, so nothing appears in the repository). A second
    run tells `waiting` whom it waits for (the command prints it), then proceeds and sees the
    first run's lock.yaml."""
    root = Path(manifests_root).resolve()
    key = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    d = sources.cache_root() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / f"lock-{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            waiting(f"waiting for another lock run (pid {holder}) on {root.name}/{lockfile.LOCK_NAME}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def choose_cutoff(
    previous: dict | None,
    only: str | None,
    upgrade_target: str | None,
    exclude_newer: str | None,
    where: str,
    now: datetime | None = None,
) -> tuple[dict, list[str]]:
    """The resolution cutoff of this run and notes to print. The recorded one, unless
    `--exclude-newer WHEN` or `--upgrade` (over every profile) moves it; a lock without one
    gets `now`. A moved cutoff drops the per-package holds (older cutoffs kept only to
    reproduce a lock made before cutoffs were recorded). One cutoff per lock.yaml: the
    profiles a `--profile` run keeps were resolved at the recorded one."""
    now = now or datetime.now(UTC)
    recorded = lockfile.cutoff_of(previous, where)
    fresh = {"exclude_newer": lockfile.stamp(now - SETTLE), "exclude_newer_package": {}}
    others = sorted(set((previous or {}).get("profiles") or {}) - {only}) if only else []
    if exclude_newer is not None:
        when = (
            fresh["exclude_newer"]
            if exclude_newer == "now"
            else lockfile.parse_stamp(exclude_newer, "--exclude-newer", "WHEN", now)
        )
        chosen = {"exclude_newer": when, "exclude_newer_package": {}}
        if others and recorded and chosen != recorded:
            raise InputError(
                "--exclude-newer",
                exclude_newer,
                f"lock.yaml has one resolution cutoff and profiles {', '.join(others)} were "
                f"resolved at {recorded['exclude_newer']}",
                "move it without --profile, so every profile is resolved again",
            )
        return chosen, []
    if recorded is None:
        return fresh, [
            f"no resolution cutoff recorded: resolving at {fresh['exclude_newer']} (now, less an hour)"
        ]
    if upgrade_target == "*":
        if others:
            return recorded, [
                f"resolution cutoff kept at {recorded['exclude_newer']}: it is one per lock.yaml "
                "(move it with `lock --upgrade` without --profile)"
            ]
        return fresh, []
    return recorded, []


def lock(
    m: manifest.Manifests,
    only: str | None = None,
    upgrade_target: str | None = None,
    require_verified: bool = False,
    exclude_newer: str | None = None,
) -> LockOutcome:
    """Lock `only` (else every profile) of the manifests `m`; the caller holds exclusive().
    exclude_newer: a new resolution cutoff (`now` or YYYY-MM-DDTHH:MM:SSZ). Stages: the
    cutoff and upgrades, one pin per component, verify and resolve every profile, the
    document, then write it unless refused."""
    names = [only] if only else m.names()
    for n in names:
        manifest.resolve_profile(m, n)  # unknown profile -> InputError before any network
    path = lockfile.lock_path(m.root)
    previous = lockfile.read(path)
    where = f"{m.root.name}/{lockfile.LOCK_NAME}"
    cutoff, notes = choose_cutoff(previous, only, upgrade_target, exclude_newer, where)
    moved = []
    if upgrade_target:
        moved = upgrade(m, names, upgrade_target)
        if moved:
            m = manifest.load(m.root)
    t0 = time.monotonic()
    plans = _plans(m, names)
    _one_pin_per_component(m, plans)
    locker = Locker(m, cutoff)
    old = (previous if only else None) or {}
    entries = _LockEntries(
        components=dict(old.get("components") or {}),
        packages=dict(old.get("packages") or {}),
        profiles=dict(old.get("profiles") or {}),
        sets=dict(old.get("python_sets") or {}),
    )
    try:
        _lock_profiles(m, plans, locker, entries)
    except (sources.GitError, pydeps.IndexUnreachable, PatchUnavailable) as exc:
        raise BuilderError(f"lock failed, manifests/lock.yaml left unchanged: {exc.one_line()}") from None
    entries.sets.update(locker.sets)
    doc = _document(plans, cutoff, entries)
    locker.unverified.insert(
        0,
        f"base image {doc['base_image']['name']}:{doc['base_image']['tag']}: digest not checked "
        f"({BASE_UNVERIFIED.split(';')[0]})",
    )
    outcome = LockOutcome(
        written=False,
        moved=moved,
        profiles=len(plans),
        components=len(doc["components"]),
        # each profile that builds a package checks its source again: say each finding once
        unverified=list(dict.fromkeys(locker.unverified)),
        failures=list(dict.fromkeys(locker.failures)),
        cutoff=cutoff["exclude_newer"],
        notes=notes,
    )
    recorded = lockfile.cutoff_of(previous, where)
    if recorded != cutoff:
        outcome.cutoff_was = recorded["exclude_newer"] if recorded else ""
    if require_verified and len(locker.unverified) > 0:
        return outcome
    _write(path, previous, doc, outcome)
    outcome.elapsed = time.monotonic() - t0
    outcome.resolve_seconds = locker.resolve_seconds
    outcome.packages = sum(
        len(s.get("packages") or {}) for k, s in doc["python_sets"].items() if k in locker.sets
    )
    return outcome


@dataclass
class _LockEntries:
    """lock.yaml's sections as this run builds them (a --profile run starts from the old ones)."""

    components: dict[str, dict]
    packages: dict[str, dict]
    profiles: dict[str, dict]
    sets: dict[str, dict]


def _one_pin_per_component(m: manifest.Manifests, plans: list[Plan]) -> None:
    """One lock.yaml holds one pin per component: profiles that pin one differently are refused."""
    pins: dict[str, tuple[str, dict]] = {}
    for plan in plans:
        for c in plan.components:
            pin = {**lockfile.component_pin(c), "patches": [lockfile.patch_pin(p) for p in c.patches]}
            if c.name in pins and pins[c.name][1] != pin:
                raise InputError(
                    m.profiles[plan.profile].file,
                    f"components.{c.name}",
                    f"profiles {pins[c.name][0]} and {plan.profile} pin {c.name} differently",
                    "one lock.yaml holds one pin per component: give the variant its own name",
                )
            pins[c.name] = (plan.profile, pin)


def _lock_profiles(m: manifest.Manifests, plans: list[Plan], locker: Locker, e: _LockEntries) -> None:
    """Verify every source first (so each profile sees all trees), then per profile: its
    packages, the rules its source probes decide, and its Python set."""
    done: set[str] = set()
    for plan in plans:
        for c in plan.components:
            if c.name not in done:
                e.components[c.name] = locker.component_entry(plan, c)
                done.add(c.name)
    for plan in plans:
        for p in plan.packages:
            e.packages[p.name] = lockfile.package_pin(p)
            if p.build is not None:
                e.packages[p.name].update(locker.extension_source(p))
        probes = probe_plan(plan, m.root, locker.ss)
        results = rules.evaluate(plan, probes)
        for r in rules.errors(results):
            if r.rule.id in probes:
                locker.failures.append(f"{plan.profile}: {r.rule.id}: {r.detail}")
        key = locker.python_set(plan)
        e.profiles[plan.profile] = {
            "components": sorted(c.name for c in plan.components),
            "packages": sorted(p.name for p in plan.packages),
            "python_set": key,
            "probes": {
                rid: {"status": probes[rid].status, "detail": probes[rid].detail}
                for rid in PROBED_RULES
                if rid in probes
            },
        }


def _document(plans: list[Plan], cutoff: dict, e: _LockEntries) -> dict:
    """lock.yaml's document: only what the locked profiles use, every section sorted."""
    live = {p["python_set"] for p in e.profiles.values()}
    used_components = {c for p in e.profiles.values() for c in p["components"]}
    used_packages = {c for p in e.profiles.values() for c in p["packages"]}
    base = lockfile.base_pin(plans[0])
    base.update(verified=False, reason=BASE_UNVERIFIED)
    return {
        "schema": lockfile.LOCK_SCHEMA,
        "target": {
            "python": plans[0].python,
            "platform": pydeps.PLATFORM,
            "implementation": pydeps.IMPLEMENTATION,
        },
        lockfile.CUTOFF_KEY: lockfile.cutoff_entry(cutoff),
        "base_image": base,
        "components": {k: e.components[k] for k in sorted(e.components) if k in used_components},
        "packages": {k: e.packages[k] for k in sorted(e.packages) if k in used_packages},
        "profiles": {k: e.profiles[k] for k in sorted(e.profiles)},
        "python_sets": {k: e.sets[k] for k in sorted(e.sets) if k in live},
    }


def _write(path: Path, previous: dict | None, doc: dict, outcome: LockOutcome) -> None:
    """Write lock.yaml, unless a file it records would change under the same name."""
    outcome.changes = lockfile.version_changes(previous, doc)
    tampered = lockfile.changed_files(previous, doc)
    if tampered:
        raise BuilderError(
            "refusing a downloaded file whose sha256 differs from the lock, "
            f"lock.yaml left unchanged: {'; '.join(tampered)} (fix: clear the cache "
            "entry and lock again; if the index really changed the file, review it and "
            "remove its entry from lock.yaml)"
        )
    outcome.changed = lockfile.write(path, doc)
    outcome.written = True
