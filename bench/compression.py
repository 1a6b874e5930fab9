#!/usr/bin/env python3
"""Bytes a node pulls, and the time to pull and unpack them, per layer format of a reproducible
image (issue 48): uncompressed (what --reproducible published before), gzip and zstd, in one run.

    python3 bench/compression.py --image REF        # a reproducible image built here (its layout is kept)
    python3 bench/compression.py --layout DIR       # a kept layout (the image may be gone from dockerd)
    python3 bench/compression.py --layer-dir DIR    # a one-layer image of DIR's files (the torch layer)
        [--registry 127.0.0.1:5000/bench-compression] [--out FILE] [--reps 1]
        [--pull gzip,zstd]                          # the formats pulled (default: all three)
        [--export-profile P [--manifests DIR]]      # with --image: also `build.py export --format enroot`
        [--clients podman,skopeo+umoci,docker]      # the clients that pull
        [--client-formats docker=gzip]              # a client that pulls only these formats (repeatable)

Per format: the tool's own compressor makes the published form (layercompress.form: the time to
compress is measured), the layers' bytes are counted, the form is pushed to the loopback
registry, and each client Debian 12 ships that reads it pulls and unpacks it into empty storage:
  - docker 20.10 (`docker pull` into a dockerd of its own, started for that one pull on an empty
    data root and removed after it: a fresh node's store, not the host's dockerd, which already
    has the image's layers by diff ID and would skip them; docker cannot read zstd);
  - podman 4.3 (`podman pull` into a fresh --root);
  - skopeo 1.9 + umoci (`skopeo copy` to an OCI layout, `umoci unpack` into a rootfs).
What a client cannot read is recorded as its error, not a time; a format a client is known not
to read can be left out for it (`--client-formats docker=gzip`: docker 20.10 and zstd, measured:
"archive/tar: invalid tar header"), recorded as not run. A format left out of --pull is
counted (bytes, compress time) but neither pushed nor pulled: the real stack's uncompressed form
is 14 GB more in the registry and on disk for a number the torch layer already gave.
With --export-profile, the squashfs node path is measured beside the pulls: `build.py export
--format enroot` of the image (zstd squashfs, what pyxis imports), its bytes, and `unsquashfs`
of it into an empty folder (what `enroot create` does on the node).
Per layer (the config's history names its instruction): the bytes of every format. Writes the JSON next to this
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


def layer_names(layout: ocilayout.Layout) -> list[str]:
    """Each layer's instruction, from the config's history (empty layers left out)."""
    config = json.loads(layout.blob(layout.manifest["config"]["digest"]).read_bytes())
    made = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    names = [" ".join(m.split())[:90] for m in made]
    n = len(layout.manifest["layers"])
    return names[-n:] if len(names) >= n else [""] * (n - len(names)) + names


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
    """`docker pull` into a dockerd of its own on an empty data root (a fresh node's store),
    removed after the pull. Short paths: dockerd's sockets must fit in 108 bytes."""
    root = Path(tempfile.mkdtemp(prefix="bd-", dir=scratch))
    sock = root / "d.sock"
    # a bridge of its own: with --bridge none dockerd DELETES the host's docker0 at start
    # (libnetwork's removeDefaultBridgeInterface), which breaks the host dockerd's containers
    bridge = "mtpbench" + root.name[-4:].lower().replace("_", "0")
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", "10.213.7.1/24", "dev", bridge], check=True)
    daemon = subprocess.Popen(
        [
            "dockerd",
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "x"),
            "--pidfile",
            str(root / "d.pid"),
            "--host",
            f"unix://{sock}",
            "--bridge",
            bridge,
            "--iptables=false",
            "--ip-masq=false",
            "--storage-driver",
            "overlay2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "dockerd.log", "w"),
    )
    docker = ["docker", "--host", f"unix://{sock}"]
    try:
        for _ in range(120):
            if subprocess.run([*docker, "version"], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            return 0.0, "the private dockerd did not start: " + (root / "dockerd.log").read_text()[-240:]
        return _run([*docker, "pull", "-q", ref])
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        subprocess.run(["umount", "-R", str(root / "data")], capture_output=True)
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def pull_podman(ref: str, scratch: Path) -> tuple[float, str | None]:
    """`podman pull` into a fresh --root; its runroot under /tmp: podman refuses one longer than
    50 characters."""
    root, run = scratch / "podman", Path(tempfile.mkdtemp(prefix="pr-"))
    podman = ["podman", "--root", str(root), "--runroot", str(run)]
    try:
        return _run([*podman, "pull", "-q", "--tls-verify=false", ref])
    finally:
        subprocess.run([*podman, "system", "reset", "-f"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


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


def export_enroot(image: str, profile: str, scratch: Path, manifests: Path | None = None) -> dict:
    """The squashfs node path: `build.py export --format enroot` (the tool's default zstd
    squashfs) and `unsquashfs` into an empty folder, as `enroot create` does on the node."""
    sqsh = scratch / "export" / "image.sqsh"
    env = {**os.environ, "TMPDIR": str(scratch)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "build.py"),
            *(("--manifests", str(manifests)) if manifests else ()),
            "export",
            "--format",
            "enroot",
            "--profile",
            profile,
            "--image",
            image,
            "--out",
            str(sqsh),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    export_s = time.monotonic() - t0
    if proc.returncode:
        return {"error": " ".join((proc.stderr or proc.stdout).split())[-240:]}
    size = sqsh.stat().st_size
    dest = scratch / "export" / "rootfs"
    try:
        took, err = _run(["unsquashfs", "-no-progress", "-d", str(dest), str(sqsh)])
    finally:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.rmtree(scratch / "export", ignore_errors=True)
    out = {"export_s": round(export_s, 1), "bytes": size, "compression": "zstd (enroot's default here)"}
    out.update({"error": err} if err else {"unsquashfs_s": round(took, 1)})
    return out


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
    src.add_argument("--layout", type=Path, help="a kept OCI layout of a reproducible build")
    src.add_argument("--layer-dir", type=Path, help="a directory: a one-layer image of its files")
    ap.add_argument("--name", default="", help="a name for this input in the results file")
    ap.add_argument("--registry", default="127.0.0.1:5000/bench-compression")
    ap.add_argument(
        "--repository",
        default="img",
        help="the repository pushed to under --registry (the image's own, e.g. mtp-verl: its blobs are there)",
    )
    ap.add_argument("--scratch", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--pull", default=",".join(FORMATS), help="the formats pushed and pulled (comma-separated)"
    )
    ap.add_argument("--clients", default=",".join(CLIENTS), help="the clients that pull (comma-separated)")
    ap.add_argument(
        "--client-formats",
        action="append",
        default=[],
        metavar="CLIENT=FMT[+FMT]",
        help="this client pulls only these formats (e.g. docker=gzip: docker 20.10 cannot read zstd)",
    )
    ap.add_argument(
        "--export-profile", help="with --image: also export it for enroot (squashfs) and unsquash it"
    )
    ap.add_argument(
        "--manifests", type=Path, help="with --export-profile: the manifests the image was built from"
    )
    args = ap.parse_args()
    only = {}
    for spec in args.client_formats:
        client, _, fmts = spec.partition("=")
        if client not in CLIENTS or not fmts or set(fmts.split("+")) - set(FORMATS):
            ap.error(f"--client-formats {spec}: CLIENT=FMT[+FMT], CLIENT one of {', '.join(CLIENTS)}")
        only[client] = fmts.split("+")
    pulled = [f for f in args.pull.split(",") if f]
    if set(pulled) - set(FORMATS) or args.export_profile and not args.image:
        ap.error(f"--pull takes {', '.join(FORMATS)}; --export-profile needs --image")
    what = args.image or (args.layout and args.layout.name) or args.layer_dir.name
    name = args.name or what.replace("/", "_").replace(":", "_")
    out = args.out or BENCH / f"compression_results_{name}.json"
    with tempfile.TemporaryDirectory(prefix="mtp-bench-compression-", dir=args.scratch) as tmp:
        tmp = Path(tmp)
        t0 = time.monotonic()
        if args.image:
            layout = layout_of_image(args.image)
        elif args.layout:
            layout = ocilayout.read(args.layout)
        else:
            layout = layout_of_dir(args.layer_dir, tmp / "oci")
        prepare_s = time.monotonic() - t0
        tag = hashlib.sha256(layout.image_id.encode()).hexdigest()[:8]
        rows, per_layer = [], {}
        for fmt in FORMATS:
            c = layercompress.named(fmt)
            t0 = time.monotonic()
            form = layercompress.form(layout, c, say=lambda line: print(line, file=sys.stderr))
            compress_s = time.monotonic() - t0
            size = sum(d["size"] for d in form.manifest["layers"])
            per_layer[fmt] = [d["size"] for d in form.manifest["layers"]]
            if fmt not in pulled:
                rows.append(
                    {
                        "format": fmt,
                        "how": c.annotation if c.compresses else "uncompressed tars",
                        "bytes": size,
                        "compress_s": round(compress_s, 2),
                        "digest": form.digest,
                        "pull_unpack": {client: {"error": "not pulled (--pull)"} for client in CLIENTS},
                    }
                )
                continue
            ref = ImageRef.parse(f"{args.registry}/{args.repository}:{fmt}-{tag}")
            t0 = time.monotonic()
            digest = push(form, ref)
            push_s = time.monotonic() - t0
            pulls = {}
            for client, fn in CLIENTS.items():
                if client not in args.clients.split(","):
                    pulls[client] = {"error": "not run (--clients)"}
                    continue
                if client in only and fmt not in only[client]:
                    pulls[client] = {"error": f"not run (--client-formats {client}={'+'.join(only[client])})"}
                    continue
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
        squashfs = (
            export_enroot(args.image, args.export_profile, tmp, args.manifests)
            if args.export_profile
            else None
        )
        names = layer_names(layout)
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
    if squashfs and "bytes" in squashfs:
        ratios["bytes_squashfs_over_none"] = round(squashfs["bytes"] / by["none"]["bytes"], 3)
        g = by["gzip"]["pull_unpack"]["podman"]
        if "unsquashfs_s" in squashfs and "seconds" in g:
            ratios["unsquashfs_over_gzip_podman_pull_unpack"] = round(
                squashfs["unsquashfs_s"] / g["seconds"], 3
            )
    layers = [
        {"layer": i, "instruction": names[i], **{fmt: per_layer[fmt][i] for fmt in FORMATS}}
        for i in range(len(names))
    ]
    result = {
        "input": args.image or str(args.layer_dir),
        "uncompressed_bytes": by["none"]["bytes"],
        "layers": len(layout.manifest["layers"]),
        "prepare_s": round(prepare_s, 1),
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_end": os.getloadavg()},
        "tools": {t: _version(t) for t in ("docker", "podman", "skopeo", "umoci")},
        "formats": rows,
        "squashfs_enroot": squashfs,
        "per_layer": layers,
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
    print(f"{'layer':<5} {'none':>14} {'gzip':>7} {'zstd':>7}  instruction")
    for row in layers:
        n = max(row["none"], 1)
        print(
            f"{row['layer']:<5} {row['none']:>14,} {row['gzip'] / n:>7.3f} {row['zstd'] / n:>7.3f}  {row['instruction'][:60]}"
        )
    if squashfs:
        print(f"squashfs (enroot): {squashfs}")
    print(json.dumps(ratios, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
