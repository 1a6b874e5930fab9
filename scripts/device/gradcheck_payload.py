#!/usr/bin/env python3
"""Payload for the product's gradient check on one GPU (issue 45 item 2's GPU half).

Writes build/device/gradgpu/ (not committed; carried by the `run` tool):
  site/            megatron/ from PyPI's megatron-core 0.19.1 and verl/ from verl 0.9.1, the
                   wheels by the sha256 the CPU e2e test pins (tests/e2e/test_grad_check_cpu.py),
                   unpacked without their dependencies: the device's own torch runs them
  whl/             einops (megatron imports it; the device image may lack it)
  cases/NAME/      version.json + overrides, rendered by this checkout for each shipped
                   profile's training side, plus the two configurations that broke the
                   promise (mtp-cp-recompute's recipe of 2026-12-03, and detach_encoder +
                   mtp_detach_heads under full recompute)
Then, on the device: `bash scripts/device/gradcheck-gpu.sh` (carry build/device/gradgpu).

    .venv/bin/python scripts/device/gradcheck_payload.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from test_grad_check_cpu import OLD_CP_RECOMPUTE, WHEELS, pinned_wheel  # noqa: E402  (one home for the pins)

from mtpimage.assembly.render import render  # noqa: E402
from mtpimage.commands.load import plan_for  # noqa: E402
from mtpimage.manifests import manifest  # noqa: E402

OUT = ROOT / "build" / "device" / "gradgpu"
EINOPS = "einops==0.8.2"


def _pip_download(spec: str, dest: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "-d",
            str(dest),
            spec,
        ],
        check=True,
        timeout=600,
    )


def _site(dest: Path, cache: Path) -> None:
    for filename, sha, project in WHEELS:
        wheel = pinned_wheel(Path(sys.executable), filename, sha, cache)
        top = "megatron/" if project == "megatron-core" else "verl/"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest, [n for n in z.namelist() if n.startswith(top)])


def _cases() -> dict[str, tuple[bytes, str]]:
    m = manifest.load()
    out: dict[str, tuple[bytes, str]] = {}
    for profile in ("mtp-load-only", "mtp-full", "mtp-detach", "mtp-cp-recompute", "mtp-rollout"):
        files = render(plan_for(m, profile, None), m.root).files
        target = "rl" if profile == "mtp-rollout" else "sft"
        out[profile] = (files["mtp/version.json"], files[f"mtp/verl/{target}.overrides"].decode())
    vector, new = out["mtp-cp-recompute"]
    old = new.replace("model.mtp.detach_encoder=False", OLD_CP_RECOMPUTE)
    old = "\n".join(ln for ln in old.splitlines() if "mtp_detach_heads" not in ln) + "\n"
    out["old-cp-recompute-2026-12-03"] = (vector, old)
    out["detach-encoder-heads-recompute"] = (
        vector,
        new.replace("detach_encoder=False", "detach_encoder=True"),
    )
    return out


def main() -> int:
    if OUT.exists():
        shutil.rmtree(OUT)
    cache = ROOT / "build" / "device" / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    _site(OUT / "site", cache)
    _pip_download(EINOPS, OUT / "whl")
    for name, (vector, overrides) in _cases().items():
        case = OUT / "cases" / name
        case.mkdir(parents=True)
        (case / "version.json").write_bytes(vector)
        (case / "overrides").write_text(overrides)
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"{OUT.relative_to(ROOT)}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
