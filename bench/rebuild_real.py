#!/usr/bin/env python3
"""A reproducible rebuild after a verl bump against the cold reproducible build, on the real
stack (issue 48 item 3), read from the two main jobs' logs (`scripts/real-stack/build.sh` with
`--reproducible`: buildah's STEP lines, "--> Using cache", the tool's `built ... in Ns` and
`compress` lines, and the script's `exit N in S s`).

    python3 bench/rebuild_real.py --cold LOG [--cold-wall S] --bump LOG [--bump-wall S] \\
        [--bump-how TEXT] [--verify OUT] [--out bench/rebuild_results_real.json]

Both builds are the tool's own runs: the cold one on an empty layer cache (every step run),
the bump on the layer cache the cold one left. `--verify` reads the output of
`scripts/real-stack/verify-elsewhere.sh` run on the bump's image: a cold rebuild of the bumped
lock from another checkout and cache, compared layer by layer, so "the bump gives the digest a
cold build gives" is that run's verdict, not an assumption. Per build: the buildah build's seconds (the
tool's `built` line), the steps run and taken from the cache, the layers (RUN/COPY steps) run
again, and what the push compressed. No time is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# a multi-stage build prefixes each stage's steps with "[stage/stages] " (the extension
# builder stages make the real stack's Dockerfile one); steps are counted per stage
STEP = re.compile(r"^(?:\[(\d+)/\d+\] )?STEP (\d+)/(\d+): (\S+)")
BUILT = re.compile(r"^built\s+(sha256:[0-9a-f]+) in ([0-9.]+)s")
COMPRESS = re.compile(r"^compress (\d+) layers \(([0-9.]+) GB\) as (.*)$")
# verify-elsewhere.sh's own line, and verify's rows (assembly/verify.py `lines`)
VERIFY_EXIT = re.compile(r"^verify: exit (\d+) in (\d+) s")
VERIFY_ROW = re.compile(r"^(layer +\d+/\d+|config|blobs|manifest)\s+(same|DIFFERS)\s*(.*)$")


def read(log: Path) -> dict:
    """What one build's log says."""
    steps: list[dict] = []
    out: dict = {"log": str(log)}
    for line in log.read_text(errors="replace").splitlines():
        if m := STEP.match(line):
            name = f"{m[1]}/{m[2]}" if m[1] else m[2]  # stage/step, or the step of a one-stage build
            steps.append({"n": name, "instruction": m[4], "line": line[:160], "cached": False})
        elif line.startswith("--> Using cache") and steps:
            steps[-1]["cached"] = True
        elif m := BUILT.match(line):
            out["image_id"], out["build_s"] = m[1], float(m[2])
        elif m := COMPRESS.match(line):
            out["compressed"] = {"layers": int(m[1]), "gb": float(m[2]), "how": m[3]}
    # a layer is a RUN or COPY step (the base's layers come with FROM)
    layers = [s for s in steps if s["instruction"] in ("RUN", "COPY", "ADD")]
    out["steps"] = len(steps)
    out["steps_from_cache"] = sum(s["cached"] for s in steps)
    out["layers"] = len(layers)
    out["layers_run"] = [s["n"] for s in layers if not s["cached"]]
    out["layers_run_lines"] = [s["line"] for s in layers if not s["cached"]]
    return out


def read_verify(out: Path) -> dict:
    """What one verify-elsewhere run says: its exit and seconds, each row's state, the verdict."""
    got: dict = {"log": str(out), "rows": {}}
    for line in out.read_text(errors="replace").splitlines():
        if m := VERIFY_EXIT.match(line):
            got["exit"], got["seconds"] = int(m[1]), float(m[2])
        elif m := VERIFY_ROW.match(line.strip()):
            got["rows"][" ".join(m[1].split())] = m[2]
            if m[1] == "manifest":
                got["manifest"] = m[3]
        elif line.startswith(("identical:", "error:")):
            got["verdict"] = line
    got["layers_same"] = sum(1 for k, v in got["rows"].items() if k.startswith("layer") and v == "same")
    got["layers"] = sum(1 for k in got["rows"] if k.startswith("layer"))
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", type=Path, required=True)
    ap.add_argument("--cold-wall", type=float, help="the whole main job's seconds (build.sh's line)")
    ap.add_argument("--bump", type=Path, required=True)
    ap.add_argument("--bump-wall", type=float)
    ap.add_argument("--bump-how", default="")
    ap.add_argument("--verify", type=Path, help="verify-elsewhere.sh's output for the bump's image")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", type=Path, default=BENCH / "rebuild_results_real.json")
    args = ap.parse_args()
    cold, bump = read(args.cold), read(args.bump)
    cold["wall_s"], bump["wall_s"] = args.cold_wall, args.bump_wall
    ratios = {"build_bump_over_cold": round(bump["build_s"] / cold["build_s"], 3)}
    if args.cold_wall and args.bump_wall:
        ratios["wall_bump_over_cold"] = round(args.bump_wall / args.cold_wall, 3)
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "cold": cold,
        "bump": {**bump, "how": args.bump_how},
        "ratios": ratios,
        **({"verify_elsewhere": read_verify(args.verify)} if args.verify else {}),
        "note": args.note,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, r in (("cold", cold), ("bump", bump)):
        print(
            f"{name:<5} build {r['build_s']:>8.1f} s  wall {r['wall_s'] or float('nan'):>8.1f} s  "
            f"steps from cache {r['steps_from_cache']}/{r['steps']}  layers run {len(r['layers_run'])} of "
            f"{r['layers']} {r['layers_run']}  {r.get('compressed', '')}"
        )
    print(json.dumps(ratios))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
