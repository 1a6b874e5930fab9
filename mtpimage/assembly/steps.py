"""Install steps: the building blocks of an install layer's RUN, one class per kind of step.

A step is one thing a layer installs (a layer's share of the locked wheels, the sdists it
builds, a git source at its commit, a component's own wheel, the compiled extensions' wheels,
or, for a plan without a lock, packages and sources by version). Each owns the bind mounts it
needs and the commands it runs, and renders them itself, as hpccm's building blocks do:
images/partials/layer.j2 only frames a layer (its shared mounts, the mounts of its steps, the
steps' commands in order, the final `pip check`). Each class has an exact-string test of its
text (tests/unit/test_steps.py); the whole-Dockerfile goldens check them together.

Every manifest value that reaches a command goes through `q` (shell quoting). Paths built
from names the manifests' schema restricts (a component's name, a layer's name) are written
as they are, as they always were: changing that would change every rendered Dockerfile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from mtpimage.assembly.templating import shell_quote as q
from mtpimage.plan.model import LockedRow, Patch

LIB = "/tmp/mtp-build/lib"  # images/lib/ in the build context, bound here in every layer
REQUIREMENTS = "/tmp/mtp-build/requirements"  # build/requirements/ of the build context
CONSTRAINTS = "/tmp/mtp-build/constraints"  # build/constraints/ (plans without a lock)
SOURCES = "/tmp/mtp-src"  # src/<name>/: a git component's tree (buildctx.py)
PATCHES = "/tmp/mtp-patches"  # patches/<name>/: a component's patches (buildctx.py)
EXT_WHEELS = "/tmp/mtp-ext-wheels"  # build/ext-wheels/: the compiled extensions' wheels
INDENT = "    "  # a command in the RUN; its continuation lines are indented two more


def patch_name(index: int, patch: Patch) -> str:
    """A patch's file name in the build context: its position first, so two patches of one
    component with the same basename (from different folders) never overwrite each other,
    and the names sort in the order the patches are applied."""
    return f"{index:03d}-{patch.name}"


def hashed_lines(rows: tuple[LockedRow, ...]) -> str:
    """A requirements file that pip installs with --require-hashes: one file per row."""
    return "".join(f"{r.hashed_requirement}\n" for r in rows)


# ----------------------------------------------------------------------------- mounts
@dataclass(frozen=True)
class Mount:
    """A bind mount of part of the build context into one RUN. A layer lists its steps'
    mounts by `order` (requirement files, then sources, then wheels, then patches), each
    kind in step order: the order the Dockerfile has always had."""

    source: str
    target: str
    order: int
    rw: bool = False

    REQUIREMENTS: ClassVar[int] = 0
    SOURCE: ClassVar[int] = 1
    WHEELS: ClassVar[int] = 2
    PATCHES: ClassVar[int] = 3

    def render(self) -> str:
        return f"--mount=type=bind,source={self.source},target={self.target}{',rw' if self.rw else ''}"


def requirements_mount(file: str) -> Mount:
    return Mount(f"build/requirements/{file}", f"{REQUIREMENTS}/{file}", Mount.REQUIREMENTS)


@dataclass(frozen=True)
class PatchFile:
    """One patch of a component, where the RUN sees it, and its `patch -p` level."""

    path: str
    strip: int

    def arg(self) -> str:
        return f" --patch {q(self.path)}:{self.strip}"


def patch_files(name: str, patches: tuple[Patch, ...]) -> tuple[PatchFile, ...]:
    return tuple(PatchFile(f"{PATCHES}/{name}/{patch_name(i, p)}", p.strip) for i, p in enumerate(patches))


# ----------------------------------------------------------------------------- steps
@dataclass(frozen=True)
class Step:
    """What every step has: a name (its requirement file's or its component's) and the
    patches applied to what it installs (mounted from patches/<name>/)."""

    name: str
    patches: tuple[PatchFile, ...] = field(default=(), kw_only=True)

    def mounts(self) -> tuple[Mount, ...]:
        own = self._mounts()
        if self.patches:
            own += (Mount(f"patches/{self.name}", f"{PATCHES}/{self.name}", Mount.PATCHES),)
        return own

    def _mounts(self) -> tuple[Mount, ...]:
        return ()

    def files(self) -> dict[str, bytes]:
        """The build context files this step's mounts bind (build/requirements/...)."""
        return {}

    def installs(self) -> tuple[str, ...]:
        """The distributions it installs by an exact pin, as spelled before `==` (where the
        compiled extensions' builders start: after the layer that installs builds.against)."""
        return ()

    def commands(self) -> list[str]:
        """The step's lines of the RUN, without the RUN's indentation."""
        raise NotImplementedError

    def render(self) -> str:
        return "\n".join(INDENT + line for line in self.commands())

    def _patch_args(self) -> str:
        return "".join(p.arg() for p in self.patches)


