"""Export a tested image as an enroot/pyxis squashfs, with its version vector beside it.

The engine (engine.py; `docker export`) streams the container filesystem into GNU tar (root keeps owners and
modes), then mksquashfs (Debian's squashfs-tools) packs it with fixed timestamps so the
same image gives the same bytes.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from mtpimage import children, engine, invocation
from mtpimage.assembly.versionvector import VECTOR_PATH
from mtpimage.errors import EnvironmentProblem, InputError


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise EnvironmentProblem(f"{tool} not found (fix: apt-get install squashfs-tools tar)")
    return path


def export_enroot(image: str, out: Path, eng: engine.ContainerEngine) -> tuple[Path, Path]:
    """Write OUT (squashfs) and OUT.version.json from `image` in the engine `eng`; return both
    paths."""
    mksquashfs, tar = _need("mksquashfs"), _need("tar")
    if eng.image_id(image) is None:
        raise InputError(
            "--image",
            image,
            "image not found locally",
            f"build it first: {invocation.command()} --profile NAME",
        )
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    vector_out = out.with_name(out.name + ".version.json")
    container = eng.create(image, ["true"])
    try:
        with tempfile.TemporaryDirectory(prefix="mtp-export-") as tmp:
            root = Path(tmp) / "rootfs"
            root.mkdir()
            untar = children.spawn(
                [tar, "-x", "-C", str(root), "--numeric-owner"], stdin=subprocess.PIPE, stderr=subprocess.PIPE
            )
            try:
                for chunk in eng.export(container):
                    untar.stdin.write(chunk)
            finally:
                untar.stdin.close()
                err = untar.stderr.read().decode(errors="replace")
                untar.wait()
            if untar.returncode != 0:
                raise EnvironmentProblem(f"unpacking {image} failed: {err.strip()[-300:]}")
            vector = root / VECTOR_PATH.lstrip("/")
            if not vector.is_file():
                raise InputError(
                    "--image",
                    image,
                    f"{VECTOR_PATH} missing: not an image this tool built",
                    f"export an image built by {invocation.command()}",
                )
            partial = out.with_name(out.name + ".partial")
            partial.unlink(missing_ok=True)
            proc = children.run(
                [
                    mksquashfs,
                    str(root),
                    str(partial),
                    "-noappend",
                    "-quiet",
                    "-no-progress",
                    "-mkfs-time",
                    "0",
                    "-all-time",
                    "0",
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                partial.unlink(missing_ok=True)
                raise EnvironmentProblem(f"mksquashfs failed: {proc.stderr.strip()[-300:]}")
            shutil.copyfile(vector, vector_out)
            partial.replace(out)  # never a half-written squashfs under the final name
    finally:
        eng.remove(container)
    return out, vector_out
