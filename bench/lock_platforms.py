#!/usr/bin/env python3
"""Lock time of every shipped profile for linux/amd64 + linux/arm64 against linux/amd64 alone,
in the same run (issue 49 item 3).

    both   `python build.py lock` of the shipped manifests (builds.lock_platforms: linux/amd64,
           linux/arm64): two uv resolutions per python set, two file choices, two sets of build
           backends
    amd64  the same manifests with builds.lock_platforms: [linux/amd64] and lock.yaml's amd64
           part alone (what a lock was before): the plain alternative

Alternating rounds. Cold: the uv cache, uv's online markers and the chosen-file cache emptied
(git trees and the probe wheel kept, as bench/lock_speed.py's cold). Warm: the same cache again.
Each run's lock.yaml is compared with the first of its kind (deterministic: byte-identical), and
the amd64 set of `both` with amd64's (the second platform changes nothing of the first). Needs
what `lock` needs: PyPI and the git sources (here: upstream snapshots through url.insteadOf,
MTP_GIT_ALLOW_MISSING_BLOBS=1) in $MTP_CACHE_DIR. Writes bench/lock_platforms_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
AMD_ONLY = "  lock_platforms: [linux/amd64]\n"


def _manifests(dest: Path, kind: str) -> Path:
    out = dest / f"m-{kind}"
    shutil.copytree(ROOT / "manifests", out)
    if kind == "amd64":
        text = (out / "components.yaml").read_text()
        lines = [
            AMD_ONLY if line.strip().startswith("lock_platforms:") else line for line in text.splitlines(True)
        ]
        assert AMD_ONLY in lines, "components.yaml has no builds.lock_platforms line"
        (out / "components.yaml").write_text("".join(lines))
        lock = yaml.safe_load((out / "lock.yaml").read_text())
        for prof in lock["profiles"].values():
            prof.pop("platform_sets", None)
        lock["target"].pop("other_platforms", None)
        lock["base_image"].pop("platforms", None)
        sys.path.insert(0, str(ROOT))
        from mtpimage.lock import lockfile

        live = {p["python_set"] for p in lock["profiles"].values()}
        lock["python_sets"] = {k: v for k, v in lock["python_sets"].items() if k in live}
        lockfile.write(out / "lock.yaml", lock)
    return out


def _run(manifests: Path, cache: Path, cold: bool, seed: Path) -> tuple[float, str, bytes]:
    if cold:
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        for part in ("git", "pypi"):  # the sources and the probe wheel stay, as lock_speed's cold
            if (seed / part).is_dir():
                shutil.copytree(seed / part, cache / part)
    env = {**os.environ, "MTP_CACHE_DIR": str(cache)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "lock", "--manifests", str(manifests)],
        capture_output=True,
        text=True,
        env=env,
    )
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"lock failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return took, proc.stdout.splitlines()[0], (manifests / "lock.yaml").read_bytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    seed = Path(os.environ.get("MTP_CACHE_DIR") or Path.home() / ".cache" / "mtp-image-builder")
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="mtp-bench-lockplat-") as tmp:
        tmpd = Path(tmp)
        kinds = {k: _manifests(tmpd, k) for k in ("amd64", "both")}
        first: dict[str, bytes] = {}
        for mode in ("cold", "warm"):
            for r in range(args.rounds):
                for kind, m in kinds.items():
                    took, line, data = _run(m, tmpd / f"cache-{kind}", mode == "cold", seed)
                    first.setdefault(kind, data)
                    runs.setdefault(f"{kind} {mode}", []).append(
                        {"seconds": round(took, 1), "summary": line, "identical": data == first[kind]}
                    )
                    print(f"{kind:5} {mode} {r + 1}: {took:6.1f} s  {line}", flush=True)
        docs = {k: yaml.safe_load(v) for k, v in first.items()}
    amd_key = docs["both"]["profiles"]["mtp-rollout"]["python_set"]
    arm_key = docs["both"]["profiles"]["mtp-rollout"]["platform_sets"]["linux/arm64"]
    amd, arm = docs["both"]["python_sets"][amd_key], docs["both"]["python_sets"][arm_key]
    both_files = [n for n in amd["packages"] if n in arm["packages"] and amd["packages"][n].get("file")]
    med = {k: round(statistics.median(r["seconds"] for r in v), 2) for k, v in runs.items()}
    out = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores, shared), {platform.platform()}",
        "runs": runs,
        "median_seconds": med,
        "ratio_both_over_amd64": {
            mode: round(med[f"both {mode}"] / med[f"amd64 {mode}"], 2) for mode in ("cold", "warm")
        },
        "deterministic": all(r["identical"] for v in runs.values() for r in v),
        "amd64_set_unchanged_by_arm64": docs["amd64"]["python_sets"][amd_key] == amd,
        "packages": {"linux/amd64": len(amd["packages"]), "linux/arm64": len(arm["packages"])},
        "only_arm64": sorted(set(arm["packages"]) - set(amd["packages"])),
        "only_amd64": sorted(set(amd["packages"]) - set(arm["packages"])),
        "files_in_both": len(both_files),
        "files_differ": sum(
            1 for n in both_files if amd["packages"][n]["sha256"] != arm["packages"][n]["sha256"]
        ),
        "no_wheel_arm64": arm.get("no_wheel") or {},
    }
    (ROOT / "bench" / "lock_platforms_results.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
