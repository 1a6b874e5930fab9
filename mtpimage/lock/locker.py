"""The lock domain: verify every pin, resolve the whole image once, probe the sources and
write manifests/lock.yaml (the command line is commands/lock.py's).

What cannot be checked from this machine (a host git cannot resolve, an index that does
not answer, the base image's registry) is recorded as `verified: false` with the reason;
the base's digest is kept as components.yaml writes it, and the manifest the build pulls from
it for the build platform is recorded beside it where its registry answers (baseplatform.py);
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

from mtpimage import gitfetch, netpolicy
from mtpimage.errors import BuilderError, InputError
from mtpimage.lock import lockfile, pydeps, pythonset, srcmeta, staging
from mtpimage.lock.extsource import verify_source
from mtpimage.lock.probes import PROBED_RULES, apply_check, patch_paths, probe_plan, source_root
from mtpimage.lock.pythonset import PythonSets
from mtpimage.lock.sources import SourceSet
from mtpimage.manifests import manifest
from mtpimage.manifests.patches import PatchUnavailable
from mtpimage.manifests.patches import as_files as patch_files
from mtpimage.mirrors import BuildMirrors
from mtpimage.plan import rules
from mtpimage.plan.model import Plan, build_plan, lock_platforms
from mtpimage.plan.platforms import arch_of
from mtpimage.publish import baseplatform
from mtpimage.publish.baseplatform import BaseNotServed

# `now` as a cutoff is an hour ago: an upload takes minutes to reach every index page and
# mirror, and uv answers from a page it fetched up to 10 minutes before; a cutoff that recent
# could resolve differently on the next machine.
SETTLE = timedelta(hours=1)


@dataclass
class LockOutcome:
    """What a lock run did, for the command to print."""

    written: bool  # False: refused (a failure, --require-verified, a dry run), nothing written
    changed: bool = False  # lock.yaml's bytes changed
    moved: list[str] = field(default_factory=list)  # --upgrade: pins moved
    profiles: int = 0
    components: int = 0
    packages: int = 0  # Python packages resolved in this run
    per_platform: dict[str, int] = field(default_factory=dict)  # platform -> packages (its sets)
    no_wheel: list[str] = field(default_factory=list)  # platform: NAME VERSION (profiles)
    resolve_seconds: float = 0.0
    elapsed: float = 0.0
    unverified: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    cutoff: str = ""  # the resolution cutoff this run resolved at
    cutoff_was: str | None = None  # the recorded one, when this run moved it ("" when none was)
    notes: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # resolved versions that moved
    moves: list[Move] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # the files written, relative to manifests/..
    previous: dict | None = None  # lock.yaml before the run (None: there was none)
    doc: dict | None = None  # lock.yaml as this run made it
    results: dict[str, list] = field(default_factory=dict)  # profile -> rules.RuleResult list
    plans: list[Plan] = field(default_factory=list)


# ----------------------------------------------------------------------------- upgrade


@dataclass(frozen=True)
class Move:
    """One pin a bump moves: a component's (or a compiled package's git source's) ref, commit
    and version, old -> new ("" where the manifest records none)."""

    name: str
    kind: str  # "component" or "package" (packages.NAME.build.git)
    ref: tuple[str, str]
    commit: tuple[str, str]
    version: tuple[str, str] = ("", "")

    def line(self) -> str:
        if self.commit[0] or self.commit[1]:
            ref = self.ref[1] if self.ref[0] == self.ref[1] else f"{self.ref[0]} -> {self.ref[1]}"
            out = f"{self.name}: {ref} {self.commit[0][:12]} -> {self.commit[1][:12]}"
        else:
            out = f"{self.name}: {self.version[0]} -> {self.version[1]}"
            return out
        if self.version[0] != self.version[1]:
            out += f" (version {self.version[0]} -> {self.version[1]}, read from the source)"
        return out


def _upgradable(
    m: manifest.Manifests, names: list[str], target: str, flag: str = "--upgrade"
) -> tuple[dict, dict]:
    """The components and compiled packages (by git) of the locked profiles that `target`
    ("*": all) names; an override of a commit in a profile is refused (it is a person's edit)."""
    comps: dict[str, dict] = {}
    pkgs: dict[str, dict] = {}
    for name in names:
        rp = manifest.resolve_profile(m, name)
        for cname, c in rp.components.items():
            if "commit" in rp.overridden_fields.get(cname, []) and (target in ("*", cname)):
                raise InputError(
                    m.profiles[name].file,
                    f"stack.overrides.{cname}.commit",
                    f"profile {name} overrides the commit of {cname}",
                    "edit that override by hand; --upgrade rewrites components.yaml only",
                )
            comps.setdefault(cname, c)
        for pname, p in rp.packages.items():
            if ((p.get("build") or {}).get("git") or {}).get("commit"):
                pkgs.setdefault(pname, p)
    if target == "*":
        return comps, pkgs
    if target in pkgs:
        return {}, {target: pkgs[target]}
    if target not in comps:
        raise InputError(
            flag,  # the command the user typed: `lock --upgrade NAME` or `bump NAME`
            target,
            f"'{target}' is not a component of the locked profiles (nor a package built from git)",
            f"use one of: {', '.join(sorted(set(comps) | set(pkgs)))}",
        )
    return {target: comps[target]}, {}


def upgrade(
    m: manifest.Manifests, names: list[str], target: str, to: str | None = None, flag: str = "--upgrade"
) -> tuple[list[Move], str | None]:
    """Re-resolve refs (or move `target` to the ref or version `to`) and return the moves and
    components.yaml's new text (None: nothing moved). Nothing is written here: lock() writes the
    text with lock.yaml once every check passed on it. A moved git component's version is read
    from its source at the new commit and written when the manifest records one."""
    comps, pkgs = _upgradable(m, names, target, flag)
    if to is not None and target != "*" and target in comps and comps[target]["source"] != "git":
        return _move_version(m, target, comps[target], to)
    if target != "*" and target in comps and comps[target]["source"] != "git":
        raise InputError(
            flag,
            target,
            f"{target} comes from PyPI, pinned by version",
            f"bump it to a version with `bump {target} --to VERSION`, or edit its version in "
            "manifests/components.yaml",
        )
    text = (m.root / "components.yaml").read_text(encoding="utf-8")
    moves: list[Move] = []
    pins = [("components", n, c, ("components", n)) for n, c in sorted(comps.items()) if c["source"] == "git"]
    pins += [
        ("packages", n, p["build"]["git"], ("packages", n, "build", "git")) for n, p in sorted(pkgs.items())
    ]
    for section, name, c, path in pins:
        if to is not None and gitfetch.SHA_RE.match(to):
            ref, new = c.get("ref"), to  # a commit: the ref stays (fetching it verifies it)
        else:
            ref = to if to is not None else c.get("ref")
            if not ref or (to is None and gitfetch.SHA_RE.match(ref)):
                continue
            new = gitfetch.ls_remote(c["repo"], ref)
        if new == c.get("commit") and ref == c.get("ref"):
            continue
        what = ".".join(path)
        if ref != c.get("ref"):
            if not c.get("ref"):
                raise InputError(
                    m.catalogue.where(*path), f"{what}.ref", "has no ref to move", f"add ref: {ref}"
                )
            text = staging.set_field(
                text, m.catalogue.where(*path, "ref"), "ref", c["ref"], ref, f"{what}.ref"
            )
        text = staging.set_field(
            text, m.catalogue.where(*path, "commit"), "commit", c["commit"], new, f"{what}.commit"
        )
        version = (c.get("version") or "", c.get("version") or "")
        if section == "components" and c.get("version"):
            read = _source_version(c, new)
            if read != c["version"]:
                text = staging.set_field(
                    text,
                    m.catalogue.where(*path, "version"),
                    "version",
                    c["version"],
                    read,
                    f"{what}.version",
                )
                version = (str(c["version"]), read)
        kind = "component" if section == "components" else "package"
        moves.append(Move(name, kind, (c.get("ref") or "", ref), (c["commit"], new), version))
    return moves, (text if moves else None)


def _move_version(m: manifest.Manifests, name: str, c: dict, to: str) -> tuple[list[Move], str | None]:
    """A PyPI component moved to another version (`bump NAME --to VERSION`)."""
    if str(c.get("version")) == to:
        return [], None
    text = (m.root / "components.yaml").read_text(encoding="utf-8")
    text = staging.set_field(
        text,
        m.catalogue.where("components", name, "version"),
        "version",
        c["version"],
        to,
        f"components.{name}.version",
    )
    return [Move(name, "component", ("", ""), ("", ""), (str(c["version"]), to))], text


def _source_version(c: dict, commit: str) -> str:
    """The version a git component's source builds at `commit` (its own metadata)."""
    from packaging.version import InvalidVersion, Version

    tree = gitfetch.fetch(c["repo"], commit).path
    if c.get("subdir") not in (None, "", "."):
        tree = tree / c["subdir"]
    try:
        read = srcmeta.read(tree).version
    except srcmeta.MetadataUnreadable:
        return str(c["version"])  # the lock names what it cannot read, with its fix
    try:
        return str(c["version"]) if Version(read) == Version(str(c["version"])) else read
    except InvalidVersion:
        return read


# ----------------------------------------------------------------------------- verification


class Locker(PythonSets):
    def __init__(
        self,
        m: manifest.Manifests,
        cutoff: dict | None = None,
        previous: dict | None = None,
        keep_pins: bool = True,
    ):
        self.m = m
        self.previous = previous  # lock.yaml before this run: what each patch was known to fit
        self.keep_pins = keep_pins  # False under `--upgrade` of everything: every pin may move
        self.cutoff = cutoff or {}
        self.ss = SourceSet()
        self.unverified: list[str] = []
        self.failures: list[str] = []
        self.sets: dict[str, dict] = {}
        self.resolve_seconds = 0.0
        self.notes: list[str] = []  # what the run found to review (an override's changed coverage)
        self.results: dict[str, list] = {}  # profile -> its rules' results (with its probes)

    # compiled extensions ----------------------------------------------------
    def extension_source(self, p) -> dict:
        """A compiled extension's source pin, checked: the sdist's sha256 as its index lists
        it, or the git commit fetched. Unreachable is recorded; a mismatch is a failure."""
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
            if c.source == "git" and gitfetch.missing_paths(tree):
                # the commit is verified by hash; these files were absent from the mirror
                entry["missing_from_mirror"] = gitfetch.missing_paths(tree)
            if c.source == "pypi":
                wheel = next(iter(sorted(tree.parent.glob("*.whl"))), None)
                if wheel is not None:
                    entry.update(file=wheel.name, sha256=pydeps.sha256_file(wheel))
        patches = []
        where = self.patch_where(plan, c.name)
        src_root = source_root(tree, c) if tree is not None else None
        for p in c.patches:
            pe = lockfile.patch_pin(p)
            if p.repo:
                pe["made_with"] = gitfetch.diff_command(p.base, p.head, p.paths)
            try:
                with patch_files(c.name, (p,), self.m.root, where) as [(path, _strip)]:
                    if tree is None:
                        pe.update(applies=None, verified=False, reason="source not available to apply it to")
                        self.unverified.append(
                            f"{c.name}: patch {p.describe()}: not checked (source unavailable)"
                        )
                        patches.append(pe)
                        continue
                    target = src_root if c.source == "git" else tree
                    ok, err, pe["checked_with"] = apply_check(c, tree, path, p.strip)
                    misfit = None if ok else self._misfit(c, p, path, target, err)  # the file exists here
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
                self.failures.append(misfit)
            patches.append(pe)
        entry["patches"] = patches
        return entry

    def _misfit(self, c, p, path: Path, tree: Path, err: str) -> str:
        """One line: the patch, the artifact it does not fit, the files it cannot find there
        (or git's/patch's reason), and the version it fitted when the previous lock checked it."""
        artifact = f"{c.package} {c.version}" if c.source == "pypi" else f"{c.repo} @ {c.commit[:12]}"
        gone = [f for f in patch_paths(path, p.strip) if not (tree / f).exists()]
        why = f"{', '.join(gone)} not in it" if gone else err
        old = ((self.previous or {}).get("components") or {}).get(c.name) or {}
        fitted = any(e.get("sha256") == p.sha256 and e.get("applies") for e in old.get("patches") or [])
        was = (
            f"{old.get('package')} {old.get('version')}"
            if old.get("source") == "pypi"
            else f"{old.get('repo')} @ {str(old.get('commit'))[:12]}"
        )
        fits = f"it fits {was} (lock.yaml)" if fitted else "no locked version recorded it applying"
        return (
            f"{c.name}: patch {p.describe()} does not apply to {artifact}: {why}; {fits} (fix: keep "
            f"{c.name} where the patch fits, or replace the patch with one made for {artifact}; drop it "
            "if its fix landed upstream)"
        )

    def patch_where(self, plan: Plan, comp: str) -> str:
        """file:line of a component's patch list: its profile's override, or components.yaml."""
        if "patches" in dict(plan.profile_overridden_fields).get(comp, ()):
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
    d = gitfetch.cache_root() / "locks"
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
    to: str | None = None,
    write: bool = True,
    mirrors: BuildMirrors | None = None,
    flag: str = "--upgrade",
) -> LockOutcome:
    """Lock `only` (else every profile) of the manifests `m`; the caller holds exclusive().
    exclude_newer: a new resolution cutoff (`now` or YYYY-MM-DDTHH:MM:SSZ); to: the ref (or a
    PyPI component's version) `upgrade_target` moves to. Stages: the cutoff and upgrades (held
    in memory), one pin per component, verify and resolve every profile, the document; then,
    only when nothing failed (and `write`), components.yaml and lock.yaml in one commit.
    mirrors: the registry mirrors the base is read through (a build pulls it from them).
    flag: how errors about `upgrade_target` name it (`bump` passes "bump")."""
    names = [only] if only else m.names()
    for n in names:
        manifest.resolve_profile(m, n)  # unknown profile -> InputError before any network
    path = lockfile.lock_path(m.root)
    previous = lockfile.read(path)
    where = f"{m.root.name}/{lockfile.LOCK_NAME}"
    cutoff, notes = choose_cutoff(previous, only, upgrade_target, exclude_newer, where)
    moves: list[Move] = []
    staged = None  # components.yaml's new text, verified below before it is written
    t0 = time.monotonic()
    try:
        if upgrade_target:
            moves, staged = upgrade(m, names, upgrade_target, to, flag)
            if staged is not None:
                m = manifest.load(m.root, staged)
        plans = _plans(m, names)
        _one_pin_per_component(m, plans)
        locker = Locker(m, cutoff, previous, keep_pins=upgrade_target != "*")
        old = (previous if only else None) or {}
        entries = _LockEntries(
            components=dict(old.get("components") or {}),
            packages=dict(old.get("packages") or {}),
            profiles=dict(old.get("profiles") or {}),
            sets=dict(old.get("python_sets") or {}),
        )
        _lock_profiles(m, plans, locker, entries)
        base = _base_entry(plans[0], previous, mirrors, locker, lock_platforms(m.catalogue.data)[1:])
    except (gitfetch.GitError, pydeps.IndexUnreachable, PatchUnavailable, BaseNotServed) as exc:
        raise BuilderError(f"lock failed, {_untouched(staged, m.root)}: {exc.one_line()}") from None
    except InputError as exc:
        if staged is None:
            raise
        raise InputError(
            exc.where, exc.key, f"{exc.problem} ({_untouched(staged, m.root)})", exc.fix
        ) from None
    entries.sets.update(locker.sets)
    doc = _document(plans, cutoff, entries, base)
    outcome = LockOutcome(
        written=False,
        moved=[mv.line() for mv in moves],
        profiles=len(plans),
        components=len(doc["components"]),
        # each profile that builds a package checks its source again: say each finding once
        unverified=list(dict.fromkeys(locker.unverified)),
        failures=list(dict.fromkeys(locker.failures)),
        cutoff=cutoff["exclude_newer"],
        notes=notes + locker.notes,
        moves=moves,
        previous=previous,
        doc=doc,
        results=locker.results,
        plans=plans,
    )
    recorded = lockfile.cutoff_of(previous, where)
    if recorded != cutoff:
        outcome.cutoff_was = recorded["exclude_newer"] if recorded else ""
    outcome.changes = lockfile.version_changes(previous, doc)
    outcome.elapsed = time.monotonic() - t0
    outcome.resolve_seconds = locker.resolve_seconds
    outcome.packages = sum(
        len(s.get("packages") or {}) for k, s in doc["python_sets"].items() if k in locker.sets
    )
    _platform_counts(doc, set(locker.sets), outcome)
    if locker.failures or not write or (require_verified and len(locker.unverified) > 0):
        return outcome  # a lock is written only complete and with every check passed
    files = {path: lockfile.dumps(doc)}
    if staged is not None:
        files[m.root / "components.yaml"] = staged
    _refuse_changed_files(previous, doc, staged, m.root)
    written = staging.commit(files)
    outcome.written = True
    outcome.changed = path in written
    outcome.files = [f"{m.root.name}/{p.name}" for p in written]
    return outcome


