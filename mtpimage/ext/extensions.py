"""Compiled extensions: packages the tool builds itself (components.yaml `build`).

TransformerEngine's torch extension, flash-attn and apex are compiled from a pinned source
(an sdist by sha256, or a git commit) in a builder stage of the rendered Dockerfile: the
stack up to the torch layer, so on the same base and against the locked torch, with
--no-build-isolation and hashed build backends. The image gets only the wheels, by sha256.

A wheel is made once per key: the sha256 of every input that changes its bytes (source pin,
the locked torch file, the base image, Python, CUDA, architectures, the package's build
switches, its build backends, and the builder stage's own text). The wheel cache
(wheelcache.py) keeps it on this machine outside BuildKit, so `docker builder prune` does
not make anything compile again, and shares it through a registry. Parallel jobs are not in
the key: they change how long a build takes, not what it makes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import ClassVar

from packaging.utils import canonicalize_name as canonical

from mtpimage.ext.wheelcache import cache_key
from mtpimage.manifests import schema
from mtpimage.mirrors import INDEX_SECRET
from mtpimage.plan.model import COMPONENTS, LockedRow, Package, Plan

KEY_SCHEMA = "mtp-image-builder/extension-key/v1"
STACK_STAGE = "mtp-torch"  # the stack right after the torch layer: where builders start
CONTEXT_SRC = "ext-src"  # build context: ext-src/<name>/ (sdist file or git tree)
CONTEXT_WHEELS = "build/ext-wheels"  # build context: the cached wheels the image installs
BUILD_HELPER = "mtp_extension.py"  # images/lib/: what a builder stage runs
# A builder stage's mount of the site's index mirrors (mirrors.py): it decides where the stage's
# hash-checked build backends are fetched from, never which bytes they are, so it is no part
# of how the wheel is made. Left out of the recipe the key hashes (as comments are), every wheel
# keyed before mirrors existed (cached, shared, pinned in wheels.lock.yaml) keeps its key.
MIRROR_MOUNT = f"--mount=type=secret,id={INDEX_SECRET} \\"


def recipe_lines(text: str) -> str:
    """What of a builder stage's text the key hashes: every line but comments (they say why,
    not what runs: editing them must not recompile for hours) and the mirrors' mount."""
    return "".join(
        ln
        for ln in text.splitlines(keepends=True)
        if not ln.lstrip().startswith("#") and ln.strip() != MIRROR_MOUNT
    )


def built(plan: Plan) -> list[Package]:
    """The plan's packages the tool compiles, in catalogue order."""
    return [p for p in plan.packages if p.build is not None]


def is_built(plan: Plan, name: str) -> bool:
    p = next((p for p in plan.packages if canonical(p.name) == canonical(name)), None)
    return p is not None and p.build is not None


def torch_cuda_arch(arch: str) -> str:
    """`90` -> `9.0`, `100` -> `10.0`, `90a` -> `9.0a`: TORCH_CUDA_ARCH_LIST's spelling."""
    digits = arch.rstrip("af")
    return f"{digits[:-1]}.{digits[-1]}{arch[len(digits) :]}"


def filled_env(plan: Plan, pkg: Package) -> list[str]:
    """The package's build switches as K=V, with the architectures filled in."""
    values = {
        "cuda_archs": ";".join(plan.cuda_archs),
        "torch_cuda_arch_list": ";".join(torch_cuda_arch(a) for a in plan.cuda_archs),
    }
    return [f"{k}={v.format(**values)}" for k, v in pkg.build.env]


def build_stage(name: str) -> str:
    return f"mtp-ext-build-{canonical(name)}"


def wheel_stage(name: str) -> str:
    return f"mtp-ext-wheel-{canonical(name)}"


def build_file(name: str) -> str:
    return f"ext-build-{canonical(name)}.txt"


def origin(pkg: Package) -> str:
    b = pkg.build
    if b.source == "sdist":
        return f"{b.url.rsplit('/', 1)[-1]} (sha256 {b.sha256[:12]}...)"
    return f"{b.repo} @ {b.commit[:12]}"


def source_pin(pkg: Package) -> dict:
    b = pkg.build
    if b.source == "sdist":
        return {"kind": "sdist", "url": b.url, "sha256": b.sha256}
    return {"kind": "git", "repo": b.repo, "ref": b.ref, "commit": b.commit}


def build_rows(plan: Plan, pkg: Package) -> list[LockedRow]:
    """The locked, hashed build backends of one extension (lock.yaml build_requires)."""
    return [r for r in plan.locked if r.builds == pkg.name]


