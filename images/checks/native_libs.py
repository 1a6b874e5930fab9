"""One copy of each native library, and extensions that link (issue 37, item 3).

Part of the in-image checks (run_checks.py, group native-libs); standard library only.

- copies: each library of native_libs.txt (NCCL, cuDNN, cuBLAS, cudart, nvrtc) is looked up
  on the loader path (the ldconfig cache, LD_LIBRARY_PATH, the nvidia wheels' lib dirs on
  sys.path); every distinct file found is a copy. The lock's copy is the one its wheel's
  RECORD lists. Any other copy fails the check, naming both files, unless it is provably the
  same library: byte-identical, or a file whose full version (libX.so.MAJOR.MINOR.PATCH) is
  the wheel's version. A held system libnccl2 2.28.3 beside torch's nvidia-nccl-cu13 2.28.9
  is the classic mismatch: two NCCLs in one process, and which one a module gets depends on
  who loaded first.
- undefined symbols: `ldd -r` over the compiled modules of the extensions (native_libs.txt
  `extensions`, and the ones the image built), with the loader path the stack's own import
  sees: the image's LD_LIBRARY_PATH, then torch's lib dir (a torch extension loads after
  torch) and the nvidia wheels' lib dirs (TransformerEngine preloads from there). Symbols the
  Python interpreter itself provides are not missing: an extension module gets them at import.
  Nor are those of the libraries a package loads itself before its modules (native_libs.txt
  `preloads`: TransformerEngine's ctypes loads of nvrtc, curand and its core library), which
  ldd -r sees only when they are preloaded (LD_PRELOAD) as the import loads them.

The sys.path part (one megatron, verl, sglang, transformer_engine, the pinned one) is
run_checks.py's launch-env one-copy check, which this group does not repeat.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import fnmatch
import functools
import glob
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE / "native_libs.txt"
PASS, FAIL, SKIP = "pass", "fail", "skip"
# The toolkit's link-time stubs of the driver's libraries, where LIBRARY_PATH does not name them
# (the real base sets LIBRARY_PATH=/usr/local/cuda/lib64/stubs).
STUB_DIRS = ("/usr/local/cuda/lib64/stubs", "/usr/local/cuda/targets/x86_64-linux/lib/stubs")
# A file name's full version: libnccl.so.2.28.3 -> 2.28.3 (libnccl.so.2 says only the major).
_FULL_VERSION = re.compile(r"\.so\.(\d+\.\d+\.\d+(?:\.\d+)*)$")


@dataclass(frozen=True)
class Library:
    name: str
    sonames: str  # a glob of file names
    wheels: tuple[str, ...]


@dataclass(frozen=True)
class Preload:
    """Libraries a distribution's Python package loads with ctypes (RTLD_GLOBAL) before its
    compiled modules: their symbols are global at import, yet no DT_NEEDED names them."""

    dist: str
    sonames: tuple[str, ...]  # globs of file names


@dataclass(frozen=True)
class Table:
    libraries: tuple[Library, ...]
    extensions: tuple[str, ...]
    driver: tuple[str, ...]
    preloads: tuple[Preload, ...] = ()


@dataclass(frozen=True)
class Copy:
    path: str  # the real file (links resolved)
    found: tuple[str, ...]  # where: "ldconfig cache", "LD_LIBRARY_PATH", "site-packages", "wheel RECORD"
    wheel: str | None = None  # the lock's wheel whose RECORD lists it, as "name version"
    wheel_version: str | None = None

    @property
    def version(self) -> str | None:
        if self.wheel_version:
            return self.wheel_version
        m = _FULL_VERSION.search(self.path)
        return m.group(1) if m else None


@dataclass(frozen=True)
class Verdict:
    id: str
    status: str
    detail: str
    checked: int | None = None


@dataclass(frozen=True)
class LoaderPath:
    """Where the dynamic loader (and the stack's Python packages) find libraries."""

    ld_cache: tuple[tuple[str, str], ...]  # (soname, path) from `ldconfig -p`
    ld_library_path: tuple[str, ...]
    wheel_dirs: tuple[str, ...]  # nvidia/*/lib on sys.path


class TableError(ValueError):
    pass


def read_table(path: Path = TABLE) -> Table:
    libs, exts, driver, preloads = [], [], [], []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        kind, rest = words[0], words[1:]
        if kind == "library" and len(rest) == 3:
            libs.append(Library(rest[0], rest[1], tuple(w for w in rest[2].split(",") if w)))
        elif kind == "extensions" and rest:
            exts.extend(rest)
        elif kind == "driver" and rest:
            driver.extend(rest)
        elif kind == "preloads" and len(rest) >= 2:
            preloads.append(Preload(rest[0], tuple(rest[1:])))
        else:
            raise TableError(
                f"{path}:{number}: {raw.strip()!r}: want `library NAME SONAMES WHEELS`, "
                "`extensions DIST...`, `driver SONAME...` or `preloads DIST SONAME...`"
            )
    return Table(tuple(libs), tuple(exts), tuple(driver), tuple(preloads))


# ----------------------------------------------------------------------------- the loader path
def _ldconfig() -> str | None:
    return shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None
    )


