#!/usr/bin/env python3
"""What `builds.cuda_archs: ["90", "100"]` costs against `["90"]` (issue 49), in one run.

    # 1. objects compiled both ways with exactly the flags the extension's setup.py gives
    .venv/bin/python bench/cuda_archs.py sample --image IMAGE --package flash-attn \
        --source flash_attn-2.8.3.tar.gz --sha256 1e71dd64... \
        --files flash_fwd_hdim128_bf16_sm80.cu,flash_bwd_hdim128_bf16_sm80.cu --out R.json
    # 2. the wheels the tool built (`wheels build`), listed with cuobjdump, sizes and times
    .venv/bin/python bench/cuda_archs.py wheels --cuobjdump PATH KEY90 KEY90_100 [...] --out R.json

How the 2026-12-06 numbers were made (docs/extensions-and-wheel-cache.md, "sm_100 measured here"):
    python3 build.py render --profile mtp-detach --set builds.cuda_archs=90,100 --out R
    DOCKER_BUILDKIT=1 docker build --network host --target mtp-torch -t mtp-torch:sample R
    bench/cuda_archs.py sample --image mtp-torch:sample --package flash-attn \
        --source flash_attn-2.8.3.tar.gz --sha256 1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d \
        --requirements R/build/requirements/ext-build-flash-attn.txt \
        --files flash_fwd_hdim128_bf16_sm80.cu,flash_bwd_hdim128_bf16_sm80.cu,flash_fwd_split_hdim64_fp16_sm80.cu ...
    bench/cuda_archs.py sample --image mtp-torch:sample --package apex --source APEX_TREE_AT_6424da3b \
        --requirements R/build/requirements/ext-build-apex.txt \
        --files multi_tensor_adam.cu,scaled_masked_softmax_cuda.cu,layer_norm_cuda_kernel.cu ...
(cuobjdump: PyPI's nvidia-cuda-cuobjdump 13.2.51, file nvidia/cu13/bin/cuobjdump; results in
bench/cuda_archs_results.json).

`sample` runs in a container of IMAGE (the builder stages' own `mtp-torch` stage: the stand-in
base and the locked torch; `docker build --target mtp-torch` of `build.py render`'s output),
with the package's hashed build requirements (build/requirements/ext-build-<name>.txt of the
same render, --requirements). For each arch set it runs the package's setup.py with the
tool's switches (components.yaml `build.env`, filled in as extensions.filled_env does) and
a `ninja` that only records the build.ninja torch's cpp_extension writes, so every compile
command is setup.py's own; then compiles each sampled object once per arch set, the sets
alternating per object (load on a shared machine drifts), timing wall and CPU seconds (the
compiler's children: nvcc's `--threads` runs the two `-gencode` targets in parallel, so
wall time on a loaded machine says less than CPU time). Each object comes back and is listed
with cuobjdump (mtpimage/ext/devicecode.py).

`wheels` reads cached wheels (MTP_CACHE_DIR): size, the builder stage's compile seconds
(meta.json), and each module's SASS/PTX. The ratios are of the second key (and later ones)
against the first.

Results are JSON (machine, date, the commands, per-object and per-wheel numbers, ratios);
the table goes into docs/extensions-and-wheel-cache.md by hand.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

# The switches of each compiled package (components.yaml build.env), per arch set.
SWITCHES = {
    "flash-attn": lambda archs: {
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
        "FLASH_ATTN_CUDA_ARCHS": ";".join(archs),
    },
    "apex": lambda archs: {
        "APEX_CPP_EXT": "1",
        "APEX_CUDA_EXT": "1",
        "TORCH_CUDA_ARCH_LIST": ";".join(f"{a[:-1]}.{a[-1]}" for a in archs),
    },
}

# The recording ninja: torch's cpp_extension asks `ninja --version`, then runs `ninja -v` in
# the directory of the build.ninja it wrote; each one is kept (apex writes one per module) and
# each of its outputs is an empty object, so the real link succeeds and setup.py goes on to
# the next module instead of stopping at the first.
FAKE_NINJA = """#!/usr/bin/env python3
import os, pathlib, shutil, subprocess, sys
if sys.argv[1:2] == ["--version"]:
    print("1.13.0"); sys.exit(0)
