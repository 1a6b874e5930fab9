#!/usr/bin/env python3
"""Cost of the CPU gradient check (issue 45 item 2) on this builder, against the plain
alternative in the same run: a container start that runs nothing, and the whole in-image
check suite the tool runs before tagging.

    python3 bench/gradcheck.py --image REF [--reps 3]

REF is a built image (the real stack: `scripts/real-stack/build.sh mtp-cp-recompute`). Per rep,
interleaved: `docker run REF true`; `docker run REF python /opt/mtp/checks/gpu_check.py
--cpu-model --json` with this checkout's gpu_check.py mounted over the image's (both the
profile's own recipe with and without recompute; every verdict must be PASS, or the run
stops). The tool runs the same script as its `mtp-grad` check group; that group's time and the
whole suite's are in the build's log (docs/real-stack.md). Writes bench/gradcheck_results.json and prints
the table. No timing is asserted anywhere: the numbers are reported, the goal (30 s or less on
2 cores) is compared in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CHECK = REPO / "images" / "checks" / "gpu_check.py"
GOAL_S = 30.0


def _timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    return time.monotonic() - t0, proc


def _docker(image: str, *argv: str) -> list[str]:
    return ["docker", "run", "--rm", "-v", f"{CHECK}:/opt/mtp/checks/gpu_check.py:ro", image, *argv]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(BENCH / "gradcheck_results.json"))
    args = ap.parse_args()
    empty, check, inside = [], [], []
    for rep in range(args.reps):
        t, proc = _timed(["docker", "run", "--rm", args.image, "true"])
        if proc.returncode:
            sys.exit(f"docker run {args.image} true: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        empty.append(t)
        t, proc = _timed(
            _docker(args.image, "python", "/opt/mtp/checks/gpu_check.py", "--cpu-model", "--json")
        )
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        verdicts = {c["name"]: c["status"] for c in report["checks"] if c["status"] != "SKIP"}
        if proc.returncode or not verdicts or set(verdicts.values()) != {"PASS"}:
            sys.exit(f"the gradient check did not pass (exit {proc.returncode}): {verdicts}")
        check.append(t)
        inside.append(report["env"]["seconds"])
        print(
            f"rep {rep + 1}: empty container {empty[-1]:.1f} s, gradient check {check[-1]:.1f} s "
            f"(model work inside {inside[-1]:.1f} s; {', '.join(verdicts)})",
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in (("empty", empty), ("check", check), ("inside", inside))}
    result = {
        "image": args.image,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "reps": args.reps,
        "empty_container_s": empty,
        "gradient_check_s": check,
        "model_work_s": inside,
        "median": med,
        "check_minus_container_start_s": med["check"] - med["empty"],
        "goal_s": GOAL_S,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"| case | median of {args.reps} |")
    print("|---|---|")
    print(
        f"| `docker run IMAGE true` (container start, the plain alternative's floor) | {med['empty']:.1f} s |"
    )
    print(
        f"| gradient check, whole `docker run` (the profile's contract with and without recompute) | "
        f"{med['check']:.1f} s ({med['check'] / med['empty']:.1f}x an empty run; goal {GOAL_S:.0f} s: "
        f"{'met' if med['check'] <= GOAL_S else 'NOT met'}) |"
    )
    print(f"| of which the two model runs (build, forward, backward, step) | {med['inside']:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