@dataclass(frozen=True)
class _LockedRequirements(Step):
    """Locked rows from one index, as a hashed requirements file mounted into the step (what
    LockedWheels and LockedSdists share; they differ only in how pip installs the file)."""

    index_url: str
    rows: tuple[LockedRow, ...]

    @property
    def file(self) -> str:
        return f"{self.name}.txt"

    def _mounts(self) -> tuple[Mount, ...]:
        return (requirements_mount(self.file),)

    def files(self) -> dict[str, bytes]:
        return {f"build/requirements/{self.file}": hashed_lines(self.rows).encode()}

    def installs(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rows)


@dataclass(frozen=True)
class LockedWheels(_LockedRequirements):
    """A layer's share of lock.yaml from one index: every wheel by version and sha256, with
    no dependency resolution and no sdist fallback (`--no-deps --require-hashes
    --only-binary`)."""

    def commands(self) -> list[str]:
        return [
            f"pip install --no-deps --require-hashes --only-binary=:all: --index-url {q(self.index_url)} \\",
            f"  -r {REQUIREMENTS}/{q(self.file)}; \\",
        ]


@dataclass(frozen=True)
class LockedSdists(_LockedRequirements):
    """The locked rows lock.yaml's `resolution.sdists` names: built from their sdists, checked
    by sha256, against what the layers below installed (`--no-build-isolation`)."""

    def commands(self) -> list[str]:
        binary = "".join(f" --no-binary {q(r.name)}" for r in self.rows)
        return [
            f"pip install --no-deps --require-hashes --no-build-isolation{binary} \\",
            f"  --index-url {q(self.index_url)} -r {REQUIREMENTS}/{q(self.file)}; \\",
        ]


@dataclass(frozen=True)
class ExtensionWheels(Step):
    """The compiled extensions' wheels (build/ext-wheels/, from the wheel cache), each by
    sha256 and from no index, and what each was built from recorded in the image
    (mtp_extension.py record). Named after its layer."""

    def _mounts(self) -> tuple[Mount, ...]:
        return (Mount("build/ext-wheels", EXT_WHEELS, Mount.WHEELS),)

    def commands(self) -> list[str]:
        return [
            "pip install --no-deps --require-hashes --only-binary=:all: --no-index "
            f"-r {EXT_WHEELS}/requirements.txt; \\",
            f"python {LIB}/mtp_extension.py record --wheels {EXT_WHEELS}; \\",
        ]


@dataclass(frozen=True)
class LockedGitSource(Step):
    """A git component built from its pinned commit (src/<name>/, added by buildctx.py), its
    patches applied first, its build backends from lock.yaml by sha256; then recorded."""

    package: str
    index_url: str
    src: str  # where its project is: the tree, or its subdir
    build_rows: tuple[LockedRow, ...] = ()  # lock.yaml's build_requires of this component

    @property
    def build_file(self) -> str | None:
        return f"build-{self.name}.txt" if self.build_rows else None

    def _mounts(self) -> tuple[Mount, ...]:
        reqs = (requirements_mount(self.build_file),) if self.build_file else ()
        return (*reqs, Mount(f"src/{self.name}", f"{SOURCES}/{self.name}", Mount.SOURCE, rw=True))

    def files(self) -> dict[str, bytes]:
        if not self.build_file:
            return {}
        return {f"build/requirements/{self.build_file}": hashed_lines(self.build_rows).encode()}

    def commands(self) -> list[str]:
        build = f"python {LIB}/mtp_install.py build-source --name {q(self.name)} --src {q(self.src)}"
        lines = [build]
        if self.build_file:
            lines[-1] += " \\"
            lines.append(
                f"  --build-requirements {REQUIREMENTS}/{q(self.build_file)} --index-url {q(self.index_url)}"
            )
        lines[-1] += f"{self._patch_args()}; \\"
        return lines + [
            f"python {LIB}/mtp_install.py record --name {q(self.name)} --package {q(self.package)} \\",
            f"  --source git --src {SOURCES}/{self.name}{self._patch_args()}; \\",
        ]


