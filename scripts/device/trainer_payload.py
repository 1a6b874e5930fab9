"""Preparation HERE (not on the device) for issue 34's trainer runs on an H200: what verl's
sft_trainer (or, with --rl, main_ppo with SGLang rollout) needs beyond the device's own torch
stack, taken from manifests/lock.yaml exactly.

    .venv/bin/python scripts/device/trainer_payload.py [--profile mtp-detach] [--out build/device/trainer]
    .venv/bin/python scripts/device/trainer_payload.py --rl --compress --profile mtp-rollout \
        [--ext-key transformer-engine-torch=KEY]        # -> build/device/rl, for rl-proof.sh

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
stay behind; trainer_check.py then adds its named stand-in settings. --ext-key NAME=KEY carries one
cached wheel by its key whatever profile or base it was built for (its inputs go into payload.json),
beside the sdist: the device tries the wheel and builds from the sdist if it does not load.

--rl: the RL closure as well, i.e. sglang, sglang-kernel and everything they reach (flashinfer-*,
xgrammar, tilelang, ...; ray and transferqueue are in the SFT closure already), the image's sglang
patch (made from its two pinned commits and checked against the lock's sha256, as a build does), and
`libnuma.so.1`, which sgl_kernel's sm90 ops NEED (the image installs Debian/Ubuntu's libnuma1): it
comes from Debian's libnuma1 package at a pinned version and sha256.
--compress: every wheel goes as a zstd-compressed tar of its unpacked files (-9 --long=27): a wheel
is a zip of separately deflated files, and the big ones are mostly CUDA kernels that compress far
better as one stream (sglang-kernel 307 -> 104 MiB, flashinfer-cubin 344 -> 135 MiB), which saves
device calls. The wheel itself is checked against the lock's sha256 here; on the device
payload_install.py checks every unpacked file against the wheel's own RECORD (sha256 per file).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mtpimage import gitfetch  # noqa: E402

ROOTS = (
    "verl",
    "megatron-core",
    "megatron-bridge",
    "mbridge",
    "transformer-engine",
    "transformer-engine-torch",
)
NOT_ON_PATH = ("sglang", "sglang-kernel")  # the SFT trainer never imports the rollout server
RL_ROOTS = NOT_ON_PATH  # ... main_ppo with SGLang rollout does
DEVICE_HAS = ("torch",)  # and everything it requires (cuda-toolkit, nvidia-*, triton), at the lock's versions
CARRY_MIB = 58


@dataclasses.dataclass(frozen=True)
class Pinned:
    """A file from outside the lock that the device run needs, pinned here by version and sha256."""

    name: str
    version: str
    filename: str
    sha256: str


# sgl_kernel/sm90/common_ops.abi3.so NEEDs libnuma.so.1 (readelf; shared/docs/real-stack.md);
# Debian bookworm's build needs nothing newer than glibc 2.14
LIBNUMA = Pinned(
    "libnuma1",
    "2.0.16-1",
    "libnuma1_2.0.16-1_amd64.deb",
    "639e1ab6bd66ead40db8a22c332d7199679fa22db261cac34444eb8eb4c17dda",
)
# the decompressor for --compress where the device has no zstd command: a transport tool, not
# part of the stack (PyPI, pinned by its sha256)
ZSTANDARD = Pinned(
    "zstandard",
    "0.25.0",
    "zstandard-0.25.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "5a56ba0db2d244117ed744dfa8f6f5b366e14148e00de44723413b2f3938a902",
)


@dataclasses.dataclass(frozen=True)
class Piece:
    """A file, or the bytes start:end of it as NAME.partNN (reassembled in order on the device)."""

    file: str
    start: int
    end: int
    part: int | None = None

    @property
    def name(self) -> str:
        return self.file if self.part is None else f"{self.file}.part{self.part:02d}"


TAR_MEMBER = 1024  # a tar header and the padding of a member, at most
TAR_END = 16384  # the end blocks and tarfile's padding to a 10 KiB record, with room to spare


def pack(sizes: dict[str, int], limit: int) -> list[list[Piece]]:
    """Pieces of at most limit bytes (with their tar overhead) in as few bins as first-fit-
    decreasing finds: a carry is one call of at most `limit`."""
    part = limit - TAR_END - TAR_MEMBER
    pieces = []
    for name, size in sizes.items():
        if size + TAR_MEMBER + TAR_END <= limit:
            pieces.append(Piece(name, 0, size))
        else:
            pieces += [Piece(name, a, min(a + part, size), i) for i, a in enumerate(range(0, size, part))]
    bins: list[list[Piece]] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda x: (-(x.end - x.start), x.name)):
        cost = piece.end - piece.start + TAR_MEMBER
        for i, left in enumerate(room):
            if cost <= left:
                bins[i].append(piece)
                room[i] -= cost
                break
        else:
            bins.append([piece])
            room.append(limit - TAR_END - cost)
    return bins


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


def render_profile(name: str, dest: Path) -> None:
    """What trainer-proof.sh reads for a profile: the image's version vector and overrides."""
    tmp = dest / "render"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "render", "--profile", name, "--out", str(tmp)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    shutil.copyfile(tmp / "mtp" / "version.json", dest / "version.json")
    for f in ("sft.overrides", "rl.overrides"):  # a profile has the targets it has
        if (tmp / "mtp" / "verl" / f).is_file():
            shutil.copyfile(tmp / "mtp" / "verl" / f, dest / f)
    if not (dest / "sft.overrides").is_file():
        # rl only (mtp-rollout): its training side through verl's SFT trainer, said in a file beside
        rl = (dest / "rl.overrides").read_text().splitlines()
        (dest / "sft.overrides").write_text("\n".join(sft_of_rl([ln for ln in rl if ln.strip()])) + "\n")
        (dest / "sft.overrides.from").write_text(
            "derived from rl.overrides by trainer_payload.py sft_of_rl (the profile has no sft target)\n"
        )
    shutil.rmtree(tmp)


