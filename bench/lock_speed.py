#!/usr/bin/env python3
"""Lock speed on the REAL shipped stack, against the plain alternative in the same run.

    tool   `python build.py lock` of every shipped profile: fetch the git sources (cached by
           repository+commit), read their metadata, ONE uv resolution of the whole image with the
           declared overrides, one hashed wheel per package, source probes, lock.yaml
    plain  `uv pip compile` alone of the same requirements and stand-ins (the resolution floor:
           no sources, no file selection, no probes), and pip's own resolver on the same input
           (`pip install --dry-run --report`), which has no overrides/excludes: it must fail
           (the stack does not resolve without them) and the time it takes to say so is shown.

    bump   `python build.py bump megatron-lm --to core_r0.19.0` (the weekly bump, one component:
           ls-remote, fetch, version from the source, every rule and probe, re-lock, both files
           written) on a fresh copy of the manifests each run, against `uv pip compile` alone of
           the bumped requirements (what a hand bump would re-resolve), both with a warm cache.

Cold: a fresh cache directory (every index page and git tree fetched again). Warm: the same
cache again. Medians of --runs warm runs. Needs what `lock` needs: PyPI, and the git sources
reachable (here: upstream snapshots mapped in with git's url.insteadOf, plus
MTP_GIT_ALLOW_MISSING_BLOBS=1). Writes bench/lock_results.json; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the weekly bump measured: a tag of the pinned Megatron-LM's release line (docs/bump-session.md)
BUMP = ("megatron-lm", "--to", "core_r0.19.0")
sys.path.insert(0, str(ROOT))


def timed(cmd, env, cwd=ROOT, timeout=900) -> tuple[float, int, str]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.monotonic() - t0, 124, f"gave up after {timeout} s"
    return time.monotonic() - t0, proc.returncode, (proc.stdout + proc.stderr)[-400:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    import yaml

    from mtpimage.lock import resolver

    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="mtp-bench-lock-"))
    manifests = work / "manifests"
    shutil.copytree(ROOT / "manifests", manifests)
    cache = work / "cache"
    env = {**os.environ, "MTP_CACHE_DIR": str(cache)}
    lock_cmd = [py, str(ROOT / "build.py"), "lock", "--manifests", str(manifests)]
    results: dict = {}

    cold, rc, out = timed(lock_cmd, env)
    assert rc == 0, out
    warm = [timed(lock_cmd, env)[0] for _ in range(args.runs)]
    same = (manifests / "lock.yaml").read_bytes() == (ROOT / "manifests" / "lock.yaml").read_bytes()
    results["tool"] = {
        "cold_s": round(cold, 2),
        "warm_s": round(statistics.median(warm), 2),
        "lock_identical_to_committed": same,
    }

    doc = yaml.safe_load((manifests / "lock.yaml").read_text())
    pyset = next(iter(doc["python_sets"].values()))
    cat = yaml.safe_load((manifests / "components.yaml").read_text())
    overrides = [o["requirement"] for o in cat["resolution"]["overrides"]]
    excludes = [e["package"] for e in cat["resolution"]["excludes"]]
    uv_cache = work / "uv-plain"

    def uv_once(fresh: bool, pset: dict = pyset) -> float:
        if fresh and uv_cache.exists():
            shutil.rmtree(uv_cache)
        os.environ["MTP_CACHE_DIR"] = str(uv_cache)
        os.environ["MTP_LOCK_REFRESH"] = "0"
        t0 = time.monotonic()
        resolver.resolve(
            pset["requirements"], pset["stubs"], overrides, excludes, ["https://pypi.org/simple"], "3.12"
        )
        return time.monotonic() - t0

    results["uv_compile_only"] = {
        "cold_s": round(uv_once(True), 2),
        "warm_s": round(statistics.median(uv_once(False) for _ in range(args.runs)), 2),
    }

    # one component bumped, on a fresh copy of the manifests each run (the cache stays warm)
    bump_times = []
    for n in range(args.runs):
        copy = work / f"bump-{n}"
        shutil.copytree(ROOT / "manifests", copy)
        t, rc, out = timed([py, str(ROOT / "build.py"), "bump", *BUMP, "--manifests", str(copy)], env)
        assert rc == 0, out
        bump_times.append(t)
    bumped = yaml.safe_load((work / "bump-0" / "lock.yaml").read_text())
    bumped_set = next(iter(bumped["python_sets"].values()))
    uv_once(False, bumped_set)  # the bumped requirements' index pages into uv's cache first
    results["bump"] = {
        "command": "build.py bump " + " ".join(BUMP),
        "warm_s": round(statistics.median(bump_times), 2),
        "runs_s": [round(t, 2) for t in bump_times],
        "uv_compile_only_warm_s": round(
            statistics.median(uv_once(False, bumped_set) for _ in range(args.runs)), 2
        ),
    }

    # pip's resolver on the same requirements, stand-ins as local wheels, no overrides possible
    from mtpimage.lock import pydeps

    stubdir = work / "stubs"
    stubdir.mkdir()
    reqs = []
    for line in pyset["requirements"]:
        name = line.split("==")[0].split("[")[0]
        spec = pyset["stubs"].get(name)
        if spec:
            whl = pydeps.write_stub_wheel(stubdir, name, spec["version"], spec.get("requires"))
            reqs.append(f"{name} @ {whl.as_uri()}")
        else:
            reqs.append(line)
    pip_cmd = [
        py,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "-q",
        "--report",
        str(work / "r.json"),
        "--python-version",
        "3.12",
        *[a for plat in pydeps.PLATFORMS for a in ("--platform", plat)],
        "--only-binary=:all:",
        "--target",
        str(work / "t"),
        "--no-cache-dir",
        *reqs,
    ]
    t, rc, out = timed(pip_cmd, {**os.environ, "PIP_CONFIG_FILE": os.devnull}, cwd=work)
    results["pip_resolver"] = {"cold_s": round(t, 2), "exit": rc, "says": " ".join(out.split())[-300:]}
    (ROOT / "bench" / "lock_results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("| | cold | warm (median) | note |\n|---|---|---|---|")
    print(
        f"| `build.py lock`, 5 profiles | {results['tool']['cold_s']} s | {results['tool']['warm_s']} s | "
        f"lock.yaml identical to the committed one: {same} |"
    )
    print(
        f"| `uv pip compile` alone (floor) | {results['uv_compile_only']['cold_s']} s | "
        f"{results['uv_compile_only']['warm_s']} s | resolution only |"
    )
    print(
        f"| pip resolver, same input | {results['pip_resolver']['cold_s']} s | - | exit {rc}: cannot apply overrides |"
    )
    b = results["bump"]
    print(
        f"| `{b['command']}` | - | {b['warm_s']} s | `uv pip compile` alone of the bumped "
        f"requirements: {b['uv_compile_only_warm_s']} s warm (ratio {b['warm_s'] / b['uv_compile_only_warm_s']:.1f}x) |"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
