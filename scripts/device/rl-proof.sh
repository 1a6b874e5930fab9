#!/usr/bin/env bash
# ON THE DEVICE (an H200 machine of the `run` tool): issue 34's runs of verl's main_ppo with SGLang
# rollout and the Megatron actor on one GPU, with the lock's packages, through the product's
# images/checks/rl_check.py.
#   rl-proof.sh stage DIR...    copy carries (build/device/rl/carry/cN) to /tmp/rl-stage
#   rl-proof.sh run PROFILE...  payload_install.py (every file at its sha256, every wheel's files
#                               at their RECORD hash, the sglang patch, libnuma), then the sdists and
#                               git sources with pip, the TE torch extension (the carried wheel if
#                               it loads, else built from its sdist), then rl_check.py for each
#                               profile at once; reports in $OUT
# Prepared here by scripts/device/trainer_payload.py --rl --compress (files) and `build.py render`
# (each profile's version vector and rl overrides under build/device/rl/profiles/P/). Staged files
# live while the machine stays warm (30 s between calls). MTP_RL_STEPS (3), MTP_RL_TIMEOUT (s per run).
set -euo pipefail
cd "$(dirname "$0")/../.."
# own folders: trainer-proof.sh (another session's payload) may stage on the same machine
STAGE=/tmp/rl-stage SITE=/tmp/rl-site D=build/device/rl
case "$1" in
stage)
    mkdir -p $STAGE
    shift
    for dir in "$@"; do
        for f in "$dir"/*; do
            case "$f" in *.tar) tar xf "$f" -C $STAGE ;; *) cp "$f" $STAGE/ ;; esac
        done
    done
    echo "staged: $(ls $STAGE | wc -l) files, $(du -sm $STAGE | cut -f1) MiB"
    exit 0 ;;
run) shift ;;
*) echo "usage: $0 stage DIR... | run PROFILE..." >&2; exit 2 ;;
esac
t0=$(date +%s)
rm -rf $SITE && mkdir -p $SITE
python3 scripts/device/payload_install.py $D/payload.json $STAGE $SITE | tee $OUT/install.json
# a folder on PYTHONPATH is no site dir: its .pth files are not read, so their path lines go on
# PYTHONPATH too (nvidia_cutlass_dsl.pth: nvidia_cutlass_dsl/python_packages, the `cutlass` DSL)
pth=$(python3 -c "
import pathlib, sys
site = pathlib.Path(sys.argv[1])
dirs = [site / ln.strip() for p in sorted(site.glob('*.pth')) for ln in p.read_text().splitlines()
        if ln.strip() and not ln.startswith(('#', 'import'))]
print(':'.join(str(d) for d in dirs if d.is_dir()))" $SITE)
export PYTHONPATH=$SITE${pth:+:$pth} LD_LIBRARY_PATH=$SITE/_native${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PATH=$SITE/bin:$PATH
echo "PYTHONPATH=$PYTHONPATH"
# the lock's pure-Python sdists (resolution.sdists: antlr4-python3-runtime)
for sd in $STAGE/*.tar.gz; do
    case "$(basename "$sd")" in src-*|transformer_engine_torch-*) continue ;; esac
    rm -rf /tmp/rl-one
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/rl-one "$sd" 2>&1 | tail -3 || true
    cp -r /tmp/rl-one/. $SITE/
done
# each source into a folder of its own, then merged: pip --target skips a top-level folder that
# exists already (megatron/ is a namespace that Megatron-LM and Megatron-Bridge share)
for src in $STAGE/src-*.tar.gz; do
    rm -rf /tmp/rl-src /tmp/rl-one && mkdir /tmp/rl-src && tar xzf "$src" -C /tmp/rl-src
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/rl-one /tmp/rl-src/* 2>&1 | tail -3 || true
    cp -r /tmp/rl-one/. $SITE/
done
echo "installed in $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
# TE's torch extension: the carried wheel (payload_install.py put the image's compiled extension
# wheels, TE's, apex's and flash-attn's where carried, over the lock's) when it loads here;
# otherwise built from the lock's sdist as trainer-proof.sh does
te_ok=no
if ls $STAGE/transformer_engine_torch-*.whl >/dev/null 2>&1; then
    if python3 -c "import transformer_engine.pytorch" 2>/tmp/rl-te.err; then te_ok="carried wheel"; else tail -3 /tmp/rl-te.err; fi
fi
if [ "$te_ok" = no ]; then
    NVTE_FRAMEWORK=pytorch NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 MAX_JOBS=16 \
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/rl-te-build \
        $STAGE/transformer_engine_torch-*.tar.gz 2>&1 | tail -3
    cp -r /tmp/rl-te-build/. $SITE/
    te_ok="built here from the sdist"
fi
echo "TE torch extension: $te_ok ($(( $(date +%s) - t1 )) s)"
# apex's and flash-attn's compiled modules, where their wheels were carried (else rl_check.py
# adds its named stand-ins for the actor)
for mod in fused_weight_gradient_mlp_cuda flash_attn_2_cuda; do
    python3 -c "import torch, $mod" 2>/dev/null && echo "compiled extension $mod: loads" || echo "compiled extension $mod: absent or does not load"
done
python3 -c "
import transformer_engine.pytorch, megatron.core, megatron.bridge, verl, sglang, sgl_kernel, flashinfer
import verl.workers.rollout.sglang_rollout.async_sglang_server
print('imports ok: sglang', sglang.__version__, 'verl', verl.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t2=$(date +%s)
pids=()
for p in "$@"; do
    python3 images/checks/rl_check.py --json --steps "${MTP_RL_STEPS:-3}" --work /tmp/rl-w-$p \
        --version-vector $D/profiles/$p/version.json --overrides $D/profiles/$p/rl.overrides \
        > $OUT/$p.json 2> $OUT/$p.err &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
echo "rl checks done in $(( $(date +%s) - t2 )) s (rc $rc); whole run $(( $(date +%s) - t0 )) s"
for p in "$@"; do
    python3 -c "
import json
r = json.load(open('$OUT/$p.json'))
print('==', '$p', 'ok' if r['ok'] else 'FAILED', r['notes'])
for x in r['results']: print(' ', x['status'].upper(), x['id'], x['detail'][:300])
for x in r['runs']: print('  run', {k: x[k] for k in ('rc', 'seconds', 'steps', 'step_seconds', 'actor_peak_gib', 'gpu_peak_mib')})
" 2>&1 || tail -5 $OUT/$p.err
done
tar czf $OUT/runs.tar.gz --exclude=ckpt --exclude=model --exclude=ray -C /tmp $(cd /tmp && ls -d rl-w-*/runs) 2>/dev/null || true
exit $rc