def parse_ld_cache(text: str) -> tuple[tuple[str, str], ...]:
    """`ldconfig -p` lines: `\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2`."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*(\S+)\s+\(.*\)\s+=>\s+(\S+)\s*$", line)
        if m:
            out.append((m.group(1), m.group(2)))
    return tuple(out)


def wheel_lib_dirs(search: list[str]) -> tuple[str, ...]:
    """The nvidia-* wheels' lib dirs (nvidia/nccl/lib, nvidia/cu13/lib, ...) under each sys.path entry."""
    out: list[str] = []
    for entry in search:
        for d in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib"))):
            real = os.path.realpath(d)
            if os.path.isdir(real) and real not in out:
                out.append(real)
    return tuple(out)


def loader_path(env: dict | None = None, search: list[str] | None = None) -> LoaderPath:
    env = os.environ if env is None else env
    exe = _ldconfig()
    cache: tuple[tuple[str, str], ...] = ()
    if exe:
        proc = subprocess.run([exe, "-p"], capture_output=True, text=True)
        cache = parse_ld_cache(proc.stdout) if proc.returncode == 0 else ()
    ldlp = tuple(d for d in (env.get("LD_LIBRARY_PATH") or "").split(":") if d)
    return LoaderPath(cache, ldlp, wheel_lib_dirs(sys.path if search is None else search))


# ----------------------------------------------------------------------------- copies
def _dist(names: tuple[str, ...]):
    for name in names:
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def wheel_copies(lib: Library) -> tuple[str | None, dict[str, str]]:
    """(\"wheel version\", {real path: version}) of the lock's copy: the files the wheel's
    RECORD lists whose name matches the library's sonames."""
    dist = _dist(lib.wheels)
    if dist is None:
        return None, {}
    files = {}
    for f in dist.files or ():
        if fnmatch.fnmatch(f.name, lib.sonames):
            real = os.path.realpath(str(dist.locate_file(f)))
            if os.path.isfile(real):
                files[real] = dist.version
    return f"{dist.metadata['Name']} {dist.version}", files


def find_copies(lib: Library, where: LoaderPath) -> list[Copy]:
    """Every distinct file of `lib` on the loader path, the wheel's own first."""
    found: dict[str, list[str]] = {}

    def add(path: str, how: str) -> None:
        real = os.path.realpath(path)
        if os.path.isfile(real):
            hows = found.setdefault(real, [])
            if how not in hows:
                hows.append(how)

    for soname, path in where.ld_cache:
        if fnmatch.fnmatch(soname, lib.sonames):
            add(path, "ldconfig cache")
    for d in where.ld_library_path:
        for path in sorted(glob.glob(os.path.join(d, lib.sonames))):
            add(path, "LD_LIBRARY_PATH")
    for d in where.wheel_dirs:
        for path in sorted(glob.glob(os.path.join(d, lib.sonames))):
            add(path, "site-packages")
    wheel, owned = wheel_copies(lib)
    for path in owned:
        add(path, "wheel RECORD")
    copies = [Copy(p, tuple(h), wheel if p in owned else None, owned.get(p)) for p, h in found.items()]
    return sorted(copies, key=lambda c: (c.wheel is None, c.path))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def same_library(other: Copy, lock: Copy) -> bool:
    """Provably the lock's library in another file: the same bytes, or the same full version."""
    version, want = other.version, lock.version or ""
    if version and (want == version or want.startswith(version + ".")):
        return True
    return os.path.getsize(other.path) == os.path.getsize(lock.path) and _sha256(other.path) == _sha256(
        lock.path
    )


def _owner(path: str) -> str | None:
    """The Debian package that installed `path` (for the fix), where dpkg knows it."""
    if not shutil.which("dpkg-query"):
        return None
    proc = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True)
    if proc.returncode != 0 or ":" not in proc.stdout:
        return None
    return proc.stdout.split(":", 1)[0].strip() or None


def _said(c: Copy) -> str:
    what = c.wheel or (c.version or "version unknown")
    return f"{c.path} ({what}; {', '.join(c.found)})"