def _platform_counts(doc: dict, resolved: set[str], outcome: LockOutcome) -> None:
    """Packages per platform of the sets this run resolved, and each pin a platform's set has no
    wheel for, with the profiles it blocks (printed by the command; rule platform-wheels says
    it per plan)."""
    by_platform: dict[str, set[str]] = {}
    blocked: dict[tuple[str, str], list[str]] = {}
    for name, prof in sorted(doc["profiles"].items()):
        keys = {pythonset.LOCK_PLATFORM: prof.get("python_set")} | dict(prof.get("platform_sets") or {})
        for platform, key in keys.items():
            if key in resolved:
                by_platform.setdefault(platform, set()).add(key)
                for pkg, e in sorted((doc["python_sets"][key].get("no_wheel") or {}).items()):
                    blocked.setdefault((platform, f"{pkg} {e.get('version')}"), []).append(name)
    outcome.per_platform = {
        p: sum(len(doc["python_sets"][k].get("packages") or {}) for k in keys)
        for p, keys in by_platform.items()
    }
    outcome.no_wheel = [
        f"{p}: {what} (blocks {', '.join(names)})" for (p, what), names in sorted(blocked.items())
    ]


def _untouched(staged: str | None, root: Path) -> str:
    what = (
        lockfile.shown(root) if staged is None else f"{lockfile.shown(root, 'components.yaml')} and lock.yaml"
    )
    return f"{what} left unchanged"


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
        results = rules.evaluate(plan, probes, f=rules.facts_for(m.root))
        locker.results[plan.profile] = results
        for r in rules.errors(results):
            if r.rule.id in PROBED_RULES and r.rule.id in probes:  # a misfit patch is said per component
                locker.failures.append(f"{plan.profile}: {r.rule.id}: {r.detail}")
        key = locker.python_set(plan)
        # every other platform of builds.lock_platforms: its own resolution and files
        others = {p: locker.python_set(plan, p, first=key) for p in lock_platforms(m.catalogue.data)[1:]}
        e.profiles[plan.profile] = {
            "components": sorted(c.name for c in plan.components),
            "packages": sorted(p.name for p in plan.packages),
            "python_set": key,
            **({"platform_sets": others} if others else {}),
            "probes": {
                rid: {"status": probes[rid].status, "detail": probes[rid].detail}
                for rid in PROBED_RULES
                if rid in probes
            },
        }


