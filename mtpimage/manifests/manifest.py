"""Load manifests/: the component catalogue and the profiles, with inheritance.

Output is plain, validated data (`Catalogue`, `ResolvedProfile`); turning it into
a Plan is plan/model.py's job. Every error is an InputError naming file:line and key.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpimage import invocation
from mtpimage.errors import InputError
from mtpimage.locations import DEFAULT_MANIFESTS
from mtpimage.manifests import schema
from mtpimage.manifests.modes import get
from mtpimage.manifests.yamlsource import SourceDoc, load_file, load_text

GIT_ONLY_FIELDS = ("repo", "ref", "commit")
NOT_INHERITED = ("name", "extends", "abstract")
# `--set` targets that are a profile's own sections, not a component or package of its stack:
# `--set builds.cuda_archs=90,100` sets the profile's builds.cuda_archs for one run
PROFILE_SECTIONS = ("builds",)
LIST_FIELDS = ("extras", "build_requires", "cuda_archs")  # --set values split at commas


@dataclass
class Catalogue:
    root: Path
    doc: SourceDoc
    data: dict

    def where(self, *path) -> str:
        return self.doc.where(tuple(path))


@dataclass
class ResolvedProfile:
    name: str
    file: str
    data: dict  # merged, validated, defaults applied
    components: dict[str, dict]  # name -> catalogue entry with overrides applied
    packages: dict[str, dict]
    chain: list[str] = field(default_factory=list)  # leaf first
    # component or package -> the fields stack.overrides or --set changed
    overridden_fields: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class BrokenProfile:
    """A profile file that did not load (`load(keep_going=True)`): its file and its error."""

    path: Path
    error: InputError

    @property
    def stem(self) -> str:
        """The profile name its file name suggests (the name inside did not load)."""
        return self.path.stem


@dataclass
class Manifests:
    root: Path
    catalogue: Catalogue
    profiles: dict[str, SourceDoc]  # name -> raw (partially validated) doc
    # profile files that did not load; only `load(keep_going=True)` leaves any here
    broken: list[BrokenProfile] = field(default_factory=list)

    def names(self, include_abstract: bool = False) -> list[str]:
        return sorted(
            n for n, d in self.profiles.items() if include_abstract or not d.data.get("abstract", False)
        )

    def broken_named(self, name: str) -> BrokenProfile | None:
        """The broken file that likely holds profile `name`, for an error that names the cause."""
        return next((b for b in self.broken if b.stem == name), None)


def _rel(path: Path, root: Path) -> str:
    """The file as errors name it: a path the user can open from where the command ran."""
    return invocation.shown_path(path)


def load_catalogue(root: Path, text: str | None = None) -> Catalogue:
    """`text`: components.yaml as a bump would write it (staging.py), read instead of the
    file, so every check runs on the edit before anything is written."""
    path = root / "components.yaml"
    doc = load_file(path, _rel(path, root)) if text is None else load_text(text, _rel(path, root))
    if not isinstance(doc.data, dict):
        raise InputError(doc.file, None, "expected a mapping at the top level")
    data = schema.validate(doc, "components")
    layers = data["layers"]
    for section in ("packages", "components"):
        for name, entry in data[section].items():
            if entry["layer"] not in layers:
                raise InputError(
                    doc.where((section, name, "layer")),
                    f"{section}.{name}.layer",
                    f"unknown layer '{entry['layer']}'",
                    f"use one of: {', '.join(layers)}",
                )
            index = entry.get("index", "pypi")
            if index not in data["indexes"]:
                raise InputError(
                    doc.where((section, name, "index")),
                    f"{section}.{name}.index",
                    f"unknown index '{index}'",
                    f"define it under indexes or use one of: {', '.join(data['indexes'])}",
                )
    for name in set(data["packages"]) & set(data["components"]):
        raise InputError(
            doc.where(("components", name)),
            f"components.{name}",
            "a package of the same name exists",
            "rename one of the two",
        )
    for name, entry in data["packages"].items():
        if "build" in entry and "requires_dist" not in entry:
            raise InputError(
                doc.where(("packages", name, "build")),
                f"packages.{name}.requires_dist",
                "a package built from source needs its Requires-Dist as data (its metadata needs a build)",
                "add requires_dist (requires + source) read from the source's PKG-INFO or setup.py",
            )
    cat = Catalogue(root, doc, data)
    for name, comp in data["components"].items():
        check_patches(cat, name, comp.get("patches", []))
    return cat


REF_FIELDS = ("repo", "base", "head")


def check_patches(cat: Catalogue, comp: str, patches: list[dict], where: str | None = None) -> None:
    """Each patch is either a reference (repo, base and head commits, optional paths: the
    tool makes the diff; checked when it is made, see patches.py) or a local file inside
    manifests/ that hashes to its declared sha256 (a site's own fix). Nothing is fetched here."""
    root = cat.root.resolve()
    for i, patch in enumerate(patches):

        def loc(field: str, i: int = i) -> str:
            return where or cat.where("components", comp, "patches", i, field)

        key = f"components.{comp}.patches[{i}]"
        if "file" not in patch:
            missing = [f for f in REF_FIELDS if f not in patch]
            if missing:
                raise InputError(
                    loc(next((f for f in REF_FIELDS if f in patch), "sha256")),
                    f"{key}.{missing[0]}",
                    f"missing required key '{missing[0]}'",
                    "name the fix by its commits: repo, base (where it branched off, "
                    "git merge-base) and head (its last commit); or give file: for a "
                    "site's own patch under manifests/patches/",
                )
            if patch["base"] == patch["head"]:
                raise InputError(
                    loc("head"),
                    f"{key}.head",
                    "base and head are the same commit: the diff is empty",
                    "set base to where the fix branched off (git merge-base) and head to its last commit",
                )
            continue
        both = [f for f in REF_FIELDS + ("paths",) if f in patch]
        if both:
            raise InputError(
                loc(both[0]),
                f"{key}.{both[0]}",
                "a patch is either a local file or a reference (repo, base, head), not both",
                "remove file to pin the fix by its commits, or remove the reference keys",
            )
        path = (root / patch["file"]).resolve()
        if root not in path.parents:
            raise InputError(
                loc("file"),
                f"{key}.file",
                f"patch path {patch['file']!r} leaves manifests/",
                "keep a site's own patch under manifests/patches/",
            )
        if not path.is_file():
            raise InputError(
                loc("file"),
                f"{key}.file",
                f"patch file {patch['file']!r} not found",
                "keep a site's own patch under manifests/patches/ or fix the path",
            )
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != patch["sha256"]:
            raise InputError(
                loc("sha256"),
                f"{key}.sha256",
                f"sha256 of {patch['file']} is {digest}, manifest says {patch['sha256']}",
                "review the file and update the sha256, or pin the fix by its commits (repo, base, head)",
            )


def load(root: Path | None = None, components_text: str | None = None, keep_going: bool = False) -> Manifests:
    """manifests/ as on disk, or with components.yaml replaced by `components_text` (a staged
    edit that `lock --upgrade` and `bump` verify before they write it). `keep_going`: a profile
    file that does not load is recorded in `broken` instead of stopping everything, so `list`,
    `check` and `explain` still answer for the others (components.yaml stays fatal: every
    profile needs it)."""
    root = Path(root or DEFAULT_MANIFESTS)
    if not root.is_dir():
        raise InputError(
            str(root),
            None,
            "manifests directory not found",
            "run where manifests/ is (a checkout's root) or pass --manifests DIR",
        )
    catalogue = load_catalogue(root, components_text)
    profiles: dict[str, SourceDoc] = {}
    pdir = root / "profiles"
    broken: list[BrokenProfile] = []
    for path in sorted(pdir.glob("*.yaml")) if pdir.is_dir() else []:
        try:
            doc = _load_profile(path, root, profiles)
        except InputError as exc:
            if not keep_going:
                raise
            broken.append(BrokenProfile(path, exc))
            continue
        profiles[doc.data["name"]] = doc
    if not profiles and not broken:
        raise InputError(_rel(pdir, root), None, "no profiles found", "add manifests/profiles/<name>.yaml")
    return Manifests(root, catalogue, profiles, broken)


def _load_profile(path: Path, root: Path, profiles: dict[str, SourceDoc]) -> SourceDoc:
    """One profile file, parsed and partly validated (the rest needs its parents)."""
    doc = load_file(path, _rel(path, root))
    if not isinstance(doc.data, dict):
        raise InputError(doc.file, None, "expected a mapping at the top level")
    schema.validate(doc, "profile", partial=True)
    for key in ("schema_version", "name"):
        if key not in doc.data:
            raise InputError(doc.where(), key, f"missing required key '{key}'", f"add '{key}'")
    name = doc.data["name"]
    if name in profiles:
        raise InputError(
            doc.where(("name",)),
            "name",
            f"duplicate profile name '{name}' (also in {profiles[name].file})",
            "give each profile a unique name",
        )
    return doc


def _chain(m: Manifests, name: str) -> list[SourceDoc]:
    """Leaf first. Rejects cycles and missing parents."""
    seen: list[str] = []
    docs: list[SourceDoc] = []
    current: str | None = name
    while current is not None:
        if current in seen:
            cycle = " -> ".join(seen + [current])
            doc = m.profiles[seen[-1]]
            raise InputError(
                doc.where(("extends",)),
                "extends",
                f"inheritance cycle: {cycle}",
                "make the chain end at a profile without 'extends'",
            )
        doc = m.profiles.get(current)
        if doc is None and m.broken_named(current) is not None:
            raise m.broken_named(current).error  # the parent's own error names what to fix
        if doc is None:
            child = m.profiles[seen[-1]]
            raise InputError(
                child.where(("extends",)),
                "extends",
                f"parent profile '{current}' not found",
                f"use one of: {', '.join(m.names(include_abstract=True))}",
            )
        seen.append(current)
        docs.append(doc)
        current = doc.data.get("extends")
    return docs


def _merge(base: Any, over: Any, path: tuple, origin: dict, doc: SourceDoc) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base.get(key), value, path + (key,), origin, doc)
        return out
    _record(over, path, origin, doc)
    return copy.deepcopy(over)


