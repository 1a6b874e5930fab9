"""Preparation HERE (not on the device) for issue 34's trainer run on an H200: what verl's
sft_trainer needs beyond the device's own torch stack, taken from manifests/lock.yaml exactly.

    .venv/bin/python scripts/device/trainer_payload.py [--profile mtp-detach] [--out build/device/trainer]

  - every package of the profile's python set that the trainer path can reach (the lock's `via`
    edges from verl, megatron-core, Megatron-Bridge, mbridge and TransformerEngine; sglang's own
    closure and what torch itself pins are left out: the device has torch 2.11.0+cu130 and its
    CUDA wheels, the lock's versions), each file downloaded from PyPI and checked against the
    lock's sha256 (a mismatch stops the script);
  - the git sources at their pinned commits (the tool's git fetcher: cache, url.insteadOf
    mirrors), as source tarballs, and the TE torch extension's sdist by its sha256;
  - all of it packed into carries of at most CARRY_MIB under OUT/carry/cN (build/ is ignored by
    git: never commit it, it holds upstream files), with a manifest of what each holds.
With --ext-wheels VERSION_JSON (a rendered profile's mtp/version.json), the image's three
compiled extension wheels (TE torch extension, apex, flash-attn) are carried from the tool's wheel
cache under the keys that version vector names, checked against the cache's record: the device
then runs the image's own compiled code, and trainer-proof.sh installs them instead of building.
Without it, the TE torch extension goes as its sdist (built on the device) and flash-attn and apex
stay behind; trainer_check.py then adds its named stand-in settings.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mtpimage.lock import sources  # noqa: E402

ROOTS = (
    "verl",
    "megatron-core",
    "megatron-bridge",
    "mbridge",
    "transformer-engine",
    "transformer-engine-torch",
)
NOT_ON_PATH = ("sglang", "sglang-kernel")  # the SFT trainer never imports the rollout server
DEVICE_HAS = ("torch",)  # and everything it requires (cuda-toolkit, nvidia-*, triton), at the lock's versions
CARRY_MIB = 58


def closure(packages: dict, roots, stop) -> set[str]:
    fwd = collections.defaultdict(set)
    for name, row in packages.items():
        for parent in row.get("via") or []:
            fwd[parent].add(name)
    seen, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        if n in seen or n in stop:
            continue
        seen.add(n)
        todo.extend(fwd.get(n, ()))
    return seen


def pypi_url(name: str, version: str, filename: str) -> str:
    """The file's URL from PyPI's simple index (PEP 691 JSON), as pip finds it."""
    page = requests.get(
        f"https://pypi.org/simple/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        timeout=60,
    )
    page.raise_for_status()
    for f in page.json()["files"]:
        if f["filename"] == filename:
            return f["url"]
    raise SystemExit(f"{name}=={version}: {filename} is not on PyPI")


def download(name: str, version: str, filename: str, sha256: str, dest: Path) -> Path:
    path = dest / filename
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        with requests.get(pypi_url(name, version, filename), stream=True, timeout=300) as r:
            r.raise_for_status()
            with open(path, "wb") as f:
                shutil.copyfileobj(r.raw, f)
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != sha256:
        raise SystemExit(f"{filename}: sha256 {got}, the lock says {sha256}")
    return path


def extension_wheels(vector_path: Path, dest: Path) -> list[str]:
    """The image's compiled wheels, by the keys its version vector records, verified in the cache."""
    from mtpimage.ext.wheelcache import WheelCache

    cache = WheelCache()
    names = []
    for ext in json.loads(vector_path.read_text())["extensions"]:
        wheel = cache.get(ext["key"])  # verifies the entry's sha256 and size
        if wheel is None:
            raise SystemExit(
                f"{ext['name']}: no wheel under key {ext['key'][:12]} in {cache.root} "
                "(fix: build the profile first, or `build.py wheels pull` it)"
            )
        shutil.copyfile(wheel.path, dest / wheel.filename)
        print(f"{ext['name']}: {wheel.filename} sha256 {wheel.sha256[:12]} (key {ext['key'][:12]})")
        names.append(wheel.filename)
    return names


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="mtp-detach")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "device" / "trainer")
    ap.add_argument(
        "--ext-wheels",
        type=Path,
        metavar="VERSION_JSON",
        help="carry the compiled extension wheels this version vector names, from the wheel cache",
    )
    args = ap.parse_args()
    lock = yaml.safe_load((ROOT / "manifests" / "lock.yaml").read_text())
    pset = lock["python_sets"][lock["profiles"][args.profile]["python_set"]]["packages"]
    device = closure(pset, DEVICE_HAS, ())
    wanted = sorted(closure(pset, ROOTS, NOT_ON_PATH) - device)
    files = args.out / "files"
    files.mkdir(parents=True, exist_ok=True)
    listing = []
    for name in wanted:
        row = pset[name]
        if row.get("file") and row.get("sha256"):
            download(name, row["version"], row["file"], row["sha256"], files)
            listing.append(row["file"])
    comps = lock["components"]
    for cname in ("megatron-lm", "megatron-bridge", "mbridge", "verl"):
        c = comps[cname]
        tree = sources.fetch(c["repo"], c["commit"]).path
        tarball = files / f"src-{cname}-{c['commit'][:12]}.tar.gz"
        if not tarball.is_file():
            subprocess.run(
                ["tar", "czf", str(tarball), "--exclude=.git", "-C", str(tree.parent), tree.name], check=True
            )
        listing.append(tarball.name)
    if args.ext_wheels:
        listing.extend(extension_wheels(args.ext_wheels, files))
    else:
        te = lock["packages"]["transformer-engine-torch"]["build"]["source"]
        sdist = files / te["url"].rsplit("/", 1)[1]
        if not sdist.is_file():
            sdist.write_bytes(requests.get(te["url"], timeout=300).content)
        if hashlib.sha256(sdist.read_bytes()).hexdigest() != te["sha256"]:
            raise SystemExit(f"{sdist.name}: not the lock's sha256")
        listing.append(sdist.name)
    # carries: a tar of whole files where they fit, large files split in parts
    carry = args.out / "carry"
    shutil.rmtree(carry, ignore_errors=True)
    carry.mkdir()
    limit = CARRY_MIB * 2**20
    bins: list[list[Path]] = [[]]
    size = 0
    big = []
    for name in sorted(listing, key=lambda n: -(files / n).stat().st_size):
        p = files / name
        if p.stat().st_size > limit:
            big.append(p)
            continue
        if size + p.stat().st_size > limit:
            bins.append([])
            size = 0
        bins[-1].append(p)
        size += p.stat().st_size
    n = 0
    manifest = {}
    for p in big:
        data = p.read_bytes()
        for i in range(0, len(data), limit):
            n += 1
            d = carry / f"c{n}"
            d.mkdir()
            (d / f"{p.name}.part{i // limit:02d}").write_bytes(data[i : i + limit])
            manifest[f"c{n}"] = [f"{p.name}.part{i // limit:02d}"]
    for group in bins:
        if not group:
            continue
        n += 1
        d = carry / f"c{n}"
        d.mkdir()
        with tarfile.open(d / "files.tar", "w") as tar:
            for p in group:
                tar.add(p, arcname=p.name)
        manifest[f"c{n}"] = [p.name for p in group]
    sums = {name: hashlib.sha256((files / name).read_bytes()).hexdigest() for name in listing}
    (args.out / "payload.json").write_text(json.dumps({"carries": manifest, "sha256": sums}, indent=1))
    total = sum((files / x).stat().st_size for x in listing)
    print(f"{len(listing)} files, {total / 2**20:.0f} MiB in {n} carries under {carry}")
    skipped = sorted(set(pset) - set(wanted))
    print(
        "left out (device torch stack or sglang's closure):", " ".join(re.sub(r"\s", "", s) for s in skipped)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