def sft_of_rl(lines: list[str]) -> list[str]:
    """An rl-only profile's training side as SFT overrides (mtp-rollout: verl's SFT trainer has no
    rollout), key by key through verl.yaml's own per-target keys: MtpConfig prefix, engine,
    context parallelism, TransformerConfig prefix; the rollout's name has no SFT key and is
    dropped. A key without an SFT counterpart stops the script (never guessed)."""
    verl = yaml.safe_load((ROOT / "mtpimage" / "data" / "verl.yaml").read_text())
    rl, sft = verl["engine_keys"]["rl"], verl["engine_keys"]["sft"]
    prefixes = (
        (verl["mtp_prefix"]["rl"], verl["mtp_prefix"]["sft"]),
        (rl["transformer_config"], sft["transformer_config"]),
    )
    out: list[str] = []
    for ln in lines:
        plus = "+" if ln.startswith("+") else ""
        key, _, value = ln.lstrip("+").partition("=")
        new: list[str] = []
        for a, b in prefixes:
            if key.startswith(a):
                new = [f"{plus}{b}{key[len(a) :]}={value}"]
        for group in ("engine", "context_parallel_size", "vanilla_mbridge"):
            if key in rl[group]:
                new = [f"{plus}{k}={value}" for k in sft[group]]
        if key in rl["rollout_name"]:
            continue
        if not new:
            raise SystemExit(f"{ln}: no SFT counterpart in mtpimage/data/verl.yaml engine_keys")
        out += [x for x in new if x not in out]
    return out


def extension_wheels(vector_path: Path, dest: Path) -> list[str]:
    """The image's compiled wheels, by the keys its version vector records, verified in the cache."""
    from mtpimage.ext.wheelcache import WheelCache

    cache = WheelCache()
    names = []
    for ext in json.loads(vector_path.read_text())["extensions"]:
        wheel = cache.get(ext["key"])  # verifies the entry's sha256 and size
        if wheel is None:
            # said, not hidden: the device run then names its stand-in for this extension
            print(
                f"{ext['name']}: NOT CARRIED, no wheel under key {ext['key'][:12]} in {cache.root} "
                "(build the profile first, or `build.py wheels pull` it)"
            )
            continue
        shutil.copyfile(wheel.path, dest / wheel.filename)
        print(f"{ext['name']}: {wheel.filename} sha256 {wheel.sha256[:12]} (key {ext['key'][:12]})")
        names.append(wheel.filename)
    return names


