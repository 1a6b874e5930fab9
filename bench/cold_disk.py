#!/usr/bin/env python3
"""Peak disk of a cold build, and of the profiles after it on the same engine (issue 26).

    .venv/bin/python bench/cold_disk.py [--profile P ...] [--out bench/cold_disk_results.json]

The figure the generated workflow's `disk_need_gb` (mtpimage/data/ci.yaml) stands on. It
removes every `mtp-verl` image and the plan's base image, and prunes all of BuildKit's cache
(this engine's layers, pip's and apt's cache mounts), so the base is pulled, every layer
built and every wheel downloaded again; the tool's own cache (git sources, extension wheels)
is kept and its size reported, since a CI job fetches those first. Then it runs the tool's
main job for each profile in turn (default mtp-detach then mtp-full: the `test` job's order),
sampling the used bytes of the filesystem that holds docker's data every 2 s. The environment
passes through (MTP_SUBSTITUTE_BASE for a stand-in base). Destructive for this engine's
images and cache: run it on a machine where that is fine. Writes JSON; the table goes into
docs/ci.md by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout


def base_of(profile: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "build.py", "render", "--profile", profile, "--out", tmp],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        found = re.search(r"^FROM (\S+)", (Path(tmp) / "Dockerfile").read_text(), re.M)
    return found.group(1) if found else ""


def make_cold(profiles: list[str]) -> None:
    images = docker("images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}").splitlines()
    bases = {base_of(p).split("@")[0] for p in profiles}
    doomed = [
        ref.split()[1] for ref in images if ref.split(":")[0].endswith("mtp-verl") or ref.split()[0] in bases
    ]
    if doomed:
        docker("rmi", "-f", *sorted(set(doomed)), check=False)
    docker("builder", "prune", "-af")


class Sampler(threading.Thread):
    def __init__(self, path: str, every: float = 2.0):
        super().__init__(daemon=True)
        self.path, self.every, self.samples, self.stop = path, every, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), shutil.disk_usage(self.path).used))
            self.stop.wait(self.every)

    def peak_since(self, start: float, base: int) -> int:
        return max((u for t, u in self.samples if t >= start), default=base) - base


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", action="append", default=[])
    ap.add_argument("--out", default=str(BENCH / "cold_disk_results.json"))
    ap.add_argument("--ca-bundle", help="passed to the builds (a site whose TLS is intercepted)")
    args = ap.parse_args()
    profiles = args.profile or ["mtp-detach", "mtp-full"]
    root = docker("info", "--format", "{{.DockerRootDir}}").strip() or "/var/lib/docker"
    make_cold(profiles)
    sampler = Sampler(root)
    sampler.start()
    time.sleep(0.1)
    base = sampler.samples[0][1]
    runs = []
    for profile in profiles:
        started = time.monotonic()
        extra = ["--ca-bundle", args.ca_bundle] if args.ca_bundle else []
        proc = subprocess.run(
            [sys.executable, "build.py", "--profile", profile, "--progress", "plain", *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        out = proc.stdout + proc.stderr
        runs.append(
            {
                "profile": profile,
                "rc": proc.returncode,
                "seconds": round(time.monotonic() - started, 1),
                "peak_growth_bytes": sampler.peak_since(started, base),
            }
        )
        print(json.dumps(runs[-1]), flush=True)
        if proc.returncode:
            print(out[-2000:], file=sys.stderr)
    sampler.stop.set()
    sampler.join()
    cache = Path.home() / ".cache" / "mtp-image-builder"
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "docker_root": root,
        "runs": runs,
        "peak_growth_bytes": max(u for _t, u in sampler.samples) - base,
        "docker_system_df": docker("system", "df"),
        "tool_cache_bytes": {p.name: du(p) for p in sorted(cache.iterdir()) if p.is_dir()}
        if cache.is_dir()
        else {},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"peak growth {result['peak_growth_bytes'] / 1e9:.2f} GB; written {args.out}")
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
