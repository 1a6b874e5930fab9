"""What GPU code a compiled extension's wheel carries, read with `cuobjdump` (issue 49).

`cuobjdump --list-elf FILE` names one cubin (SASS for one architecture) a line,
`ELF file    2: flash_attn_2_cuda.2.sm_100.cubin`; `--list-ptx` names the PTX the same way
(`PTX file    1: t.1.sm_90.ptx`). A module with no device code makes cuobjdump say "does not
contain device code" and exit non-zero: that is an answer (a CppExtension such as TE's torch
extension), not an error. Any other failure is.

`builds.cuda_archs` is a promise about SASS: the image's preflight trusts version.json's
archs (docs/site-checks.md), so a wheel whose modules lack one of its key's archs would let a
node start a job that fails at its first fused kernel. `check(wheel, wanted)` says which
module lacks which arch; `wheels archs` runs it over the cache.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mtpimage.errors import EnvironmentProblem

# `ELF file    1: name.1.sm_90.cubin` / `PTX file    1: name.1.sm_90a.ptx`
_LINE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+(\S+)$")
_ARCH = re.compile(r"\.sm_(\d+[a-z]?)\.(?:cubin|ptx)$")
NO_DEVICE_CODE = "does not contain device code"
NO_PTX = "No PTX file found"
# Where a CUDA toolkit puts it; PyPI's `nvidia-cuda-cuobjdump` wheel puts it under nvidia/cu13/bin
TOOLKIT_CUOBJDUMP = Path("/usr/local/cuda/bin/cuobjdump")


class CuobjdumpFailed(EnvironmentProblem):
    pass


@dataclass(frozen=True)
class Listing:
    """One file's device code: the architectures of its SASS (cubins) and of its PTX."""

    sass: tuple[str, ...]  # e.g. ("90", "100"), in cuobjdump's order, repeats kept
    ptx: tuple[str, ...]

    @property
    def has_device_code(self) -> bool:
        return bool(self.sass or self.ptx)

    @property
    def sass_archs(self) -> frozenset[str]:
        return frozenset(self.sass)


def parse(text: str) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) of cuobjdump's `--list-elf`/`--list-ptx` output, one per line
    it names. A line naming a cubin without an `sm_` arch is refused: reading it as "no code
    for that arch" would pass a wheel it should not."""
    sass: list[str] = []
    ptx: list[str] = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        kind, name = m.groups()
        a = _ARCH.search(name)
        if a is None:
            raise CuobjdumpFailed(f"cuobjdump named {name!r}, whose architecture this cannot read")
        (sass if kind == "ELF" else ptx).append(a.group(1))
    return sass, ptx


def find_cuobjdump(given: Path | None = None) -> Path:
    """The cuobjdump to run: `given`, else PATH's, else the toolkit's under /usr/local/cuda."""
    # a path given and wrong is an error, not a reason to take another one
    for cand in (given,) if given else (shutil.which("cuobjdump"), TOOLKIT_CUOBJDUMP):
        if cand and Path(cand).is_file():
            return Path(cand)
    raise EnvironmentProblem(
        (f"cuobjdump: {given} is not a file" if given else "no cuobjdump on PATH or in /usr/local/cuda/bin")
        + " (fix: pass --cuobjdump PATH: a CUDA 12.8+ toolkit's, which reads sm_100, or PyPI's "
        "nvidia-cuda-cuobjdump wheel by sha256, whose file is nvidia/cu13/bin/cuobjdump)"
    )


def _run(cuobjdump: Path, flag: str, path: Path, quiet: str) -> str:
    proc = subprocess.run([str(cuobjdump), flag, str(path)], capture_output=True, text=True)
    if proc.returncode == 0:
        return proc.stdout
    said = (proc.stderr + proc.stdout).strip()
    if NO_DEVICE_CODE in said or quiet in said:
        return ""
    raise CuobjdumpFailed(
        f"cuobjdump {flag} {path.name} failed (exit {proc.returncode}): {said.splitlines()[0] if said else ''}"
    )


def listing(path: Path, cuobjdump: Path) -> Listing:
    sass, _ = parse(_run(cuobjdump, "--list-elf", path, NO_DEVICE_CODE))
    _, ptx = parse(_run(cuobjdump, "--list-ptx", path, NO_PTX))
    return Listing(tuple(sass), tuple(ptx))


@dataclass(frozen=True)
class Module:
    """One compiled module of a wheel (its path inside the wheel) and its device code."""

    name: str
    size: int  # uncompressed bytes
    code: Listing


@dataclass(frozen=True)
class WheelCode:
    wheel: str
    modules: tuple[Module, ...]

    def missing(self, wanted: list[str]) -> list[tuple[str, str]]:
        """(module, arch) for each module with device code that lacks SASS for a wanted arch."""
        return [
            (m.name, a)
            for m in self.modules
            if m.code.has_device_code
            for a in wanted
            if a not in m.code.sass_archs
        ]

    def extra(self, wanted: list[str]) -> list[tuple[str, str]]:
        """(module, arch) for SASS the key did not ask for (a linked library's own code)."""
        return sorted({(m.name, a) for m in self.modules for a in m.code.sass if a not in set(wanted)})

    def to_dict(self) -> dict:
        return {
            "wheel": self.wheel,
            "modules": [
                {"module": m.name, "size": m.size, "sass": list(m.code.sass), "ptx": list(m.code.ptx)}
                for m in self.modules
            ],
        }


def read_wheel(wheel: Path, cuobjdump: Path) -> WheelCode:
    """Every `.so` in the wheel, unpacked to a temporary directory and listed."""
    mods: list[Module] = []
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory(prefix="mtp-devcode-") as tmp:
        for info in z.infolist():
            if not info.filename.endswith(".so") or ".dist-info/" in info.filename:
                continue
            out = Path(tmp) / Path(info.filename).name
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mods.append(Module(info.filename, info.file_size, listing(out, cuobjdump)))
            out.unlink()
    return WheelCode(wheel.name, tuple(sorted(mods, key=lambda m: m.name)))


def cubin_bytes(path: Path, cuobjdump: Path) -> dict[str, int]:
    """{arch: bytes of its cubins} in one file (`cuobjdump -xelf all`, extracted to a temporary
    directory): what each architecture adds to a module, where a wheel's size goes."""
    out: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="mtp-cubins-") as tmp:
        proc = subprocess.run(
            [str(cuobjdump), "-xelf", "all", str(Path(path).resolve())],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 and NO_DEVICE_CODE not in proc.stderr + proc.stdout:
            raise CuobjdumpFailed(f"cuobjdump -xelf all {Path(path).name} failed (exit {proc.returncode})")
        for f in Path(tmp).glob("*.cubin"):
            a = _ARCH.search(f.name)
            if a:
                out[a.group(1)] = out.get(a.group(1), 0) + f.stat().st_size
    return out
