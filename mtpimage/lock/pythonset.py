"""The Python set of a lock: one uv resolution of a profile's whole environment, its stub
wheels for the git sources, the hashed file of every package and its layer, and what
could not be verified (the `python` entries of manifests/lock.yaml; locker.py runs it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mtpimage.errors import BuilderError, InputError
from mtpimage.ext.extensions import source_pin
from mtpimage.lock import lockfile, pydeps, resolver, srcmeta
from mtpimage.manifests import schema
from mtpimage.plan import platforms, rules
from mtpimage.plan.model import COMPONENTS, Plan

# the lock's own platform: each profile's `python_set` is for it; another is a `platform_sets` entry
LOCK_PLATFORM = schema.default(COMPONENTS, "builds", "platform")


def resolution_fix(exc: resolver.ResolutionFailed) -> str:
    """The fix that fits why uv failed: a pin the index does not list is not a conflict."""
    missing = exc.not_on_index
    if missing:
        return (
            f"{', '.join(missing)} is not on the index: pin a version the index lists in "
            "components.yaml, or add the index (or mirror) that serves it"
        )
    return "an override or exclude in components.yaml `resolution`, with why and link"


class PythonSets:
    """The resolution half of Locker: needs self.m, self.cutoff, self.previous, self.keep_pins,
    self.ss (a SourceSet), self.sets, self.unverified, self.failures and self.resolve_seconds."""

    def _cutoff_args(self) -> dict:
        return {
            "exclude_newer": self.cutoff.get("exclude_newer"),
            "exclude_newer_package": self.cutoff.get("exclude_newer_package") or {},
        }

    def _preferences(
        self, plan: Plan, key: str, platform: str = LOCK_PLATFORM, first: str = ""
    ) -> dict[str, str]:
        """The previous lock's pins for this set (else for the set the profile had), kept where
        they still fit, when the cutoff has not moved and nothing asked to upgrade everything:
        a re-lock then changes only what a changed input forces (as `uv lock` keeps its pins
        unless --upgrade), not what an index that back-dates its listings newly shows.
        Another platform's set also prefers the versions this run resolved for the lock's own
        platform (`first`, its set key), always: one stack at the same versions on every CPU,
        where only markers (sglang's decord2 on aarch64) make them differ."""
        prev = self.previous or {}
        out: dict[str, str] = {}
        if self.keep_pins and lockfile.cutoff_of(prev) == self.cutoff:
            sets = prev.get("python_sets") or {}
            profile = (prev.get("profiles") or {}).get(plan.profile) or {}
            was = (
                profile.get("python_set")
                if platform == LOCK_PLATFORM
                else (profile.get("platform_sets") or {}).get(platform)
            )
            doc = sets.get(key) or sets.get(was) or {}
            out = {
                str(n): str(e["version"]) for n, e in (doc.get("packages") or {}).items() if "version" in e
            }
        if first:
            pkgs = (self.sets.get(first) or {}).get("packages") or {}
            out.update({str(n): str(e["version"]) for n, e in pkgs.items() if "version" in e})
        return out

    def _stub_for(self, plan: Plan, c) -> tuple[str, dict]:
        """A git source's resolution stub: its own metadata, read from the fetched source.
        The catalogue's version must agree with the source's (a disagreement names both)."""
        tree = self.ss.trees.get(c.name)
        if tree is None:
            reason = self.ss.unavailable.get(c.name, "not fetched")
            raise BuilderError(
                f"lock failed, {lockfile.shown(self.m.root)} left unchanged: git source {c.name} "
                f"({c.repo} @ {c.commit}) could not be fetched: {reason} (fix: give git a "
                "mirror with url.<mirror>.insteadOf; the lock resolves every source's real "
                "metadata and never guesses it)"
            )
        try:
            meta = srcmeta.read(tree)  # SourceSet trees already point into subdir
        except srcmeta.MetadataUnreadable as exc:
            raise InputError(
                self.m.catalogue.where("components", c.name),
                f"components.{c.name}",
                f"cannot read {c.package}'s metadata from {c.repo} @ {c.commit[:12]}: {exc}",
                "set dependencies.declared: false and list its runtime needs in dependencies.add",
            ) from None
        if pydeps.canonical(meta.name) != pydeps.canonical(c.package):
            raise InputError(
                self.m.catalogue.where("components", c.name),
                f"components.{c.name}.package",
                f"the source at {c.commit[:12]} builds {meta.name!r}, the catalogue says {c.package!r}",
                f"set package: {meta.name}",
            )
        from packaging.version import InvalidVersion, Version

        try:
            same = Version(c.version or "0") == Version(meta.version)
        except InvalidVersion:
            same = c.version == meta.version
        if c.version and not same:
            raise InputError(
                self.m.catalogue.where("components", c.name, "version"),
                f"components.{c.name}.version",
                f"the catalogue says {c.version}, the source at {c.commit[:12]} builds "
                f"{meta.version} ({meta.where})",
                f"set version: {meta.version}",
            )
        requires = list(meta.requires) if c.deps_declared else []
        requires += list(c.deps_add)
        extras = {k: list(v) for k, v in meta.extras.items()} if c.deps_declared else {}
        return meta.version, {
            "version": meta.version,
            "requires": requires,
            "extras": extras,
            "declared": list(meta.requires),
        }

    def python_set(self, plan: Plan, platform: str = LOCK_PLATFORM, first: str = "") -> str:
        """Resolve `plan`'s whole Python environment for `platform` once per distinct input (its
        key, which names the platform unless it is the lock's own) and record the set's document
        in self.sets; returns the key. `first`: the key of this plan's set for the lock's own
        platform (another platform prefers its versions). Stages: inputs (index probes,
        requirements and stubs), resolution, layer assignment, file selection, document. On
        another platform a pin with no wheel for it is recorded in the set's `no_wheel`
        (rule platform-wheels names it and what it blocks), not a failure of the lock."""
        s = self._set_inputs(plan, platform)
        if s.key in self.sets:
            return s.key
        doc = _set_head(plan, s)
        t0 = time.monotonic()
        arch = platforms.arch_of(platform)
        gaps: dict[str, str] = {}
        try:
            args = (s.requirements, s.stubs, s.overrides, s.excludes, s.reachable, plan.python)
            kwargs = dict(
                **self._cutoff_args(), preferences=self._preferences(plan, s.key, platform, first), arch=arch
            )
            if platform == LOCK_PLATFORM:
                res = resolver.resolve(*args, **kwargs)
            else:
                res, gaps = resolver.resolve_allowing_gaps(*args, **kwargs)
        except resolver.ResolutionFailed as exc:
            self.resolve_seconds += time.monotonic() - t0
            tls = pydeps.tls_failure(str(exc))
            if tls:  # not the stack's fault: no set is recorded, nothing is written
                raise pydeps.IndexUnreachable(
                    f"python set {s.key} ({plan.profile}): an index cannot be read: {tls} (fix: {pydeps.CA_FIX})"
                ) from None
            return self._failed_set(
                s.key,
                doc,
                exc,
                f"python set {s.key} ({plan.profile}): the stack does not resolve: {exc} (fix: {resolution_fix(exc)})",
            )
        self._cuda_line(plan, res.packages, s.key)
        layers = resolver.assign_layers(res.packages, _layer_members(plan))
        try:
            files, index_of = self._select_files(plan, s, res, arch, gaps)
        except resolver.ResolutionFailed as exc:
            return self._failed_set(s.key, doc, exc, f"python set {s.key} ({plan.profile}): {exc}")
        self.resolve_seconds += time.monotonic() - t0
        packages = {
            name: _package_entry(plan, s, name, entry, layers[name], index_of, files)
            for name, entry in res.packages.items()
            if name not in gaps
        }
        doc.update(resolved=True, packages=dict(sorted(packages.items())))
        if gaps:
            doc["no_wheel"] = self._no_wheel(plan, s, gaps, first)
        # what stood in for the sources and the unreachable packages: enough to re-run this
        # resolution without GitHub (tests/e2e/test_real_stack_resolution.py does, in CI)
        doc["stubs"] = {
            n: {
                "version": v["version"],
                "requires": list(v.get("requires") or []),
                **({"extras": v["extras"]} if v.get("extras") else {}),
            }
            for n, v in sorted(s.stubs.items())
        }
        doc["build_requires"] = self._build_sets(plan, s.indexes, arch, doc)
        self._unverified_of(doc, res, s.unverified)
        self._override_covers(plan, s, doc)
        self.sets[s.key] = doc
        return s.key

    def _override_covers(self, plan: Plan, s: _SetInputs, doc: dict) -> None:
        """Each override records what it overrides: every declaration of a component on the
        package it pins (who, requirement), read from the sources (git: their metadata; PyPI:
        the wheel's Requires-Dist). A declaration components.yaml's `overrides:` record of it
        does not name is printed: the override now covers a declaration nobody reviewed
        (sglang 0.5.13 moved to transformers==5.8.1 while the record said 5.6.0)."""
        from packaging.utils import canonicalize_name

        records = {
            o["requirement"]: [str(r) for r in o.get("overrides") or []]
            for o in (self.m.catalogue.data.get("resolution") or {}).get("overrides") or []
        }
        declared = self._declarations(plan, s)
        for entry in doc.get("overrides") or []:
            name = canonicalize_name(_req_name(entry["requirement"]))
            covers = [f"{who}: {req}" for who, req in declared.get(name, [])]
            entry["covers"] = covers
            known = records.get(entry["requirement"], [])
            for line in covers:
                who, req = line.split(": ", 1)
                if not any(_same_declaration(who, req, r) for r in known):
                    note = (
                        f"override {entry['requirement']} now covers {line}; components.yaml records "
                        f"{'; '.join(known) or 'nothing'} (review it, then update the override's `overrides:` record)"
                    )
                    if note not in self.notes:
                        self.notes.append(note)

    def _declarations(self, plan: Plan, s: _SetInputs) -> dict[str, list[tuple[str, str]]]:
        """canonical package -> [(who, requirement)] of every component's declared requirements."""
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import canonicalize_name

        out: dict[str, list[tuple[str, str]]] = {}
        for c in plan.components:
            if c.source == "git":
                reqs = list((s.stubs.get(c.package) or {}).get("declared") or [])
                version = (s.stubs.get(c.package) or {}).get("version", "")
                who = f"{c.name} {version} ({c.ref} {c.commit[:8]})"
            else:
                reqs = _wheel_requires(self.ss.trees.get(c.name))
                who = f"{c.name} {c.version}"
            for r in reqs:
                try:
                    req = Requirement(r)
                except InvalidRequirement:
                    continue
                if req.marker is not None and "extra" in str(req.marker):
                    continue  # an extra's requirement: not what the image installs by default
                text = f"{req.name}{req.specifier}" if str(req.specifier) else req.name
                out.setdefault(canonicalize_name(req.name), []).append((who, text))
        return out

    def _cuda_line(self, plan: Plan, packages: dict, key: str) -> None:
        """CUDA toolkit wheels of another minor than the base's (nvidia-cuda-nvcc 13.2 on a CUDA
        13.0 stack) fail the lock, unless a resolution override names the package (declared)."""
        from packaging.utils import canonicalize_name

        versioned = {canonicalize_name(n) for n in rules.facts().get("cuda_toolkit_versioned") or ()}
        declared = {canonicalize_name(_req_name(r)) for r, _w, _l in plan.resolution_overrides}
        want = ".".join(plan.cuda.split(".")[:2])
        for name, entry in sorted(packages.items()):
            base = canonicalize_name(name)
            base = base.rsplit("-cu", 1)[0] if base.rsplit("-cu", 1)[-1].isdigit() else base
            line = ".".join(str(entry["version"]).split(".")[:2])
            if base in versioned and line != want and canonicalize_name(name) not in declared:
                self.failures.append(
                    f"python set {key} ({plan.profile}): {name} {entry['version']} is CUDA {line}, the base "
                    f"image is CUDA {plan.cuda} (required by {', '.join(entry.get('via') or ['?'])}) (fix: "
                    f"pin it to CUDA {want} with a resolution override, e.g. {name}=={want}.*, with why and "
                    "link; an override that names it is the declaration that the mix is meant)"
                )

    def _no_wheel(self, plan: Plan, s: _SetInputs, gaps: dict[str, str], first: str) -> dict:
        """The set's pins with no wheel for its platform: version (uv's, else the lock's own
        platform's), the layer the lock's own platform installs it in, and its index."""
        own = (self.sets.get(first) or {}).get("packages") or {}
        out = {}
        for name, version in sorted(gaps.items()):
            row = own.get(name) or {}
            pk = plan.package(s.owner.get(name, ""))
            out[name] = {
                "version": version or str(row.get("version", "")),
                "layer": str(row.get("layer", "")),
                "index": pk.index if pk is not None else str(row.get("index", "pypi")),
            }
        return out

    def _set_inputs(self, plan: Plan, platform: str = LOCK_PLATFORM) -> _SetInputs:
        """Stage 1: which indexes answer, what is required, what stands in for what an index
        cannot tell (git sources' own metadata, compiled extensions' declared requires)."""
        indexes = dict(plan.indexes)
        used = {p.index for p in plan.packages} | {c.index for c in plan.components if c.source == "pypi"}
        used.add("pypi")
        reach: dict[str, str | None] = {}
        for name in sorted(used):
            probe = next((p.name for p in plan.packages if p.index == name), None) or next(
                (c.package for c in plan.components if c.index == name and c.source == "pypi"), "pip"
            )
            reach[name] = pydeps.probe_index(indexes[name], probe)
        s = _SetInputs(indexes=indexes, used=sorted(used), reach=reach)
        self._requirements_and_stubs(plan, s)
        # An unreachable default index is recorded, not fatal: a stack of stubs and git sources
        # alone still resolves (offline, --no-index); anything that needs the index fails there.
        s.reachable = ([] if reach["pypi"] else [indexes["pypi"]]) + [
            indexes[n] for n in s.used if n != "pypi" and not reach[n]
        ]
        if reach["pypi"]:
            self.unverified.append(f"index pypi unreachable: {reach['pypi']}")
        s.overrides = [o[0] for o in plan.resolution_overrides]
        s.excludes = [e[0] for e in plan.excludes]
        stub_key = {k: {kk: vv for kk, vv in v.items() if kk != "declared"} for k, v in s.stubs.items()}
        inputs: dict = {"stubs": stub_key, "overrides": s.overrides, "excludes": s.excludes}
        if platform != LOCK_PLATFORM:  # the lock's own platform keeps the keys made before
            inputs["platform"] = platform
            s.platform = platform
        s.key = lockfile.set_key(s.requirements, {n: indexes[n] for n in s.used}, inputs)
        return s

    def _requirements_and_stubs(self, plan: Plan, s: _SetInputs) -> None:
        """Stage 2: one requirement per package and component; stubs for git sources and
        compiled extensions. A package whose index does not answer would have no sha256:
        refused (HashlessPackage), never locked by version alone."""
        hashless: list[tuple[str, str]] = []  # (name==version, index): no file, no sha256
        for p in plan.packages:
            s.requirements.append(p.requirement)
            s.owner[pydeps.canonical(p.name)] = p.name
            if p.build is not None:
                # compiled here: its metadata needs a build, so it is data (requires_dist)
                s.stubs[p.name] = {"version": p.version, "requires": list(p.requires_dist or ())}
                continue
            if s.reach[p.index]:
                # no file, so no sha256: the image would install it by version alone
                hashless.append((f"{p.name}=={p.version}", p.index))
        for c in plan.components:
            extras = f"[{','.join(c.extras)}]" if c.extras else ""
            s.owner[pydeps.canonical(c.package)] = c.name
            if c.source == "pypi":
                s.requirements.append(f"{c.package}{extras}=={c.version}")
                if s.reach[c.index]:
                    hashless.append((f"{c.package}=={c.version}", c.index))
                continue
            version, stub = self._stub_for(plan, c)
            s.requirements.append(f"{c.package}{extras}=={version}")
            s.stubs[c.package] = stub
        if hashless:
            by_index: dict[str, list[str]] = {}  # one reason per index, said once
            for what, idx in hashless:
                by_index.setdefault(idx, []).append(what)
            tls = any(pydeps.TLS_REASON in (s.reach[idx] or "") for idx in by_index)
            raise HashlessPackage(
                f"lock failed, {lockfile.shown(self.m.root)} left unchanged: "
                + "; ".join(
                    f"{', '.join(whats)} from index {idx} ({s.indexes[idx]}) would install without a "
                    f"sha256: the index does not answer ({s.reach[idx]})"
                    for idx, whats in by_index.items()
                )
                + " (fix: "
                + (pydeps.CA_FIX + "; or " if tls else "")
                + "lock where the index answers, or mirror it with MTP_INDEX_REWRITE, or build "
                "it from a pinned source: components.yaml `build`, an sdist by sha256 or a git commit)"
            )

    def _select_files(
        self, plan: Plan, s: _SetInputs, res, arch: str = pydeps.ARCH, gaps: dict | None = None
    ) -> tuple[dict, dict]:
        """Stage 4: one hashed file per resolved package, from the index that serves it, for
        the platform's CPU. With `gaps` (another platform), a pin with no file for it is
        added there instead of failing (uv may resolve it from an sdist it never installs)."""
        pins_by_index: dict[str, dict[str, str]] = {}
        index_of: dict[str, str] = {}
        for name, entry in res.packages.items():
            if entry["stub"]:
                continue
            pk = plan.package(s.owner.get(name, "")) if name in s.owner else None
            idx = pk.index if pk is not None else "pypi"
            index_of[name] = idx
            pins_by_index.setdefault(idx, {})[name] = entry["version"]
        files: dict[str, dict] = {}
        sdists = {pydeps.canonical(n) for n, _w in plan.sdists}
        for idx, pins in sorted(pins_by_index.items()):
            try:
                files.update(resolver.select_files(pins, s.indexes[idx], plan.python, sdists, arch))
            except resolver.NoPlatformWheel as exc:
                if gaps is None:
                    raise
                gaps.update(exc.missing)
                rest = {n: v for n, v in pins.items() if n not in exc.missing}
                files.update(resolver.select_files(rest, s.indexes[idx], plan.python, sdists, arch))
        return files, index_of

    def _failed_set(self, key: str, doc: dict, exc: Exception, failure: str) -> str:
        """A set that does not resolve is recorded as such (the lock then fails, naming it)."""
        doc.update(resolved=False, error=str(exc), packages={})
        self.failures.append(failure)
        self.sets[key] = doc
        return key

    def _build_sets(
        self, plan: Plan, indexes: dict[str, str], arch: str = pydeps.ARCH, doc: dict | None = None
    ) -> dict:
        """The hashed build backends of every git source and compiled extension, for the
        platform's CPU; on another platform a backend with no wheel there goes to the set's
        `no_wheel` (with the build it serves) instead of failing the lock."""
        build_sets = {}
        builders = [_Named(c.name, c.build_requires) for c in plan.components if c.source == "git"]
        builders += [_Named(p.name, p.build.build_requires) for p in plan.packages if p.build is not None]
        for c in builders:
            if not c.build_requires:
                continue
            gaps: dict[str, str] = {}
            try:
                args = (list(c.build_requires), {}, [], [], [indexes["pypi"]], plan.python)
                if arch == pydeps.ARCH:
                    br = resolver.resolve(*args, **self._cutoff_args())
                else:
                    br, gaps = resolver.resolve_allowing_gaps(*args, **self._cutoff_args(), arch=arch)
                pins = {n: e["version"] for n, e in br.packages.items()}
                try:
                    bfiles = resolver.select_files(pins, indexes["pypi"], plan.python, arch=arch)
                except resolver.NoPlatformWheel as exc:
                    if arch == pydeps.ARCH:
                        raise
                    gaps.update(exc.missing)
                    rest = {n: v for n, v in pins.items() if n not in exc.missing}
                    bfiles = resolver.select_files(rest, indexes["pypi"], plan.python, arch=arch)
            except resolver.ResolutionFailed as exc:
                self.failures.append(f"{c.name}: build_requires do not resolve: {exc}")
                continue
            build_sets[c.name] = {
                n: {"version": e["version"], **bfiles[n]} for n, e in br.packages.items() if n not in gaps
            }
            if gaps and doc is not None:
                for n, v in sorted(gaps.items()):
                    doc.setdefault("no_wheel", {})[n] = {
                        "version": v,
                        "layer": f"build:{c.name}",
                        "index": "pypi",
                    }
        return build_sets

    def _unverified_of(self, doc: dict, res, unverified: dict[str, str]) -> None:
        """What this set could not verify, in its document and in the run's list."""
        if res.unbounded:
            # their index serves no upload times (PEP 700): uv cannot hold them to the cutoff
            doc["not_bounded_in_time"] = res.unbounded
            for name in res.unbounded:
                unverified.setdefault(
                    name, "its index serves no upload times: not held to the resolution cutoff"
                )
        doc["unverified"] = dict(sorted(unverified.items()))
        for name, why in sorted(unverified.items()):
            line = f"python {name}: {why}"
            if line not in self.unverified:
                self.unverified.append(line)


@dataclass
class _SetInputs:
    """What one Python set is resolved from (python_set's first stages fill it in)."""

    indexes: dict[str, str]  # index name -> URL
    used: list[str]  # the index names this plan uses, sorted
    reach: dict[str, str | None]  # index name -> why it does not answer (None: it answers)
    requirements: list[str] = field(default_factory=list)
    stubs: dict = field(default_factory=dict)  # distribution -> stand-in metadata
    owner: dict[str, str] = field(default_factory=dict)  # canonical distribution -> component/package
    unverified: dict[str, str] = field(default_factory=dict)
    reachable: list[str] = field(default_factory=list)  # index URLs the resolver may ask
    overrides: list[str] = field(default_factory=list)
    excludes: list[str] = field(default_factory=list)
    key: str = ""
    platform: str = LOCK_PLATFORM


def _wheel_requires(tree) -> list[str]:
    """Requires-Dist of an unpacked wheel (its *.dist-info/METADATA); [] when there is none."""
    from pathlib import Path

    if tree is None:
        return []
    meta = next(iter(sorted(Path(tree).glob("*.dist-info/METADATA"))), None)
    if meta is None:
        return []
    return [
        line.split(":", 1)[1].strip()
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines()
        if line.startswith("Requires-Dist:")
    ]


_SPEC = r"(?:===|==|!=|<=|>=|~=|<|>)\s*[\w.*+!-]+"


def _same_declaration(who: str, req: str, record: str) -> bool:
    """A components.yaml record ("sglang 0.5.12: transformers==5.6.0", "verl 7bc80c00
    setup.py:43: transformers>=5.5.3,!=5.6.0,<5.11") names this declaration: the same component,
    one of its version/ref/commit, and the same specifiers in any order."""
    import re

    name, _, rest = who.partition(" ")
    ids = [t for t in re.split(r"[\s()]+", rest) if t]
    low = record.lower()
    if not low.startswith(name.lower()) or not any(i.lower() in low for i in ids):
        return False
    want = {t.replace(" ", "") for t in re.findall(_SPEC, req)}
    have = {t.replace(" ", "") for t in re.findall(_SPEC, record)}
    package = re.split(r"[<>=!~\s]", req, maxsplit=1)[0].lower()
    return package in low and want <= have


def _req_name(requirement: str) -> str:
    import re

    return re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0]