def judge_copies(lib: Library, copies: list[Copy], owner=_owner) -> Verdict:
    cid = f"native-libs:{lib.name}"
    lock = [c for c in copies if c.wheel]
    others = [c for c in copies if not c.wheel]
    if not copies:
        return Verdict(
            cid, SKIP, f"no {lib.sonames} on the loader path and no {'/'.join(lib.wheels)} installed"
        )
    if not lock:
        if len(others) == 1:
            return Verdict(
                cid, PASS, f"one copy, {_said(others[0])}; no {'/'.join(lib.wheels)} in this image", 1
            )
        versions = {c.version for c in others}
        if len(versions) == 1 and None not in versions:
            return Verdict(
                cid, PASS, f"{len(others)} files, all {versions.pop()}: " + ", ".join(map(_said, others)), 1
            )
        return Verdict(
            cid,
            FAIL,
            f"{len(others)} different copies of {lib.sonames} on the loader path: "
            + " and ".join(map(_said, others))
            + " (fix: keep one in the image, off the others' directories)",
            len(others),
        )
    main = lock[0]
    bad = [c for c in others + lock[1:] if not same_library(c, main)]
    same = [c for c in others if c not in bad]
    if not bad:
        detail = f"one copy: {_said(main)}"
        if same:
            detail += "; also " + ", ".join(map(_said, same)) + ", the same library (same version or bytes)"
        return Verdict(cid, PASS, detail, len(copies))
    packages = [p for p in dict.fromkeys(owner(c.path) for c in bad) if p]
    if packages:
        fix = (
            f"remove the other copy in the image: apt-get remove --allow-change-held-packages {' '.join(packages)}"
            " (docs/site-checks.md)"
        )
    else:
        fix = (
            "remove the other copy from the image or its directory from LD_LIBRARY_PATH (docs/site-checks.md)"
        )
    return Verdict(
        cid,
        FAIL,
        f"{len(bad) + 1} copies of {lib.sonames}: "
        + " beside the lock's ".join([_said(bad[0]), _said(main)])
        + "".join(f"; also {_said(c)}" for c in bad[1:])
        + f" (fix: {fix})",
        len(copies),
    )


# ----------------------------------------------------------------------------- undefined symbols
def extension_modules(dists: list[str]) -> list[tuple[str, str]]:
    """(distribution, real path) of each compiled module (.so) the distributions' RECORDs list."""
    out, seen = [], set()
    for name in dict.fromkeys(dists):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name.endswith(".so") or ".so." in f.name:
                real = os.path.realpath(str(dist.locate_file(f)))
                if os.path.isfile(real) and real not in seen:
                    seen.add(real)
                    out.append((name, real))
    return out


@functools.cache
def _interpreter_has(symbol: str) -> bool:
    """The running Python provides `symbol` (an extension module gets it at import): dlsym in
    the process's global scope, which holds the interpreter and libpython."""
    try:
        getattr(ctypes.CDLL(None), symbol)
        return True
    except AttributeError:
        return False


def parse_ldd(text: str, provided=_interpreter_has) -> tuple[list[str], list[str]]:
    """(missing libraries, undefined symbols) from `ldd -r` output."""
    missing, undefined = [], []
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"(\S+) => not found", line)
        if m:
            missing.append(m.group(1))
            continue
        m = re.match(r"undefined symbol: (\S+)\s*\(([^)]*)\)", line)
        if m:
            if not provided(m.group(1)):
                undefined.append(f"{m.group(1)} ({m.group(2)})")
            continue
        if "not defined in file" in line:  # a symbol version the library lacks
            undefined.append(line)
    return list(dict.fromkeys(missing)), list(dict.fromkeys(undefined))


def stub_dir(driver: tuple[str, ...], where: LoaderPath, env: dict, tmp: str) -> str | None:
    """A directory of the driver's sonames linked to the toolkit's stubs, where the loader
    path has no driver (a machine without a GPU); None when the driver is there or no stubs."""
    have = {s for s, _ in where.ld_cache} | {
        s for d in where.ld_library_path for s in driver if os.path.exists(os.path.join(d, s))
    }
    lacking = [s for s in driver if s not in have]
    if not lacking:
        return None
    dirs = [d for d in (env.get("LIBRARY_PATH") or "").split(":") if d] + list(STUB_DIRS)
    made = False
    for soname in lacking:
        stem = soname.split(".so")[0] + ".so"
        stub = next((os.path.join(d, stem) for d in dirs if os.path.isfile(os.path.join(d, stem))), None)
        if stub:
            os.symlink(stub, os.path.join(tmp, soname))
            made = True
    return tmp if made else None


