"""The Plan: a frozen, fully resolved description of one image.

Everything after `resolve` reads only the Plan. Its content hash is the image's
identity; the same manifests give the same Plan and the same hash, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from mtpimage.manifests import schema, sitefacts
from mtpimage.manifests.manifest import Manifests, ResolvedProfile
from mtpimage.manifests.modes import mode_overrides, verl_facts
from mtpimage.manifests.patches import context_name, describe
from mtpimage.plan import mtponly
from mtpimage.plan.facts import tool_facts
from mtpimage.settings import IMAGE_REPOSITORY  # noqa: F401 - the tool's one name for it; imported from here

PLAN_SCHEMA = "mtp-image-builder/plan/v1"
# The one rule for a tag that names one variant of an image (issues 48, 49): the plain tag, a
# dot, the variant (a platform's arch: `mtp-detach.arm64`; a layer format: `mtp-detach.zstd`;
# both, platform first: `mtp-detach.arm64.zstd`). A dot is in no profile name (profile.v1.json
# `name`: [a-z0-9-]) and in no identity (`<profile>-<12 hex>`), so a variant's tag is never
# another profile's or image's plain tag; a hyphen would be (`mtp-detach-arm64` is a valid name).
TAG_VARIANT_SEPARATOR = "."
MODE_LAYER = "mode"
OS_LAYER = "os"


def variant_tag(tag: str, variant: str) -> str:
    """`tag` of one variant (TAG_VARIANT_SEPARATOR's rule): `mtp-detach` + `arm64` ->
    `mtp-detach.arm64`."""
    return f"{tag}{TAG_VARIANT_SEPARATOR}{variant}"


@dataclass(frozen=True)
class Patch:
    """A fix on top of a component, pinned by the sha256 of its bytes: by reference (`repo`,
    `base`, `head`, optional `paths`: the diff the tool makes from the two commits) or a local
    file under manifests/ (`file`, a site's own fix). See patches.py."""

    file: str | None
    sha256: str
    url: str
    strip: int
    provides: tuple[str, ...]
    repo: str | None = None
    base: str | None = None
    head: str | None = None
    paths: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """Its file name in the build context."""
        return context_name(self)

    def describe(self) -> str:
        """`ArronHZG/sglang 47e9ec11..99433255 (3 files), sha256 ...` (or the local file)."""
        return describe(self)


@dataclass(frozen=True)
class Component:
    name: str
    source: str  # git | pypi
    package: str
    layer: str
    repo: str | None
    ref: str | None
    commit: str | None
    version: str | None
    index: str
    subdir: str
    extras: tuple[str, ...]
    patches: tuple[Patch, ...]
    build_requires: tuple[str, ...] = ()
    deps_declared: bool = True  # False: installed without its own Requires-Dist
    deps_add: tuple[str, ...] = ()  # runtime needs its packaging omits
    entry_checks: tuple = ()  # what users start from it (in-image checks)
    # variables the image sets for its users (components.yaml `runtime_env`), sorted, and why
    runtime_env: tuple[tuple[str, str], ...] = ()
    runtime_env_why: str = ""

    @property
    def pin(self) -> str:
        return self.commit if self.source == "git" else f"{self.package}=={self.version}"

    def pinned_artifact(self) -> str:
        """What a patch applies to, as the patches-apply rule names it: `sglang 0.5.12` (PyPI) or
        `megatron-lm 5be9626709` (git)."""
        return (
            f"{self.package} {self.version}" if self.source == "pypi" else f"{self.name} {self.commit[:10]}"
        )

    def provides(self) -> set[str]:
        return {p for patch in self.patches for p in patch.provides}


@dataclass(frozen=True)
class ExtensionBuild:
    """How the tool compiles a package itself (components.yaml `build`): its pinned source
    (an sdist by sha256, or a git commit), its own build switches and hashed build backends.
    The architectures come from `builds.cuda_archs`; see extensions.py."""

    source: str  # sdist | git
    url: str | None  # sdist url
    sha256: str | None  # of the sdist
    repo: str | None
    ref: str | None
    commit: str | None
    env: tuple[tuple[str, str], ...]  # sorted; {cuda_archs}/{torch_cuda_arch_list} unfilled
    build_requires: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()  # compiled modules the wheel must hold

    @property
    def pin(self) -> str:
        return f"sha256:{self.sha256}" if self.source == "sdist" else str(self.commit)


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    index: str
    layer: str
    extras: tuple[str, ...]
    requires_dist: tuple[str, ...] | None = None  # as data, for an index unreachable at lock time
    build: ExtensionBuild | None = None  # compiled by the tool from a pinned source

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}=={self.version}"


@dataclass(frozen=True)
class LockedRow:
    """One distribution lock.yaml resolved for the image (lockfile.locked_requirements): what
    is installed, exactly, with no resolution at build time. `layer` is the catalogue layer
    that installs it, or `build:<name>` for a build backend of the git component or compiled
    extension <name> (installed in that build only, never in the image). `file` and `sha256`
    are empty for a row locked without a file (hash-pinned refuses those)."""

    name: str
    version: str
    layer: str
    index: str
    file: str
    sha256: str

    BUILD_PREFIX: ClassVar[str] = "build:"

    @property
    def builds(self) -> str | None:
        """The component or extension whose build backend this is; None for an image row."""
        return self.layer[len(self.BUILD_PREFIX) :] if self.is_build_backend else None

    @property
    def is_build_backend(self) -> bool:
        return self.layer.startswith(self.BUILD_PREFIX)

    @property
    def hashed_requirement(self) -> str:
        """Its line in a requirements file pip installs with --require-hashes."""
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"

    def as_list(self) -> list[str]:
        """The row in the Plan's canonical JSON (and so in its digest): a list, in field order."""
        return [self.name, self.version, self.layer, self.index, self.file, self.sha256]


@dataclass(frozen=True)
class Layer:
    name: str
    items: tuple[str, ...]  # component / package names, in install order


@dataclass(frozen=True)
class BasePlatform:
    """lock.yaml's record of the manifest the build pulls from the pinned base for its platform
    (publish/baseplatform.py): `manifest` says what the base digest names (an `index`, or a
    `single-platform` image, whose platform digest is that digest itself)."""

    platform: str  # os/architecture, e.g. linux/amd64
    manifest: str  # index | single-platform
    digest: str  # the platform manifest's digest


# Plan fields whose key in to_dict, and so in the canonical JSON and the digest, is the name
# the field had before issue 39 renamed it: renaming a field moves no digest
DIGEST_KEYS = {
    "training_engine": "engine",
    "verl_cli_overrides": "verl_overrides",
    "profile_overridden_fields": "overridden",
    "resolution_overrides": "overrides",
}


@dataclass(frozen=True)
class Plan:
    profile: str
    summary: str
    choose_when: str
    mode: str
    experimental: bool
    targets: tuple[str, ...]
    models: tuple[str, ...]
    # verl's training engine settings (name: megatron, bridge, recompute, ...), not the container
    # engine; a frozen mapping: sorted (key, value). Its key in to_dict (and the digest) is "engine"
    training_engine: tuple[tuple[str, Any], ...]
    rollout_engine: str
    python: str
    cuda: str
    base_image: str  # name:tag@digest (digest may be absent)
    base_digest: str | None
    os_packages: tuple[str, ...]
    indexes: tuple[tuple[str, str], ...]
    components: tuple[Component, ...]
    packages: tuple[Package, ...]
    layers: tuple[Layer, ...]
    # target -> the Hydra override lines verl's trainer is started with (`explain` prints them)
    verl_cli_overrides: tuple[tuple[str, tuple[str, ...]], ...]
    size_budget_gb: float | None = None
    # mtp-only modes: the id of the verl.yaml mtp_only_recipes entry the overrides follow
    # (mtponly.choose); "" for the others (then absent from to_dict: their digests keep)
    mtp_recipe: str = ""
    # component or package -> the fields the profile's stack.overrides or --set changed
    profile_overridden_fields: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())
    # every Python distribution lock.yaml resolved for this image, with its file (see lockfile)
    locked: tuple[LockedRow, ...] = ()
    # conflicts settled as data (components.yaml resolution.overrides and .excludes):
    # (requirement, why, link) and (package, why, link)
    resolution_overrides: tuple[tuple[str, str, str], ...] = ()
    excludes: tuple[tuple[str, str, str], ...] = ()
    sdists: tuple[tuple[str, str], ...] = ()  # (package, why): the only builds from an sdist
    substitutions: tuple[tuple[str, str], ...] = ()  # (what, detail): see substitute.py
    # builds.cuda_archs (the profile's, else the catalogue's): what compiled extensions target
    cuda_archs: tuple[str, ...] = ()
    routes: tuple[tuple[str, str, str], ...] = ()  # (package, choice, why): resolution.routes
    # builds.against: builder stages start after its layer (the schema's default: torch)
    builds_against: str = field(default_factory=lambda: schema.default(COMPONENTS, "builds", "against"))
    builder_os_packages: tuple[str, ...] = ()  # builds.os_packages (builder stages only)
    # platform.os_remove: (package, why) of the base's packages the os layer removes
    os_remove: tuple[tuple[str, str], ...] = ()
    # lock.yaml's platform manifest of this base (None: not recorded, or a substituted base)
    base_platform: BasePlatform | None = None
    # builds.platform: the os/architecture the image is for (issue 49); absent from to_dict
    # while it is the schema default, the lock's platform, so every digest made before keeps
    platform: str = field(default_factory=lambda: schema.default(COMPONENTS, "builds", "platform"))
    # the locked rows of packages with no wheel for `platform` (lock.yaml's platform set
    # names them): rule platform-wheels refuses the plan; outside the digest (nothing builds)
    platform_gaps: tuple[LockedRow, ...] = field(default=(), compare=False)
    # builds.max_jobs: how long a compile takes, not what it makes: outside the digest
    ext_max_jobs: int = field(
        default_factory=lambda: schema.default(COMPONENTS, "builds", "max_jobs"), compare=False
    )
    # builds.compression (the profile's, else the catalogue's; "" = compression.yaml's
    # default): how the published layers are compressed, not what they hold (the config and
    # diff IDs are the same in every format): outside the digest, as --compression is
    layer_compression: str = field(default="", compare=False)
    # resolution.routes' links (package, link): evidence shown to people by check and explain,
    # not what is built: outside the digest
    route_links: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    # -- views -------------------------------------------------------------
    def training_engine_dict(self) -> dict:
        return {k: _thaw(v) for k, v in self.training_engine}

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def package(self, name: str) -> Package | None:
        return next((p for p in self.packages if p.name == name), None)

    def verl_cli_overrides_for(self, target: str) -> list[str]:
        return list(dict(self.verl_cli_overrides).get(target, ()))

    @property
    def profile_tag(self) -> str:
        """The tag users pull, moved to the image once its checks passed: the profile's name for
        the lock's platform; `<profile>.<arch>` for another (mtp-detach.arm64: variant_tag), so
        the platforms' publish jobs never move one tag in turn and no profile's name is another's
        platform tag: the multi-arch index (`index`) takes the profile's name and lists both
        (issue 49)."""
        if self.platform == schema.default(COMPONENTS, "builds", "platform"):
            return self.profile
        return variant_tag(self.profile, self.platform.rsplit("/", 1)[-1])

    @property
    def recompute(self) -> dict | None:
        return self.training_engine_dict().get("recompute")

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["ext_max_jobs"], d["route_links"], d["layer_compression"], d["platform_gaps"]
        if not self.cuda_archs:
            del d["builds_against"]
        if self.platform == schema.default(COMPONENTS, "builds", "platform"):
            del d["platform"]
        for key in (
            "cuda_archs",
            "routes",
            "builder_os_packages",
            "base_platform",
            "os_remove",
            "mtp_recipe",
        ):  # absent when unused
            if not d[key]:
                del d[key]
        for c in d["components"]:  # absent when unused: older plans keep their digests
            if not c["runtime_env"]:
                del c["runtime_env"], c["runtime_env_why"]
        # the keys the digest and every output have always had, each in its field's place
        d = {DIGEST_KEYS.get(k, k): v for k, v in d.items()}
        d["engine"] = self.training_engine_dict()
        d["indexes"] = dict(self.indexes)
        d["verl_overrides"] = {t: list(lines) for t, lines in self.verl_cli_overrides}
        d["overridden"] = {t: list(f) for t, f in self.profile_overridden_fields}
        d["layers"] = [{"name": layer.name, "items": list(layer.items)} for layer in self.layers]
        d["locked"] = [row.as_list() for row in self.locked]  # lists, as the digest always had them
        return {"schema": PLAN_SCHEMA, **_lists(d)}

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