keep = pathlib.Path(os.environ["MTP_NINJA_KEEP"])
shutil.copy("build.ninja", keep / f"{len(list(keep.iterdir()))}.ninja")
for line in open("build.ninja"):
    if line.startswith("build ") and ": " in line:
        out = pathlib.Path(line[6:].split(": ")[0].replace("$:", ":"))
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-c", "-x", "c", "/dev/null", "-o", str(out)], check=True)
"""


# ------------------------------------------------------------------------------ in the container
def _inside(args) -> int:
    """Runs in IMAGE: record setup.py's build.ninja per arch set, compile the sampled objects."""
    src = Path(args.src)
    out = Path(args.out)
    sets = [s.split(",") for s in args.sets]
    fake = Path("/tmp/recording-ninja/ninja")
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(FAKE_NINJA)
    fake.chmod(0o755)

    real_ninja = shutil.which("ninja")
    # the builder stage's own environment: the CUDA wheels' headers on CPATH (mtp_extension.py)
    sys.path.insert(0, "/mtp-lib")
    import mtp_extension

    base_env = dict(os.environ)
    mtp_extension._cuda_wheel_paths(base_env)
    commands: dict[tuple[str, str], tuple[str, str, Path]] = {}  # (set, file) -> (obj, cmd, ninja file)
    for archs in sets:
        tag = "+".join(archs)
        tree = Path(f"/tmp/build-{tag}")
        if tree.exists():
            shutil.rmtree(tree)
        shutil.copytree(src, tree)
        keep = Path(f"/tmp/ninja-{tag}")
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir()
        env = {
            **base_env,
            **SWITCHES[args.package](archs),
            "MAX_JOBS": "1",
            "PATH": f"{fake.parent}:{os.environ['PATH']}",
            "MTP_NINJA_KEEP": str(keep),
        }
        log = out / f"setup-{tag}.log"
        with open(log, "w") as f:
            subprocess.run(
                [sys.executable, "setup.py", "build_ext"],
                cwd=tree,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )  # fails at the link (no objects): the ninja files are what it is run for
        files = sorted(keep.glob("*.ninja"), key=lambda p: int(p.stem))
        if not files:
            tail = "\n".join(log.read_text().splitlines()[-15:])
            raise SystemExit(f"setup.py wrote no build.ninja for {tag}:\n{tail}")
        for nf in files:
            for line in nf.read_text().splitlines():
                if not line.startswith("build ") or ": " not in line:
                    continue
                outs, _, rest = line[len("build ") :].partition(": ")
                parts = rest.split()
                if len(parts) < 2:
                    continue
                name = Path(parts[1]).name
                if name in args.files and (tag, name) not in commands:
                    obj = outs.strip().replace("$:", ":")
                    cmd = subprocess.run(
                        [real_ninja, "-f", str(nf), "-t", "commands", "-s", obj],
                        capture_output=True,
                        text=True,
                        check=True,
                        cwd=nf.parent,
                    ).stdout.strip()
                    commands[(tag, name)] = (obj, cmd, nf)
    rows = []
    for name in args.files:
        for archs in sets:
            tag = "+".join(archs)
            if (tag, name) not in commands:
                raise SystemExit(f"{name}: not in the build.ninja setup.py wrote for {tag}")
            obj, cmd, nf = commands[(tag, name)]
            Path(obj).parent.mkdir(parents=True, exist_ok=True)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            subprocess.run(["bash", "-c", cmd], check=True, cwd=f"/tmp/build-{tag}", env=base_env)
            wall = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            kept = out / tag / (Path(obj).name)
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(obj, kept)
            rows.append(
                {
                    "file": name,
                    "archs": archs,
                    "object": str(kept.relative_to(out)),
                    "bytes": kept.stat().st_size,
                    "wall_s": round(wall, 1),
                    "cpu_s": round(cpu, 1),
                    "command": cmd,
                }
            )
            print(f"{name} [{tag}] {wall:.0f}s wall, {cpu:.0f}s cpu, {kept.stat().st_size} bytes", flush=True)
    (out / "inside.json").write_text(json.dumps(rows, indent=1))
    return 0


# ------------------------------------------------------------------------------ on the host
@dataclass(frozen=True)
class Sample:
    file: str
    archs: list[str]
    bytes: int
    wall_s: float
    cpu_s: float
    sass: list[str]
    ptx: list[str]
    cubin_bytes: dict
    command: str


