#!/usr/bin/env python3
"""Bytes a node pulls, and the time to pull and unpack them, per layer format of a reproducible
image (issue 48): uncompressed (what --reproducible published before), gzip and zstd, in one run.

    python3 bench/compression.py --image REF        # a reproducible image built here (its layout is kept)
    python3 bench/compression.py --layer-dir DIR    # a one-layer image of DIR's files (the torch layer)
        [--registry 127.0.0.1:5000/bench-compression] [--out FILE] [--reps 1]

Per format: the tool's own compressor makes the published form (layercompress.form: the time to
compress is measured), the layers' bytes are counted, the form is pushed to the loopback
registry, and each client Debian 12 ships that reads it pulls and unpacks it into empty storage:
  - docker 20.10 (`docker pull` after `docker rmi`: download, decompress, unpack into overlay2;
    it cannot read zstd, and it skips layers dockerd already has by diff ID, so its numbers are
    meaningful for --layer-dir only);
  - podman 4.3 (`podman pull` into a fresh --root);
  - skopeo 1.9 + umoci (`skopeo copy` to an OCI layout, `umoci unpack` into a rootfs).
What a client cannot read is recorded as its error, not a time. Writes the JSON next to this
script (compression_results[_NAME].json) and prints the table with ratios against gzip and
against the uncompressed bytes. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from mtpimage.engine import layercompress, ocilayout  # noqa: E402
from mtpimage.imageref import ImageRef, Registry  # noqa: E402
from mtpimage.publish.registryclient import RegistryClient  # noqa: E402

FORMATS = ("none", "gzip", "zstd")


def layout_of_image(ref: str) -> ocilayout.Layout:
    """The kept layout of a reproducible image built here."""
    from mtpimage.engine.buildahengine import BuildahEngine

    eng = BuildahEngine()
    found = eng.image_id(ref)
    if found is None:
        sys.exit(f"{ref}: no reproducible build of it here (build it with --engine buildah)")
    return ocilayout.read(eng.layout_of(found))


def layout_of_dir(src: Path, dest: Path) -> ocilayout.Layout:
    """A one-layer OCI layout of the files under `src` (as /), made the way the tool's layers
    are: sorted entries, mtime 0, root-owned."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    part = blobs / "layer.part"
    with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = Path(root) / name
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(src)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    diff_id = "sha256:" + ocilayout.file_sha256(part)
    size = part.stat().st_size
    os.replace(part, blobs / diff_id.split(":")[1])
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/true"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_bytes = ocilayout.canonical(config)
    (blobs / ocilayout.sha256_hex(config_bytes)).write_bytes(config_bytes)
    manifest = {
        "config": {
            "digest": "sha256:" + ocilayout.sha256_hex(config_bytes),
            "mediaType": ocilayout.OCI_CONFIG,
            "size": len(config_bytes),
        },
        "layers": [{"digest": diff_id, "mediaType": ocilayout.OCI_LAYER, "size": size}],
        "mediaType": ocilayout.OCI_MANIFEST,
        "schemaVersion": 2,
    }
    manifest_bytes = ocilayout.canonical(manifest)
    (blobs / ocilayout.sha256_hex(manifest_bytes)).write_bytes(manifest_bytes)
    index = {
        "manifests": [
            {
                "digest": "sha256:" + ocilayout.sha256_hex(manifest_bytes),
                "mediaType": ocilayout.OCI_MANIFEST,
                "size": len(manifest_bytes),
            }
        ],
        "schemaVersion": 2,
    }
    (dest / "index.json").write_bytes(ocilayout.canonical(index))
    return ocilayout.read(dest)


def push(form: layercompress.Form, ref: ImageRef) -> str:
    client = RegistryClient(Registry(ref.host, ""))
    manifest = form.manifest
    for desc in [*manifest["layers"], manifest["config"]]:
        if not client.blob_exists(ref.path, desc["digest"]):
            client.upload_blob(ref.path, desc["digest"], form.blob(desc["digest"]))
    client.put_manifest(ref.path, ref.tag, form.manifest_bytes, ocilayout.OCI_MANIFEST)
    return form.digest


def _run(argv: list[str], timeout: float = 3600) -> tuple[float, str | None]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    if proc.returncode:
        return took, " ".join((proc.stderr or proc.stdout).split())[-240:] or f"exit {proc.returncode}"
    return took, None


def pull_docker(ref: str, scratch: Path) -> tuple[float, str | None]:
    subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)
    took, err = _run(["docker", "pull", "-q", ref])
    subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)
    return took, err