class _FrozenDict(dict):
    """A dict that hashes (Plan is frozen); asdict() copies it as a plain dict."""

    def __hash__(self):
        return hash(json.dumps(self, sort_keys=True))


def _freeze_dict(d: dict) -> dict:
    return _FrozenDict({k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if (
        isinstance(value, tuple)
        and value
        and all(isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) for i in value)
    ):
        return {k: _thaw(v) for k, v in value}
    return value


def verl_override_lines(
    mode: str, target: str, training_engine: dict, rollout_engine: str, recipe: mtponly.Recipe | None = None
) -> list[str]:
    """The exact Hydra overrides for a mode and target, MTP block first (upstream's order).
    recipe: how an mtp-only mode is configured on the pinned stack (mtponly.choose): its
    detach_encoder value replaces the mode's, and its TransformerConfig settings follow."""
    facts = verl_facts()
    keys = facts["engine_keys"][target]
    prefix = facts["mtp_prefix"][target]
    fields = mode_overrides(mode)
    if recipe is not None:
        fields = [(k, recipe.detach_encoder if k == "detach_encoder" else v) for k, v in fields]
    lines = [f"{prefix}{k}={v}" for k, v in fields]
    lines += [f"{k}={training_engine['name']}" for k in keys["engine"]]
    if training_engine.get("bridge") == "mbridge":
        lines += [f"{k}=True" for k in keys["vanilla_mbridge"]]
    cp = training_engine.get("context_parallel_size", 1)
    if cp and cp > 1:
        lines += [f"{k}={cp}" for k in keys["context_parallel_size"]]
    recompute = training_engine.get("recompute")
    tc = keys["transformer_config"]
    if recompute:
        lines.append(f"{tc}recompute_granularity={recompute['granularity']}")
        if recompute.get("method"):
            lines.append(f"{tc}recompute_method={recompute['method']}")
        if recompute.get("num_layers"):
            lines.append(f"{tc}recompute_num_layers={recompute['num_layers']}")
    for setting in recipe.transformer if recipe is not None else ():
        lines.append(f"{'+' if setting.new_key else ''}{tc}{setting.key}={setting.value}")
    lines += [f"{k}={rollout_engine}" for k in keys["rollout_name"]]
    return lines


def mode_guarantees(plan: Plan) -> list[str]:
    """What the plan's mode promises on its pins, from the mtp-only recipe it takes: the exact
    promise, or what an inexact recipe gives up. Empty for modes without mtp-only semantics."""
    if not plan.mtp_recipe:
        return []
    recipe = mtponly.by_id(plan.mtp_recipe)
    if recipe.exact:
        return [mtponly.guarantee()]
    return [f"NOT exact on these pins ({recipe.why}): {recipe.loses}"]


def _extension_build(b: dict | None) -> ExtensionBuild | None:
    if not b:
        return None
    src = b.get("sdist") or {}
    git = b.get("git") or {}
    return ExtensionBuild(
        source="sdist" if src else "git",
        url=src.get("url"),
        sha256=src.get("sha256"),
        repo=git.get("repo"),
        ref=git.get("ref"),
        commit=git.get("commit"),
        env=tuple(sorted(b.get("env", {}).items())),
        build_requires=tuple(b.get("build_requires", [])),
        produces=tuple(b.get("produces", [])),
    )


COMPONENTS = "components"  # the catalogue's schema (mtpimage/schemas/components.v1.json)


def _builds(cat: dict, key: str):
    """builds.<key> of the catalogue, else the schema's default for it."""
    return (cat.get("builds") or {}).get(key, schema.default(COMPONENTS, "builds", key))


def cuda_archs(cat: dict, profile: dict) -> list[str]:
    """The GPU architectures the compiled extensions target: the profile's builds.cuda_archs
    (its own file, a parent's, or --set), else the catalogue's builds.cuda_archs."""
    return (profile.get("builds") or {}).get("cuda_archs") or _builds(cat, "cuda_archs")


def lock_platforms(cat: dict) -> list[str]:
    """The platforms lock resolves every profile for (components.yaml builds.lock_platforms),
    the lock's own platform (the schema default of builds.platform) first."""
    first = schema.default(COMPONENTS, "builds", "platform")
    return [first] + sorted(set(_builds(cat, "lock_platforms")) - {first})


def target_platform(cat: dict, profile: dict) -> str:
    """The os/architecture the image is for: the profile's builds.platform (its own file, a
    parent's, or --set), else the catalogue's builds.platform."""
    return (profile.get("builds") or {}).get("platform") or _builds(cat, "platform")


def layer_compression(cat: dict, profile: dict) -> str:
    """How published layers are compressed: the profile's builds.compression (its own file, a
    parent's, or --set), else the catalogue's; "" when neither says (compression.yaml's default)."""
    return (profile.get("builds") or {}).get("compression") or (cat.get("builds") or {}).get(
        "compression", ""
    )


def _component(name: str, c: dict) -> Component:
    """One catalogue component (with its profile's overrides applied) as the Plan holds it."""
    return Component(
        name=name,
        source=c["source"],
        package=c["package"],
        layer=c["layer"],
        repo=c.get("repo"),
        ref=c.get("ref"),
        commit=c.get("commit"),
        version=c.get("version"),
        index=c.get("index", schema.default(COMPONENTS, "$defs", "component", "index")),
        subdir=c.get("subdir", schema.default(COMPONENTS, "$defs", "component", "subdir")),
        extras=tuple(c.get("extras", [])),
        patches=tuple(
            Patch(
                p.get("file"),
                p["sha256"],
                p["url"],
                p.get("strip", schema.default(COMPONENTS, "$defs", "patch", "strip")),
                tuple(p.get("provides", [])),
                p.get("repo"),
                p.get("base"),
                p.get("head"),
                tuple(p.get("paths", [])),
            )
            for p in c.get("patches", [])
        ),
        build_requires=tuple(c.get("build_requires", [])),
        deps_declared=(c.get("dependencies") or {}).get("declared", True),
        deps_add=tuple((c.get("dependencies") or {}).get("add", [])),
        entry_checks=tuple(_freeze_dict(e) for e in c.get("entry_checks", [])),
        runtime_env=tuple(sorted(((c.get("runtime_env") or {}).get("vars") or {}).items())),
        runtime_env_why=(c.get("runtime_env") or {}).get("why", ""),
    )


def build_plan(m: Manifests, rp: ResolvedProfile) -> Plan:
    cat = m.catalogue.data
    data = rp.data
    plat = cat["platform"]
    img = plat["base_image"]
    base = f"{img['name']}:{img['tag']}" + (f"@{img['digest']}" if img.get("digest") else "")
    components = tuple(_component(name, c) for name, c in rp.components.items())
    packages = tuple(
        Package(
            name=name,
            version=p["version"],
            index=p.get("index", schema.default(COMPONENTS, "$defs", "package", "index")),
            layer=p["layer"],
            extras=tuple(p.get("extras", [])),
            requires_dist=tuple(p["requires_dist"]["requires"]) if p.get("requires_dist") else None,
            build=_extension_build(p.get("build")),
        )
        for name, p in rp.packages.items()
    )
    layers = [Layer(OS_LAYER, tuple(plat.get("os_packages", [])))]
    for layer in cat["layers"]:
        items = [p.name for p in packages if p.layer == layer] + [
            c.name for c in components if c.layer == layer
        ]
        if items:
            layers.append(Layer(layer, tuple(items)))
    layers.append(Layer(MODE_LAYER, ()))
    training_engine = data["engine"]
    # the facts a site added (manifests/facts.yaml) decide the recipe as they decide the rules
    choice = mtponly.choose(data["mode"], components, sitefacts.load(m.root, tool_facts()).facts)
    recipe = choice.recipe if choice is not None else None
    verl_cli_overrides = tuple(
        (t, tuple(verl_override_lines(data["mode"], t, training_engine, data["rollout"]["engine"], recipe)))
        for t in data["targets"]
    )
    return Plan(
        profile=rp.name,
        summary=data["summary"],
        choose_when=data.get("choose_when", ""),
        mode=data["mode"],
        experimental=data.get("experimental", False),
        targets=tuple(data["targets"]),
        models=tuple(data.get("models", [])),
        training_engine=_freeze(training_engine),
        rollout_engine=data["rollout"]["engine"],
        python=plat["python"],
        cuda=plat["cuda"],
        base_image=base,
        base_digest=img.get("digest"),
        os_packages=tuple(plat.get("os_packages", [])),
        os_remove=tuple((r["package"], " ".join(r["why"].split())) for r in plat.get("os_remove", [])),
        indexes=tuple(sorted(cat["indexes"].items())),
        components=components,
        packages=packages,
        layers=tuple(layers),
        verl_cli_overrides=verl_cli_overrides,
        mtp_recipe=recipe.id if recipe is not None else "",
        size_budget_gb=data.get("size_budget_gb"),
        profile_overridden_fields=tuple(sorted((k, tuple(v)) for k, v in rp.overridden_fields.items())),
        resolution_overrides=tuple(
            (o["requirement"], " ".join(o["why"].split()), o["link"])
            for o in (cat.get("resolution") or {}).get("overrides", [])
        ),
        excludes=tuple(
            (e["package"], " ".join(e["why"].split()), e["link"])
            for e in (cat.get("resolution") or {}).get("excludes", [])
        ),
        sdists=tuple(
            (e["package"], " ".join(e["why"].split()))
            for e in (cat.get("resolution") or {}).get("sdists", [])
        ),
        cuda_archs=tuple(cuda_archs(cat, data)) if any(p.build for p in packages) else (),
        platform=target_platform(cat, data),
        routes=tuple(
            (r["package"], " ".join(r["choice"].split()), " ".join(r["why"].split()))
            for r in (cat.get("resolution") or {}).get("routes", [])
        ),
        route_links=tuple((r["package"], r["link"]) for r in (cat.get("resolution") or {}).get("routes", [])),
        ext_max_jobs=_builds(cat, "max_jobs"),
        layer_compression=layer_compression(cat, data),
        builds_against=_builds(cat, "against"),
        builder_os_packages=tuple(_builds(cat, "os_packages")) if any(p.build for p in packages) else (),
    )