def libnuma(dest: Path) -> str:
    """libnuma.so.1 out of Debian's libnuma1 package (apt-get download, checked by sha256)."""
    deb = dest / LIBNUMA.filename
    if not deb.is_file():
        subprocess.run(["apt-get", "download", f"{LIBNUMA.name}={LIBNUMA.version}"], cwd=dest, check=True)
    got = hashlib.sha256(deb.read_bytes()).hexdigest()
    if got != LIBNUMA.sha256:
        raise SystemExit(f"{deb.name}: sha256 {got}, pinned {LIBNUMA.sha256}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        so = Path(tmp) / "usr/lib/x86_64-linux-gnu/libnuma.so.1"
        (dest / "libnuma.so.1").write_bytes(so.resolve().read_bytes())
    deb.unlink()  # only the library travels
    return "libnuma.so.1"


def sglang_patches(profile: str, dest: Path) -> list[str]:
    """The profile's sglang patch files, made as a build makes them (their two pinned commits'
    diff) and checked against the lock's sha256 there."""
    from mtpimage.assembly.buildctx import patch_entries
    from mtpimage.assembly.render import render
    from mtpimage.commands.load import plan_for
    from mtpimage.manifests import manifest

    m = manifest.load(ROOT / "manifests")
    rendered = render(plan_for(m, profile, None), m.root)
    names = []
    for path, data, _mode in patch_entries(rendered, progress=print):
        comp, _, name = path.removeprefix("patches/").partition("/")
        if comp != "sglang":
            continue
        (dest / f"patch-sglang-{name}").write_bytes(data)
        names.append(f"patch-sglang-{name}")
    return names


def compress_wheel(wheel: Path, dest: Path) -> Path:
    """A wheel's files as one zstd stream (tar, sorted names, zeroed times: reproducible)."""
    out = dest / (wheel.name + ".tar.zst")
    if out.is_file():
        return out
    raw = io.BytesIO()
    with zipfile.ZipFile(wheel) as z, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            data = z.read(info)
            ti = tarfile.TarInfo(info.filename)
            ti.size = len(data)
            ti.mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
            tar.addfile(ti, io.BytesIO(data))
    tmp = out.with_suffix(".tmp")
    subprocess.run(
        ["zstd", "-q", "-9", "--long=27", "-T1", "-f", "-o", str(tmp)], input=raw.getvalue(), check=True
    )
    tmp.rename(out)
    return out


def cached_wheel(spec: str, dest: Path) -> tuple[str, dict]:
    """NAME=KEY: a wheel of the tool's wheel cache by its key, and what it was built from."""
    from mtpimage.ext.wheelcache import WheelCache

    name, _, key = spec.partition("=")
    cache = WheelCache()
    wheel = cache.get(key)  # verifies the entry's sha256 and size
    if wheel is None:
        raise SystemExit(f"{name}: no wheel under key {key[:12]} in {cache.root}")
    meta = json.loads((Path(wheel.path).parent / "meta.json").read_text())
    shutil.copyfile(wheel.path, dest / wheel.filename)
    print(
        f"{name}: {wheel.filename} sha256 {wheel.sha256[:12]} (key {key[:12]}, base {meta['inputs'].get('base')})"
    )
    return wheel.filename, {"name": name, "key": key, "sha256": wheel.sha256, "inputs": meta.get("inputs")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="mtp-detach")
    ap.add_argument("--out", type=Path, help="default build/device/trainer (with --rl: build/device/rl)")
    ap.add_argument(
        "--ext-wheels",
        action="store_true",
        help="carry the compiled extension wheels the profile's version vector names, from the wheel cache",
    )
    ap.add_argument(
        "--render",
        nargs="*",
        default=[],
        metavar="PROFILE",
        help="render these profiles' version vector and verl overrides into OUT/profiles/P/ "
        "(with MTP_SUBSTITUTE_BASE as the build had it)",
    )
    ap.add_argument(
        "--ext-key",
        action="append",
        default=[],
        metavar="NAME=KEY",
        help="also carry the cached wheel under KEY (any base; the TE sdist goes too)",
    )
    ap.add_argument("--rl", action="store_true", help="main_ppo with SGLang rollout: add sglang's closure")
    ap.add_argument("--compress", action="store_true", help="wheels as zstd tars of their files")
    args = ap.parse_args()
    if args.out is None:
        args.out = ROOT / "build" / "device" / ("rl" if args.rl else "trainer")
    for name in sorted(set(args.render) | {args.profile}):
        render_profile(name, args.out / "profiles" / name)
    lock = yaml.safe_load((ROOT / "manifests" / "lock.yaml").read_text())
    pset = lock["python_sets"][lock["profiles"][args.profile]["python_set"]]["packages"]
    device = closure(pset, DEVICE_HAS, ())
    roots, stop = (ROOTS + RL_ROOTS, ()) if args.rl else (ROOTS, NOT_ON_PATH)
    wanted = sorted(closure(pset, roots, stop) - device)
    files = args.out / "files"
    files.mkdir(parents=True, exist_ok=True)
    listing = []
    items: list[dict] = []  # what each carried file is, for payload_install.py
    for name in wanted:
        row = pset[name]
        if row.get("file") and row.get("sha256"):
            download(name, row["version"], row["file"], row["sha256"], files)
            if args.compress and row["file"].endswith(".whl"):
                packed = compress_wheel(files / row["file"], files)
                listing.append(packed.name)
                items.append(
                    {
                        "file": packed.name,
                        "kind": "wheel-zst",
                        "wheel": row["file"],
                        "wheel_sha256": row["sha256"],
                    }
                )
            else:
                listing.append(row["file"])
                kind = "wheel" if row["file"].endswith(".whl") else "sdist"
                items.append({"file": row["file"], "kind": kind, "sha256_lock": row["sha256"]})
    comps = lock["components"]
    for cname in ("megatron-lm", "megatron-bridge", "mbridge", "verl"):
        c = comps[cname]
        tree = gitfetch.fetch(c["repo"], c["commit"]).path
        tarball = files / f"src-{cname}-{c['commit'][:12]}.tar.gz"
        if not tarball.is_file():
            subprocess.run(
                ["tar", "czf", str(tarball), "--exclude=.git", "-C", str(tree.parent), tree.name], check=True
            )
        listing.append(tarball.name)
        items.append({"file": tarball.name, "kind": "src", "component": cname, "commit": c["commit"]})
    if args.rl:
        for name in sglang_patches(args.profile, files):
            listing.append(name)
            items.append({"file": name, "kind": "patch", "component": "sglang", "strip": 2})
        listing.append(libnuma(files))
        items.append({"file": "libnuma.so.1", "kind": "lib", "from": dataclasses.asdict(LIBNUMA)})
    if args.compress:
        z = ZSTANDARD
        download(z.name, z.version, z.filename, z.sha256, files)
        listing.append(z.filename)
        items.append({"file": z.filename, "kind": "tool", "sha256_pinned": z.sha256})
    for spec in args.ext_key:
        fname, meta = cached_wheel(spec, files)
        listing.append(fname)
        items.append({"file": fname, "kind": "ext-wheel", **meta})
    if args.ext_wheels:
        for fname in extension_wheels(args.out / "profiles" / args.profile / "version.json", files):
            listing.append(fname)
            items.append({"file": fname, "kind": "ext-wheel"})
    else:
        te = lock["packages"]["transformer-engine-torch"]["build"]["source"]
        sdist = files / te["url"].rsplit("/", 1)[1]
        if not sdist.is_file():
            sdist.write_bytes(requests.get(te["url"], timeout=300).content)
        if hashlib.sha256(sdist.read_bytes()).hexdigest() != te["sha256"]:
            raise SystemExit(f"{sdist.name}: not the lock's sha256")
        listing.append(sdist.name)
        items.append({"file": sdist.name, "kind": "ext-sdist", "name": "transformer-engine-torch"})
    # carries: large files split in parts, then parts and files packed into as few tars of at
    # most CARRY_MIB as first-fit-decreasing finds (a split file's last part shares a carry)
    carry = args.out / "carry"
    shutil.rmtree(carry, ignore_errors=True)
    carry.mkdir()
    bins = pack({name: (files / name).stat().st_size for name in listing}, CARRY_MIB * 2**20)
    manifest = {}
    for n, group in enumerate(bins, 1):
        d = carry / f"c{n}"
        d.mkdir()
        with tarfile.open(d / "files.tar", "w") as tar:
            for piece in group:
                with open(files / piece.file, "rb") as f:
                    f.seek(piece.start)
                    data = f.read(piece.end - piece.start)
                info = tarfile.TarInfo(piece.name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        manifest[f"c{n}"] = [piece.name for piece in group]
    n = len(bins)
    sums = {name: hashlib.sha256((files / name).read_bytes()).hexdigest() for name in listing}
    payload = {"carries": manifest, "sha256": sums, "items": items, "profile": args.profile, "rl": args.rl}
    (args.out / "payload.json").write_text(json.dumps(payload, indent=1))
    total = sum((files / x).stat().st_size for x in listing)
    print(f"{len(listing)} files, {total / 2**20:.0f} MiB in {n} carries under {carry}")
    skipped = sorted(set(pset) - set(wanted))
    print(
        "left out (device torch stack" + ("" if args.rl else " or sglang's closure") + "):",
        " ".join(re.sub(r"\s", "", s) for s in skipped),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
