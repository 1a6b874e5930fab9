#!/usr/bin/env python3
"""Benchmark of the in-image checks (issue 28), old against new in one run.

    python3 bench/checks.py [--reps 3] [--image REF ...] [--no-test-image] [--old-ref REV]

For each image: `docker run` of it with the checks of --old-ref (one fresh interpreter per
module) and of this checkout (fork servers) mounted over /opt/mtp/checks, interleaved rep
by rep: the whole check run, the import check alone, and the run of a mode-layer-only change
(this checkout's run_checks.py told to reuse every reusable group, as the tool tells it on
an image whose lower layers passed). Verdicts must agree check by check. With the test
image (default: built like bench/run.py builds it, needs scripts/setup-test-host.sh), also
the tool itself: `build.py test` of a second profile with the same lower layers, reusing vs
--full-checks. Writes bench/checks_results.json and prints the table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
FILES = ("run_checks.py", "import_skip.txt", "gpu_check.py", "import_server.py")


def log(msg: str) -> None:
    print(f"[checks {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# What the checks know about the stack (which modules need a GPU at import), not how they run:
# taken from this checkout on both sides, so that old and new judge the same facts.
DATA = ("import_skip.txt",)


def old_checks(rev: str, dest: Path) -> Path:
    """images/checks/ as it was at `rev` (the files it had), with this checkout's DATA."""
    dest.mkdir(parents=True)
    for name in DATA:
        (dest / name).write_bytes((REPO / "images" / "checks" / name).read_bytes())
    for name in FILES:
        if name in DATA:
            continue
        proc = subprocess.run(["git", "show", f"{rev}:images/checks/{name}"], cwd=REPO, capture_output=True)
        if proc.returncode == 0:
            (dest / name).write_bytes(proc.stdout)
    return dest


