"""Export a tested image as a squashfs for enroot/pyxis or Apptainer, with its version vector
beside it.

The engine (`docker export`) streams the container filesystem into GNU tar (root keeps owners
and modes); the runtime's environment file is written from the image config
(runtimeconfig.py); mksquashfs (Debian's squashfs-tools) packs it with the compression of
data/runtimes.yaml and fixed timestamps, no xattrs, so the same image, runtime and compression
give the same bytes on any machine with the same squashfs-tools.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mtpimage import children, engine, invocation
from mtpimage.assembly.versionvector import VECTOR_PATH
from mtpimage.engine.ocilayout import file_sha256
from mtpimage.errors import EnvironmentProblem, InputError, last_words
from mtpimage.outputs import runtimeconfig
from mtpimage.outputs.runtimes import Runtime, SquashCompression, reproducible_args


@dataclass(frozen=True)
class Exported:
    squashfs: Path
    vector: Path
    runtime: Runtime
    compression: SquashCompression
    sha256: str
    size: int


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise EnvironmentProblem(f"{tool} not found (fix: apt-get install squashfs-tools tar)")
    return path


def unpack(image: str, eng: engine.ContainerEngine, root: Path) -> None:
    """The filesystem of a container of `image` into the empty directory `root`."""
    tar = _need("tar")
    container = eng.create(image, ["true"])
    try:
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
            raise EnvironmentProblem(f"unpacking {image} failed: {last_words(err, 300)}")
    finally:
        eng.remove(container)


def _place(root: Path, f: runtimeconfig.RootfsFile) -> None:
    """Write `f` under `root`, never through a link: the image's own /etc/environment may be
    a symlink, and an absolute one would point at this machine's file."""
    target = root / f.path
    parent = Path(os.path.realpath(target.parent))
    if not parent.is_relative_to(os.path.realpath(root)):
        raise InputError(
            "--image",
            None,
            f"/{f.path}'s folder links outside the image",
            "export an image built by this tool",
        )
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / target.name
    if path.is_dir() and not path.is_symlink():
        raise InputError(
            "--image", None, f"/{f.path} is a folder in the image", "export an image built by this tool"
        )
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, f.mode)
    with os.fdopen(fd, "w") as out:
        out.write(f.text)
    os.chmod(path, f.mode)  # the umask may have taken bits


def squash(root: Path, out: Path, comp: SquashCompression, processors: int | None = None) -> None:
    """mksquashfs `root` into `out` (replaced) with `comp` and the reproducible settings."""
    cmd = [
        _need("mksquashfs"),
        str(root),
        str(out),
        *reproducible_args(),
        *comp.args,
        "-quiet",
        "-no-progress",
    ]
    if processors:
        cmd += ["-processors", str(processors)]
    out.unlink(missing_ok=True)
    proc = children.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        err = last_words(proc.stderr, 300)
        fix = ""
        if "not supported" in err.lower() or "unrecognised" in err.lower():
            fix = f" (fix: a squashfs-tools built with {comp.name} (4.4 or later for zstd), or --squash-compression gzip)"
        raise EnvironmentProblem(f"mksquashfs failed: {err}{fix}")


def export_squashfs(
    image: str, out: Path, eng: engine.ContainerEngine, rt: Runtime, comp: SquashCompression
) -> Exported:
    """Write OUT (squashfs for `rt`, compressed with `comp`) and OUT.version.json from
    `image` in the engine `eng`."""
    _need("mksquashfs")
    if eng.image_id(image) is None:
        raise InputError(
            "--image",
            image,
            "image not found locally",
            f"build it first: {invocation.command()} --profile NAME",
        )
    config = eng.rootfs(image)
    if config is None:
        raise EnvironmentProblem(
            f"the {eng.name} engine cannot read {image}'s config (fix: use --engine docker)"
        )
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    vector_out = out.with_name(out.name + ".version.json")
    with tempfile.TemporaryDirectory(prefix="mtp-export-") as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir()
        unpack(image, eng, root)
        vector = root / VECTOR_PATH.lstrip("/")
        if not vector.is_file():
            raise InputError(
                "--image",
                image,
                f"{VECTOR_PATH} missing: not an image this tool built",
                f"export an image built by {invocation.command()}",
            )
        for f in runtimeconfig.files_for(rt.name, config[1]):
            _place(root, f)
        partial = out.with_name(out.name + ".partial")
        squash(root, partial, comp)
        shutil.copyfile(vector, vector_out)
        partial.replace(out)  # never a half-written squashfs under the final name
    return Exported(out, vector_out, rt, comp, file_sha256(out), out.stat().st_size)
