#!/usr/bin/env bash
# The product's gradient check (images/checks/gpu_check.py) on one GPU, for every case that
# scripts/device/gradcheck_payload.py rendered (carry build/device/gradgpu). The device's own
# torch; megatron-core 0.19.1 and verl 0.9.1's mtp_patch from PyPI's wheels by sha256.
# Writes $OUT/NAME.json (the check's report), $OUT/summary.txt (name, exit, verdicts).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P=build/device/gradgpu
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gsite $P/whl/*.whl || exit 3
export PYTHONPATH=$PWD/$P/site:/tmp/gsite
S=$OUT/summary.txt; : > "$S"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$S"
python3 -c 'import torch, megatron.core as mc; print("torch", torch.__version__, "megatron.core", mc.__version__)' >> "$S" 2>&1
for c in $P/cases/*/; do
    n=$(basename "$c")
    t0=$(date +%s.%N)
    python3 images/checks/gpu_check.py --json --version-vector "$c/version.json" --overrides "$c/overrides" \
        > "$OUT/$n.json" 2> "$OUT/$n.err"
    rc=$?
    t=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
    python3 - "$OUT/$n.json" "$n" "$rc" "$t" >> "$S" <<'PY'
import json, sys
path, name, rc, t = sys.argv[1:]
try:
    r = json.loads(open(path).read().strip().splitlines()[-1])
except Exception as e:  # the report is missing: say so, keep going
    print(f"{name}: exit {rc} in {t}s, no report ({e})"); sys.exit()
verdicts = ", ".join(f"{c['name']}={c['status']}" + (f"({c['rule']})" if c["rule"] else "") for c in r["checks"])
print(f"{name}: exit {rc} in {t}s; {verdicts}")
for check, g in (r["env"].get("gradients") or {}).items():
    print("   ", check, "; ".join(f"{k} {v['with_grad']}/{v['params']} ({v['norm']:.3e})" for k, v in g.items()))
PY
done
cat "$S"