def ldd_env(where: LoaderPath, env: dict, stubs: str | None) -> dict:
    dirs = list(where.ld_library_path)
    torch_lib = _torch_lib()
    dirs += [d for d in [torch_lib, *where.wheel_dirs, stubs] if d and d not in dirs]
    return {**env, "LD_LIBRARY_PATH": ":".join(dirs)}


def _torch_lib() -> str | None:
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    d = os.path.realpath(str(dist.locate_file("torch/lib")))
    return d if os.path.isdir(d) else None


def ldd_one(path: str, env: dict) -> tuple[int, str]:
    proc = subprocess.run(["ldd", "-r", path], capture_output=True, text=True, env=env, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def preloaded(path: str, dist: str, preloads: tuple[Preload, ...], env: dict) -> list[str]:
    """The files `dist`'s package loads before `path` (table `preloads`), found as its import
    finds them: beside the module, then on the loader path of `env`; the first match of each."""
    dirs = [os.path.dirname(path)] + [d for d in (env.get("LD_LIBRARY_PATH") or "").split(":") if d]
    out = []
    for pattern in (s for p in preloads if p.dist == dist for s in p.sonames):
        hit = next((f for d in dirs for f in sorted(glob.glob(os.path.join(d, pattern))) if f != path), None)
        if hit and hit not in out:
            out.append(hit)
    return out


def judge_links(
    modules: list[tuple[str, str]],
    env: dict,
    driver: tuple[str, ...],
    stubs: str | None,
    provided=_interpreter_has,
    preloads: tuple[Preload, ...] = (),
) -> Verdict:
    cid = "native-libs:undefined-symbols"
    if not modules:
        return Verdict(cid, SKIP, "no compiled extension modules in this image")
    if not shutil.which("ldd"):
        return Verdict(cid, SKIP, "no ldd in this image")
    problems, waived = [], []
    # what a package loads itself (ctypes, RTLD_GLOBAL) is preloaded for its modules, as at import
    first = {path: preloaded(path, dist, preloads, env) for dist, path in modules}
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 2)) as pool:
        runs = {
            path: pool.submit(
                ldd_one, path, {**env, "LD_PRELOAD": ":".join(first[path])} if first[path] else env
            )
            for _d, path in modules
        }
    for dist, path in modules:
        _rc, text = runs[path].result()
        missing, undefined = parse_ldd(text, provided)
        gone_driver = [m for m in missing if m in driver]
        missing = [m for m in missing if m not in driver]
        if gone_driver:
            # without the driver the symbols it would give are undefined too: not this module's fault
            waived.append(f"{os.path.basename(path)} needs {', '.join(gone_driver)} (the driver's)")
            undefined = []
        if missing:
            problems.append(f"{path} ({dist}): needs {', '.join(missing)}, not found")
        if undefined:
            shown = ", ".join(undefined[:5]) + (
                f" and {len(undefined) - 5} more" if len(undefined) > 5 else ""
            )
            problems.append(f"{path} ({dist}): undefined symbol {shown}")
    dists = sorted({d for d, _ in modules})
    looked = f"ldd -r over {len(modules)} compiled modules of {', '.join(dists)}"
    if stubs:
        looked += " (no driver here: its libraries from the toolkit's stubs)"
    shown_preloads = sorted({os.path.basename(f) for files in first.values() for f in files})
    if shown_preloads:
        looked += f", with what the packages load themselves first ({', '.join(shown_preloads)})"
    if waived:
        looked += f"; not judged, no driver and no stub: {'; '.join(waived)}"
    if problems:
        return Verdict(
            cid,
            FAIL,
            "; ".join(problems) + f" ({looked}; fix: the module was built against other libraries than the "
            "lock installs: rebuild it, or pin the library it was built for)",
            len(modules),
        )
    return Verdict(cid, PASS, looked + ": every symbol defined", len(modules) - len(waived))


# ----------------------------------------------------------------------------- the group
def check(
    vector: dict, table: Table | None = None, env: dict | None = None, search: list[str] | None = None
) -> list[Verdict]:
    table = table or read_table()
    env = dict(os.environ if env is None else env)
    where = loader_path(env, search)
    out = [judge_copies(lib, find_copies(lib, where)) for lib in table.libraries]
    built = [e["name"] for e in vector.get("extensions") or () if e.get("name")]
    modules = extension_modules([*built, *table.extensions])
    with tempfile.TemporaryDirectory(prefix="mtp-stubs-") as tmp:
        stubs = stub_dir(table.driver, where, env, tmp)
        out.append(
            judge_links(modules, ldd_env(where, env, stubs), table.driver, stubs, preloads=table.preloads)
        )
    return out
