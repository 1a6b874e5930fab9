"""The image's software bill of materials, as CycloneDX 1.5 JSON, made from the recipe alone
(mtpimage/assembly/recipe.py: the Plan and the compiled extensions' builder stages).

It is exact because the Plan carries the lock: every locked distribution (name, version,
index, wheel file, sha256, layer), every git source by commit, each patch by its commits and
sha256, every compiled extension by its pinned source (and its wheel's sha256 once built),
and the base image by digest. Nothing is scanned from the image, so nothing is guessed.

Deterministic: the same plan (and the same known wheels) gives the same bytes. There is no
timestamp, and the serialNumber is a UUID made from the sha256 of the rest of the document.

Not in it: what the base image and the OS-package layer hold (apt resolves those at build
time from the distribution's archive, not from the lock); `compositions` says so.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from packaging.utils import canonicalize_name

from mtpimage import __version__
from mtpimage.ext.wheelcache import WheelCache
from mtpimage.imageref import ImageRef
from mtpimage.plan.model import IMAGE_REPOSITORY, Component, LockedRow, Package, Patch, Plan

if TYPE_CHECKING:  # annotations only: the SBOM's purls and file names need no renderer
    from mtpimage.assembly.recipe import Recipe
    from mtpimage.ext.extensions import BuilderStage

SPEC_VERSION = "1.5"
NS = "io.mtp-image-builder"  # property names: the labels' namespace
IMAGE_REF = "image"  # bom-ref of the image itself (metadata.component)


@dataclass(frozen=True)
class BuiltWheel:
    """A compiled extension's wheel as this machine knows it: its wheel-cache key and, once
    built (or pulled), the file and its sha256."""

    key: str
    filename: str | None = None
    sha256: str | None = None


# ----------------------------------------------------------------------------- purls
def _q(value: str) -> str:
    # purl: qualifier values and versions percent-encoded; ':' and '/' may stay (purl spec)
    return quote(value, safe=":/")


def pypi_purl(name: str, version: str, file: str | None = None, index_url: str | None = None) -> str:
    quals = {}
    if file:
        quals["file_name"] = file
    if index_url and index_url.rstrip("/") != "https://pypi.org/simple":
        quals["repository_url"] = index_url
    tail = "&".join(f"{k}={_q(v)}" for k, v in sorted(quals.items()))
    return f"pkg:pypi/{canonicalize_name(name)}@{_q(version)}" + (f"?{tail}" if tail else "")


def _github(repo: str) -> tuple[str, str] | None:
    u = urlsplit(repo)
    parts = u.path.strip("/").removesuffix(".git").split("/")
    if u.hostname == "github.com" and len(parts) == 2:
        return parts[0], parts[1]
    return None


def git_purl(repo: str, commit: str, name: str, subdir: str = ".") -> str:
    """pkg:github/OWNER/REPO@COMMIT for GitHub, else pkg:generic/NAME@COMMIT?vcs_url=git+REPO@COMMIT."""
    sub = f"#{subdir.strip('/')}" if subdir and subdir != "." else ""
    gh = _github(repo)
    if gh:
        return f"pkg:github/{gh[0].lower()}/{gh[1].lower()}@{commit}{sub}"
    return f"pkg:generic/{canonicalize_name(name)}@{commit}?vcs_url={_q(f'git+{repo}@{commit}')}{sub}"


def oci_purl(image: str) -> str:
    """pkg:oci/NAME@sha256%3A...?repository_url=HOST/PATH&tag=TAG (the digest is the version)."""
    ref = ImageRef.parse(image, flag="base image")
    quals = {"repository_url": ref.repository}
    if ref.tag:
        quals["tag"] = ref.tag
    tail = "&".join(f"{k}={_q(v)}" for k, v in sorted(quals.items()))
    version = f"@{quote(ref.digest, safe='')}" if ref.digest else ""
    return f"pkg:oci/{ref.path.rsplit('/', 1)[-1].lower()}{version}?{tail}"


# ----------------------------------------------------------------------------- parts
def _props(*pairs: tuple[str, str]) -> list[dict]:
    return [{"name": f"{NS}:{k}", "value": str(v)} for k, v in pairs]


def _sha256(hexdigest: str) -> list[dict]:
    return [{"alg": "SHA-256", "content": hexdigest}] if hexdigest else []


def _commit_url(repo: str, commit: str) -> str | None:
    return f"https://github.com/{'/'.join(_github(repo))}/commit/{commit}" if _github(repo) else None


def _patch(p: Patch) -> dict:
    """CycloneDX pedigree.patches[]: a diff by URL and what it resolves. The diff's own sha256
    and its commits are properties of the patched component (a patch has no hash field)."""
    if p.repo and _github(p.repo):
        owner, name = _github(p.repo)
        diff = f"https://github.com/{owner}/{name}/compare/{p.base}...{p.head}.diff"
    else:
        diff = p.repo or p.url
    return {
        "type": "unofficial",
        "diff": {"url": diff},
        "resolves": [{"type": "defect", "name": ", ".join(p.provides) or p.name, "source": {"url": p.url}}],
    }


def _patch_props(patches: tuple[Patch, ...]) -> list[dict]:
    out = []
    for p in patches:
        pre = f"patch:{p.name}"
        pairs = [(f"{pre}:sha256", p.sha256), (f"{pre}:strip", p.strip)]
        if p.repo:
            pairs += [(f"{pre}:repo", p.repo), (f"{pre}:base", p.base), (f"{pre}:head", p.head)]
            pairs += [(f"{pre}:paths", " ".join(p.paths))] if p.paths else []
        else:
            pairs.append((f"{pre}:file", p.file))
        out += _props(*pairs)
    return out


def _with_patches(comp: dict, patches: tuple[Patch, ...], commits: list[dict] | None = None) -> dict:
    pedigree = {}
    if commits:
        pedigree["commits"] = commits
    if patches:
        pedigree["patches"] = [_patch(p) for p in patches]
        comp["properties"] = comp.get("properties", []) + _patch_props(patches)
    if pedigree:
        comp["pedigree"] = pedigree
    return comp


def _locked(plan: Plan, rows: list[LockedRow], patched: dict) -> dict:
    """One component for one wheel file: a locked row, or the same file in several layers
    (a build backend shared by builders) with one layer property each."""
    first = rows[0]
    name, version, index, file, sha = first.name, first.version, first.index, first.file, first.sha256
    index_url = dict(plan.indexes).get(index)
    purl = pypi_purl(name, version, file, index_url)
    layers = sorted({r.layer for r in rows})
    comp = {
        "type": "library",
        "bom-ref": purl,
        "name": name,
        "version": version,
        # builder stages' backends are in no image layer: "excluded" is CycloneDX's
        # scope for what is used to make the software, not shipped in it
        "scope": "required" if any(not r.is_build_backend for r in rows) else "excluded",
        "hashes": _sha256(sha),
        "purl": purl,
        "properties": _props(("index", index), *(("layer", x) for x in layers))
        + (_props(("file", file)) if file else []),
    }
    if not sha:
        del comp["hashes"]  # unlocked: a version, no file
    if index_url:
        comp["externalReferences"] = [
            {"type": "distribution", "url": f"{index_url.rstrip('/')}/{canonicalize_name(name)}/"}
        ]
    return _with_patches(comp, patched.get(canonicalize_name(name), ()))


def _git(c: Component) -> dict:
    purl = git_purl(c.repo, c.commit, c.package, c.subdir)
    commit = {
        "uid": c.commit,
        **({"url": _commit_url(c.repo, c.commit)} if _commit_url(c.repo, c.commit) else {}),
    }
    comp = {
        "type": "library",
        "bom-ref": purl,
        "name": c.package,
        "version": c.version or c.commit,
        "scope": "required",
        "purl": purl,
        "externalReferences": [{"type": "vcs", "url": c.repo}],
        "properties": _props(
            ("component", c.name),
            ("layer", c.layer),
            ("git:commit", c.commit),
            *((("git:ref", c.ref),) if c.ref else ()),
            *((("git:subdir", c.subdir),) if c.subdir != "." else ()),
        ),
    }
    return _with_patches(comp, c.patches, [commit])


def _source(pkg: Package) -> dict:
    """An extension's pinned source, as its pedigree ancestor."""
    b = pkg.build
    if b.source == "sdist":
        file = b.url.rsplit("/", 1)[-1]
        return {
            "type": "library",
            "name": pkg.name,
            "version": pkg.version,
            "hashes": _sha256(b.sha256),
            "purl": pypi_purl(pkg.name, pkg.version, file),
            "externalReferences": [{"type": "distribution", "url": b.url}],
        }
    return {
        "type": "library",
        "name": pkg.name,
        "version": b.commit,
        "purl": git_purl(b.repo, b.commit, pkg.name),
        "externalReferences": [{"type": "vcs", "url": b.repo}],
    }


