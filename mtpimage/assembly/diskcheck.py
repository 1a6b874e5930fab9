"""`build.py disk`: stop a CI job at its start, with one line, when the runner's disk cannot
hold what the job will write (image store, builder storage and caches), instead of failing
hours later with "no space left on device". Each job's need is data (mtpimage/data/ci.yaml,
measured: docs/ci.md); the workflow passes it as --need-gb.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from mtpimage.engine import SCRATCH_PARENT
from mtpimage.errors import EnvironmentProblem

GB = 1e9
DOCKER_ROOT = Path("/var/lib/docker")  # dockerd's data root on GitHub's runners and Debian's


class NotEnoughDisk(EnvironmentProblem):
    pass


def default_paths(engine_name: str, cache_root: Path) -> list[Path]:
    """Where a job's build writes: dockerd's data root (the image, also when buildah built it:
    it is loaded there for the checks) and the tool's cache (with the reproducible engine, its
    kept layout and compressed layers); the reproducible engine's clean builders also write under
    their fixed scratch (buildahengine.SCRATCH_PARENT), on another filesystem on some hosts."""
    paths = [DOCKER_ROOT, cache_root]
    if engine_name == "buildah":
        paths.append(SCRATCH_PARENT)
    return paths


def existing(path: Path) -> Path:
    """`path`, or its nearest existing parent (a data root not made yet lives there)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_by_filesystem(paths: list[Path]) -> list[tuple[list[Path], int]]:
    """([the paths on it], free bytes) per filesystem, in the order first named."""
    seen: dict[int, tuple[list[Path], int]] = {}
    for p in paths:
        at = existing(p)
        dev = os.stat(at).st_dev
        if dev not in seen:
            seen[dev] = ([], shutil.disk_usage(at).free)
        seen[dev][0].append(Path(p))
    return list(seen.values())


def check(need_gb: float, paths: list[Path], job: str, say: Callable[[str], None] = print) -> None:
    """Every filesystem holding one of `paths` must have `need_gb` free."""
    for on, free in free_by_filesystem(paths):
        where = ", ".join(str(p) for p in on)
        if free < need_gb * GB:
            raise NotEnoughDisk(
                f"disk: the {job} job needs {need_gb:g} GB free for {where}, the runner has "
                f"{free / GB:.1f} GB (fix: free more space before it, or run it on a runner with "
                "a larger disk; docs/ci.md lists what each job needs)"
            )
        say(f"disk    {job} job needs {need_gb:g} GB for {where}: {free / GB:.1f} GB free")