@dataclass(frozen=True)
class LockedPypiComponent(Step):
    """A component whose own wheel a LockedWheels step installed: its patches applied to the
    installed files, then recorded."""

    package: str

    def commands(self) -> list[str]:
        lines = []
        if self.patches:
            lines.append(
                f"python {LIB}/mtp_install.py patch-installed --name {q(self.name)}{self._patch_args()}; \\"
            )
        return lines + [
            f"python {LIB}/mtp_install.py record --name {q(self.name)} --package {q(self.package)} \\",
            f"  --source pypi{self._patch_args()}; \\",
        ]


# ------------------------------------------------------------- plans without a lock
@dataclass(frozen=True)
class Packages(Step):
    """A plan without a lock (shown, never built --frozen): the layer's packages from one
    index by exact version, held to the layers below by build/constraints/<layer>.txt."""

    layer: str
    index_url: str
    extra_index_url: str | None
    requirements: tuple[str, ...]

    def installs(self) -> tuple[str, ...]:
        return tuple(r.split("==")[0] for r in self.requirements)

    def commands(self) -> list[str]:
        extra = f" --extra-index-url {q(self.extra_index_url)}" if self.extra_index_url else ""
        return [
            f"pip install --constraint {CONSTRAINTS}/{self.layer}.txt \\",
            f"  --index-url {q(self.index_url)}{extra} \\",
            f"  {' '.join(q(r) for r in self.requirements)}; \\",
        ]


@dataclass(frozen=True)
class GitSource(Step):
    """A plan without a lock: a git component patched in its tree, its declared build
    backends installed, then the tree installed against the layer's constraints."""

    layer: str
    package: str
    index_url: str
    build_requires: tuple[str, ...]
    target: str  # the tree (or its subdir) with its extras: what pip installs

    def _mounts(self) -> tuple[Mount, ...]:
        return (Mount(f"src/{self.name}", f"{SOURCES}/{self.name}", Mount.SOURCE, rw=True),)

    def commands(self) -> list[str]:
        lines = [
            f"python {LIB}/mtp_install.py patch-source --name {q(self.name)} \\",
            f"  --dir {SOURCES}/{self.name}{self._patch_args()}; \\",
        ]
        if self.build_requires:
            reqs = " ".join(q(r) for r in self.build_requires)
            lines.append(f"pip install --index-url {q(self.index_url)} {reqs}; \\")
        return lines + [
            f"pip install --no-build-isolation --constraint {CONSTRAINTS}/{self.layer}.txt \\",
            f"  --index-url {q(self.index_url)} {q(self.target)}; \\",
            f"python {LIB}/mtp_install.py record --name {q(self.name)} --package {q(self.package)} \\",
            f"  --source git --src {SOURCES}/{self.name}{self._patch_args()}; \\",
        ]


@dataclass(frozen=True)
class PypiComponent(Step):
    """A plan without a lock: a PyPI component by exact version against the layer's
    constraints, its patches applied to the installed files, then recorded."""

    layer: str
    package: str
    index_url: str
    extra_index_url: str | None
    requirement: str

    def commands(self) -> list[str]:
        extra = f" --extra-index-url {q(self.extra_index_url)}" if self.extra_index_url else ""
        lines = [
            f"pip install --constraint {CONSTRAINTS}/{self.layer}.txt \\",
            f"  --index-url {q(self.index_url)}{extra} \\",
            f"  {q(self.requirement)}; \\",
        ]
        if self.patches:
            lines.append(
                f"python {LIB}/mtp_install.py patch-installed --name {q(self.name)}{self._patch_args()}; \\"
            )
        return lines + [
            f"python {LIB}/mtp_install.py record --name {q(self.name)} --package {q(self.package)} \\",
            f"  --source pypi{self._patch_args()}; \\",
        ]