def _machine() -> dict:
    return {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _ratio(a: float, b: float) -> float | None:
    return round(b / a, 3) if a else None


def _unpack(source: Path, sha256: str | None, dest: Path) -> Path:
    if source.is_dir():
        return source
    got = hashlib.sha256(source.read_bytes()).hexdigest()
    if sha256 and got != sha256:
        raise SystemExit(f"{source}: sha256 {got}, expected {sha256}")
    with tarfile.open(source) as t:
        t.extractall(dest, filter="data")
    (top,) = list(dest.iterdir())
    return top


def cmd_sample(args) -> int:
    sys.path.insert(0, str(REPO))
    from mtpimage.ext import devicecode

    cuobjdump = devicecode.find_cuobjdump(args.cuobjdump)
    files = args.files.split(",")
    sets = [s for s in args.sets]
    with tempfile.TemporaryDirectory(prefix="mtp-cuda-archs-", dir=args.scratch) as tmp:
        tree = _unpack(Path(args.source).resolve(), args.sha256, Path(tmp) / "src")
        out = Path(tmp) / "out"
        out.mkdir()
        inside = (
            "pip install --no-deps --require-hashes --only-binary=:all: -q -r /req.txt && "
            f"nice -n {args.nice} python /bench/cuda_archs.py _inside --package {args.package} --src /src --out /out "
            f"--files {','.join(files)} " + " ".join(f"--set {s}" for s in sets)
        )
        docker = [
            args.docker,
            "run",
            "--rm",
            "--network",
            "host",
            "-v",
            f"{tree}:/src:ro",
            "-v",
            f"{out}:/out",
            "-v",
            f"{BENCH}:/bench:ro",
            "-v",
            f"{REPO / 'images' / 'lib'}:/mtp-lib:ro",
            "-v",
            f"{Path(args.requirements).resolve()}:/req.txt:ro",
            *(
                ["-v", f"{Path(args.ca_bundle).resolve()}:/ca.pem:ro", "-e", "PIP_CERT=/ca.pem"]
                if args.ca_bundle
                else []
            ),
            args.image,
            "bash",
            "-c",
            inside,
        ]
        t0 = time.monotonic()
        subprocess.run(docker, check=True)
        total = time.monotonic() - t0
        rows = json.loads((out / "inside.json").read_text())
        samples = []
        for r in rows:
            code = devicecode.listing(out / r["object"], cuobjdump)
            samples.append(
                Sample(
                    r["file"],
                    r["archs"],
                    r["bytes"],
                    r["wall_s"],
                    r["cpu_s"],
                    list(code.sass),
                    list(code.ptx),
                    devicecode.cubin_bytes(out / r["object"], cuobjdump),
                    r["command"],
                )
            )
            if args.keep:
                dest = Path(args.keep) / r["object"]
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(out / r["object"], dest)
    base_set = sets[0].split(",")
    ratios = []
    for f in files:
        first = next(s for s in samples if s.file == f and s.archs == base_set)
        for s in samples:
            if s.file == f and s.archs != base_set:
                ratios.append(
                    {
                        "file": f,
                        "archs": s.archs,
                        "against": base_set,
                        "bytes": _ratio(first.bytes, s.bytes),
                        "wall": _ratio(first.wall_s, s.wall_s),
                        "cpu": _ratio(first.cpu_s, s.cpu_s),
                    }
                )
    result = {
        "package": args.package,
        "source": {"path": str(args.source), "sha256": args.sha256},
        "image": args.image,
        "machine": _machine(),
        "seconds": round(total, 1),
        "samples": [asdict(s) for s in samples],
        "ratios": ratios,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for s in samples:
        print(
            f"{s.file:<40} {'+'.join(s.archs):<7} {s.bytes / 1e6:7.2f} MB {s.wall_s:7.1f}s wall "
            f"{s.cpu_s:7.1f}s cpu  SASS {','.join(s.sass)} PTX {','.join(s.ptx) or '-'}"
        )
    for r in ratios:
        print(
            f"{r['file']:<40} {'+'.join(r['archs'])}/{'+'.join(r['against'])}: size x{r['bytes']} wall x{r['wall']} cpu x{r['cpu']}"
        )
    return 0


def cmd_wheels(args) -> int:
    sys.path.insert(0, str(REPO))
    from mtpimage.ext import devicecode
    from mtpimage.ext.wheelcache import WheelCache

    cuobjdump = devicecode.find_cuobjdump(args.cuobjdump)
    cache = WheelCache()
    rows = []
    for k in args.keys:
        key = cache.resolve(k)
        e = cache.get(key)
        if e is None:
            raise SystemExit(f"{k}: not in {cache.root}")
        code = devicecode.read_wheel(e.path, cuobjdump)
        archs = e.meta["inputs"]["archs"]
        cubins = {}
        with zipfile.ZipFile(e.path) as z, tempfile.TemporaryDirectory(prefix="mtp-cuda-archs-") as tmp:
            for m in code.modules:
                if m.code.has_device_code:
                    so = Path(z.extract(m.name, tmp))
                    cubins[m.name] = devicecode.cubin_bytes(so, cuobjdump)
                    so.unlink()
        rows.append(
            {
                "key": key,
                "name": e.meta["inputs"]["name"],
                "archs": archs,
                "wheel": e.filename,
                "sha256": e.sha256,
                "bytes": e.size,
                "build_seconds": e.meta.get("build_seconds"),
                "compile_seconds": e.meta.get("compile_seconds"),
                "built_at": e.meta.get("built_at"),
                "modules": [
                    {**m, "cubin_bytes": cubins.get(m["module"], {})} for m in code.to_dict()["modules"]
                ],
                "missing": [list(m) for m in code.missing(archs)],
            }
        )
    ratios = [
        {
            "key": r["key"],
            "against": rows[0]["key"],
            "bytes": _ratio(rows[0]["bytes"], r["bytes"]),
            "compile_seconds": _ratio(rows[0]["compile_seconds"] or 0, r["compile_seconds"] or 0),
            "same_wheel": r["sha256"] == rows[0]["sha256"],
        }
        for r in rows[1:]
    ]
    result = {"machine": _machine(), "wheels": rows, "ratios": ratios}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(
            f"{r['key'][:12]} {r['name']:<24} archs {','.join(r['archs']):<7} {r['bytes'] / 1e6:8.2f} MB "
            f"compile {r['compile_seconds']}s sha256 {r['sha256'][:12]} missing {r['missing'] or 'none'}"
        )
        for m in r["modules"]:
            print(
                f"    {m['module']:<60} {m['size'] / 1e6:7.2f} MB SASS {','.join(m['sass']) or '-'} "
                f"PTX {','.join(m['ptx']) or '-'} cubin bytes {m['cubin_bytes'] or '-'}"
            )
    for r in ratios:
        print(
            f"{r['key'][:12]} against {r['against'][:12]}: size x{r['bytes']} compile x{r['compile_seconds']} same wheel {r['same_wheel']}"
        )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    subs = p.add_subparsers(dest="cmd", required=True)
    s = subs.add_parser("sample", help="compile sampled objects both ways in the builder's environment")
    s.add_argument(
        "--image", required=True, help="the mtp-torch stage's image (docker build --target mtp-torch)"
    )
    s.add_argument("--package", required=True, choices=sorted(SWITCHES))
    s.add_argument("--source", required=True, help="the sdist (checked against --sha256) or a source tree")
    s.add_argument("--sha256")
    s.add_argument("--requirements", required=True, help="render's build/requirements/ext-build-<name>.txt")
    s.add_argument("--files", required=True, help="comma-separated source file names to compile")
    s.add_argument(
        "--set", dest="sets", action="append", help="an arch set, comma-separated (first: the baseline)"
    )
    s.add_argument("--cuobjdump", type=Path)
    s.add_argument("--ca-bundle", help="CA bundle for pip in the container (a TLS-intercepting proxy)")
    s.add_argument("--docker", default=shutil.which("docker") or "docker")
    s.add_argument(
        "--scratch", default=None, help="where the unpacked source and objects go (default: TMPDIR)"
    )
    s.add_argument("--keep", help="copy the objects here")
    s.add_argument("--nice", type=int, default=10, help="niceness of the compiles (shared machines)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_sample)
    w = subs.add_parser("wheels", help="cached wheels: size, compile time, cuobjdump per module")
    w.add_argument("keys", nargs="+")
    w.add_argument("--cuobjdump", type=Path)
    w.add_argument("--out", required=True)
    w.set_defaults(func=cmd_wheels)
    i = subs.add_parser("_inside")  # what `sample` runs in the container
    i.add_argument("--package", required=True)
    i.add_argument("--src", required=True)
    i.add_argument("--out", required=True)
    i.add_argument("--files", required=True, type=lambda v: v.split(","))
    i.add_argument("--set", dest="sets", action="append", required=True)
    i.set_defaults(func=_inside)
    args = p.parse_args(argv)
    if args.cmd == "sample" and not args.sets:
        args.sets = ["90", "90,100"]
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
