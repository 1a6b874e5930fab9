#!/usr/bin/env python3
"""Compiled extensions in the rendered Dockerfile (bind-mounted, never in a layer).

  build    in a builder stage: unpack the pinned source (an sdist, checked against its
           sha256, or a git tree), compile it with --no-build-isolation against the torch
           installed below, through ccache in a cache mount (an interrupted build resumes
           with every object it had compiled), and leave exactly one wheel plus build.json
           in --out. The wheel must hold every module the manifest says it produces.
  record   in the image, after the wheels were installed by sha256: write
           /opt/mtp/installed/<name>.json and the PEP 610 direct_url.json of each (the sdist's
           URL and sha256, or the repository and commit), so `pip freeze` and `pip inspect`
           name where each came from, not the temporary file it was installed from.

Standard library only: it runs on the base image's Python.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

RECORDS = Path("/opt/mtp/installed")
# A fixed build directory: ccache's hashes then match between runs (with CCACHE_BASEDIR and
# CCACHE_NOHASHDIR the path itself is left out, but one place keeps the logs readable too).
WORK = Path("/tmp/mtp-ext-build")
CCACHE_DIR = "/root/.cache/ccache"
# Zip timestamps of the wheel: the earliest a zip can hold (1980-01-01).
SOURCE_DATE_EPOCH = "315532800"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _unpack(src: Path, name: str, sha256: str | None) -> Path:
    """The source tree under WORK/<name>: an sdist archive (checked against its pinned sha256
    here too, so a context that was tampered with stops the build) or a copied git tree."""
    dest = WORK / name
    if dest.exists():
        shutil.rmtree(dest)
    archives = sorted(p for p in src.iterdir() if p.name.endswith((".tar.gz", ".zip")))
    if archives:
        if len(archives) != 1:
            raise SystemExit(f"mtp_extension: {src} holds {len(archives)} archives; expected one sdist")
        archive = archives[0]
        got = _sha256(archive)
        if sha256 and got != sha256:
            raise SystemExit(f"mtp_extension: {archive.name} has sha256 {got}, the plan pins {sha256}")
        tmp = WORK / f".{name}-unpack"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                try:
                    t.extractall(tmp, filter="data")
                except TypeError:  # Python < 3.11.4 has no extraction filters; the sha256 was checked
                    t.extractall(tmp)  # noqa: S202
        tops = list(tmp.iterdir())
        (tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp).rename(dest)
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".mtp-source.json"))
    return dest


def _ccache_env() -> dict[str, str]:
    """ccache in front of the host compiler (PATH) and nvcc (PYTORCH_NVCC: torch's extension
    builder calls nvcc by absolute path). Hashes ignore the directory, and time stamps of the
    freshly unpacked headers, so a second run of the same source hits."""
    env: dict[str, str] = {}
    ccache = shutil.which("ccache")
    if not ccache:
        print("mtp_extension: no ccache: an interrupted build starts over", flush=True)
        return env
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    masq = Path("/usr/lib/ccache")
    env.update(
        CCACHE_DIR=CCACHE_DIR,
        CCACHE_BASEDIR=str(WORK),
        CCACHE_NOHASHDIR="true",
        CCACHE_COMPILERCHECK="content",
        CCACHE_SLOPPINESS="include_file_mtime,include_file_ctime,time_macros,file_stat_matches",
        CCACHE_MAXSIZE=os.environ.get("CCACHE_MAXSIZE", "40G"),
        PYTORCH_NVCC=f"{ccache} {nvcc}",
    )
    if masq.is_dir():
        env["PATH"] = f"{masq}:{os.environ.get('PATH', '')}"
    remote = os.environ.get("MTP_CCACHE_REMOTE", "").strip()
    if remote:
        # the tool's host-side cache: objects outlive this RUN and the daemon (ccache >= 4.8
        # reads REMOTE, older ones SECONDARY)
        env["CCACHE_REMOTE_STORAGE"] = remote
        env["CCACHE_SECONDARY_STORAGE"] = remote
    return env


def _ccache_stats() -> str:
    if not shutil.which("ccache"):
        return ""
    proc = subprocess.run(
        ["ccache", "--show-stats"],
        capture_output=True,
        text=True,
        env={**os.environ, "CCACHE_DIR": CCACHE_DIR},
    )
    return proc.stdout.strip()


def _cuda_wheel_paths(env: dict[str, str]) -> None:
    """The headers of the CUDA libraries torch itself loads (the nvidia-* wheels it pins),
    after the toolkit's: a devel base's own /usr/local/cuda/include comes first (torch passes
    it with -I); a base with only nvcc and cudart (the local stand-in) still finds
    cusparse.h and cublas headers, of exactly the versions the extension will run against."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    incs = sorted(str(p) for p in site.glob("*/include") if p.is_dir())
    if incs:
        env["CPATH"] = ":".join([x for x in [env.get("CPATH", "")] if x] + incs)