def _base_entry(
    plan: Plan, previous: dict | None, mirrors: BuildMirrors | None, locker: Locker, others: list[str] = ()
) -> dict:
    """lock.yaml's `base_image`: the manifests' pin, and the platform manifest it names where
    the registry (or the mirror a build pulls from) answers; unverified with the reason where not.
    `others`: the lock's other platforms, whose manifests of the same index go in `platforms`."""
    base = lockfile.base_pin(plan)
    image = plan.base_image
    previous_base = (previous or {}).get("base_image")
    fields, unverified = baseplatform.lock_entry(image, previous_base, mirrors)
    base.update(fields)
    if unverified:
        locker.unverified.insert(0, f"base image {base['name']}:{base['tag']}: {unverified}")
    else:
        locker.notes.append(
            f"base image {base['name']}:{base['tag']}: {base['platform']} manifest "
            f"{base['platform_digest']} ({base['manifest']}) recorded beside {base['digest']}"
        )
        moved = baseplatform.tag_moved(image, mirrors)
        if moved:
            locker.notes.append(moved)
    if others:
        prev = (
            ((previous_base or {}).get("platforms") or {})
            if (previous_base or {}).get("digest") == plan.base_digest
            else {}
        )
        base["platforms"] = {p: _other_platform_base(image, p, prev.get(p), mirrors, locker) for p in others}
    return base


