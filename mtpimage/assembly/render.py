"""Render: Plan -> recipe (recipe.py) -> Dockerfile + build context (jinja2 templates under images/).

Pure: no network, no clock, no host paths in the output. The same Plan renders the same
bytes, and the context is packed as a normalised tar (sorted names, mtime 0, uid/gid 0,
fixed modes), so its sha256 is stable. Sources of git components and patch bytes are not
rendered: they are pinned in the Plan (commit; patch commits or file, and sha256) and added
by buildctx.py at build time (src/<name>/, patches/<name>/).

The identity tag is `<profile>-<12 hex of sha256(plan digest, rendered context digest)>`.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from mtpimage import __version__
from mtpimage.assembly import driver
from mtpimage.assembly.recipe import Recipe, recipe_of
from mtpimage.assembly.templating import environment
from mtpimage.assembly.versionvector import labels, vector_bytes
from mtpimage.ext import extensions
from mtpimage.locations import IMAGES_DIR
from mtpimage.plan.model import IMAGE_REPOSITORY, Plan
from mtpimage.settings import local_image


@dataclass(frozen=True)
class Rendered:
    # what the files were rendered from: the Plan, install layers of typed steps, builder stages
    # (recipe.py); the one home of the plan a build, the stack key and the SBOM read
    recipe: Recipe
    files: dict  # relative path -> bytes (sorted on output)
    context_digest: str  # sha256 of the normalised tar of `files`
    identity: str  # <profile>-<12 hex>
    # where local patch files are read from at build time (buildctx.py); not part of the output
    manifests_root: Path | None = field(default=None, compare=False)

    @property
    def plan(self) -> Plan:
        return self.recipe.plan

    @property
    def extensions(self) -> tuple[dict, ...]:
        """The compiled extensions' records as the version vector holds them (with their keys)."""
        return self.recipe.extensions

    @property
    def dockerfile(self) -> str:
        return self.files["Dockerfile"].decode()

    def image(self) -> str:
        """The content tag, mtp-verl:<identity>: the one tag a build creates."""
        return local_image(self.identity)

    def profile_image(self) -> str:
        """The tag users run, mtp-verl:<profile>: moved to the image once its checks passed."""
        return local_image(self.plan.profile_tag)

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


def _tree(src: Path, prefix: str) -> dict[str, bytes]:
    files = {}
    for path in sorted(src.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc"):
            files[f"{prefix}/{path.relative_to(src).as_posix()}"] = path.read_bytes()
    return files


def render(plan: Plan, manifests_root: Path, images: Path | None = None) -> Rendered:
    images = Path(images or IMAGES_DIR)
    recipe = recipe_of(plan, images)
    template = environment(images).get_template("Dockerfile.j2")
    dockerfile = template.render(
        plan=plan,
        builder_version=__version__,
        os_packages=list(plan.os_packages),
        os_remove=[name for name, _why in plan.os_remove],
        install_layers=recipe.layers,
        labels=labels(plan, IMAGE_REPOSITORY),
        builders=recipe.builders,
        builders_after=recipe.builders_after,
        stack_stage=extensions.STACK_STAGE,
    )
    files: dict[str, bytes] = {"Dockerfile": dockerfile.encode()}
    files.update(recipe.files())
    files.update(_tree(images / "lib", "build/lib"))
    files["mtp/version.json"] = vector_bytes(recipe)
    files.update(_tree(images / "checks", "mtp/checks"))
    # the entrypoint and the driver check, with what this CUDA line needs of the driver
    files.update(_tree(images / "runtime", "mtp/runtime"))
    files[driver.FACTS_FILE] = driver.facts_text(
        driver.need(plan.cuda), driver.compiled_archs(recipe.extensions), plan.profile
    ).encode()
    for target, lines in plan.verl_cli_overrides:
        files[f"mtp/verl/{target}.overrides"] = "".join(f"{line}\n" for line in lines).encode()
    files = dict(sorted(files.items()))
    digest = hashlib.sha256(deterministic_tar(files)).hexdigest()
    identity = f"{plan.profile}-{hashlib.sha256(f'{plan.digest}:{digest}'.encode()).hexdigest()[:12]}"
    return Rendered(recipe, files, digest, identity, Path(manifests_root).resolve())


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
