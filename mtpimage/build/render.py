"""Render: Plan -> Dockerfile + build context (jinja2 templates under images/).

Pure: no network, no clock, no host paths in the output. The same Plan renders the same
bytes, and the context is packed as a normalised tar (sorted names, mtime 0, uid/gid 0,
fixed modes), so its sha256 is stable. Sources of git components and patch bytes are not
rendered: they are pinned in the Plan (commit; patch commits or file, and sha256) and added
by buildctx.py at build time (src/<name>/, patches/<name>/).

The identity tag is `<profile>-<12 hex of sha256(plan digest, rendered context digest)>`.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
from packaging.utils import canonicalize_name as canonical

from mtpimage import __version__
from mtpimage.errors import EnvironmentProblem
from mtpimage.ext import extensions
from mtpimage.locations import IMAGES_DIR
from mtpimage.outputs import driver
from mtpimage.outputs.versionvector import labels, vector_bytes
from mtpimage.plan.model import IMAGE_REPOSITORY, MODE_LAYER, OS_LAYER, LockedRow, Plan

PYPI = "pypi"


class UnpinnedPackage(EnvironmentProblem):
    """A locked row without a sha256 reached the renderer (check refuses it first)."""

    exit_code = 1


def shell_quote(value) -> str:
    return shlex.quote(str(value))


def docker_quote(value) -> str:
    """A Dockerfile double-quoted string (LABEL/ENV): JSON escapes, `$` escaped."""
    text = json.dumps(str(value), ensure_ascii=True)
    return text.replace("$", "\\$")


@functools.lru_cache(maxsize=4)  # one Environment per template folder: its compiled templates are kept
def _env(images: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(images)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )
    env.filters["q"] = shell_quote
    env.filters["dq"] = docker_quote
    return env


@dataclass(frozen=True)
class Rendered:
    plan: Plan
    files: dict  # relative path -> bytes (sorted on output)
    context_digest: str  # sha256 of the normalised tar of `files`
    identity: str  # <profile>-<12 hex>
    # where local patch files are read from at build time (buildctx.py); not part of the output
    manifests_root: Path | None = field(default=None, compare=False)
    # compiled extensions: (name, the builder stage's text) and their wheel-cache entries as the
    # version vector records them (extensions.py)
    builders: tuple[tuple[str, str], ...] = ()
    extensions: tuple[dict, ...] = field(default=(), compare=False)

    @property
    def dockerfile(self) -> str:
        return self.files["Dockerfile"].decode()

    def image(self, repository: str = IMAGE_REPOSITORY) -> str:
        return f"{repository}:{self.identity}"

    def write(self, out: Path) -> list[Path]:
        out = Path(out)
        written = []
        for rel in sorted(self.files):
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.files[rel])
            if rel.endswith((".py", ".sh")):
                path.chmod(0o755)
            written.append(path)
        return written


def _index_url(plan: Plan, name: str) -> str:
    return dict(plan.indexes)[name]


def patch_name(index: int, patch) -> str:
    """A patch's file name in the build context: its position first, so two patches of one
    component with the same basename (from different folders) never overwrite each other,
    and the names sort in the order the patches are applied."""
    return f"{index:03d}-{patch.name}"


def _patch_mounts(c) -> list[dict]:
    return [
        {"path": f"/tmp/mtp-patches/{c.name}/{patch_name(i, p)}", "strip": p.strip}
        for i, p in enumerate(c.patches)
    ]


def _own_packages(plan: Plan, items: tuple[str, ...]) -> set[str]:
    """The distributions that ARE the layer's components (sglang's own wheel, not its
    dependencies): they change with a pin or patch bump and so go in the top part."""
    return {canonical(c.package) for c in (plan.component(i) for i in items) if c is not None}


def _wheel_steps(plan: Plan, name: str, mine: list[LockedRow]) -> list[dict]:
    """Locked rows by exact file hash (`--no-deps --require-hashes --only-binary`), sdists
    built from their hashed sdist, and rows locked without a hash by exact version."""
    steps: list[dict] = []
    sdists = {n for n, _ in plan.sdists}
    # compiled by the tool: installed from their cached wheels by sha256 (the extensions layer)
    mine = [r for r in mine if not extensions.is_built(plan, r.name)]
    for index in sorted({r.index for r in mine}):
        rows = [r for r in mine if r.index == index]
        hashed = [r for r in rows if r.sha256 and r.name not in sdists]
        if hashed:
            steps.append(
                {
                    "kind": "locked",
                    "name": f"{name}-{index}",
                    "index_url": _index_url(plan, index),
                    "file": f"{name}-{index}.txt",
                    "patches": [],
                    "text": "".join(f"{r.hashed_requirement}\n" for r in hashed),
                }
            )
        built = [r for r in rows if r.sha256 and r.name in sdists]
        if built:
            steps.append(
                {
                    "kind": "sdist",
                    "name": f"{name}-{index}-sdist",
                    "index_url": _index_url(plan, index),
                    "file": f"{name}-{index}-sdist.txt",
                    "packages": [r.name for r in built],
                    "patches": [],
                    "text": "".join(f"{r.hashed_requirement}\n" for r in built),
                }
            )
        # The Dockerfile never installs by version alone: lock and check refuse such a row
        # (rule hash-pinned); a plan that still has one is a defect, not an input.
        unhashed = [r.name for r in rows if not r.sha256]
        if unhashed:
            raise UnpinnedPackage(
                f"{', '.join(unhashed)} from index {index} would install without a sha256 "
                "(fix: `python build.py lock` where the index answers, or build it from a pinned source)"
            )
    return steps


def _locked_dependency_steps(plan: Plan, layer_name: str, items: tuple[str, ...]) -> list[dict]:
    """The bottom part of a locked layer: its share of the resolved set, less the layer's own
    components. Heavy (torch, sglang's kernels) and stable across pin and patch bumps."""
    own = _own_packages(plan, items)
    return _wheel_steps(
        plan, layer_name, [r for r in plan.locked if r.layer == layer_name and canonical(r.name) not in own]
    )


def _locked_steps(plan: Plan, layer_name: str, items: tuple[str, ...]) -> list[dict]:
    """The top part of a locked layer: its components themselves. A PyPI component's own
    wheel by hash; git sources built from their commits with their locked build backends;
    then patches and records. Nothing is resolved here."""
    own = _own_packages(plan, items)
    steps = _wheel_steps(
        plan,
        f"{layer_name}-self",
        [r for r in plan.locked if r.layer == layer_name and canonical(r.name) in own],
    )
    for item in items:
        c = plan.component(item)
        if c is None:
            continue
        patches = _patch_mounts(c)
        if c.source == "git":
            sub = "" if c.subdir in (".", "") else f"/{c.subdir}"
            breq = [r for r in plan.locked if r.builds == c.name]
            steps.append(
                {
                    "kind": "git-locked",
                    "name": c.name,
                    "package": c.package,
                    "index_url": _index_url(plan, c.index),
                    "src": f"/tmp/mtp-src/{c.name}{sub}",
                    "build_file": f"build-{c.name}.txt" if breq else None,
                    "build_text": "".join(f"{r.hashed_requirement}\n" for r in breq),
                    "patches": patches,
                }
            )
        else:
            steps.append({"kind": "pypi-locked", "name": c.name, "package": c.package, "patches": patches})
    return steps


def _allowed_conflicts(plan: Plan) -> bytes:
    """What `pip check` may report in the image: declarations that lock.yaml's overrides and
    excludes replace, and the declared dependencies of sources installed without them."""
    from packaging.requirements import Requirement

    required = sorted(
        {Requirement(r).name.lower() for r, _w, _l in plan.overrides}
        | {n.lower() for n, _w, _l in plan.excludes}
    )
    dependents = sorted(c.package.lower() for c in plan.components if not c.deps_declared)
    return (
        json.dumps({"required": required, "dependents": dependents}, indent=2, sort_keys=True) + "\n"
    ).encode()


def _filled(steps: list[dict]) -> list[dict]:
    return [{"file": None, "build_file": None, "patches": [], **step} for step in steps]


def _install_layers(plan: Plan) -> list[dict]:
    """The install layers between the python layer and the mode layer. Locked plans put every
    layer's dependencies first, in catalogue order (gigabytes that change only when the lock
    moves), then the components themselves (megabytes that change with each pin or patch
    bump): a verl bump rebuilds verl's own layer and the mode layer, not sglang's kernels."""
    layers = [layer for layer in plan.layers if layer.name not in (OS_LAYER, MODE_LAYER)]
    if not plan.locked:
        return [
            {
                "name": layer.name,
                "members": list(layer.items),
                "steps": _layer_steps(plan, layer.name, layer.items),
                "env": _layer_env(plan, layer.items),
            }
            for layer in layers
        ]
    out = []
    built = extensions.built(plan)
    for layer in layers:
        steps = _filled(_locked_dependency_steps(plan, layer.name, layer.items))
        if steps:
            out.append(
                {
                    "name": f"{layer.name}-deps",
                    "steps": steps,
                    "members": [f"from PyPI for {', '.join(layer.items) or layer.name}"],
                }
            )
        mine = [p.name for p in built if p.layer == layer.name]
        if mine:
            # right above their own dependencies, below everything a pin bump touches: a
            # Megatron-LM, bridge, sglang or verl bump rebuilds none of them
            out.append(
                {
                    "name": layer.name,
                    "members": [f"compiled: {', '.join(mine)}"],
                    "steps": _filled([{"kind": "ext-wheels", "name": layer.name}]),
                }
            )
    for layer in layers:
        steps = _filled(_locked_steps(plan, layer.name, layer.items))
        if steps and any(plan.component(i) is not None for i in layer.items):
            out.append(
                {
                    "name": layer.name,
                    "members": list(layer.items),
                    "steps": steps,
                    "env": _layer_env(plan, layer.items),
                }
            )
    return out


def _layer_env(plan: Plan, items: tuple[str, ...]) -> list[dict]:
    """The `runtime_env` of the layer's components: an ENV right after the layer that installs
    them, so it changes with that component's pins and never with a profile."""
    out = []
    for item in items:
        c = plan.component(item)
        if c is not None and c.runtime_env:
            out.append({"component": c.name, "vars": list(c.runtime_env), "why": c.runtime_env_why})
    return out


def _layer_steps(plan: Plan, layer_name: str, items: tuple[str, ...]) -> list[dict]:
    steps: list[dict] = []
    pkgs = [plan.package(i) for i in items if plan.package(i) is not None]
    built = [p.name for p in pkgs if p.build is not None]
    pkgs = [p for p in pkgs if p.build is None]
    by_index: dict[str, list[str]] = {}
    for p in pkgs:
        by_index.setdefault(p.index, []).append(p.requirement)
    for index in sorted(by_index):
        steps.append(
            {
                "kind": "packages",
                "name": f"{layer_name}-{index}",
                "index_url": _index_url(plan, index),
                "extra_index_url": _index_url(plan, PYPI)
                if index != PYPI and PYPI in dict(plan.indexes)
                else None,
                "requirements": by_index[index],
                "patches": [],
            }
        )
    if built:
        steps.append({"kind": "ext-wheels", "name": layer_name, "patches": []})
    for item in items:
        c = plan.component(item)
        if c is None:
            continue
        patches = _patch_mounts(c)
        extras = f"[{','.join(c.extras)}]" if c.extras else ""
        if c.source == "git":
            sub = "" if c.subdir in (".", "") else f"/{c.subdir}"
            steps.append(
                {
                    "kind": "git",
                    "name": c.name,
                    "package": c.package,
                    "index_url": _index_url(plan, c.index),
                    "build_requires": list(c.build_requires),
                    "target": f"/tmp/mtp-src/{c.name}{sub}{extras}",
                    "patches": patches,
                }
            )
        else:
            steps.append(
                {
                    "kind": "pypi",
                    "name": c.name,
                    "package": c.package,
                    "index_url": _index_url(plan, c.index),
                    "extra_index_url": _index_url(plan, PYPI)
                    if c.index != PYPI and PYPI in dict(plan.indexes)
                    else None,
                    "requirement": f"{c.package}{extras}=={c.version}",
                    "patches": patches,
                }
            )
    return steps


def _constraints(plan: Plan) -> dict[str, bytes]:
    """build/constraints/<layer>.txt: the pins of that layer and every layer below it, so a
    later install cannot silently move an earlier pin, and a pin change above a layer does
    not change the layer's inputs (its cache stays valid)."""
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
        lines = sorted(pins)
        if plan.locked and any(plan.component(i) is not None for i in layer.items):
            # Source layers resolve dependencies at build time: hold them to lock.yaml's
            # versions. Package-only layers (torch, extensions) keep their cache when a
            # transitive pin above them moves.
            text += "# plus every transitive dependency version from manifests/lock.yaml\n"
            lines += [x for x in plan.locked if x not in pins]
        out[f"build/constraints/{layer.name}.txt"] = (text + "".join(f"{x}\n" for x in lines)).encode()
    return out


def _tree(src: Path, prefix: str) -> dict[str, bytes]:
    files = {}
    for path in sorted(src.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc"):
            files[f"{prefix}/{path.relative_to(src).as_posix()}"] = path.read_bytes()
    return files


PYTHON_LAYER = "python"  # builders start right after the venv when nothing is built against


def _against_layer(plan: Plan, install_layers: list[dict]) -> str | None:
    """The install layer that installs builds.against (torch): builder stages start right
    after it. The python layer when the plan has no such package; None when it has one
    that is not locked (nothing to build against by hash)."""
    want = canonical(plan.builds_against)
    for layer in install_layers:
        for step in layer["steps"]:
            lines = step.get("text", "").splitlines() + list(step.get("requirements") or [])
            if any(canonical(line.split("==")[0]) == want for line in lines):
                return layer["name"]
    if any(canonical(p.name) == want for p in plan.packages):
        return None
    return PYTHON_LAYER


def _builders(plan: Plan, images: Path, install_layers: list[dict]) -> tuple[list[dict], str | None]:
    """One builder stage per compiled extension, each rendered on its own: its text is part
    of the wheel's key (extensions.key_inputs)."""
    pkgs = extensions.built(plan)
    if not pkgs:
        return [], None
    after = _against_layer(plan, install_layers)
    if after is None:
        raise UnpinnedPackage(
            f"{', '.join(p.name for p in pkgs)}: compiled extensions need a locked "
            f"{plan.builds_against} to build against (fix: `python build.py lock`)"
        )
    template = _env(images).get_template("partials/ext_build.j2")
    # what the stage runs is part of how the wheel is made: its key covers the helper too
    helper = hashlib.sha256((images / "lib" / extensions.BUILD_HELPER).read_bytes()).hexdigest()
    out = []
    for pkg in pkgs:
        spec = extensions.builder_spec(plan, pkg, _index_url(plan, PYPI))
        spec["text"] = template.render(b=spec).rstrip("\n") + "\n"
        steps = extensions.recipe_lines(spec["text"])
        spec["recipe"] = f"{steps}# {extensions.BUILD_HELPER} sha256 {helper}\n"
        out.append(spec)
    return out, after


def render(plan: Plan, manifests_root: Path, images: Path | None = None) -> Rendered:
    images = Path(images or IMAGES_DIR)
    install_layers = _install_layers(plan)
    builders, builders_after = _builders(plan, images, install_layers)
    recipes = {b["name"]: b["recipe"] for b in builders}
    ext_entries = extensions.vector_entries(plan, recipes)
    template = _env(images).get_template("Dockerfile.j2")
    dockerfile = template.render(
        plan=plan,
        builder_version=__version__,
        os_packages=list(plan.os_packages),
        install_layers=install_layers,
        labels=labels(plan, IMAGE_REPOSITORY),
        builders=builders,
        builders_after=builders_after,
        stack_stage=extensions.STACK_STAGE,
    )
    files: dict[str, bytes] = {"Dockerfile": dockerfile.encode()}
    for b in builders:
        files[f"build/requirements/{b['build_file']}"] = b["build_text"].encode()
    files.update(_tree(images / "lib", "build/lib"))
    if plan.locked:
        for layer in install_layers:
            for step in layer["steps"]:
                if step.get("file"):
                    files[f"build/requirements/{step['file']}"] = step["text"].encode()
                if step.get("build_file"):
                    files[f"build/requirements/{step['build_file']}"] = step["build_text"].encode()
        files["build/allowed-conflicts.json"] = _allowed_conflicts(plan)
    else:
        files.update(_constraints(plan))
    files["mtp/version.json"] = vector_bytes(plan, ext_entries)
    files.update(_tree(images / "checks", "mtp/checks"))
    # the entrypoint and the driver check, with what this CUDA line needs of the driver
    files.update(_tree(images / "runtime", "mtp/runtime"))
    files[driver.FACTS_FILE] = driver.facts_text(driver.need(plan.cuda)).encode()
    for target, lines in plan.verl_overrides:
        files[f"mtp/verl/{target}.overrides"] = "".join(f"{line}\n" for line in lines).encode()
    files = dict(sorted(files.items()))
    digest = hashlib.sha256(deterministic_tar(files)).hexdigest()
    identity = f"{plan.profile}-{hashlib.sha256(f'{plan.digest}:{digest}'.encode()).hexdigest()[:12]}"
    return Rendered(
        plan,
        files,
        digest,
        identity,
        Path(manifests_root).resolve(),
        builders=tuple((b["name"], b["recipe"]) for b in builders),
        extensions=tuple(ext_entries),
    )


def image_of(plan: Plan, manifests_root: Path) -> str:
    """THE image identity, `mtp-verl:<profile>-<12 hex>` of the plan and its rendered context:
    the one tag a build creates and every command prints (render is pure and takes ~30 ms)."""
    return render(plan, manifests_root).image()


def _mode(name: str) -> int:
    return 0o755 if name.endswith((".py", ".sh")) else 0o644


def deterministic_tar(files: dict[str, bytes], extra: list[tuple[str, bytes, int]] | None = None) -> bytes:
    """A tar of {path: bytes}: sorted, directories listed, mtime 0, root-owned, fixed modes."""
    entries: dict[str, tuple[bytes | None, int]] = {}
    for rel, data in files.items():
        entries[rel] = (data, _mode(rel))
    for rel, data, mode in extra or []:
        entries[rel] = (data, mode)
    dirs = set()
    for rel in entries:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(dirs | set(entries)):
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if name in dirs and name not in entries:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
                continue
            data, mode = entries[name]
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
