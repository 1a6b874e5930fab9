"""The recipe: what the image is made of, in build order, between the Plan and the Dockerfile.

`recipe_of(plan)` reads the Plan once: its install layers (each a list of typed install
steps, steps.py), the compiled extensions' builder stages (with the text and key of each),
and where those stages start. Everything that used to re-derive these from the Plan reads
them here instead: render (the Dockerfile and the build files), the stack cut (stack.py),
the extensions' wheel cache (extbuild.py, sitewheel.py, wheelcheck.py), the SBOM and the
version vector. docs/recipe.md walks a build through these types.

Pure, as render is: no network, no clock, no host paths; the templates are read for the
builder stages' text only (it is part of their wheels' keys).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name as canonical

from mtpimage import invocation
from mtpimage.assembly import steps as st
from mtpimage.assembly.templating import environment
from mtpimage.errors import EnvironmentProblem
from mtpimage.ext import extensions
from mtpimage.ext.extensions import BuilderStage
from mtpimage.locations import IMAGES_DIR
from mtpimage.plan.model import MODE_LAYER, OS_LAYER, Component, LockedRow, Plan

PYPI = "pypi"
PYTHON_LAYER = "python"  # builders start right after the venv when nothing is built against


class UnpinnedPackage(EnvironmentProblem):
    """A locked row without a sha256 reached the renderer (check refuses it first)."""

    exit_code = 1


@dataclass(frozen=True)
class RuntimeEnv:
    """A component's `runtime_env`: an ENV right after the layer that installs it."""

    component: str
    vars: tuple[tuple[str, str], ...]
    why: str


@dataclass(frozen=True)
class InstallLayer:
    """One RUN between the python layer and the mode layer (images/partials/layer.j2)."""

    name: str
    members: tuple[str, ...]  # what the layer's header comment lists
    steps: tuple[st.Step, ...]
    locked: bool  # installs lock.yaml's files by sha256 (else: by version, held by constraints)
    env: tuple[RuntimeEnv, ...] = ()

    def mounts(self) -> list[st.Mount]:
        """Its steps' bind mounts: by kind (Mount.order), each kind in step order."""
        return sorted((m for s in self.steps for m in s.mounts()), key=lambda m: m.order)

    def files(self) -> dict[str, bytes]:
        return {path: data for s in self.steps for path, data in s.files().items()}

    def installs(self) -> set[str]:
        """Canonical names of what its steps install by an exact pin."""
        return {canonical(name) for s in self.steps for name in s.installs()}


@dataclass(frozen=True)
class Recipe:
    plan: Plan
    layers: tuple[InstallLayer, ...]
    builders: tuple[BuilderStage, ...] = ()  # one per compiled extension, in catalogue order
    builders_after: str | None = None  # the install layer (or python) the builders start after

    @property
    def locked(self) -> bool:
        return bool(self.plan.locked)

    def image_rows(self) -> tuple[LockedRow, ...]:
        """The locked rows the image itself installs (a builder's backends are not in it)."""
        return tuple(r for r in self.plan.locked if not r.is_build_backend)

    @property
    def compiled(self) -> tuple:
        """The packages the tool compiles (their builder stages'), in catalogue order."""
        return tuple(b.package for b in self.builders)

    def builder(self, name: str) -> BuilderStage:
        return next(b for b in self.builders if b.name == name)

    @property
    def extensions(self) -> tuple[dict, ...]:
        """The version vector's record of each compiled extension (its source pin and key)."""
        return tuple(b.entry for b in self.builders)

    def added_sources(self) -> list[list]:
        """What buildctx.py adds to the context at build time besides the rendered files: each
        component's pin and its patches' sha256, by component name."""
        return [
            [c.name, c.source, c.commit, [p.sha256 for p in c.patches]]
            for c in sorted(self.plan.components, key=lambda c: c.name)
        ]

    def files(self) -> dict[str, bytes]:
        """The build files the RUNs bind: requirement files of the steps and of the builders,
        and the allowed `pip check` conflicts (a locked plan) or the constraints (unlocked)."""
        out = {f"build/requirements/{b.build_file}": b.build_text.encode() for b in self.builders}
        if self.locked:
            for layer in self.layers:
                out.update(layer.files())
            out["build/allowed-conflicts.json"] = _allowed_conflicts(self.plan)
        else:
            out.update(_constraints(self.plan))
        return out