def pull_podman(ref: str, scratch: Path) -> tuple[float, str | None]:
    root = scratch / "podman"
    try:
        return _run(
            [
                "podman",
                "--root",
                str(root / "root"),
                "--runroot",
                str(root / "run"),
                "pull",
                "-q",
                "--tls-verify=false",
                ref,
            ]
        )
    finally:
        subprocess.run(
            ["podman", "--root", str(root / "root"), "--runroot", str(root / "run"), "system", "reset", "-f"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def pull_skopeo_umoci(ref: str, scratch: Path) -> tuple[float, str | None]:
    oci, bundle = scratch / "pulled-oci", scratch / "pulled-bundle"
    try:
        t1, err = _run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}", f"oci:{oci}:img"])
        if err:
            return t1, f"skopeo: {err}"
        t2, err = _run(["umoci", "unpack", "--image", f"{oci}:img", str(bundle)])
        return t1 + t2, f"umoci: {err}" if err else None
    finally:
        shutil.rmtree(oci, ignore_errors=True)
        shutil.rmtree(bundle, ignore_errors=True)


CLIENTS = {"docker": pull_docker, "podman": pull_podman, "skopeo+umoci": pull_skopeo_umoci}
NEEDS = {"docker": ["docker"], "podman": ["podman"], "skopeo+umoci": ["skopeo", "umoci"]}


def _version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return "absent"
    return " ".join(out.split())[:80]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--image", help="a reproducible image built here")
    src.add_argument("--layer-dir", type=Path, help="a directory: a one-layer image of its files")
    ap.add_argument("--name", default="", help="a name for this input in the results file")
    ap.add_argument("--registry", default="127.0.0.1:5000/bench-compression")
    ap.add_argument("--scratch", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    name = args.name or (args.image or args.layer_dir.name).replace("/", "_").replace(":", "_")
    out = args.out or BENCH / f"compression_results_{name}.json"
    with tempfile.TemporaryDirectory(prefix="mtp-bench-compression-", dir=args.scratch) as tmp:
        tmp = Path(tmp)
        t0 = time.monotonic()
        layout = layout_of_image(args.image) if args.image else layout_of_dir(args.layer_dir, tmp / "oci")
        prepare_s = time.monotonic() - t0
        tag = hashlib.sha256(layout.image_id.encode()).hexdigest()[:8]
        rows = []
        for fmt in FORMATS:
            c = layercompress.named(fmt)
            t0 = time.monotonic()
            form = layercompress.form(layout, c, say=lambda line: print(line, file=sys.stderr))
            compress_s = time.monotonic() - t0
            size = sum(d["size"] for d in form.manifest["layers"])
            ref = ImageRef.parse(f"{args.registry}/img:{fmt}-{tag}")
            t0 = time.monotonic()
            digest = push(form, ref)
            push_s = time.monotonic() - t0
            pulls = {}
            for client, fn in CLIENTS.items():
                if not all(shutil.which(t) for t in NEEDS[client]):
                    pulls[client] = {"error": "not installed"}
                    continue
                times, err = [], None
                for _ in range(args.reps):
                    took, err = fn(f"{ref.host}/{ref.path}@{digest}", tmp)
                    if err:
                        break
                    times.append(took)
                pulls[client] = {"error": err} if err else {"seconds": min(times), "all": times}
                print(f"  {fmt:<5} {client:<13} {pulls[client]}", file=sys.stderr)
            rows.append(
                {
                    "format": fmt,
                    "how": c.annotation if c.compresses else "uncompressed tars",
                    "bytes": size,
                    "compress_s": round(compress_s, 2),
                    "push_s": round(push_s, 2),
                    "digest": digest,
                    "pull_unpack": pulls,
                }
            )
    by = {r["format"]: r for r in rows}
    ratios = {
        "bytes_gzip_over_none": round(by["gzip"]["bytes"] / by["none"]["bytes"], 3),
        "bytes_zstd_over_none": round(by["zstd"]["bytes"] / by["none"]["bytes"], 3),
        "bytes_zstd_over_gzip": round(by["zstd"]["bytes"] / by["gzip"]["bytes"], 3),
        "compress_zstd_over_gzip": round(by["zstd"]["compress_s"] / max(by["gzip"]["compress_s"], 1e-9), 3),
    }
    for client in CLIENTS:
        z, g = by["zstd"]["pull_unpack"][client], by["gzip"]["pull_unpack"][client]
        if "seconds" in z and "seconds" in g:
            ratios[f"pull_unpack_zstd_over_gzip_{client}"] = round(z["seconds"] / g["seconds"], 3)
    result = {
        "input": args.image or str(args.layer_dir),
        "uncompressed_bytes": by["none"]["bytes"],
        "layers": len(layout.manifest["layers"]),
        "prepare_s": round(prepare_s, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "tools": {t: _version(t) for t in ("docker", "podman", "skopeo", "umoci")},
        "formats": rows,
        "ratios": ratios,
        "note": "one run on a shared 2-core builder; registry on loopback (no network cost in the pull times)",
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'format':<6} {'bytes':>14} {'x none':>7} {'compress s':>11}  pull+unpack s (docker / podman / skopeo+umoci)"
    )
    for r in rows:
        pulls = " / ".join(
            f"{p['seconds']:.1f}" if "seconds" in p else "n/a" for p in r["pull_unpack"].values()
        )
        print(
            f"{r['format']:<6} {r['bytes']:>14,} {r['bytes'] / by['none']['bytes']:>7.3f} "
            f"{r['compress_s']:>11.1f}  {pulls}"
        )
    print(json.dumps(ratios, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
