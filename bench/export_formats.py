#!/usr/bin/env python3
"""Squashfs compressions of `export` (issue 48 item 4) against gzip, in one run: size, export
time, and the time a node takes to read the file back.

    .venv/bin/python bench/export_formats.py [--image REF ...] [--reps 3] [--processors 1]

Without --image it measures the stand-in test profile's image (tests/manifests/ `test-detach`:
what the e2e tests build), `mtp-verl:test-detach` where one is local, else it builds one
(loopback git sources, digest-pinned test base; needs scripts/setup-test-host.sh) and removes
the tags it made at the end; each --image (repeatable)
is measured as it is. Each image is unpacked once (`docker export`, as `export` does); then
each rep, for every compression of data/runtimes.yaml in turn (interleaved, so a load change
hits each alike):

  export     mksquashfs with export's own arguments (outputs/squashfs.py `squash`)
  unsquashfs `unsquashfs -d DIR` into tmpfs (/dev/shm), what pyxis's `enroot create` runs on
             every node of a job
  squashfuse every file read through a squashfuse mount, what `enroot start FILE.sqsh`, pyxis
             with use_squashfuse and Apptainer without setuid read through (only where
             squashfuse and /dev/fuse are; skipped otherwise)

The squashfs was just written, so reads come from the page cache: decompression and file
creation, not the disk, are what is timed. Medians of the reps; ratios are against gzip
(mksquashfs's default, what export wrote before issue 48). Also checks that every rep wrote
the same bytes per compression. Writes bench/export_formats.json; docs/clusters.md quotes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from mtpimage import engine  # noqa: E402
from mtpimage.engine.ocilayout import file_sha256  # noqa: E402
from mtpimage.outputs import runtimes  # noqa: E402
from mtpimage.outputs.squashfs import squash, unpack  # noqa: E402

PROFILE = "test-detach"
# Settings export does not offer, measured beside its own for context (not choices): zstd at
# mksquashfs's 128 KiB blocks (export's zstd uses pyxis's 1 MiB), and enroot's own default
# for the squashfs files it imports (ENROOT_SQUASH_OPTIONS: data blocks uncompressed).
VARIANTS = {
    "zstd-128k": ("-comp", "zstd", "-Xcompression-level", "3"),
    "enroot-lzo-noD": ("-comp", "lzo", "-noD"),
}
PY = str(REPO / ".venv" / "bin" / "python")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _timed(fn, *args, **kwargs) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the children it waited for) of `fn(*args, **kwargs)`."""
    c0, t0 = _children_cpu(), time.monotonic()
    fn(*args, **kwargs)
    return time.monotonic() - t0, _children_cpu() - c0