# ----------------------------------------------------------------------------- building it
def recipe_of(plan: Plan, images: Path | None = None) -> Recipe:
    images = Path(images or IMAGES_DIR)
    layers = tuple(_install_layers(plan))
    builders, after = _builders(plan, images, layers)
    return Recipe(plan, layers, builders, after)


def _index_url(plan: Plan, name: str) -> str:
    return dict(plan.indexes)[name]


def _extra_index_url(plan: Plan, index: str) -> str | None:
    return _index_url(plan, PYPI) if index != PYPI and PYPI in dict(plan.indexes) else None


def _own_packages(plan: Plan, items: tuple[str, ...]) -> set[str]:
    """The distributions that ARE the layer's components (sglang's own wheel, not its
    dependencies): they change with a pin or patch bump and so go in the top part."""
    return {canonical(c.package) for c in (plan.component(i) for i in items) if c is not None}


def _wheel_steps(plan: Plan, name: str, mine: list[LockedRow]) -> list[st.Step]:
    """Locked rows by exact file hash (`--no-deps --require-hashes --only-binary`), and
    sdists built from their hashed sdist; a row locked without a hash is refused."""
    out: list[st.Step] = []
    sdists = {n for n, _ in plan.sdists}
    # compiled by the tool: installed from their cached wheels by sha256 (the extensions layer)
    mine = [r for r in mine if not extensions.is_built(plan, r.name)]
    for index in sorted({r.index for r in mine}):
        rows = [r for r in mine if r.index == index]
        hashed = tuple(r for r in rows if r.sha256 and r.name not in sdists)
        if hashed:
            out.append(st.LockedWheels(f"{name}-{index}", _index_url(plan, index), hashed))
        built = tuple(r for r in rows if r.sha256 and r.name in sdists)
        if built:
            out.append(st.LockedSdists(f"{name}-{index}-sdist", _index_url(plan, index), built))
        # The Dockerfile never installs by version alone: lock and check refuse such a row
        # (rule hash-pinned); a plan that still has one is a defect, not an input.
        unhashed = [r.name for r in rows if not r.sha256]
        if unhashed:
            raise UnpinnedPackage(
                f"{', '.join(unhashed)} from index {index} would install without a sha256 "
                f"(fix: `{invocation.command()} lock` where the index answers, or build it from a pinned "
                "source)"
            )
    return out


def _layer_rows(plan: Plan, layer_name: str, items: tuple[str, ...], own: bool) -> list[LockedRow]:
    mine = _own_packages(plan, items)
    return [r for r in plan.locked if r.layer == layer_name and (canonical(r.name) in mine) == own]


def _locked_dependency_steps(plan: Plan, layer_name: str, items: tuple[str, ...]) -> list[st.Step]:
    """The bottom part of a locked layer: its share of the resolved set, less the layer's own
    components. Heavy (torch, sglang's kernels) and stable across pin and patch bumps."""
    return _wheel_steps(plan, layer_name, _layer_rows(plan, layer_name, items, own=False))


def _subdir(c: Component) -> str:
    return "" if c.subdir in (".", "") else f"/{c.subdir}"