def _other_platform_base(image: str, platform: str, previous: dict | None, mirrors, locker: Locker) -> dict:
    """The manifest the pinned base's index names for another platform (linux/arm64), read as
    baseplatform.lock_entry reads the build platform's; where the registry does not answer, the
    previous lock's record is kept (marked unverified) and nothing is invented."""
    try:
        got = netpolicy.retrying(baseplatform.transient)(baseplatform.resolve, image, mirrors, platform, None)
    except Exception as exc:
        if not baseplatform.unreachable(exc):
            raise
        why = f"{baseplatform._where(image, mirrors).source} {baseplatform.reason(exc)}"  # as lock_entry says it
        entry: dict = {}
        if (previous or {}).get("platform_digest"):
            entry.update(manifest=previous.get("manifest"), platform_digest=previous["platform_digest"])
            why += "; platform_digest kept as the previous lock recorded it, not read again"
        else:
            why += f"; no {platform} manifest digest recorded (lock again where the registry answers)"
        locker.unverified.append(f"base image {image.split('@')[0]}: {platform} manifest not verified: {why}")
        return entry | {"verified": False, "reason": why}
    return {"manifest": got.manifest, "platform_digest": got.platform_digest, "verified": True}


def _document(plans: list[Plan], cutoff: dict, e: _LockEntries, base: dict) -> dict:
    """lock.yaml's document: only what the locked profiles use, every section sorted."""
    live = {p["python_set"] for p in e.profiles.values()}
    live |= {k for p in e.profiles.values() for k in (p.get("platform_sets") or {}).values()}
    others = sorted({pl for p in e.profiles.values() for pl in p.get("platform_sets") or {}})
    used_components = {c for p in e.profiles.values() for c in p["components"]}
    used_packages = {c for p in e.profiles.values() for c in p["packages"]}
    return {
        "schema": lockfile.LOCK_SCHEMA,
        "target": {
            "python": plans[0].python,
            "platform": pydeps.PLATFORM,
            "implementation": pydeps.IMPLEMENTATION,
            # the other platforms this lock holds sets for (each profile's platform_sets)
            **({"other_platforms": {p: pydeps.wheel_platform(arch_of(p)) for p in others}} if others else {}),
        },
        lockfile.CUTOFF_KEY: lockfile.cutoff_entry(cutoff),
        "base_image": base,
        "components": {k: e.components[k] for k in sorted(e.components) if k in used_components},
        "packages": {k: e.packages[k] for k in sorted(e.packages) if k in used_packages},
        "profiles": {k: e.profiles[k] for k in sorted(e.profiles)},
        "python_sets": {k: e.sets[k] for k in sorted(e.sets) if k in live},
    }


def _refuse_changed_files(previous: dict | None, doc: dict, staged: str | None, root: Path) -> None:
    """Nothing is written when a file the lock records would change under the same name."""
    tampered = lockfile.changed_files(previous, doc)
    if tampered:
        raise BuilderError(
            "refusing a downloaded file whose sha256 differs from the lock, "
            f"{_untouched(staged, root)}: {'; '.join(tampered)} (fix: clear the cache "
            "entry and lock again; if the index really changed the file, review it and "
            "remove its entry from lock.yaml)"
        )
