#!/usr/bin/env bash
# Second CP=2 proof run (issue 17), after the MTP-tracker fix (megatron-core 0.18's
# clean_loss_in_tracker raised KeyError('values') in the first run). Call 3 on nvidia-h200-x2, after
# scripts/device/cp2-stage.sh 1 and 2 on the same (still held) machine; carries build/device/p3.
# megatron-core and verl are wheels built here from the exact commits the image installs
# (Megatron-LM 5be9626709af..., core_v0.18.0 ba7b5ebce12a... for the negative proof,
# verl 7bc80c00a078...). TransformerEngine 2.12.0: PyPI core (transformer_engine_cu13) +
# meta wheel + transformer_engine_torch built on the device from the PyPI sdist.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$OUT/summary.txt; P=$OUT/setup.txt
: > $S; : > $P
cp build/device/p3/tecore.part.2 /tmp/teparts/ || exit 3
ls -l /tmp/teparts >> $P
t0=$(date +%s)
cat /tmp/teparts/tecore.part.0 /tmp/teparts/tecore.part.1 /tmp/teparts/tecore.part.2 > /tmp/tecore.tar.xz
echo "6837f9a1a81e72657a464f01fb7aded421a20e83cf94fce97e46f7ea23a8c11c  /tmp/tecore.tar.xz" | sha256sum -c >> $P 2>&1 \
  || { echo "TE core parts incomplete (machine changed between calls?)" | tee -a $S; exit 4; }
mkdir -p /tmp/te && xz -dc -T0 /tmp/tecore.tar.xz | tar x -C /tmp/te || exit 5
(cd /tmp/te && python3 -c 'import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); [z.extract(n) for n in z.namelist() if not __import__("os").path.exists(n)]' /tmp/tetb/transformer_engine-2.12.0-py3-none-any.whl)
echo "TE core + meta unpacked in $(( $(date +%s) - t0 ))s" >> $P
for i in $(seq 1 120); do [ -f /tmp/tetb/rc ] && break; sleep 2; done
echo "transformer_engine_torch build: rc secs = $(cat /tmp/tetb/rc 2>/dev/null || echo 'not finished')" >> $P
grep -E -i "error|Successfully|Building|nvcc|g\+\+ .*-o " /tmp/tetb/build.log | tail -5 >> $P
cp -an /tmp/tetorch/. /tmp/te/ || { tail -30 /tmp/tetb/build.log >> $P; echo "torch extension missing" | tee -a $S; exit 6; }
ls /tmp/te >> $P
export PYTHONPATH=/tmp/te:/tmp/pyd:/tmp/mc019:/tmp/verl
python3 - >> $P 2>&1 <<'PY'
import importlib.metadata as md, torch
print("torch cudnn (before TE is imported)", torch.backends.cudnn.version())
import transformer_engine, transformer_engine.pytorch as te
print("transformer_engine", md.version("transformer_engine"), "core", md.version("transformer_engine_cu13"),
      "torch ext", md.version("transformer_engine_torch"), "from", transformer_engine.__file__)
print("TE cudnn", te.get_cudnn_version())
print("libcudnn mapped:", sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcudnn.so" in l}))
for d in ("nvidia-cublas", "nvidia-cudnn-cu13", "megatron-core", "verl"):
    try: print(d, md.version(d))
    except Exception as e: print(d, e)
import megatron.core, os; print("megatron.core", megatron.core.__version__, os.path.dirname(megatron.core.__file__))
PY
echo "smoke rc=$?" >> $P
C=images/checks/gpu_check.py
TR="python3 -m torch.distributed.run --nproc-per-node 2"
run() {  # version label, then the command
  local v=$1 label=$2; shift 2
  local t1=$(date +%s)
  export PYTHONPATH=/tmp/te:/tmp/pyd:/tmp/mc$v:/tmp/verl
  echo "===== [$label] PYTHONPATH=$PYTHONPATH \$ $*" >> $OUT/mc$v.txt
  echo "===== [$label] \$ $*" >> $OUT/mc$v.err
  timeout 240 "$@" >> $OUT/mc$v.txt 2>> $OUT/mc$v.err
  local rc=$?
  echo "----- [$label] rc=$rc ($(( $(date +%s) - t1 ))s)" >> $OUT/mc$v.txt
  echo "mc$v [$label] rc=$rc ($(( $(date +%s) - t1 ))s)" | tee -a $S
}
run 019 all-torchrun2 env NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 $TR $C --mode all
run 018 all-torchrun2 $TR $C --mode all
for v in 019 018; do echo "mc$v (rows of both ranks):"; grep -h -E "^(cp-recompute|load-only|full|mtp-only)" $OUT/mc$v.txt | awk '{print $1, $2, $3}' | sort | uniq -c; done >> $S
echo "total $(( $(date +%s) - t0 ))s" >> $S
cat $S