def _set_head(plan: Plan, s: _SetInputs) -> dict:
    """The set document's inputs, written whether or not the set resolves (another platform's
    set names it first; the lock's own platform's sets keep the bytes they had)."""
    head = {} if s.platform == LOCK_PLATFORM else {"platform": s.platform}
    return head | {
        "requirements": sorted(s.requirements),
        "indexes": {
            n: (
                {"url": s.indexes[n], "verified": True}
                if not s.reach[n]
                else {"url": s.indexes[n], "verified": False, "reason": s.reach[n]}
            )
            for n in s.used
        },
        "overrides": [{"requirement": r, "why": w, "link": l} for r, w, l in plan.resolution_overrides],
        "excludes": [{"package": n, "why": w, "link": l} for n, w, l in plan.excludes],
    }


def _layer_members(plan: Plan) -> list[tuple[str, list[str]]]:
    """Stage 3's input: the plan's own layers and their distributions, members first."""
    members = []
    for layer in plan.layers:
        names = []
        for item in layer.items:
            pk = plan.package(item)
            cp = plan.component(item)
            if pk is not None:
                names.append(pk.name)
            elif cp is not None:
                names.append(cp.package)
        if names:
            members.append((layer.name, names))
    return members


def _package_entry(plan: Plan, s: _SetInputs, name: str, entry: dict, layer: str, index_of, files) -> dict:
    """Stage 5: one resolved distribution as lock.yaml records it: a git source, a package
    built here (its source pin), a stand-in, or a hashed file of its index."""
    e: dict = {"version": entry["version"], "layer": layer}
    owner = s.owner.get(name, "")
    comp = plan.component(owner)
    if comp is not None and comp.source == "git":
        e["source"] = f"git ({comp.name})"
        if not comp.deps_declared:
            e["declared_dependencies"] = "not installed (dependencies.declared: false)"
    elif entry["stub"] and _built(plan, owner) is not None:
        e.update(source="built", built_from=_built(plan, owner))
    elif entry["stub"]:
        e.update(
            index=plan.package(s.owner[name]).index,
            verified=False,
            reason=s.unverified.get(s.owner[name], "stub"),
        )
    else:
        e.update(index=index_of[name], **files[name])
    e["via"] = entry["via"]
    return e


class HashlessPackage(BuilderError):
    """A package would be locked without a file and sha256 (its index does not answer): the
    image would install it by version alone (rule hash-pinned), so lock refuses it. Built
    packages are exempt: their source is pinned by hash instead."""


@dataclass(frozen=True)
class _Named:
    """A source with build backends to lock: a git component or a compiled extension."""

    name: str
    build_requires: tuple[str, ...]


def _built(plan: Plan, name: str) -> dict | None:
    """The source pin of a package the tool compiles (lock.yaml records it, not a file)."""
    p = plan.package(name)
    return source_pin(p) if p is not None and p.build is not None else None
