#!/usr/bin/env python3
"""What the images workflow's publish job costs now that it publishes the reproducible image
(issue 48 item 2), against the docker-engine publish it replaced, in one run, on the stand-in
test profile (tests/manifests/: loopback git sources, the digest-pinned test base).

    .venv/bin/python bench/publish_cost.py [--profile test-detach]

Needs scripts/setup-test-host.sh (dockerd, the registry binary, buildah) and root (each case
runs on a fresh dockerd). Each case is one job on a new runner: a fresh dockerd (its own data
root: empty image store and BuildKit cache), an empty tool cache (MTP_CACHE_DIR), pushing to
a registry of this run's own (its storage measured):
  stack            the stack job, `build.py stack --push` (docker; the before-case's cache)
  docker publish   the publish job before: the main job with --cache-from the pushed stack,
                   --push (only the mode layer is built)
  docker cold      the main job with docker and --push on the empty engine (no stack to reuse)
  reproducible     the publish job now: --engine buildah --no-cache --compression gzip --push
                   (a clean builder; nothing to reuse, by design)
While each runs, the disk it writes is sampled every second (du -sxb of the engine's data
root, the tool cache and this run's buildah scratch under /var/tmp/mtp-image-builder-UID);
the peak of their sum, each part's peak and what is left after are recorded, with the wall
time and the time of each phase (from the tool's output lines). Prints ratios reproducible /
docker publish and reproducible / docker cold; writes bench/publish_cost_results.json.
The real stack's figures are an extrapolation from these ratios and from docs/real-stack.md
(docs/ci.md, "The reproducible publish job: what it costs").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from mtpimage.demo.gitserver import serve_git_world  # noqa: E402
from mtpimage.demo.registry import private_registry  # noqa: E402
from mtpimage.engine import SCRATCH_PARENT, ocilayout  # noqa: E402
from tests.fixtures.dockerhost import probe_docker_host, remove_session_images  # noqa: E402
from tests.fixtures.freshdocker import du_bytes, fresh_dockerd  # noqa: E402
from tests.fixtures.image_fixtures import copy_manifests, make_test_base  # noqa: E402

PY = str(REPO / ".venv" / "bin" / "python")
SCRATCH = SCRATCH_PARENT / f"mtp-image-builder-{os.getuid()}" / "buildah"
BUILDAH_CACHE_MOUNTS = SCRATCH_PARENT / f"buildah-cache-{os.getuid()}"  # buildah's RUN cache mounts
# where a phase starts: the first output line with this prefix (mtpimage/assembly/pipeline.py;
# "compress": engine/layercompress.py, before the blobs are uploaded; "sbom": after them)
PHASES = (
    ("build", "image   "),
    ("checks", "test    in-image checks"),
    ("tag_and_push", "tagged  "),
    ("compress_and_upload_layers", "compress "),
    ("sbom_and_tags", "sbom    "),
)
COMPRESS_LINE = re.compile(r"^compress (\d+) layers \(([\d.]+) GB\)")


@dataclasses.dataclass
class Sampler:
    """Peak bytes of the parts a job writes, sampled in a thread while it runs."""

    parts: dict  # name -> callable returning bytes now
    peak_total: int = 0
    peak: dict = dataclasses.field(default_factory=dict)
    samples: int = 0

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(1.0)

    def sample(self) -> dict:
        now = {name: f() for name, f in self.parts.items()}
        self.samples += 1
        self.peak_total = max(self.peak_total, sum(now.values()))
        for name, value in now.items():
            self.peak[name] = max(self.peak.get(name, 0), value)
        return now

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def scratch_of(pid_box: list) -> int:
    """Bytes of this job's clean builders and layout scratch (names carry the tool's pid)."""
    if not pid_box or not SCRATCH.is_dir():
        return 0
    tag = f"-{pid_box[0]}-"
    return sum(du_bytes(p) for p in SCRATCH.iterdir() if tag in p.name)


def run_job(env: dict, args: list[str], parts: dict, pid_box: list) -> dict:
    """The tool as a job runs it; wall time, phase times, disk peaks, its output's tail."""
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    out: list[str] = []
    with Sampler(parts) as sampler:
        proc = subprocess.Popen(
            [PY, str(REPO / "build.py"), *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        pid_box.append(proc.pid)
        for line in proc.stdout:
            out.append(line.rstrip("\n"))
            for phase, prefix in PHASES:
                if phase not in marks and line.startswith(prefix):
                    marks[phase] = time.monotonic() - t0
        code = proc.wait()
        wall = time.monotonic() - t0
        after = sampler.sample()
    if code != 0:
        raise SystemExit(f"build.py {' '.join(args)} failed ({code}):\n" + "\n".join(out[-60:]))
    # each phase lasts until the next one that appeared (a phase a case lacks takes no time)
    seen = sorted((t, p) for p, t in marks.items()) + [(wall, "end")]
    phases = {p: round(seen[i + 1][0] - t, 1) for i, (t, p) in enumerate(seen[:-1])}
    return {
        "wall_s": round(wall, 1),
        "phases_s": phases,
        "peak_bytes": sampler.peak_total,
        "peak_bytes_by_part": sampler.peak,
        "after_bytes_by_part": after,
        "samples": sampler.samples,
        "output_tail": out[-12:],
        "output": out,
    }


def layout_bytes(cache: Path) -> int | None:
    """Bytes of the layer tars of the layout the reproducible engine kept in `cache`."""
    layouts = sorted((cache / "oci").iterdir()) if (cache / "oci").is_dir() else []
    if len(layouts) != 1:
        return None
    return sum(x["size"] for x in ocilayout.read(layouts[0]).manifest["layers"])


def registry_manifest(address: str, path: str, tag: str) -> dict:
    import urllib.request

    accept = (
        "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
    )
    req = urllib.request.Request(f"http://{address}/v2/{path}/manifests/{tag}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def line_value(output: list[str], prefix: str) -> str:
    return next(line.split()[1] for line in output if line.startswith(prefix))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="test-detach")
    opts = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: each case starts a fresh dockerd")
    host, problems = probe_docker_host()
    if host is None:
        raise SystemExit("; ".join(problems))
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="mtp-bench-publish-", dir="/var/tmp") as tmp:
        top = Path(tmp)
        with serve_git_world(top / "git") as world, private_registry(top / "registry") as address:
            host = dataclasses.replace(host, registry=address)
            try:
                manifests = copy_manifests(top / "manifests", make_test_base(host))
                storage = top / "registry" / "storage"
                base_env = {
                    **os.environ,
                    **world.env,
                    "MTP_DOCKER_CLI": host.cli,
                    "MTP_FASTPATH": "0",
                    "MTP_NO_BOOTSTRAP": "1",
                }
                common = ["--manifests", str(manifests)]
                cases = (
                    ("stack", "before", lambda reg: ["stack", *common, "--push", "--registry", reg]),
                    ("docker publish", "before", None),  # its cache options come from `stack`
                    ("docker cold", "cold", lambda reg: [*common, "--profile", opts.profile, "--push", "--registry", reg]),
                    (
                        "reproducible",
                        "repro",
                        lambda reg: [
                            *common, "--profile", opts.profile, "--engine", "buildah", "--no-cache",
                            "--compression", "gzip", "--push", "--registry", reg,
                        ],
                    ),
                )  # fmt: skip
                for i, (case, ns, argv_of) in enumerate(cases):
                    reg = f"{address}/bench-{ns}"
                    cache = top / f"cache-{i}"
                    env = {**base_env, "MTP_CACHE_DIR": str(cache)}
                    if argv_of is None:
                        proc = subprocess.run(
                            [PY, str(REPO / "build.py"), "stack", *common, "--cache-from-args",
                             "--profile", opts.profile, "--registry", reg],
                            cwd=REPO, env=env, capture_output=True, text=True, check=True,
                        )  # fmt: skip
                        args = [*common, "--profile", opts.profile, "--push", "--registry", reg]
                        args += proc.stdout.split()
                    else:
                        args = argv_of(reg)
                    registry_before = du_bytes(storage)
                    mounts_before = du_bytes(BUILDAH_CACHE_MOUNTS) if BUILDAH_CACHE_MOUNTS.exists() else 0
                    with fresh_dockerd(host.cli, f"pc{i}") as engine:
                        env["DOCKER_HOST"] = engine["DOCKER_HOST"]
                        root = Path(engine["root"])
                        pid_box: list = []
                        parts = {
                            "dockerd": lambda root=root: du_bytes(root),
                            "tool_cache": lambda cache=cache: du_bytes(cache) if cache.exists() else 0,
                            "buildah_scratch": lambda box=pid_box: scratch_of(box),
                        }
                        print(f"{case}: build.py {' '.join(args[2:])}", flush=True)
                        r = run_job(env, args, parts, pid_box)
                    r["registry_bytes_added"] = du_bytes(storage) - registry_before
                    if BUILDAH_CACHE_MOUNTS.exists():
                        r["buildah_cache_mounts_bytes_added"] = du_bytes(BUILDAH_CACHE_MOUNTS) - mounts_before
                    output = r.pop("output")
                    if case != "stack":
                        identity = line_value(output, "image   ").split(":", 1)[1]
                        m = registry_manifest(address, f"bench-{ns}/mtp-verl", identity)
                        compressed = [COMPRESS_LINE.match(x) for x in output if COMPRESS_LINE.match(x)]
                        r["image"] = {
                            "digest": line_value(output, "digest  "),
                            "compress_line_gb": float(compressed[0].group(2)) if compressed else None,
                            # the kept layout's layer tars (reproducible only): the image unpacked
                            "unpacked_bytes": layout_bytes(cache),
                            "layers": len(m["layers"]),
                            "layer_media_types": sorted({x["mediaType"] for x in m["layers"]}),
                            "compressed_bytes": sum(x["size"] for x in m["layers"]),
                        }
                    results[case] = r
                    print(
                        f"{case}: {r['wall_s']} s, peak {r['peak_bytes'] / 1e6:.1f} MB {r['phases_s']}",
                        flush=True,
                    )
            finally:
                remove_session_images(host.cli, [f"{address}/"])
    repro, pub, cold = results["reproducible"], results["docker publish"], results["docker cold"]
    image_gb = repro["image"]["unpacked_bytes"] / 1e9
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "buildah": subprocess.run(["buildah", "--version"], capture_output=True, text=True).stdout.strip(),
        "profile": opts.profile,
        "cases": results,
        "ratios": {
            "time_reproducible_vs_docker_publish": round(repro["wall_s"] / pub["wall_s"], 2),
            "time_reproducible_vs_docker_cold": round(repro["wall_s"] / cold["wall_s"], 2),
            "peak_disk_reproducible_vs_docker_publish": round(repro["peak_bytes"] / pub["peak_bytes"], 2),
            "peak_disk_reproducible_vs_docker_cold": round(repro["peak_bytes"] / cold["peak_bytes"], 2),
            "registry_bytes_reproducible_vs_docker_publish": round(
                repro["registry_bytes_added"] / max(pub["registry_bytes_added"], 1), 2
            ),
            "registry_bytes_reproducible_vs_docker_cold": round(
                repro["registry_bytes_added"] / max(cold["registry_bytes_added"], 1), 2
            ),
        },
        # the peak of each case over the image's uncompressed size (the layout's tars): what the
        # real stack's figures are extrapolated from (docs/ci.md)
        "peak_over_image": {
            case: round(r["peak_bytes"] / (image_gb * 1e9), 2)
            for case, r in results.items()
            if case != "stack"
        },
        "reproducible_compress_and_upload_mb_per_s": round(
            image_gb * 1e3 / repro["phases_s"]["compress_and_upload_layers"], 1
        ),
    }
    (BENCH / "publish_cost_results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