def _locked_steps(plan: Plan, layer_name: str, items: tuple[str, ...]) -> list[st.Step]:
    """The top part of a locked layer: its components themselves. A PyPI component's own
    wheel by hash; git sources built from their commits with their locked build backends;
    then patches and records. Nothing is resolved here."""
    out = _wheel_steps(plan, f"{layer_name}-self", _layer_rows(plan, layer_name, items, own=True))
    for item in items:
        c = plan.component(item)
        if c is None:
            continue
        patches = st.patch_files(c.name, c.patches)
        if c.source == "git":
            out.append(
                st.LockedGitSource(
                    c.name,
                    package=c.package,
                    index_url=_index_url(plan, c.index),
                    src=f"{st.SOURCES}/{c.name}{_subdir(c)}",
                    build_rows=tuple(r for r in plan.locked if r.builds == c.name),
                    patches=patches,
                )
            )
        else:
            out.append(st.LockedPypiComponent(c.name, package=c.package, patches=patches))
    return out


def _unlocked_steps(plan: Plan, layer_name: str, items: tuple[str, ...]) -> list[st.Step]:
    """A plan without a lock: packages by exact version from each index, the compiled
    extensions' wheels, then each component (shown by render; `--frozen` refuses to build it)."""
    out: list[st.Step] = []
    pkgs = [plan.package(i) for i in items if plan.package(i) is not None]
    by_index: dict[str, list[str]] = {}
    for p in pkgs:
        if p.build is None:
            by_index.setdefault(p.index, []).append(p.requirement)
    for index in sorted(by_index):
        out.append(
            st.Packages(
                f"{layer_name}-{index}",
                layer=layer_name,
                index_url=_index_url(plan, index),
                extra_index_url=_extra_index_url(plan, index),
                requirements=tuple(by_index[index]),
            )
        )
    if any(p.build is not None for p in pkgs):
        out.append(st.ExtensionWheels(layer_name))
    for item in items:
        c = plan.component(item)
        if c is None:
            continue
        patches = st.patch_files(c.name, c.patches)
        extras = f"[{','.join(c.extras)}]" if c.extras else ""
        if c.source == "git":
            out.append(
                st.GitSource(
                    c.name,
                    layer=layer_name,
                    package=c.package,
                    index_url=_index_url(plan, c.index),
                    build_requires=c.build_requires,
                    target=f"{st.SOURCES}/{c.name}{_subdir(c)}{extras}",
                    patches=patches,
                )
            )
        else:
            out.append(
                st.PypiComponent(
                    c.name,
                    layer=layer_name,
                    package=c.package,
                    index_url=_index_url(plan, c.index),
                    extra_index_url=_extra_index_url(plan, c.index),
                    requirement=f"{c.package}{extras}=={c.version}",
                    patches=patches,
                )
            )
    return out


def _layer_env(plan: Plan, items: tuple[str, ...]) -> tuple[RuntimeEnv, ...]:
    """The `runtime_env` of the layer's components: an ENV right after the layer that installs
    them, so it changes with that component's pins and never with a profile."""
    comps = [plan.component(i) for i in items]
    return tuple(
        RuntimeEnv(c.name, c.runtime_env, c.runtime_env_why) for c in comps if c is not None and c.runtime_env
    )


def _install_layers(plan: Plan) -> list[InstallLayer]:
    """The install layers between the python layer and the mode layer. Locked plans put every
    layer's dependencies first, in catalogue order (gigabytes that change only when the lock
    moves), then the components themselves (megabytes that change with each pin or patch
    bump): a verl bump rebuilds verl's own layer and the mode layer, not sglang's kernels."""
    layers = [layer for layer in plan.layers if layer.name not in (OS_LAYER, MODE_LAYER)]
    if not plan.locked:
        return [
            InstallLayer(
                layer.name,
                layer.items,
                tuple(_unlocked_steps(plan, layer.name, layer.items)),
                locked=False,
                env=_layer_env(plan, layer.items),
            )
            for layer in layers
        ]
    out = []
    built = extensions.built(plan)
    for layer in layers:
        deps = _locked_dependency_steps(plan, layer.name, layer.items)
        if deps:
            members = (f"from PyPI for {', '.join(layer.items) or layer.name}",)
            out.append(InstallLayer(f"{layer.name}-deps", members, tuple(deps), locked=True))
        mine = [p.name for p in built if p.layer == layer.name]
        if mine:
            # right above their own dependencies, below everything a pin bump touches: a
            # Megatron-LM, bridge, sglang or verl bump rebuilds none of them
            members = (f"compiled: {', '.join(mine)}",)
            out.append(InstallLayer(layer.name, members, (st.ExtensionWheels(layer.name),), locked=True))
    for layer in layers:
        own = _locked_steps(plan, layer.name, layer.items)
        if own and any(plan.component(i) is not None for i in layer.items):
            env = _layer_env(plan, layer.items)
            out.append(InstallLayer(layer.name, layer.items, tuple(own), locked=True, env=env))
    return out


