#!/usr/bin/env bash
# gpu_check.py driven by the version vectors rendered for the five shipped profiles,
# on megatron-core 0.19.2 (the pinned line) and 0.18.2 (the buggy one), with verl 0.9.1's mtp_patch.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target"
$PIP /tmp/mc018 .whl018/*.whl && $PIP /tmp/mc019 .whl019/*.whl && $PIP /tmp/verl .whlverl/*.whl || exit 3
nvidia-smi -L
for v in 019 018; do
  for p in mtp-load-only mtp-full mtp-detach mtp-cp-recompute mtp-rollout; do
    PYTHONPATH=/tmp/mc$v:/tmp/verl timeout 150 python3 images/checks/gpu_check.py \
        --version-vector .devrun/vv/$p.json > $OUT/$v-$p.txt 2>&1
    echo "megatron-core 0.${v:1:2}.2 $p rc=$?"
    grep -E "^(torch-cuda|nccl|load-only|full|mtp-only|cp-recompute)" $OUT/$v-$p.txt | awk '{print "    " $1, $2, $3}'
  done
done
