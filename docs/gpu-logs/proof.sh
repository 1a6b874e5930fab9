#!/usr/bin/env bash
# Device proof for images/checks/gpu_check.py (issue 5). Run from the repo root.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target"
$PIP /tmp/mc018 .whl018/*.whl && $PIP /tmp/mc019 .whl019/*.whl && $PIP /tmp/verl .whlverl/*.whl || exit 3
C=images/checks/gpu_check.py
S=$OUT/summary.txt
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1; python3 -c 'import torch;print(torch.__version__, torch.version.cuda)'; } > $S 2>&1
cat > /tmp/vv.json <<'J'
{"mode": "mtp-only", "engine": {"context_parallel_size": 2, "recompute": {"granularity": "full", "method": "uniform", "num_layers": 1}}}
J
run() {  # label, then the command
  local label=$1; shift
  local t0=$(date +%s)
  echo "===== [$label] \$ $*" >> $T
  echo "===== [$label] \$ $*" >> $E
  timeout 150 "$@" >> $T 2>> $E
  local rc=$?
  echo "----- [$label] rc=$rc ($(( $(date +%s) - t0 ))s)" >> $T
  echo "$V [$label] rc=$rc ($(( $(date +%s) - t0 ))s)" | tee -a $S
}
use() { V=$1; export PYTHONPATH=/tmp/mc$V:/tmp/verl; T=$OUT/mc$V.txt; E=$OUT/mc$V.err; touch $T $E; }
# phase 1: the proofs that matter most
for v in 019 018; do use $v; run all python3 $C --mode all; done
for v in 019 018; do use $v; run broken-detach python3 $C --mode all --inject-broken-detach; done
for v in 019 018; do use $v; run torchrun2 python3 -m torch.distributed.run --nproc-per-node 2 $C --mode cp-recompute; done
for v in 019 018; do use $v; run vector-json python3 $C --version-vector /tmp/vv.json --json; done
# phase 2: exit codes mode by mode, and the local (no verl) detach
for v in 019 018; do use $v; for m in load-only full mtp-only cp-recompute; do run $m python3 $C --mode $m; done; done
for v in 019 018; do use $v; run no-verl python3 $C --mode all --no-verl; done
V=nogpu; T=$OUT/nogpu.txt; E=$OUT/nogpu.err; : > $T; : > $E
export PYTHONPATH=/tmp/mc019:/tmp/verl
run no-gpu env CUDA_VISIBLE_DEVICES= python3 $C --mode full
run cpu-only env CUDA_VISIBLE_DEVICES= python3 $C --mode full --cpu-only
cat $S
