#!/usr/bin/env python3
"""How a fresh node gets an image that is already published, gzip and zstd (issue 48 item 4),
in one run: each client's pull + unpack into empty storage, and the squashfs path.

    python3 bench/node_paths.py --gzip HOST/NAME@sha256:... --zstd HOST/NAME@sha256:... \\
        [--export-profile P [--manifests DIR]] [--clients podman,docker,skopeo+umoci] --out FILE

bench/compression.py makes the formats from a kept layout and pushes them; this script takes
what the main job published (`--push`, `--compression zstd --push`), so it needs neither the
layout nor the disk for it (the real stack: 14 GB). The clients are compression.py's: podman
4.3 into a fresh --root, docker 20.10 into a dockerd of its own on an empty data root (gzip
only: it cannot read zstd), skopeo 1.9 + umoci (gzip only: umoci 0.4.7 refuses zstd). With
--export-profile, `build.py export --format enroot` of the gzip image (the host's dockerd must
hold it) and `unsquashfs` of the squashfs into an empty folder, as `enroot create` does. Ratios
are against podman's gzip pull + unpack, the one client that reads both formats. No time is
asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import compression  # noqa: E402  (the clients and the export, one home)

READS = {"podman": ("gzip", "zstd"), "docker": ("gzip",), "skopeo+umoci": ("gzip",)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gzip", required=True, help="the gzip image, by digest")
    ap.add_argument("--zstd", required=True, help="the zstd image of the same build, by digest")
    ap.add_argument("--clients", default="podman,docker,skopeo+umoci")
    ap.add_argument("--export-profile", help="also export the gzip image for enroot and unsquash it")
    ap.add_argument("--manifests", type=Path, help="the manifests the image was built from")
    ap.add_argument("--scratch", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    scratch = args.scratch / f"mtp-bench-node-paths-{os.getpid()}"
    scratch.mkdir(parents=True)
    result: dict = {
        "gzip": args.gzip,
        "zstd": args.zstd,
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_at_start": os.getloadavg(),
        },
        "tools": {t: compression._version(t) for t in ("docker", "podman", "skopeo", "umoci")},
        "pull_unpack": {},
    }
    for client in args.clients.split(","):
        for fmt in READS[client]:
            took, err = compression.CLIENTS[client](getattr(args, fmt), scratch)
            row = {"error": err} if err else {"seconds": round(took, 1)}
            result["pull_unpack"][f"{client} {fmt}"] = row
            print(f"{client:<13} {fmt:<5} {row}", flush=True)
    if args.export_profile:
        result["squashfs_enroot"] = compression.export_enroot(
            args.gzip, args.export_profile, scratch, args.manifests
        )
        print(f"squashfs      {result['squashfs_enroot']}", flush=True)
    scratch.rmdir()
    pulls = result["pull_unpack"]
    base = pulls.get("podman gzip", {}).get("seconds")
    ratios = {}
    if base:
        for name, row in pulls.items():
            if "seconds" in row and name != "podman gzip":
                ratios[f"{name} / podman gzip"] = round(row["seconds"] / base, 3)
        sq = result.get("squashfs_enroot") or {}
        if "unsquashfs_s" in sq:
            ratios["unsquashfs / podman gzip"] = round(sq["unsquashfs_s"] / base, 3)
    result["ratios"] = ratios
    result["machine"]["load_at_end"] = os.getloadavg()
    result["note"] = (
        "one run on a shared 2-core builder; registry on loopback (no network cost in the pull times)"
    )
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