def in_image(image: str, checks: Path, *args: str) -> tuple[float, list[dict]]:
    """(seconds, results) of run_checks.py from `checks`, mounted over the image's own."""
    argv = ["docker", "run", "--rm", "-v", f"{checks}:/opt/mtp/checks:ro", image]
    argv += ["python", "/opt/mtp/checks/run_checks.py", "--json", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    dt = time.perf_counter() - t0
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            return dt, json.loads(line)["results"]
        except (ValueError, KeyError):
            continue
    raise RuntimeError(f"no results from {image}: {proc.stdout[-800:]} {proc.stderr[-800:]}")


def reuse_all(results: list[dict]) -> list[str]:
    digests = {r["group"]: r["inputs"] for r in results if r.get("inputs")}
    return [a for g, d in sorted(digests.items()) for a in ("--reuse", f"{g}={d}")]


def verdicts(results: list[dict]) -> dict[str, str]:
    """check -> status; an entry check the new checks split in two (`entry:X:import`, run
    where it can be reused, and `entry:X:config`, the mode's overrides) is one verdict, as
    the old checks ran it in one interpreter: pass only when both parts pass."""
    out: dict[str, str] = {}
    for r in results:
        cid = r["id"]
        if cid.startswith("entry:") and cid.endswith((":import", ":config")):
            cid = cid.rsplit(":", 1)[0]
            if out.get(cid, "pass") != "pass":
                continue
        out[cid] = r["status"]
    return out


def compare(image: str, old: Path, new: Path, reps: int) -> dict:
    """Old vs new on one image, interleaved rep by rep (the machine's load moves)."""
    t = {k: [] for k in ("old_all", "new_all", "old_imports", "new_imports", "new_mode_layer_only")}
    agree, last, only, differ = True, {}, {}, {}
    for rep in range(reps):
        log(f"{image} rep {rep + 1}/{reps}")
        t["old_all"].append((dt := in_image(image, old))[0])
        old_results = dt[1]
        t["new_all"].append((dt := in_image(image, new))[0])
        new_results = dt[1]
        vo, vn = verdicts(old_results), verdicts(new_results)
        # checks added since the old revision (gpu-imports) have no old verdict to agree with
        differ = {k: {"old": vo[k], "new": vn[k]} for k in sorted(vo.keys() & vn.keys()) if vo[k] != vn[k]}
        agree &= not differ
        only = {"old": sorted(vo.keys() - vn.keys()), "new": sorted(vn.keys() - vo.keys())}
        t["old_imports"].append(in_image(image, old, "--only", "imports")[0])
        t["new_imports"].append(in_image(image, new, "--only", "imports")[0])
        dt, reused = in_image(image, new, *reuse_all(new_results))
        t["new_mode_layer_only"].append(dt)
        last = {"old": old_results, "new": new_results, "reused": reused}
    med = {k: statistics.median(v) for k, v in t.items()}
    return {
        "image": image,
        "reps": reps,
        "seconds": t,
        "median": med,
        "ratio_all": med["old_all"] / med["new_all"],
        "ratio_imports": med["old_imports"] / med["new_imports"],
        "ratio_mode_layer_only": med["old_all"] / med["new_mode_layer_only"],
        "verdicts_agree": agree,
        "checks_on_one_side": only,
        "verdicts_differ": differ,
        "reused_groups": sorted({r["group"] for r in last["reused"] if r["status"] == "reused"}),
        "new_per_check": {r["id"]: r.get("seconds") for r in last["new"]},
        "imports_detail": next(r["detail"] for r in last["new"] if r["id"] == "imports"),
    }


def test_image_case(tmp: Path, reps: int) -> tuple[str, dict]:
    """Build test-detach and test-cp-recompute (same pins, other mode layer) with the tool;
    time `build.py test` of the second reusing the first's checks vs --full-checks."""
    import bench.run as run
    from tests.fixtures.dockerhost import probe_docker_host
    from tests.fixtures.servers import serve_git_world

    host, problems = probe_docker_host()
    if host is None:
        raise RuntimeError("host not ready: " + "; ".join(problems))
    import dataclasses

    host = dataclasses.replace(host, registry=host.registry or "127.0.0.1:5000")
    world_cm = serve_git_world(tmp / "git-world")
    world = world_cm.__enter__()
    os.environ.update(world.env)
    os.environ["MTP_CACHE_DIR"] = str(tmp / "src-cache")
    os.environ["MTP_DOCKER_CLI"] = host.cli
    b = run.Bench(host, world, tmp, 1)
    b.setup()  # builds test-detach through the tool (build + checks + push)
    other = "test-cp-recompute"
    b.tool("--profile", other)
    b.local_refs |= {f"mtp-verl:{b.ident[other]}", f"mtp-verl:{other}"}
    image = f"mtp-verl:{b.ident[run.PROFILE]}"
    tool = {"reuse": [], "full": []}
    for _ in range(reps):
        tool["full"].append(b.tool("test", "--profile", other, "--full-checks")[0])
        dt, proc = b.tool("test", "--profile", other)
        tool["reuse"].append(dt)
    tool["table"] = proc.stdout
    tool["median"] = {k: statistics.median(tool[k]) for k in ("reuse", "full")}
    return image, {"tool_test_second_profile": tool, "_cleanup": (b, world_cm)}


def table(cases: list[dict]) -> str:
    rows = [
        "| image | all checks: old | new | old/new | import check: old | new | old/new "
        "| mode-layer-only change: new (reused) | old/that | verdicts agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        m = c["median"]
        rows.append(
            f"| {c['image']} | {m['old_all']:.1f} s | {m['new_all']:.1f} s | {c['ratio_all']:.1f}x "
            f"| {m['old_imports']:.1f} s | {m['new_imports']:.1f} s | {c['ratio_imports']:.1f}x "
            f"| {m['new_mode_layer_only']:.1f} s ({', '.join(c['reused_groups'])}) "
            f"| {c['ratio_mode_layer_only']:.1f}x | {'yes' if c['verdicts_agree'] else '**no**'} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--image", action="append", default=[], help="also measure this local image")
    ap.add_argument("--no-test-image", action="store_true", help="do not build the test image")
    ap.add_argument("--old-ref", default="0748089^", help="the checks before issue 28 (git revision)")
    ap.add_argument("--out", default=str(BENCH / "checks_results.json"))
    args = ap.parse_args()
    out: dict = {"command": "python3 bench/checks.py " + " ".join(sys.argv[1:]), "cases": []}
    out["load_before"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mtp-bench-checks-") as tmpdir:
        tmp = Path(tmpdir)
        old = old_checks(args.old_ref, tmp / "old")
        new = REPO / "images" / "checks"
        cleanup = None
        try:
            images = list(args.image)
            if not args.no_test_image:
                image, extra = test_image_case(tmp, args.reps)
                cleanup = extra.pop("_cleanup")
                out.update(extra)
                images.insert(0, image)
            for image in images:
                out["cases"].append(compare(image, old, new, args.reps))
        finally:
            if cleanup:
                b, world_cm = cleanup
                b.cleanup()
                world_cm.__exit__(None, None, None)
    out["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(table(out["cases"]))
    tool = out.get("tool_test_second_profile")
    if tool:
        print(
            f"build.py test of a second profile on the same lower layers: {tool['median']['reuse']:.1f} s "
            f"reusing, {tool['median']['full']:.1f} s with --full-checks"
        )
    return 0 if all(c["verdicts_agree"] for c in out["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
