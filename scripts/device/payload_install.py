#!/usr/bin/env python3
"""ON THE DEVICE: install what trainer_payload.py carried, checking everything on the way.

    python3 payload_install.py PAYLOAD_JSON STAGE SITE

  1. every carried file is reassembled from its parts and must match payload.json's sha256 (what
     was made here);
  2. wheels (`wheel`: the lock's file; `wheel-zst`: the same wheel's files as one zstd tar) are
     unpacked into SITE as `pip install --target` lays them out (`*.data/purelib|platlib` at the
     top, `*.data/scripts` in SITE/bin), and every file is checked against the wheel's RECORD
     (sha256 per file, the wheel's own record of its content): nothing unlisted, nothing missing;
  3. `lib` files go to SITE/_native (put it on LD_LIBRARY_PATH), `patch` files are applied in
     SITE with `git apply -p<strip>` (the image applies them the same way, mtp_install.py);
     sdists and git sources are left to the caller (pip, as trainer-proof.sh installs them).
Standard library only, except zstandard (a carried `tool` wheel) where no `zstd` command exists.
Prints one JSON line: counts and seconds.
"""

from __future__ import annotations

import base64
import concurrent.futures
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ZSTD_WINDOW = 2**27  # the payload is made with --long=27


def reassemble(stage: Path, name: str, want: str) -> Path:
    p = stage / name
    if not p.exists():
        parts = sorted(stage.glob(name + ".part*"))
        if not parts:
            raise SystemExit(f"missing: {name}")
        with open(p, "wb") as out:
            for q in parts:
                out.write(q.read_bytes())
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    if h.hexdigest() != want:
        raise SystemExit(f"{name}: sha256 {h.hexdigest()}, payload.json says {want}")
    return p


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _target(site: Path, name: str) -> Path:
    """pip --target's place for a wheel member."""
    head, _, rest = name.partition("/")
    if head.endswith(".data") and rest:
        kind, _, tail = rest.partition("/")
        if kind in ("purelib", "platlib"):
            return site / tail
        if kind == "scripts":
            return site / "bin" / tail
        return site / "_data" / kind / tail
    return site / name


def _members_zst(path: Path):
    """(name, bytes, mode) of a .tar.zst, through the zstd command or the zstandard module."""
    zstd = shutil.which("zstd")
    if zstd:
        proc = subprocess.Popen(
            [zstd, "-d", "-q", f"--long={ZSTD_WINDOW.bit_length() - 1}", "-c", str(path)],
            stdout=subprocess.PIPE,
        )
        stream = proc.stdout
    else:
        import zstandard

        proc = None
        stream = zstandard.ZstdDecompressor(max_window_size=ZSTD_WINDOW).stream_reader(open(path, "rb"))
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for ti in tar:
            if ti.isfile():
                yield ti.name, tar.extractfile(ti).read(), ti.mode
    if proc is not None and proc.wait() != 0:
        raise SystemExit(f"{path.name}: zstd exit {proc.returncode}")


def _members_zip(path: Path):
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if not info.is_dir():
                yield info.filename, z.read(info), 0o755 if (info.external_attr >> 16) & 0o111 else 0o644


def install_wheel(path: Path, kind: str, site: Path) -> tuple[str, int]:
    """Unpack one wheel into site, every file checked against its RECORD."""
    members = list(_members_zst(path) if kind == "wheel-zst" else _members_zip(path))
    records = [n for n, _, _ in members if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(records) != 1:
        raise SystemExit(f"{path.name}: {len(records)} RECORD files")
    record = next(d for n, d, _ in members if n == records[0])
    listed = {}
    for row in csv.reader(io.StringIO(record.decode())):
        if row:
            listed[row[0]] = row[1] if len(row) > 1 else ""
    seen = set()
    for name, data, mode in members:
        if name not in listed:
            raise SystemExit(f"{path.name}: {name} is not in its RECORD")
        want = listed[name]
        if want and _record_hash(data) != want:
            raise SystemExit(f"{path.name}: {name} does not match its RECORD")
        seen.add(name)
        target = _target(site, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.chmod(target, mode)
    missing = [n for n, h in listed.items() if h and n not in seen]
    if missing:
        raise SystemExit(f"{path.name}: RECORD lists {len(missing)} files not carried, e.g. {missing[0]}")
    return path.name, len(members)


def main(argv: list[str]) -> int:
    payload_path, stage, site = Path(argv[0]), Path(argv[1]), Path(argv[2])
    payload = json.loads(payload_path.read_text())
    started = time.monotonic()
    for name, want in payload["sha256"].items():
        reassemble(stage, name, want)
    items = payload.get("items") or []
    site.mkdir(parents=True, exist_ok=True)
    tool = [i for i in items if i["kind"] == "tool"]
    if tool and not shutil.which("zstd"):
        sys.path.insert(0, str(site))
        for t in tool:  # the decompressor first, into SITE like the rest
            install_wheel(stage / t["file"], "wheel", site)
    wheels = [i for i in items if i["kind"] in ("wheel", "wheel-zst")]
    files = 0
    with concurrent.futures.ProcessPoolExecutor(min(16, os.cpu_count() or 4)) as pool:
        futures = [pool.submit(install_wheel, stage / i["file"], i["kind"], site) for i in wheels]
        for f in concurrent.futures.as_completed(futures):
            files += f.result()[1]
    # the image's compiled extension wheels (TE torch extension, apex, flash-attn) after the
    # lock's wheels: they are what the image installs over them, each checked as the rest are
    ext_wheels = [i for i in items if i["kind"] == "ext-wheel"]
    for i in ext_wheels:
        files += install_wheel(stage / i["file"], "wheel", site)[1]
    native = site / "_native"
    for i in items:
        if i["kind"] == "lib":
            native.mkdir(exist_ok=True)
            shutil.copyfile(stage / i["file"], native / i["file"])
    for i in items:
        if i["kind"] == "patch":
            patch = str(stage / i["file"])
            if shutil.which("git"):
                cmd = ["git", "apply", "--verbose", f"-p{i['strip']}", patch]
            else:  # the same hunks, where the device has no git
                cmd = ["patch", "--forward", f"-p{i['strip']}", "-i", patch]
            subprocess.run(cmd, cwd=site, check=True)
    print(
        json.dumps(
            {
                "carried_files": len(payload["sha256"]),
                "wheels": len(wheels),
                "ext_wheels": [i["file"] for i in ext_wheels],
                "wheel_files_checked": files,
                "patches": [i["file"] for i in items if i["kind"] == "patch"],
                "native": [i["file"] for i in items if i["kind"] == "lib"],
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