def _record(value: Any, path: tuple, origin: dict, doc: SourceDoc) -> None:
    origin[path] = doc
    if isinstance(value, dict):
        for k, v in value.items():
            _record(v, path + (k,), origin, doc)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _record(v, path + (i,), origin, doc)


def parse_sets(sets: list[str]) -> dict[str, dict[str, Any]]:
    """`--set COMPONENT.FIELD=VALUE` -> {component: {field: value}}."""
    out: dict[str, dict[str, Any]] = {}
    for item in sets or []:
        target, eq, value = item.partition("=")
        comp, dot, fld = target.partition(".")
        if not eq or not dot or not comp or not fld:
            raise InputError(
                "--set",
                item,
                "expected COMPONENT.FIELD=VALUE",
                "for example --set megatron-lm.commit=<40-hex sha>",
            )
        if fld == "patches":
            if value.strip() not in ("", "[]"):
                raise InputError(
                    "--set",
                    target,
                    "patches can only be cleared from the command line",
                    "use --set NAME.patches= or edit manifests/",
                )
            parsed: Any = []
        elif fld in LIST_FIELDS:
            parsed = [v for v in value.split(",") if v]
        elif fld in ("strip",):
            parsed = int(value) if value.isdigit() else value
        else:
            parsed = value
        out.setdefault(comp, {})[fld] = parsed
    return out