@dataclass(frozen=True)
class BuilderStage:
    """One compiled extension's builder stage (images/partials/ext_build.j2), as the recipe
    holds it: the package, its hashed build backends and build switches; once rendered, the
    stage's text, what of it the wheel's key hashes (`recipe`), the key's inputs and the key."""

    package: Package
    index_url: str
    backends: tuple[LockedRow, ...]  # lock.yaml's build_requires of the package (none: unlocked)
    env: tuple[str, ...]  # its build switches as K=V, the architectures filled in
    archs: tuple[str, ...]
    os_packages: tuple[str, ...]  # builds.os_packages
    text: str = ""
    recipe: str = ""
    key_inputs: dict = field(default_factory=dict, compare=False, hash=False)
    key: str = ""

    from_stage: ClassVar[str] = STACK_STAGE

    @property
    def name(self) -> str:
        return self.package.name

    @property
    def version(self) -> str:
        return self.package.version

    @property
    def origin(self) -> str:
        return origin(self.package)

    @property
    def build_stage(self) -> str:
        return build_stage(self.name)

    @property
    def wheel_stage(self) -> str:
        return wheel_stage(self.name)

    @property
    def build_file(self) -> str:
        return build_file(self.name)

    @property
    def hashed(self) -> bool:
        return bool(self.backends)

    @property
    def build_text(self) -> str:
        """Its build backends' requirements file: by sha256, or (unlocked: a --set run, shown
        but never built --frozen) the declared exact pins."""
        if self.backends:
            return "".join(f"{r.hashed_requirement}\n" for r in self.backends)
        return "".join(f"{r}\n" for r in self.package.build.build_requires)

    @property
    def sha256(self) -> str | None:
        return self.package.build.sha256

    @property
    def produces(self) -> tuple[str, ...]:
        return self.package.build.produces

    @property
    def entry(self) -> dict:
        """The version vector's record of the extension: its source pin and its key (the
        wheel's sha256 is added by the build, in /opt/mtp/installed/<name>.json and the label)."""
        return {
            "name": self.name,
            "version": self.version,
            "source": source_pin(self.package),
            "archs": list(self.archs),
            "env": list(self.env),
            "key": self.key,
        }


def builder_stage(plan: Plan, pkg: Package, index_url: str) -> BuilderStage:
    """The stage of one package, not yet rendered (see rendered())."""
    return BuilderStage(
        package=pkg,
        index_url=index_url,
        backends=tuple(build_rows(plan, pkg)),
        env=tuple(filled_env(plan, pkg)),
        archs=plan.cuda_archs,
        os_packages=plan.builder_os_packages,
    )


def rendered(plan: Plan, stage: BuilderStage, text: str, recipe: str) -> BuilderStage:
    """The stage with its rendered text, its recipe and the wheel's key made from them."""
    inputs = key_inputs(plan, stage.package, recipe)
    return dataclasses.replace(stage, text=text, recipe=recipe, key_inputs=inputs, key=key_of(inputs))


def _against(plan: Plan) -> dict:
    """The pin of what the extensions are built against (builds.against: torch by default), by
    its locked file where the plan is locked."""
    want = canonical(plan.builds_against)
    row = next((r for r in plan.locked if canonical(r.name) == want), None)
    if row is None:
        wanted = (p.version for p in plan.packages if p.name == plan.builds_against)
        return {"version": next(wanted, None)}
    return {"version": row.version, "file": row.file, "sha256": row.sha256}


def key_inputs(plan: Plan, pkg: Package, recipe: str) -> dict:
    """Everything that changes the wheel's bytes. Not MAX_JOBS (how long, not what)."""
    inputs = {
        "schema": KEY_SCHEMA,
        "name": canonical(pkg.name),
        "version": pkg.version,
        "source": source_pin(pkg),
        # named "torch" in every key since the first: renaming it would move every wheel's key
        "torch": _against(plan),
        "cuda": plan.cuda,
        "python": plan.python,
        "base": plan.base_digest or plan.base_image,
        "archs": list(plan.cuda_archs),
        "env": filled_env(plan, pkg),
        "build_requires": [[r.name, r.version, r.sha256] for r in build_rows(plan, pkg)],
        "recipe": hashlib.sha256(recipe.encode()).hexdigest(),
    }
    if plan.platform != schema.default(COMPONENTS, "builds", "platform"):
        # an aarch64 wheel never serves amd64 nor the reverse (issue 49); absent for the lock's
        # platform, so no amd64 key moved
        inputs["platform"] = plan.platform
    return inputs


def key_of(inputs: dict) -> str:
    return cache_key(inputs)


def wheels_listing(entries: list[dict]) -> bytes:
    """build/ext-wheels/extensions.json: what the image's extensions layer installs and
    records (mtp_extension.py record)."""
    return (json.dumps({"extensions": entries}, indent=2, sort_keys=True) + "\n").encode()