def _wheel_modules(wheel: Path) -> set[str]:
    """Top-level and dotted names of the compiled modules in a wheel (`x.cpython-312-...so`)."""
    out = set()
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if n.endswith(".so") and ".dist-info/" not in n:
                stem = n[: -len(".so")].split(".")[0]
                out.add(stem.replace("/", "."))
                out.add(stem.rsplit("/", 1)[-1])
    return out


def build(args) -> int:
    t0 = time.monotonic()
    tree = _unpack(args.src, args.name, args.sha256)
    env = dict(os.environ)
    env.update(_ccache_env())
    _cuda_wheel_paths(env)
    for spec in args.env:
        k, _, v = spec.partition("=")
        env[k] = v
    jobs = (os.environ.get("MTP_EXT_MAX_JOBS") or "").strip() or str(os.cpu_count() or 1)
    env["MAX_JOBS"] = jobs
    env["SOURCE_DATE_EPOCH"] = SOURCE_DATE_EPOCH
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    names = sorted({s.partition("=")[0] for s in args.env} | {"MAX_JOBS"})
    shown = " ".join(f"{k}={env[k]}" for k in names)
    print(f"mtp_extension: building {args.name} in {tree} with {shown}", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "-v",
        "-w",
        str(out),
        str(tree),
    ]
    proc = subprocess.run(cmd, env=env, cwd=tree)
    if proc.returncode != 0:
        print(_ccache_stats(), flush=True)
        print(f"mtp_extension: {args.name}: pip wheel exited {proc.returncode}", flush=True)
        return proc.returncode
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        print(f"mtp_extension: {args.name}: expected one wheel, got {[w.name for w in wheels]}", flush=True)
        return 1
    have = _wheel_modules(wheels[0])
    missing = [m for m in args.produces if m not in have]
    if missing:
        print(
            f"mtp_extension: {args.name}: the wheel lacks compiled module(s) {', '.join(missing)} "
            f"(has: {', '.join(sorted(have)) or 'none'})",
            flush=True,
        )
        return 1
    stats = _ccache_stats()
    (out / "build.json").write_text(
        json.dumps(
            {
                "name": args.name,
                "wheel": wheels[0].name,
                "sha256": _sha256(wheels[0]),
                "seconds": round(time.monotonic() - t0, 1),
                "max_jobs": int(jobs),
                "ccache": stats.splitlines(),
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    print(stats, flush=True)
    print(f"mtp_extension: {args.name}: {wheels[0].name} in {time.monotonic() - t0:.0f}s", flush=True)
    return 0


def _dist_info(package: str) -> Path:
    dist = importlib.metadata.distribution(package)
    return Path(dist._path)  # type: ignore[attr-defined]  # the .dist-info folder


def direct_url(source: dict) -> dict:
    """PEP 610: an sdist is an archive with its hash; a git tree is a VCS checkout."""
    if source["kind"] == "sdist":
        return {"url": source["url"], "archive_info": {"hashes": {"sha256": source["sha256"]}}}
    vcs = {"vcs": "git", "commit_id": source["commit"]}
    if source.get("ref"):
        vcs["requested_revision"] = source["ref"]
    return {"url": source["repo"], "vcs_info": vcs}


def record(args) -> int:
    listing = json.loads((args.wheels / "extensions.json").read_text())
    RECORDS.mkdir(parents=True, exist_ok=True)
    for ext in listing["extensions"]:
        dist = _dist_info(ext["name"])
        url = direct_url(ext["source"])
        (dist / "direct_url.json").write_text(json.dumps(url, sort_keys=True) + "\n")
        rec = {
            "name": ext["name"],
            "source": "built",
            "package": ext["name"],
            "version": importlib.metadata.version(ext["name"]),
            "wheel": ext["wheel"],
            "wheel_sha256": ext["sha256"],
            "key": ext["key"],
            "built_from": ext["source"],
            "direct_url": url,
        }
        (RECORDS / f"{ext['name']}.json").write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
        print(f"mtp_extension: recorded {ext['name']} {ext['wheel']} sha256 {ext['sha256'][:16]}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["build", "record"])
    ap.add_argument("--name", default="")
    ap.add_argument("--src", type=Path)
    ap.add_argument("--sha256")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--produces", action="append", default=[])
    ap.add_argument("--wheels", type=Path)
    args = ap.parse_args(argv)
    return build(args) if args.action == "build" else record(args)


if __name__ == "__main__":
    sys.exit(main())
