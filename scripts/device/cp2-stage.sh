#!/usr/bin/env bash
# Device staging for the CP=2 proof (issue 17): run as `bash scripts/device/cp2-stage.sh N`
# on the device machine, carrying build/device/pN (part N of the TransformerEngine core).
# The TE core wheel (190 MB; 137 MB as tar.xz of its files) is larger than one call carries,
# but files outside the working tree stay while the machine is held: each call leaves its part
# in /tmp/teparts. Call 1 also installs the carried wheels and starts building
# transformer_engine_torch 2.12.0 from its PyPI sdist in the background (setsid: it outlives
# the call), so the build runs while parts 2 and 3 travel.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
n=$1
S=$OUT/stage$n.txt
mkdir -p /tmp/teparts
cp build/device/p$n/tecore.part.$((n - 1)) /tmp/teparts/ || exit 3
{ echo "stage $n: $(date -u +%FT%TZ)"; ls -l /tmp/teparts; } > $S
if [ "$n" = 1 ]; then
  PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target"
  $PIP /tmp/mc019 build/device/whl/mlm-5be96267/*.whl && $PIP /tmp/mc018 build/device/whl/mlm-ba7b5ebc/*.whl \
    && $PIP /tmp/verl build/device/whl/verl-7bc80c00/*.whl && $PIP /tmp/pyd build/device/pyd/*.whl || exit 4
  mkdir -p /tmp/tetb && tar xzf build/device/tesmall/transformer_engine_torch-2.12.0.tar.gz -C /tmp/tetb || exit 5
  cp build/device/tesmall/transformer_engine-2.12.0-py3-none-any.whl /tmp/tetb/
  setsid bash -c 'cd /tmp/tetb/transformer_engine_torch-2.12.0 && t0=$(date +%s) &&
    env NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 MAX_JOBS=32 NVTE_PYTORCH_FORCE_BUILD=TRUE \
      python3 -m pip install -v --no-build-isolation --no-deps --no-index --no-cache-dir --target /tmp/tetorch . \
      > /tmp/tetb/build.log 2>&1; rc=$?; echo "$rc $(( $(date +%s) - t0 ))" > /tmp/tetb/rc' \
    > /dev/null 2>&1 < /dev/null &
  {
    nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
    nvcc --version | tail -2; python3 --version
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())'
    python3 -m pip list 2>/dev/null | grep -i -E "^(nvidia-cublas|nvidia-cudnn|nvidia-nccl|triton|wheel|setuptools|pybind11|typing.extensions|numpy) "
    ls /tmp/mc019 /tmp/mc018 /tmp/verl | grep dist-info
  } >> $S 2>&1
fi
sleep 2
{ echo "build: rc=$(cat /tmp/tetb/rc 2>/dev/null || echo running)"; tail -3 /tmp/tetb/build.log 2>/dev/null; } >> $S
cat $S
