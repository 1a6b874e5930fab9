"""`build.py lock`: verify every pin and write manifests/lock.yaml; `--frozen` for builds.

    python build.py lock [--profile NAME] [--upgrade [COMPONENT]] [--require-verified]

What cannot be checked from this machine (a host git cannot resolve, an index that does
not answer, the base image's registry) is recorded as `verified: false` with the reason
and listed at the end; `lock` still writes the file and exits 0 unless --require-verified.
Anything that answered and said no (a commit missing upstream, a refused connection, a
transfer cut off) fails the lock: the message names repository, commit and git's error,
and neither lock.yaml nor the source cache is changed.

Exit status: 0 written (maybe with unverified entries), 1 written but a probe, patch or
dependency conflict failed, 2 bad input, 3 a source or index failed (nothing written).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import sys
import time
from pathlib import Path

from .. import lockfile, manifest, pydeps, rules, sources
from ..errors import EXIT_ENV, EXIT_RULES, BuilderError, InputError
from ..plan import Plan, build_plan
from ..probes import PROBED_RULES, SourceSet, patch_dry_run, probe_plan

BASE_UNVERIFIED = ("lock does not query container registries; the digest is kept as written "
                   "in components.yaml (verify with `docker buildx imagetools inspect NAME:TAG`)")


def register(subparsers, add_common) -> None:
    p = subparsers.add_parser(
        "lock", help="resolve and verify every pin, probe the sources, write manifests/lock.yaml")
    add_common(p)
    p.add_argument("--profile", default=argparse.SUPPRESS,
                   help="lock only this profile (the other profiles' entries are kept)")
    p.add_argument("--upgrade", nargs="?", const="*", default=None, metavar="COMPONENT",
                   help="move git pins to the commit their ref points at now (git ls-remote), "
                        "all of them or only COMPONENT; rewrites the commit in components.yaml")
    p.add_argument("--require-verified", action="store_true",
                   help="fail (exit 3, nothing written) when anything could not be verified")
    p.set_defaults(func=cmd_lock)


def add_main_options(parser) -> None:
    parser.add_argument(
        "--frozen", dest="frozen", action=argparse.BooleanOptionalAction, default=None,
        help="stop when manifests/ and manifests/lock.yaml disagree (default: on when "
             "lock.yaml exists; --frozen also requires it to exist)")


def run_main(args, manifests, plan, results):
    frozen = getattr(args, "frozen", None)
    if frozen is False:
        return None
    if frozen is None and not lockfile.lock_path(manifests.root).is_file():
        print(f"warning: no {manifests.root.name}/lock.yaml: building unlocked pins "
              "(run `python build.py lock`)", file=sys.stderr)
        return None
    lockfile.check_frozen(manifests, plan)
    return None


# ----------------------------------------------------------------------------- upgrade


def _upgrade(m: manifest.Manifests, names: list[str], target: str) -> list[str]:
    """Re-resolve refs; rewrite components.yaml in place. Returns lines describing moves."""
    comps: dict[str, dict] = {}
    for name in names:
        rp = manifest.resolve_profile(m, name)
        for cname, c in rp.components.items():
            if "commit" in rp.overridden.get(cname, []) and (target in ("*", cname)):
                raise InputError(m.profiles[name].file, f"stack.overrides.{cname}.commit",
                                 f"profile {name} overrides the commit of {cname}",
                                 "edit that override by hand; --upgrade rewrites components.yaml only")
            comps.setdefault(cname, c)
    if target != "*":
        if target not in comps:
            raise InputError("--upgrade", target, f"'{target}' is not a component of the locked profiles",
                             f"use one of: {', '.join(sorted(comps))}")
        if comps[target]["source"] != "git":
            raise InputError("--upgrade", target, f"{target} comes from PyPI, pinned by version",
                             "edit its version in manifests/components.yaml")
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
            raise InputError(loc, f"components.{cname}.commit", "cannot find the commit line to rewrite",
                             "set the commit by hand")
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


class Locker:
    def __init__(self, m: manifest.Manifests):
        self.m = m
        self.ss = SourceSet()
        self.unverified: list[str] = []
        self.failures: list[str] = []
        self.sets: dict[str, dict] = {}
        self.resolve_seconds = 0.0

    # components -------------------------------------------------------------
    def component_entry(self, plan: Plan, c) -> dict:
        self.ss.indexes = dict(plan.indexes)
        entry = lockfile.component_pin(c)
        tree = self.ss.tree(c)        # raises GitError on anything but "offline"
        if tree is None:
            reason = self.ss.unavailable.get(c.name, "not fetched")
            entry.update(verified=False, reason=reason)
            what = f"commit {c.commit}" if c.source == "git" else f"{c.package}=={c.version}"
            self.unverified.append(f"{c.name}: {what}: {reason}")
        else:
            entry["verified"] = True
            if c.source == "pypi":
                wheel = next(iter(sorted(tree.parent.glob("*.whl"))), None)
                if wheel is not None:
                    entry.update(file=wheel.name, sha256=pydeps.sha256_file(wheel))
        patches = []
        for p in c.patches:
            pe = lockfile.patch_pin(p)
            path = self.m.root / p.file
            if tree is None:
                pe.update(applies=None, verified=False, reason="source not available to apply it to")
                self.unverified.append(f"{c.name}: patch {p.file}: not checked (source unavailable)")
            else:
                if c.source == "git":
                    ok, err = sources.apply_check(tree, path, p.strip)
                    pe["checked_with"] = f"git apply --check -p{p.strip}"
                else:
                    ok, err = patch_dry_run(tree, path, p.strip)
                    pe["checked_with"] = f"patch --dry-run -p{p.strip} on the {c.package} {c.version} wheel"
                pe.update(applies=ok, verified=True)
                if not ok:
                    pe["error"] = err
                    self.failures.append(f"{c.name}: patch {p.file} does not apply: {err}")
            patches.append(pe)
        entry["patches"] = patches
        return entry

    # python -----------------------------------------------------------------
    def python_set(self, plan: Plan) -> str:
        indexes = dict(plan.indexes)
        wanted: dict[str, str] = {}         # index name -> a project to probe it with
        for p in plan.packages:
            wanted.setdefault(p.index, p.name)
        for c in plan.components:
            if c.source == "pypi":
                wanted.setdefault(c.index, c.package)
        reach: dict[str, str | None] = {}
        for name in sorted(wanted):
            reach[name] = pydeps.probe_index(indexes[name], wanted[name])
        requirements: list[str] = []
        stubs: dict = {}
        unverified: dict[str, str] = {}
        local: list[str] = []
        git_names: dict[str, str] = {}
        for p in plan.packages:
            requirements.append(p.requirement)
            if reach[p.index]:
                stubs[p.name] = p.version
                unverified[p.name] = (f"index {p.index} ({indexes[p.index]}) unreachable; pinned version "
                                      "taken as given, its own dependencies are not in this set")
        for c in plan.components:
            extras = f"[{','.join(c.extras)}]" if c.extras else ""
            if c.source == "pypi":
                requirements.append(f"{c.package}{extras}=={c.version}")
                if reach[c.index]:
                    stubs[c.package] = c.version
                    unverified[c.package] = f"index {c.index} unreachable; its dependencies are not in this set"
                continue
            tree = self.ss.trees.get(c.name)
            git_names[pydeps.canonical(c.package)] = c.name
            if tree is None:
                version = c.version or "0"
                requirements.append(f"{c.package}{extras}=={version}")
                stubs[c.package] = version
                unverified[c.package] = (f"git source {c.name} not fetched "
                                         f"({self.ss.unavailable.get(c.name, 'unavailable')}); "
                                         "its dependencies are not in this set")
                continue
            static = pydeps.static_requirements(tree)
            if static is not None:
                name, version, deps, opt = static
                version = version or c.version or "0"
                requirements.append(f"{c.package}{extras}=={version}")
                stubs[c.package] = {"version": version, "requires": deps, "extras": opt}
            else:
                requirements.append(f"{c.package}{extras} @ git+{c.repo}")   # the key's view
                local.append(f"{c.package}{extras} @ {tree.resolve().as_uri()}")
        reachable = [indexes[n] for n in sorted(wanted, key=lambda n: (n != "pypi", n)) if not reach[n]]
        key = lockfile.set_key(requirements, {n: indexes[n] for n in wanted},
                               {k: v if isinstance(v, str) else v["version"] for k, v in stubs.items()})
        if key in self.sets:
            return key
        index_entries = {}
        for n in sorted(wanted):
            index_entries[n] = {"url": indexes[n], "verified": not reach[n]}
            if reach[n]:
                index_entries[n]["reason"] = reach[n]
        doc: dict = {"requirements": sorted(requirements), "indexes": index_entries}
        pip_reqs = [r for r in requirements if " @ git+" not in r] + local
        if not reachable:
            doc.update(resolved=False, verified=False,
                       reason="no index reachable: nothing could be resolved", packages={})
            self.unverified.append(f"python set {key}: no index reachable")
            self.sets[key] = doc
            return key
        t0 = time.monotonic()
        res = pydeps.resolve(pip_reqs, reachable, stubs, plan.python)
        self.resolve_seconds += time.monotonic() - t0
        doc["resolved"] = res["ok"]
        if not res["ok"]:
            doc["error"] = res["error"]
            doc["packages"] = {}
            self.failures.append(f"python set {key} ({plan.profile}): pip could not resolve: {res['error']}")
        else:
            doc["packages"] = self._packages(res, stubs, unverified, git_names, indexes)
        doc["unverified"] = dict(sorted(unverified.items()))
        for name, why in sorted(unverified.items()):
            line = f"python {name}: {why}"
            if line not in self.unverified:
                self.unverified.append(line)
        self.sets[key] = doc
        return key

    @staticmethod
    def _packages(res, stubs, unverified, git_names, indexes) -> dict:
        stub_names = {pydeps.canonical(n) for n in stubs}
        out = {}
        for item in res["install"]:
            meta = item["metadata"]
            name = pydeps.canonical(meta["name"])
            info = item.get("download_info", {})
            url = info.get("url", "")
            entry: dict = {"version": meta["version"]}
            if name in git_names:
                entry["source"] = f"git ({git_names[name]})"
            elif name in stub_names or url.startswith("file:"):
                entry.update(verified=False)
            else:
                digest = (info.get("archive_info", {}).get("hashes") or {}).get("sha256")
                entry["file"] = url.rsplit("/", 1)[-1].split("#")[0]
                if digest:
                    entry["sha256"] = digest
                idx = next((n for n, u in sorted(indexes.items()) if url.startswith(u.rstrip("/").rsplit("/simple", 1)[0])), None)
                if idx and idx != "pypi":
                    entry["index"] = idx
            out[name] = entry
        return dict(sorted(out.items()))


def _plans(m, names) -> list[Plan]:
    return [build_plan(m, manifest.resolve_profile(m, n)) for n in names]


@contextlib.contextmanager
def exclusive(manifests_root: Path):
    """One `lock` run at a time per manifests directory: an exclusive flock on a file in
    the cache (keyed by the manifests path, so nothing appears in the repository). A second
    run says whom it waits for, then proceeds and sees the first run's lock.yaml."""
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
            print(f"waiting for another lock run (pid {holder}) on {root.name}/{lockfile.LOCK_NAME}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)          # releases the flock


def cmd_lock(args) -> int:
    if getattr(args, "sets", None):
        raise InputError("--set", ",".join(args.sets), "lock records manifests/ as they are",
                         "put the override in a profile (stack.overrides) and lock that")
    m = manifest.load(getattr(args, "manifests", None))
    with exclusive(m.root):
        m = manifest.load(m.root)       # as the previous lock run (if any) left them
        return _lock(args, m)


def _lock(args, m: manifest.Manifests) -> int:
    only = getattr(args, "profile", None)
    names = [only] if only else m.names()
    for n in names:
        manifest.resolve_profile(m, n)          # unknown profile -> InputError before any network
    moved = []
    if args.upgrade:
        moved = _upgrade(m, names, args.upgrade)
        if moved:
            m = manifest.load(m.root)
    t0 = time.monotonic()
    plans = _plans(m, names)
    path = lockfile.lock_path(m.root)
    old = lockfile.read(path) if only else None
    locker = Locker(m)

    components: dict[str, dict] = dict((old or {}).get("components") or {})
    packages: dict[str, dict] = dict((old or {}).get("packages") or {})
    profiles: dict[str, dict] = dict((old or {}).get("profiles") or {})
    sets: dict[str, dict] = dict((old or {}).get("python_sets") or {})
    pins: dict[str, tuple[str, dict]] = {}
    for plan in plans:
        for c in plan.components:
            pin = {**lockfile.component_pin(c), "patches": [lockfile.patch_pin(p) for p in c.patches]}
            if c.name in pins and pins[c.name][1] != pin:
                raise InputError(m.profiles[plan.profile].file, f"components.{c.name}",
                                 f"profiles {pins[c.name][0]} and {plan.profile} pin {c.name} differently",
                                 "one lock.yaml holds one pin per component: give the variant its own name")
            pins[c.name] = (plan.profile, pin)
    try:
        done: set[str] = set()
        for plan in plans:                      # every source first, so each profile sees all trees
            for c in plan.components:
                if c.name not in done:
                    components[c.name] = locker.component_entry(plan, c)
                    done.add(c.name)
        for plan in plans:
            for p in plan.packages:
                packages[p.name] = lockfile.package_pin(p)
            probes = probe_plan(plan, m.root, locker.ss)
            results = rules.evaluate(plan, probes)
            for r in rules.errors(results):
                if r.rule.id in probes:
                    locker.failures.append(f"{plan.profile}: {r.rule.id}: {r.detail}")
            key = locker.python_set(plan)
            profiles[plan.profile] = {
                "components": sorted(c.name for c in plan.components),
                "packages": sorted(p.name for p in plan.packages),
                "python_set": key,
                "probes": {rid: {"status": probes[rid].status, "detail": probes[rid].detail}
                           for rid in PROBED_RULES if rid in probes},
            }
    except (sources.GitError, pydeps.IndexUnreachable) as exc:
        raise BuilderError(f"lock failed, manifests/lock.yaml left unchanged: {exc.one_line()}") from None
    sets.update(locker.sets)
    live = {p["python_set"] for p in profiles.values()}
    used_components = {c for p in profiles.values() for c in p["components"]}
    used_packages = {c for p in profiles.values() for c in p["packages"]}
    base = lockfile.base_pin(plans[0])
    base.update(verified=False, reason=BASE_UNVERIFIED)
    doc = {
        "schema": lockfile.LOCK_SCHEMA,
        "target": {"python": plans[0].python, "platform": pydeps.PLATFORM,
                   "implementation": pydeps.IMPLEMENTATION},
        "base_image": base,
        "components": {k: components[k] for k in sorted(components) if k in used_components},
        "packages": {k: packages[k] for k in sorted(packages) if k in used_packages},
        "profiles": {k: profiles[k] for k in sorted(profiles)},
        "python_sets": {k: sets[k] for k in sorted(sets) if k in live},
    }
    locker.unverified.insert(0, f"base image {base['name']}:{base['tag']}: digest not checked ({BASE_UNVERIFIED.split(';')[0]})")
    if args.require_verified and len(locker.unverified) > 0:
        for line in locker.unverified:
            print(f"unverified: {line}", file=sys.stderr)
        print("error: --require-verified: lock.yaml not written", file=sys.stderr)
        return EXIT_ENV
    tampered = lockfile.changed_files(lockfile.read(path), doc)
    if tampered:
        raise BuilderError("refusing a downloaded file whose sha256 differs from the lock, "
                           f"lock.yaml left unchanged: {'; '.join(tampered)} (fix: clear the cache "
                           "entry and lock again; if the index really changed the file, review it and "
                           "remove its entry from lock.yaml)")
    changed = lockfile.write(path, doc)
    elapsed = time.monotonic() - t0
    for line in moved:
        print(f"upgraded {line}")
    n_pk = sum(len(s.get("packages") or {}) for k, s in doc["python_sets"].items() if k in locker.sets)
    print(f"{'wrote' if changed else 'unchanged'} {m.root.name}/lock.yaml: {len(plans)} profile(s), "
          f"{len(doc['components'])} components, {n_pk} Python packages resolved "
          f"(pip {locker.resolve_seconds:.1f} s, total {elapsed:.1f} s)")
    if locker.unverified:
        print(f"{len(locker.unverified)} item(s) NOT verified from this machine (recorded as verified: false):")
        for line in locker.unverified:
            print(f"  - {line}")
    for line in locker.failures:
        print(f"error: {line}", file=sys.stderr)
    return EXIT_RULES if locker.failures else 0