def _extension(stage: BuilderStage, wheel: BuiltWheel | None) -> dict:
    pkg = stage.package
    known = wheel is not None and wheel.sha256
    purl = pypi_purl(pkg.name, pkg.version, wheel.filename if known else None)
    pairs = [("layer", pkg.layer), ("compiled", "from its pinned source by this tool")]
    pairs += [("cuda_arch", a) for a in stage.archs] + [("build_env", e) for e in stage.env]
    if wheel is not None:
        pairs.append(("wheel_key", wheel.key))
    pairs.append(("file", wheel.filename) if known else ("file", "unknown: not built on this machine"))
    return {
        "type": "library",
        "bom-ref": purl,
        "name": pkg.name,
        "version": pkg.version,
        "scope": "required",
        **({"hashes": _sha256(wheel.sha256)} if known else {}),
        "purl": purl,
        "pedigree": {"ancestors": [_source(pkg)]},
        "properties": _props(*pairs),
    }


def _base(plan: Plan) -> dict:
    ref = ImageRef.parse(plan.base_image, flag="base image")
    purl = oci_purl(plan.base_image)
    comp = {
        "type": "container",
        "bom-ref": purl,
        "name": ref.repository,
        "version": ref.digest or ref.tag or "",
        "scope": "required",
        "hashes": _sha256(ref.digest.split(":", 1)[1]) if ref.digest else [],
        "purl": purl,
        "properties": _props(("layer", "base"), *(("tag", ref.tag),) if ref.tag else ()),
    }
    if not comp["hashes"]:
        del comp["hashes"]
    return comp


