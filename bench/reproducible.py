#!/usr/bin/env python3
"""Time cost of the reproducible engine (buildah) against the normal docker build, in one run,
on the stand-in test profile (tests/manifests/, loopback git sources, digest-pinned test base).

    .venv/bin/python bench/reproducible.py [--reps 3]

Needs scripts/setup-test-host.sh (dockerd, registry on 127.0.0.1:5000, buildah). Each rep
runs, alternately, the tool's main job (render, build, in-image checks, tags; no push):
  docker cold     --engine docker --no-cache        (BuildKit, no layer cache)
  docker warm     --engine docker, the image's tags removed first (BuildKit layer cache warm)
  buildah         --engine buildah                   (always a clean builder)
and one `verify` of the last reproducible image pushed to a bench namespace. Writes
bench/reproducible_results.json; the table goes into bench/RESULTS.md by hand. Nothing here
runs `docker builder prune`: --no-cache is per build.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.dockerhost import probe_docker_host  # noqa: E402
from tests.fixtures.image_fixtures import copy_manifests, make_test_base  # noqa: E402
from tests.fixtures.servers import serve_git_world  # noqa: E402

PROFILE = "test-detach"
PY = str(REPO / ".venv" / "bin" / "python")


def tool(env: dict, *args: str) -> tuple[float, str]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [PY, str(REPO / "build.py"), *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(args)} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}"
        )
    return took, proc.stdout


def untag(host, identity_ref: str) -> None:
    for ref in (identity_ref, f"mtp-verl:{PROFILE}"):
        host.docker("image", "rm", "--no-prune", ref, check=False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    opts = ap.parse_args()
    host, problems = probe_docker_host()
    if host is None:
        raise SystemExit("; ".join(problems))
    host = dataclasses.replace(host, registry=os.environ.get("MTP_TEST_REGISTRY", "127.0.0.1:5000"))
    ns = f"bench-repro-{uuid.uuid4().hex[:6]}"
    times: dict[str, list[float]] = {"docker cold": [], "docker warm": [], "buildah": []}
    with (
        tempfile.TemporaryDirectory(prefix="mtp-bench-repro-") as tmp,
        serve_git_world(Path(tmp) / "git") as world,
    ):
        manifests = copy_manifests(Path(tmp) / "manifests", make_test_base(host))
        env = {
            **os.environ,
            **world.env,
            "MTP_CACHE_DIR": str(Path(tmp) / "cache"),
            "MTP_DOCKER_CLI": host.cli,
            "MTP_FASTPATH": "0",
        }
        base = ["--manifests", str(manifests), "--profile", PROFILE]
        _, out = tool(env, *base, "--engine", "docker")  # sources fetched, caches warm
        image = next(line.split()[1] for line in out.splitlines() if line.startswith("image "))
        for rep in range(opts.reps):
            for case, extra in (
                ("docker cold", ["--engine", "docker", "--no-cache"]),
                ("docker warm", ["--engine", "docker"]),
                ("buildah", ["--engine", "buildah"]),
            ):
                untag(host, image)
                took, _ = tool(env, *base, *extra)
                times[case].append(took)
                print(f"rep {rep + 1} {case:<12} {took:6.1f} s", flush=True)
        untag(host, image)
        push_s, out = tool(env, *base, "--engine", "buildah", "--push", "--registry", f"{host.registry}/{ns}")
        digest = next(line.split()[1] for line in out.splitlines() if line.startswith("digest "))
        verify_s, _ = tool(
            env,
            "verify",
            "--manifests",
            str(manifests),
            "--profile",
            PROFILE,
            "--image",
            f"{host.registry}/{ns}/mtp-verl@{digest}",
        )
        untag(host, image)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "profile": PROFILE,
        "reps": opts.reps,
        "seconds": times,
        "median_s": med,
        "ratio_buildah_vs_docker_cold": med["buildah"] / med["docker cold"],
        "ratio_buildah_vs_docker_warm": med["buildah"] / med["docker warm"],
        "buildah_build_and_push_s": push_s,
        "verify_s": verify_s,
    }
    (BENCH / "reproducible_results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