def _against_layer(plan: Plan, layers: tuple[InstallLayer, ...]) -> str | None:
    """The install layer that installs builds.against (torch): builder stages start right
    after it. The python layer when the plan has no such package; None when it has one
    that is not locked (nothing to build against by hash)."""
    want = canonical(plan.builds_against)
    for layer in layers:
        if want in layer.installs():
            return layer.name
    if any(canonical(p.name) == want for p in plan.packages):
        return None
    return PYTHON_LAYER


def _builders(plan: Plan, images: Path, layers: tuple[InstallLayer, ...]) -> tuple[tuple, str | None]:
    """One builder stage per compiled extension, each rendered on its own: its text is part
    of the wheel's key (extensions.key_inputs)."""
    pkgs = extensions.built(plan)
    if not pkgs:
        return (), None
    after = _against_layer(plan, layers)
    if after is None:
        raise UnpinnedPackage(
            f"{', '.join(p.name for p in pkgs)}: compiled extensions need a locked "
            f"{plan.builds_against} to build against (fix: `{invocation.command()} lock`)"
        )
    template = environment(images).get_template("partials/ext_build.j2")
    # what the stage runs is part of how the wheel is made: its key covers the helper too
    helper = hashlib.sha256((images / "lib" / extensions.BUILD_HELPER).read_bytes()).hexdigest()
    out = []
    for pkg in pkgs:
        stage = extensions.builder_stage(plan, pkg, _index_url(plan, PYPI))
        text = template.render(b=stage).rstrip("\n") + "\n"
        recipe = f"{extensions.recipe_lines(text)}# {extensions.BUILD_HELPER} sha256 {helper}\n"
        out.append(extensions.rendered(plan, stage, text, recipe))
    return tuple(out), after


# ----------------------------------------------------------------------------- build files
def _allowed_conflicts(plan: Plan) -> bytes:
    """What `pip check` may report in the image: declarations that lock.yaml's overrides and
    excludes replace, and the declared dependencies of sources installed without them."""
    from packaging.requirements import Requirement

    required = sorted(
        {Requirement(r).name.lower() for r, _w, _l in plan.resolution_overrides}
        | {n.lower() for n, _w, _l in plan.excludes}
    )
    dependents = sorted(c.package.lower() for c in plan.components if not c.deps_declared)
    return (
        json.dumps({"required": required, "dependents": dependents}, indent=2, sort_keys=True) + "\n"
    ).encode()


def _constraints(plan: Plan) -> dict[str, bytes]:
    """build/constraints/<layer>.txt of a plan without a lock: the pins of that layer and
    every layer below it, so a later install cannot silently move an earlier pin, and a pin
    change above a layer does not change the layer's inputs (its cache stays valid)."""
    out: dict[str, bytes] = {}
    pins: list[str] = []
    for layer in plan.layers:
        if layer.name in (OS_LAYER, MODE_LAYER):
            continue
        for item in layer.items:
            p = plan.package(item)
            if p is not None:
                pins.append(f"{p.name}=={p.version}")
            c = plan.component(item)
            if c is not None and c.source == "pypi":
                pins.append(f"{c.package}=={c.version}")
        text = "# pins of this layer and the layers below it (rendered; do not edit)\n"
        out[f"build/constraints/{layer.name}.txt"] = (text + "".join(f"{x}\n" for x in sorted(pins))).encode()
    return out