# ----------------------------------------------------------------------------- the document
def components(recipe: Recipe, wheels: dict[str, BuiltWheel] | None = None) -> list[dict]:
    """Every component of the image: the base, each git source, each locked wheel file (or,
    unlocked, each pinned PyPI package and component) and each compiled extension."""
    plan = recipe.plan
    wheels = wheels or {}
    built = {canonicalize_name(b.name): b for b in recipe.builders}
    patched = {canonicalize_name(c.package): c.patches for c in plan.components if c.source != "git"}
    out = [_base(plan)] + [_git(c) for c in plan.components if c.source == "git"]
    if recipe.locked:
        files: dict[tuple, list[LockedRow]] = {}
        for row in plan.locked:
            if canonicalize_name(row.name) in built and not row.file:
                continue  # a compiled extension: its own component below
            files.setdefault((canonicalize_name(row.name), row.version, row.file, row.sha256), []).append(row)
        out += [_locked(plan, rows, patched) for _, rows in sorted(files.items())]
    else:
        # unlocked (stand-in plans, --no-frozen runs): what the manifests pin, without files
        pins = [(p.name, p.version, p.layer, p.index) for p in plan.packages if p.build is None]
        pins += [(c.package, c.version, c.layer, c.index) for c in plan.components if c.source != "git"]
        out += [
            _locked(plan, [LockedRow(n, v, layer, i, "", "")], patched) for n, v, layer, i in sorted(pins)
        ]
    out += [_extension(b, wheels.get(b.name)) for b in built.values()]
    return out


def document(recipe: Recipe, identity: str, wheels: dict[str, BuiltWheel] | None = None) -> dict:
    plan = recipe.plan
    comps = components(recipe, wheels)
    meta_props = _props(
        ("profile", plan.profile),
        ("mode", plan.mode),
        ("plan_digest", plan.digest),
        ("locked", "true" if recipe.locked else "false: no lock.yaml matched; versions as pinned, no files"),
        ("python", plan.python),
        ("cuda", plan.cuda),
        *(("substitution", f"{what}: {detail}") for what, detail in plan.substitutions),
        *(("os_package", name) for name in plan.os_packages),
    )
    doc = {
        "$schema": f"http://cyclonedx.org/schema/bom-{SPEC_VERSION}.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": {
            "tools": {
                "components": [{"type": "application", "name": "mtp-image-builder", "version": __version__}]
            },
            "component": {
                "type": "container",
                "bom-ref": IMAGE_REF,
                "name": IMAGE_REPOSITORY,
                "version": identity,
                "description": plan.summary,
            },
            "properties": meta_props,
        },
        "components": comps,
        "dependencies": [
            {"ref": IMAGE_REF, "dependsOn": sorted(c["bom-ref"] for c in comps if c["scope"] == "required")}
        ],
        # the Python set and sources are complete (from the lock); the base image's and the
        # OS packages' contents are not enumerated (apt, not the lock, picks their versions)
        "compositions": [{"aggregate": "incomplete", "assemblies": [IMAGE_REF]}],
    }
    body = dumps(doc)
    doc["serialNumber"] = f"urn:uuid:{uuid.UUID(bytes=hashlib.sha256(body).digest()[:16], version=5)}"
    return doc


def dumps(doc: dict) -> bytes:
    """The document's bytes: sorted keys, two-space indent, ASCII, one trailing newline."""
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()


def file_name(profile: str) -> str:
    """What the SBOM file is called: in the registry (its layer's title) and on disk."""
    return f"{profile}.sbom.cdx.json"


def known_wheels(rendered) -> dict[str, BuiltWheel]:
    """Each compiled extension's key and, when this machine's wheel cache holds it (a build
    puts every wheel it installs there), its file and sha256. Never builds or pulls."""
    cache = WheelCache()
    out = {}
    for entry in rendered.extensions:
        hit = cache.get(entry["key"])
        out[entry["name"]] = BuiltWheel(entry["key"], hit and hit.filename, hit and hit.sha256)
    return out


def for_rendered(rendered) -> bytes:
    """The SBOM of a rendered plan, with the wheels this machine knows."""
    return dumps(document(rendered.recipe, rendered.identity, known_wheels(rendered)))