def _select(m: Manifests, stack: dict, where_of) -> tuple[dict, dict]:
    """Copy the catalogue entries a profile's stack lists."""
    cat = m.catalogue.data
    picked: list[dict] = []
    for section, key in (("components", "components"), ("packages", "packages")):
        out = {}
        for item in stack[key]:
            if item not in cat[section]:
                raise InputError(
                    where_of(("stack", key)),
                    f"stack.{key}",
                    f"unknown {section[:-1]} '{item}'",
                    f"use one of: {', '.join(sorted(cat[section]))}",
                )
            out[item] = copy.deepcopy(cat[section][item])
        picked.append(out)
    return picked[0], picked[1]


def _apply_overrides(
    m: Manifests, name: str, comps: dict, pkgs: dict, overrides: dict, where_of, overridden_fields: dict
) -> None:
    """Apply {target: {field: value}} to the selected entries, in place, re-validating each."""
    for target, fields in overrides.items():
        loc = where_of(("stack", "overrides", target))
        if target in comps:
            entries, kind = comps, "component"
        elif target in pkgs:
            entries, kind = pkgs, "package"
        else:
            raise InputError(
                loc,
                target,
                f"'{target}' is not in profile {name}'s stack",
                f"use one of: {', '.join(sorted(list(comps) + list(pkgs)))}",
            )
        if not isinstance(fields, dict):
            raise InputError(loc, target, "expected a mapping of fields")
        entry = dict(entries[target])
        if kind == "component":
            if "commit" in fields and "version" not in fields:
                entry.pop("version", None)  # the old version described the old commit
            if "commit" in fields and "ref" not in fields:
                entry["ref"] = "override"
            if ({"commit", "version", "source"} & set(fields)) and "note" not in fields:
                entry.pop("note", None)  # notes describe the catalogue pin
            if fields.get("source") == "pypi":
                for f in GIT_ONLY_FIELDS:
                    if f not in fields:
                        entry.pop(f, None)
        entry.update(fields)
        overridden_fields.setdefault(target, []).extend(sorted(fields))
        validated = _validate_entry(entry, kind, loc, target)
        if kind == "component" and fields.get("patches"):
            check_patches(m.catalogue, target, validated["patches"], where=loc)
        layers = m.catalogue.data["layers"]
        if validated["layer"] not in layers:  # an unknown layer would drop it from the image
            raise InputError(
                loc,
                f"{target}.layer",
                f"unknown layer '{validated['layer']}'",
                f"use one of: {', '.join(layers)}",
            )
        index = validated.get("index", "pypi")
        if index not in m.catalogue.data["indexes"]:
            raise InputError(
                loc,
                f"{target}.index",
                f"unknown index '{index}'",
                f"use one of: {', '.join(m.catalogue.data['indexes'])}",
            )
        entries[target] = validated