def _du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _squashfuse_read(image: Path, mnt: Path) -> tuple[float, float]:
    """(wall seconds to read every regular file through a squashfuse mount, CPU seconds of
    squashfuse itself: its decompression)."""
    mnt.mkdir(exist_ok=True)
    fuse = subprocess.Popen(["squashfuse", "-f", str(image), str(mnt)])
    try:
        while not os.path.ismount(mnt):
            if fuse.poll() is not None:
                raise SystemExit(f"squashfuse {image} ended with {fuse.returncode}")
            time.sleep(0.05)
        t0 = time.monotonic()
        # cat, not tar to /dev/null: GNU tar skips reading file data when writing to /dev/null
        subprocess.run(
            ["find", str(mnt), "-type", "f", "-exec", "cat", "{}", "+"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wall = time.monotonic() - t0
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    _, _, usage = os.wait4(fuse.pid, 0)  # squashfuse -f ends with its mount
    fuse.returncode = 0
    return wall, usage.ru_utime + usage.ru_stime


def _build_test_image() -> tuple[str, list[str], object]:
    """Build the test profile like the e2e tests; returns (image, tags to remove, cleanup)."""
    from mtpimage.demo.gitserver import serve_git_world
    from tests.fixtures.dockerhost import probe_docker_host
    from tests.fixtures.image_fixtures import copy_manifests, make_test_base

    host, problems = probe_docker_host()
    if host is None:
        raise SystemExit("; ".join(problems))
    host = dataclasses.replace(host, registry=os.environ.get("MTP_TEST_REGISTRY", "127.0.0.1:5000"))
    tmp = tempfile.TemporaryDirectory(prefix="mtp-bench-export-")
    world_cm = serve_git_world(Path(tmp.name) / "git")
    world = world_cm.__enter__()
    manifests = copy_manifests(Path(tmp.name) / "manifests", make_test_base(host))
    env = {
        **os.environ,
        **world.env,
        "MTP_CACHE_DIR": str(Path(tmp.name) / "cache"),
        "MTP_DOCKER_CLI": host.cli,
    }
    proc = subprocess.run(
        [PY, str(REPO / "build.py"), "--manifests", str(manifests), "--profile", PROFILE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"building {PROFILE} failed: {(proc.stdout + proc.stderr)[-3000:]}")
    image = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("image "))

    def cleanup():
        world_cm.__exit__(None, None, None)
        tmp.cleanup()

    return image, [image], cleanup


def _same_image(ref_a: str, ref_b: str) -> bool:
    ids = [
        subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", r], capture_output=True, text=True
        ).stdout
        for r in (ref_a, ref_b)
    ]
    return ids[0].strip() != "" and ids[0] == ids[1]


def measure(image: str, label: str, opts, eng) -> dict:
    """One image: every compression and variant, opts.reps times, interleaved."""
    fuse = shutil.which("squashfuse") is not None and os.path.exists("/dev/fuse")
    scratch = Path("/dev/shm") if os.path.isdir("/dev/shm") else None
    comps = {n: c.args for n, c in runtimes.compressions().items()} | VARIANTS
    kinds = ("export", "unsquashfs", "squashfuse")
    wall: dict[str, dict[str, list[float]]] = {n: {k: [] for k in kinds} for n in comps}
    cpu: dict[str, dict[str, list[float]]] = {n: {k: [] for k in kinds} for n in comps}
    sizes: dict[str, int] = {}
    digests: dict[str, set[str]] = {n: set() for n in comps}
    with (
        tempfile.TemporaryDirectory(prefix="mtp-bench-export-") as tmp,
        tempfile.TemporaryDirectory(prefix="mtp-bench-unsquash-", dir=scratch) as unsquash,
    ):
        root = Path(tmp) / "rootfs"
        root.mkdir()
        unpack(image, eng, root)
        tree_bytes = _du(root)
        for rep in range(opts.reps):
            for name, args in comps.items():
                out = Path(tmp) / f"{name}.sqsh"
                comp = runtimes.SquashCompression(name, args, "")
                got = {"export": _timed(squash, root, out, comp, processors=opts.processors)}
                sizes[name] = out.stat().st_size
                digests[name].add(file_sha256(out))
                dest = Path(unsquash) / "unpacked"
                cmd = [
                    "unsquashfs",
                    "-no-progress",
                    "-processors",
                    str(opts.processors),
                    "-d",
                    str(dest),
                    str(out),
                ]
                got["unsquashfs"] = _timed(subprocess.run, cmd, check=True, capture_output=True)
                shutil.rmtree(dest)
                if fuse:
                    got["squashfuse"] = _squashfuse_read(out, Path(tmp) / "mnt")
                out.unlink()
                for kind, (w, c) in got.items():
                    wall[name][kind].append(w)
                    cpu[name][kind].append(c)
                row = "  ".join(f"{k} {w:.2f}s wall {c:.2f}s cpu" for k, (w, c) in got.items())
                print(f"{label}: rep {rep + 1} {name:<14} {sizes[name] / 1e6:8.1f} MB  {row}", flush=True)

    def medians(t):
        return {n: {k: statistics.median(v) for k, v in d.items() if v} for n, d in t.items()}

    med_wall, med_cpu = medians(wall), medians(cpu)

    def ratios(med):
        gz = med["gzip"]
        return {n: {"size": sizes[n] / sizes["gzip"], **{k: m[k] / gz[k] for k in m}} for n, m in med.items()}

    return {
        "image": label,
        "tree_bytes": tree_bytes,
        "bytes": sizes,
        "wall_s": wall,
        "cpu_s": cpu,
        "median_wall_s": med_wall,
        "median_cpu_s": med_cpu,
        "vs_gzip_cpu": ratios(med_cpu),
        "vs_gzip_wall": ratios(med_wall),
        "same_bytes_every_rep": {n: len(d) == 1 for n, d in digests.items()},
        "squashfuse": fuse,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--image",
        action="append",
        help=f"a local image to measure (repeatable; default: build the test profile {PROFILE})",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--processors", type=int, default=1, help="mksquashfs/unsquashfs threads (default 1: steadier ratios)"
    )
    ap.add_argument("--out", type=Path, default=BENCH / "export_formats.json")
    opts = ap.parse_args()
    eng = engine.named("docker")
    runs = []
    for image in opts.image or []:
        runs.append(measure(image, image, opts, eng))
    if (
        not opts.image and eng.image_id(f"mtp-verl:{PROFILE}") is not None
    ):  # an e2e run left it: read it as it is
        runs.append(
            measure(f"mtp-verl:{PROFILE}", f"the test profile {PROFILE} (tests/manifests/)", opts, eng)
        )
    elif not opts.image:
        image, _, cleanup = _build_test_image()
        try:
            runs.append(measure(image, f"the test profile {PROFILE} (tests/manifests/)", opts, eng))
        finally:
            # its content tag is this run's; the profile tag only while it still names this image
            # (another run on this host may have moved it since)
            if _same_image(f"mtp-verl:{PROFILE}", image):
                subprocess.run(
                    ["docker", "image", "rm", "--no-prune", f"mtp-verl:{PROFILE}"], capture_output=True
                )
            subprocess.run(["docker", "image", "rm", "--no-prune", image], capture_output=True)
            cleanup()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs (shared, loaded: load average "
        f"{os.getloadavg()[0]:.1f} at the end), {platform.platform()}",
        "reps": opts.reps,
        "processors": opts.processors,
        "mksquashfs": subprocess.run(
            ["mksquashfs", "-version"], capture_output=True, text=True
        ).stdout.splitlines()[0],
        "settings": {n: " ".join(c.args) for n, c in runtimes.compressions().items()}
        | {n: " ".join(a) for n, a in VARIANTS.items()},
        "note": "ratios against gzip; CPU seconds (the children's user+system time; squashfuse's own "
        "for the mount) are steady under load, wall seconds are not on this shared machine",
        "runs": runs,
    }
    opts.out.write_text(json.dumps(result, indent=2) + "\n")
    for run in runs:
        print(run["image"], json.dumps(run["vs_gzip_cpu"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
