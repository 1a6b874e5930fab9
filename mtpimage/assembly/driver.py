"""The NVIDIA driver an image needs (issue 37, item 4), from mtpimage/data/drivers.yaml.

Two readers: the image, whose driver check (images/runtime/driver-check.sh, run by the
entrypoint and by the job scripts' preflight) reads the facts this module writes into the
build context (mtp/runtime/driver.facts: plain KEY=VALUE lines, so a POSIX shell reads them
without running them); and the job scripts, whose heads state the requirement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from mtpimage.errors import InputError

DATA = "mtpimage/data/drivers.yaml"
RUNTIME_DIR = "/opt/mtp/runtime"  # images/runtime/ in the image
DRIVER_CHECK = f"{RUNTIME_DIR}/driver-check.sh"
FACTS_FILE = "mtp/runtime/driver.facts"  # in the build context: /opt/mtp/runtime/driver.facts
_FAMILY = re.compile(r"[A-Za-z0-9]+")
_ARCH = re.compile(r"[0-9]{2,3}[af]?")  # builds.cuda_archs' pattern (components.v1.json)


@dataclass(frozen=True)
class DriverNeed:
    cuda_line: str  # MAJOR.MINOR
    min_driver: int  # the oldest driver branch that runs it natively
    compat_dir: str
    datacenter_gpus: tuple[str, ...]  # GPU families that may use forward compatibility

    @property
    def gpu_pattern(self) -> str:
        """A POSIX extended regex over nvidia-smi's GPU name: one of the data-center families."""
        return f"^(NVIDIA |Tesla )?({'|'.join(self.datacenter_gpus)})([ -].*)?$"

    def prerequisite(self) -> str:
        """The job scripts' head line."""
        return (
            f"NVIDIA driver >= {self.min_driver} (CUDA {self.cuda_line}) on every node, or an older one "
            "on a data-center GPU through the image's cuda-compat (the preflight checks which)"
        )


@cache
def _facts() -> dict:
    return yaml.safe_load(resources.files("mtpimage.data").joinpath("drivers.yaml").read_text())


def cuda_line(cuda: str) -> str:
    return ".".join(str(cuda).split(".")[:2])


def need(cuda: str) -> DriverNeed:
    """What an image of platform.cuda `cuda` (13.0.2) needs; a one-line error for a CUDA line
    the data file does not know."""
    facts = _facts()
    line = cuda_line(cuda)
    row = (facts.get("cuda_lines") or {}).get(line)
    if not row:
        known = ", ".join(sorted(facts.get("cuda_lines") or {}))
        raise InputError(
            DATA,
            f"cuda_lines.{line}",
            f"no minimum NVIDIA driver for CUDA {line} (platform.cuda {cuda}); known: {known}",
            f"add the line with its min_driver from NVIDIA's CUDA release notes to {DATA}",
        )
    compat = facts["compat"]
    families = tuple(str(f) for f in compat["datacenter_gpus"])
    bad = [f for f in families if not _FAMILY.fullmatch(f)]
    if bad:
        raise InputError(
            DATA, "compat.datacenter_gpus", f"{bad[0]!r} is not a GPU family name", "letters and digits only"
        )
    return DriverNeed(line, int(row["min_driver"]), str(compat["dir"]), families)


def compiled_archs(extensions: tuple[dict, ...] | list[dict]) -> tuple[str, ...]:
    """The GPU architectures every compiled extension of the image carries code for, in
    builds.cuda_archs order: the `archs` of version.json's `extensions` entries (the version
    vector's records of them); none for an image without compiled extensions."""
    if not extensions:
        return ()
    common = set.intersection(*(set(e["archs"]) for e in extensions))
    return tuple(a for a in extensions[0]["archs"] if a in common)


def served(archs: tuple[str, ...]) -> str:
    """The GPUs an image whose compiled extensions carry `archs` runs on, for the job scripts'
    heads and `explain`: each architecture with its compute capabilities and GPUs
    (drivers.yaml generations; a value it does not list by CUDA's rule alone)."""
    known = _facts().get("generations") or {}
    out = []
    for arch in archs:
        row = known.get(arch)
        if row:
            out.append(f"sm_{arch} (compute capability {row['compute_capability']}: {row['gpus']})")
        else:
            digits = arch.rstrip("af")
            major, minor = digits[:-1], digits[-1]
            runs = f"{major}.{minor} only" if arch.endswith("a") else f"{major}.{minor} or a later {major}.x"
            out.append(f"sm_{arch} (compute capability {runs})")
    return ", ".join(out)


def facts_text(n: DriverNeed, archs: tuple[str, ...] = (), profile: str = "") -> str:
    """/opt/mtp/runtime/driver.facts, as driver-check.sh reads it; with the image's compiled
    architectures (issue 49) where it has compiled extensions, and the profile its fix names.
    An image without them keeps the bytes it always had."""
    text = (
        "# What this image's CUDA line needs of the NVIDIA driver, for driver-check.sh.\n"
        # the module's path until issue 47 moved it to assembly/: these bytes are in every image
        # and its identity, so naming the new path would rebuild every image for a move
        f"# Written at render by mtpimage/outputs/driver.py from {DATA}; a render writes it again.\n"
        f"cuda_line={n.cuda_line}\n"
        f"min_driver={n.min_driver}\n"
        f"compat_dir={n.compat_dir}\n"
        f"datacenter_gpus={n.gpu_pattern}\n"
    )
    if archs:
        bad = [a for a in archs if not _ARCH.fullmatch(a)]
        if bad:  # the schema holds builds.cuda_archs to this; the shell does arithmetic on it
            raise ValueError(f"not a CUDA architecture: {bad[0]!r}")
        text += (
            "# The GPU architectures its compiled extensions carry (version.json extensions' archs):\n"
            "# a GPU of another compute capability is refused (issue 49).\n"
            f"cuda_archs={' '.join(archs)}\n"
            f"profile={profile}\n"
        )
    return text