def _validate_entry(entry: dict, kind: str, loc: str, target: str) -> dict:
    return schema.validate_def(entry, "components", kind, loc, target)


def _check_mode_targets(data: dict, where_of) -> None:
    """A mode may run for some verl targets only (rollout: SFT has no rollout); the fact is
    verl.yaml's `modes.<mode>.targets`."""
    allowed = get(data["mode"]).targets
    extra = [t for t in data["targets"] if allowed is not None and t not in allowed]
    if extra:
        raise InputError(
            where_of(("targets",)),
            "targets",
            f"mode {data['mode']} runs for {', '.join(allowed)} only, not {', '.join(extra)}",
            f"use targets: [{', '.join(allowed)}], or another mode for {', '.join(extra)}",
        )


def resolve_profile(m: Manifests, name: str, sets: list[str] | None = None) -> ResolvedProfile:
    if name not in m.profiles and m.broken_named(name) is not None:
        raise m.broken_named(name).error
    if name not in m.profiles:
        raise InputError(
            "--profile",
            name,
            f"unknown profile '{name}'",
            f"use one of: {', '.join(m.names())} (see `{invocation.command()} list`)",
        )
    docs = _chain(m, name)
    leaf = docs[0]
    origin: dict = {}
    merged: dict = {}
    for doc in reversed(docs):
        layer = {k: v for k, v in doc.data.items() if k not in NOT_INHERITED}
        merged = _merge(merged, layer, (), origin, doc)
    stack_sets = parse_sets(sets or [])
    own = {k: stack_sets.pop(k) for k in PROFILE_SECTIONS if k in stack_sets}
    if own:  # over every file of the chain; an error in them names --set
        merged = _merge(merged, own, (), origin, SourceDoc("--set", own))
    merged["name"] = name
    merged["abstract"] = bool(leaf.data.get("abstract", False))
    _record(name, ("name",), origin, leaf)

    def where_of(path: tuple) -> str:
        for cut in range(len(path), -1, -1):
            doc = origin.get(tuple(path[:cut]))
            if doc is not None:
                return doc.where(tuple(path))
        return leaf.where(tuple(path))

    merged_doc = SourceDoc(leaf.file, merged, {})
    try:
        data = schema.validate(merged_doc, "profile")
    except InputError as exc:
        # Point at the file in the chain that holds (or should hold) the key.
        key_path = tuple(int(p) if p.isdigit() else p for p in (exc.key or "").split(".") if p)
        raise InputError(where_of(key_path), exc.key, exc.problem, exc.fix) from None
    _check_mode_targets(data, where_of)
    overridden_fields: dict[str, list[str]] = {}
    comps, pkgs = _select(m, data["stack"], where_of)
    _apply_overrides(m, name, comps, pkgs, data["stack"].get("overrides", {}), where_of, overridden_fields)
    _apply_overrides(m, name, comps, pkgs, stack_sets, lambda p: "--set", overridden_fields)
    return ResolvedProfile(
        name, leaf.file, data, comps, pkgs, [d.data["name"] for d in docs], overridden_fields
    )
