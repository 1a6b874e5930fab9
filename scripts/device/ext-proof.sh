#!/usr/bin/env bash
# Extensions proof of issue 22 on the device machine, one held machine (files outside the
# working tree stay while it is held; it goes back 30 s after a call). The payload
# (scripts/device/ext-prepare.sh) is more than one call carries (64 MiB), so:
#   bash scripts/device/ext-proof.sh stage      once per carry, carrying build/device/ext/carry/cN
#   bash scripts/device/ext-proof.sh run        last, carrying the last carry
#   bash scripts/device/ext-proof.sh cp2        instead of `run`, on the 2-GPU kind (issue 23):
#                                               the product's GPU check under a 2-rank torchrun
# `run` reassembles every file from its parts and checks its sha256, unpacks the
# TransformerEngine core and AutoBridge's closure into /tmp/site, installs the compiled wheels
# with pip --no-deps next to the device's own torch 2.11.0+cu130, runs
# scripts/device/ext_gpu_tests.py and the product's GPU check for every mode at CP=1 with
# TransformerEngine layers.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
n=$1
S=$OUT/$n-$(date +%s).txt
P=/tmp/extstage/parts
mkdir -p $P
for c in build/device/ext/carry/c*; do [ -d "$c" ] && cp -n "$c"/* $P/ 2>/dev/null; done
{ echo "stage $n: $(date -u +%FT%TZ)"; ls -l $P; } > $S
case $n in run | cp2) ;; *) cat $S; exit 0 ;; esac
t0=$(date +%s)
mkdir -p /tmp/extstage/whole/whl
for sum in $P/*.sha256; do
  name=$(basename "$sum" .sha256)
  case $name in *.whl) dest=/tmp/extstage/whole/whl/$name ;; *) dest=/tmp/extstage/whole/$name ;; esac
  cat $(ls $P/"$name".part.* | sort) > "$dest"
  got=$(sha256sum "$dest" | cut -d' ' -f1)
  [ "$got" = "$(cut -d' ' -f1 "$sum")" ] || { echo "$name: parts incomplete, sha256 $got (machine changed between calls?)" | tee -a $S; exit 3; }
  echo "$name reassembled, sha256 $got" >> $S
done
W=/tmp/extstage/whole
rm -rf /tmp/site && mkdir -p /tmp/site
for t in tecore autobridge; do
  # the closure lists console scripts outside site-packages (../../../bin/...): not needed here
  xz -dc -T0 $W/$t.tar.xz | tar x --exclude="../*" -C /tmp/site || { echo "$t unpack failed" | tee -a $S; exit 4; }
done
# TE's core, meta and torch-extension wheels share the transformer_engine/ folder, which
# pip --target does not merge ("Target directory ... already exists"): unpack those three
python3 - /tmp/site $W/whl/transformer_engine*.whl >> $S 2>&1 <<'PY' || { echo "TE unpack failed" | tee -a $S; exit 5; }
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
    print("unpacked", w)
PY
ls $W/whl/*.whl | grep -v /transformer_engine | xargs python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site >> $S 2>&1 || { echo "pip install failed" | tee -a $S; exit 5; }
echo "staged in $(( $(date +%s) - t0 ))s" >> $S
( cd $W/whl && sha256sum *.whl ) >> $S
export PYTHONPATH=/tmp/site
{
  nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  nvcc --version | tail -1; python3 --version
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
} >> $S 2>&1
cat $S
set -o pipefail
if [ "$n" = cp2 ]; then
  # CP=2 with exactly the image's wheels: cp-recompute[full,cp=2] and [mtp-only,cp=2] among them
  NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 timeout 500 python3 -m torch.distributed.run --nproc-per-node 2 \
    images/checks/gpu_check.py --mode all --transformer-impl transformer_engine 2>&1 | tail -60 | tee $OUT/gpu_check_cp2.txt
  exit
fi
timeout 300 python3 scripts/device/ext_gpu_tests.py 2>&1 | tee $OUT/ext_gpu_tests.txt
timeout 250 python3 images/checks/gpu_check.py --mode all --transformer-impl transformer_engine 2>&1 \
  | tail -30 | tee $OUT/gpu_check_transformer_engine.txt
