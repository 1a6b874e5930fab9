"""Run INSIDE a built image (scripts/device/ext-prepare.sh does): pack what
`from megatron.bridge import AutoBridge` loads, at the image's versions, for the H200 proof of
issue 22, leaving out what the device machine already has at the same version and the torch/CUDA
stack (the proof's premise is the device's own torch 2.11.0+cu130; TE, flash-attn and apex
travel as the image's wheels). A distribution the device has at another version is packed only
when AutoBridge's behaviour hangs on it (AT_IMAGE_VERSION: transformers' model classes); the
rest of the device's own are used, and the packed list says which were packed. Usage: python autobridge_closure.py DEVICE_FREEZE OUT.tar"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys
import tarfile

# loaded without importing its module: tilelang dlopens z3-solver's z3/lib/libz3.so by path
# ("OSError: libz3.so: cannot open shared object file" on the device without it)
ALSO_LOADED = {"z3-solver"}
AT_IMAGE_VERSION = {"megatron-bridge", "megatron-core", "transformers", "huggingface-hub", "tokenizers"}
# flashinfer-cubin: 1.6 GB of prebuilt kernels, looked up at run time, not at import
NOT_PACKED = re.compile(
    r"^(torch|triton|nvidia-|cuda-|transformer-engine|flash-attn|apex|numpy|flashinfer-cubin)"
)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(freeze: str, out: str) -> int:
    from megatron.bridge import AutoBridge  # noqa: F401 - what it loads is the closure
    from megatron.bridge.models.mimo.mimo_bridge import MimoBridge  # noqa: F401

    pairs = (line.strip().split("==", 1) for line in open(freeze) if "==" in line)
    device = {norm(name): version for name, version in pairs}
    owners = md.packages_distributions()
    loaded = {d for m in list(sys.modules) for d in owners.get(m.split(".")[0], [])} | ALSO_LOADED
    packed = []
    site = next(p for p in sys.path if p.endswith("site-packages"))
    with tarfile.open(out, "w") as tar:
        for name in sorted(loaded, key=norm):
            dist = md.distribution(name)
            if NOT_PACKED.match(norm(name)):
                continue
            if norm(name) in device and (
                device[norm(name)] == dist.version or norm(name) not in AT_IMAGE_VERSION
            ):
                continue
            packed.append(f"{name}=={dist.version}")
            for f in dist.files or []:
                path = os.path.join(site, str(f))
                if os.path.isfile(path) and "__pycache__" not in str(f):
                    tar.add(path, arcname=str(f))
    print(f"packed {len(packed)} distributions, {os.path.getsize(out)} bytes: {' '.join(packed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
