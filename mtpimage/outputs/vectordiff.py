"""`python3 build.py diff A B`: what differs between two version vectors.

A side is a profile (its Plan, `Plan.to_dict()`), a version-vector JSON file, or an image
reference (the vector the image stage writes to /opt/mtp/version.json, found through the
image's labels). Every side is first normalised into the same sections, so a profile can be
compared with an image and plan-format dicts with version-vector-format dicts:

  platform        base image (and digest), Python, CUDA, OS packages, the compiled GPU archs
  profile         mode, experimental, targets, models, rollout engine
  engine          verl engine settings (bridge, context parallel, recompute, ...)
  components      per component: source, repo, ref, commit, version, patches, ...
  packages        per package: version, index, extras, layer
  layers          install layers and their items
  verl_overrides  per target: the Hydra overrides, compared key by key

Descriptive text (summary, choose_when) and the profile name are not part of the comparison.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtpimage import invocation
from mtpimage.errors import InputError
from mtpimage.manifests.patches import describe
from mtpimage.plan.model import LockedRow

PLAN_SCHEMA_PREFIX = "mtp-image-builder/plan/"
VECTOR_SCHEMA_PREFIX = "mtp-image-builder/version-vector/"
# Agreed with the image stage (mtpimage/assembly/versionvector.py): the image's label
# `io.mtp-image-builder.version-vector` names the file holding the vector (or holds the JSON).
LABEL_VERSION_VECTOR = "io.mtp-image-builder.version-vector"
DEFAULT_VECTOR_PATH = "/opt/mtp/version.json"

SECTIONS = (
    "platform",
    "profile",
    "engine",
    "components",
    "packages",
    "layers",
    "verl_overrides",
    "resolution",
    "python",
)
SECTION_TITLES = {
    "platform": "platform",
    "profile": "profile",
    "engine": "engine",
    "components": "components",
    "packages": "packages",
    "layers": "layers",
    "verl_overrides": "verl overrides",
    "resolution": "resolution (declared departures)",
    "python": "python packages (lock.yaml)",
}
PLATFORM_FIELDS = ("base_image", "base_digest", "base_platform", "python", "cuda", "os_packages", "os_remove")
PROFILE_FIELDS = ("mode", "experimental", "targets", "models", "rollout_engine")
COMPONENT_FIELDS = (
    "source",
    "package",
    "repo",
    "ref",
    "commit",
    "version",
    "index",
    "subdir",
    "extras",
    "layer",
    "patches",
)
PACKAGE_FIELDS = ("version", "index", "extras", "layer")
ORDER = "(order)"  # field name of a change in override order only


@dataclass(frozen=True)
class Side:
    label: str  # what the user typed (profile name, image ref, file)
    kind: str  # profile | image | file | vector
    image: str | None  # image reference, for image sides
    plan_digest: str | None  # the Plan's content hash, when known
    vector: dict  # normalised (see normalise)


@dataclass(frozen=True)
class Change:
    section: str
    item: str  # component / package / layer / target; "" for platform, profile, engine
    field: str
    a: Any  # None when absent on A
    b: Any

    @property
    def kind(self) -> str:
        if self.field == ORDER:
            return "reordered"
        if self.a is None and self.b is not None:
            return "added"
        if self.b is None and self.a is not None:
            return "removed"
        return "changed"

    def to_dict(self) -> dict:
        return {**asdict(self), "kind": self.kind}


# -- normalising ---------------------------------------------------------------------------
def normalise(raw: dict, where: str = "version vector") -> dict:
    """Plan.to_dict() or a version-vector dict (or {"plan": ...} / {"version_vector": ...}
    wrappers) -> {section: ...}. Fields a format lacks are left out, not set to None."""
    if not isinstance(raw, dict):
        raise InputError(where, None, "expected a JSON object (a version vector or a plan)")
    for wrapper in ("version_vector", "plan"):
        if isinstance(raw.get(wrapper), dict) and "components" not in raw:
            raw = raw[wrapper]
    schema = str(raw.get("schema", ""))
    if not (schema.startswith(PLAN_SCHEMA_PREFIX) or schema.startswith(VECTOR_SCHEMA_PREFIX)):
        raise InputError(
            where,
            "schema",
            f"unknown schema {schema!r}",
            f"expected {PLAN_SCHEMA_PREFIX}v1 or {VECTOR_SCHEMA_PREFIX}v1",
        )
    platform = {k: raw[k] for k in PLATFORM_FIELDS if k in raw}
    if "base_digest" not in platform and "@" in str(raw.get("base_image", "")):
        platform["base_digest"] = raw["base_image"].split("@", 1)[1]
    if "base_platform" in platform:
        # a plan without a record and a vector saying `unrecorded` say the same: no digest
        bp = platform["base_platform"] or {}
        platform["base_platform"] = bp.get("digest") and f"{bp.get('manifest')} {bp['digest']}"
    elif "base_image" in platform:
        platform["base_platform"] = None
    # the GPU architectures of the compiled extensions: a plan's builds.cuda_archs, a vector's
    # per extension (each carries the same list); absent without compiled extensions
    archs = raw.get("cuda_archs") or (raw.get("extensions") or [{}])[0].get("archs")
    if archs:
        platform["cuda_archs"] = list(archs)
    components = {}
    for c in raw.get("components", []):
        fields = {k: c[k] for k in COMPONENT_FIELDS if k in c}
        if "patches" in fields:
            fields["patches"] = [_patch_id(p) for p in fields["patches"]]
        components[c["name"]] = fields
    packages = {p["name"]: {k: p[k] for k in PACKAGE_FIELDS if k in p} for p in raw.get("packages", [])}
    layers = {layer["name"]: list(layer["items"]) for layer in raw.get("layers", [])}
    overrides = {t: list(lines) for t, lines in (raw.get("verl_overrides") or {}).items()}
    return {
        "resolution": _resolution(raw),
        "python": _python(raw),
        "platform": platform,
        "profile": {k: raw[k] for k in PROFILE_FIELDS if k in raw},
        "engine": dict(raw.get("engine") or {}),
        "components": components,
        "packages": packages,
        "layers": layers,
        "verl_overrides": overrides,
        "_name": raw.get("profile"),
        "_plan_digest": raw.get("plan_digest"),
    }


def _resolution(raw: dict) -> dict:
    """Declared departures from upstream (overrides, excludes, sdists) and substitutions, as
    {kind name: requirement}; a plan carries tuples, a version vector dicts."""
    out: dict[str, dict] = {}
    res = raw.get("resolution")
    if isinstance(res, dict):  # version vector
        for o in res.get("overrides", []):
            out[f"override {_req_name(o['requirement'])}"] = {"requirement": o["requirement"]}
        for e in res.get("excludes", []):
            out[f"exclude {e['package']}"] = {"requirement": "(not installed)"}
        for e in res.get("sdists", []):
            out[f"sdist {e['package']}"] = {"requirement": "(built from sdist)"}
    else:  # plan
        for req, _why, _link in raw.get("overrides", []):
            out[f"override {_req_name(req)}"] = {"requirement": req}
        for name, _why, _link in raw.get("excludes", []):
            out[f"exclude {name}"] = {"requirement": "(not installed)"}
        for name, _why in raw.get("sdists", []):
            out[f"sdist {name}"] = {"requirement": "(built from sdist)"}
    for s in raw.get("substitutions", []):
        what, detail = (s["what"], s["detail"]) if isinstance(s, dict) else s
        out[f"substituted {what} {detail.split('==')[0].split(' ')[0]}"] = {"requirement": detail}
    return out


def _python(raw: dict) -> dict:
    """The exact Python set lock.yaml put in the image: {name: {"version": v}}."""
    if isinstance(raw.get("python_packages"), dict):
        return {n: {"version": v} for n, v in raw["python_packages"].items()}
    # a plan's JSON holds each locked row as a list in LockedRow's field order (as_list)
    fields = [f.name for f in dataclasses.fields(LockedRow)]
    rows = [dict(zip(fields, row)) for row in raw.get("locked", [])]
    return {
        r["name"]: {"version": r["version"]}
        for r in rows
        if not str(r["layer"]).startswith(LockedRow.BUILD_PREFIX)
    }


def _req_name(req: str) -> str:
    import re

    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]


def _patch_id(patch: Any) -> str:
    """`ArronHZG/sglang 47e9ec11..99433255 (3 files), sha256 ...`, or the local file and sha256."""
    if isinstance(patch, dict):
        return describe(patch)
    return str(patch)


# -- comparing -----------------------------------------------------------------------------
def diff_vectors(a: dict, b: dict) -> list[Change]:
    """Changes from normalised vector `a` to `b`, in a stable order (section, item, field)."""
    out: list[Change] = []
    out += _fields("platform", "", a["platform"], b["platform"], shared_only=True)
    out += _fields("profile", "", a["profile"], b["profile"], shared_only=True)
    out += _engine(a["engine"], b["engine"], "")
    for section in ("components", "packages"):
        out += _entries(section, a[section], b[section])
    # Compared when both sides carry them: an unlocked plan (after --set) has no exact Python
    # set, and vectors written before these sections existed have neither.
    for section in ("resolution", "python"):
        if a.get(section) and b.get(section):
            out += _entries(section, a[section], b[section])
    for name in _names(a["layers"], b["layers"]):
        la, lb = a["layers"].get(name), b["layers"].get(name)
        if la != lb:
            out.append(Change("layers", name, "items", la, lb))
    for target in _names(a["verl_overrides"], b["verl_overrides"]):
        out += _overrides(target, a["verl_overrides"].get(target), b["verl_overrides"].get(target))
    return out


def _names(a: dict, b: dict) -> list[str]:
    return sorted(set(a) | set(b))


def _fields(section: str, item: str, a: dict, b: dict, shared_only: bool) -> list[Change]:
    keys = sorted(set(a) & set(b)) if shared_only else sorted(set(a) | set(b))
    return [Change(section, item, k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def _engine(a: dict, b: dict, prefix: str) -> list[Change]:
    out = []
    for key in _names(a, b):
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _engine(va, vb, f"{prefix}{key}.")
        else:
            out.append(Change("engine", "", f"{prefix}{key}", va, vb))
    return out


def _entries(section: str, a: dict, b: dict) -> list[Change]:
    out = []
    for name in _names(a, b):
        ea, eb = a.get(name), b.get(name)
        if ea is None or eb is None:
            out.append(Change(section, name, "(entry)", ea, eb))
        else:
            # Fields both sides carry (a plan has `subdir`, a version vector does not).
            out += _fields(section, name, ea, eb, shared_only=True)
    return out


def _split(line: str) -> tuple[str, str]:
    key, eq, value = line.partition("=")
    return (key, value) if eq else (line, "")


def _overrides(target: str, a: list | None, b: list | None) -> list[Change]:
    a, b = a or [], b or []
    ka, kb = [_split(x)[0] for x in a], [_split(x)[0] for x in b]
    if len(set(ka)) != len(ka) or len(set(kb)) != len(kb):  # repeated keys: compare lines
        only_a = [x for x in a if x not in b]
        only_b = [x for x in b if x not in a]
        return [Change("verl_overrides", target, x, x, None) for x in only_a] + [
            Change("verl_overrides", target, x, None, x) for x in only_b
        ]
    da, db = dict(map(_split, a)), dict(map(_split, b))
    out = [
        Change("verl_overrides", target, k, da.get(k), db.get(k))
        for k in _ordered_keys(ka, kb)
        if da.get(k) != db.get(k)
    ]
    shared = set(ka) & set(kb)
    if not out and [k for k in ka if k in shared] != [k for k in kb if k in shared]:
        out.append(Change("verl_overrides", target, ORDER, a, b))
    return out


def _ordered_keys(ka: list[str], kb: list[str]) -> list[str]:
    """A's keys in A's order, then B's new keys in B's order (reads like the override list)."""
    return ka + [k for k in kb if k not in ka]


# -- sides ---------------------------------------------------------------------------------
def side_from_vector(label: str, raw: dict, kind: str = "vector", image: str | None = None) -> Side:
    """A side from an already-loaded version vector (or plan) dict."""
    vector = normalise(raw, label)
    return Side(label, kind, image, vector["_plan_digest"], vector)


def side_from_plan(plan) -> Side:
    return Side(plan.profile, "profile", None, plan.digest, normalise(plan.to_dict(), plan.profile))


def side_from_file(path: Path) -> Side:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            str(path),
            None,
            f"cannot read a version vector: {exc}",
            "pass a profile name, an image reference or a version.json file",
        ) from None
    return side_from_vector(str(path), raw, kind="file")


def looks_like_image(ref: str) -> bool:
    return any(ch in ref for ch in ":/@")


def vector_from_image(ref: str, eng) -> dict:
    """The version vector inside a local (or pullable) image of the engine `eng` (a
    ContainerEngine), read without running it: the label names the file (or holds the JSON);
    the file is copied out of a created, never started container."""
    eng.ensure_local(ref, flag=None)  # a bare name is never looked up on docker.io
    value = eng.labels(ref).get(LABEL_VERSION_VECTOR, DEFAULT_VECTOR_PATH)
    if value.lstrip().startswith("{"):
        return json.loads(value)
    container = eng.create(ref, ["/bin/true"])
    try:
        data = eng.copy_out(container, value)
    finally:
        eng.remove(container)
    if data is None:
        raise InputError(
            ref,
            None,
            f"the image has no version vector at {value}",
            f"compare images built by this tool ({invocation.command()} --profile NAME)",
        )
    return json.loads(_first_file(data, ref))


def _first_file(tar_bytes: bytes, ref: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                return tar.extractfile(member).read()
    raise InputError(ref, None, "the version-vector path in the image is not a file")


# -- output --------------------------------------------------------------------------------
def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _heading(tag: str, side: Side) -> str:
    notes = [side.kind] + ([f"plan {side.plan_digest[:12]}"] if side.plan_digest else [])
    return f"{tag}: {side.label}  ({', '.join(notes)})"


def format_text(a: Side, b: Side, changes: list[Change]) -> str:
    lines = [_heading("A", a), _heading("B", b)]
    if not changes:
        lines.append("no differences in the version vectors")
        return "\n".join(lines) + "\n"
    for section in SECTIONS:
        group = [c for c in changes if c.section == section]
        items = sorted({c.item for c in group}, key=lambda i: [c.item for c in group].index(i))
        for item in items:
            title = SECTION_TITLES[section] + (
                f" ({item})" if section == "verl_overrides" else f": {item}" if item else ""
            )
            lines.append(title)
            for c in (c for c in group if c.item == item):
                lines += ["  " + x for x in _change_lines(c)]
    n = len(changes)
    lines.append(f"{n} difference{'s' if n != 1 else ''}")
    return "\n".join(lines) + "\n"


def _change_lines(c: Change) -> list[str]:
    if c.section == "verl_overrides":
        if c.field == ORDER:
            return ["order differs:"] + [f"  A: {x}" for x in c.a] + [f"  B: {x}" for x in c.b]
        if c.kind == "added":
            return [f"+ {c.field}={c.b}" if c.field != c.b else f"+ {c.b}"]
        if c.kind == "removed":
            return [f"- {c.field}={c.a}" if c.field != c.a else f"- {c.a}"]
        return [f"~ {c.field}: {c.a} -> {c.b}"]
    if c.field == "(entry)":
        return ["+ only in B" if c.a is None else "- only in A"]
    if c.field == "patches" and isinstance(c.a, list) and isinstance(c.b, list):
        return [f"patch - {p}" for p in c.a if p not in c.b] + [
            f"patch + {p}" for p in c.b if p not in c.a
        ] or [f"patches: order {_show(c.a)} -> {_show(c.b)}"]
    return [f"{c.field}: {_show(c.a)} -> {_show(c.b)}"]


def to_json(a: Side, b: Side, changes: list[Change]) -> dict:
    return {
        "a": {"label": a.label, "kind": a.kind, "image": a.image, "plan_digest": a.plan_digest},
        "b": {"label": b.label, "kind": b.kind, "image": b.image, "plan_digest": b.plan_digest},
        "same": not changes,
        "differences": [c.to_dict() for c in changes],
    }
