#!/usr/bin/env bash
# ON THE DEVICE (an H200 machine of the `run` tool): issue 34's run of verl's own sft_trainer
# with the lock's packages, through the product's images/checks/trainer_check.py.
#   trainer-proof.sh stage DIR...   copy carries (build/device/trainer/carry/cN) to /tmp/stage
#   trainer-proof.sh run PROFILE... reassemble, check every file's sha256 (payload.json), install
#                                   into /tmp/site, build the TE torch extension from its sdist,
#                                   then trainer_check.py --variants for each profile at once
# Prepared here by scripts/device/trainer_payload.py (files) and `build.py render` (each profile's
# version vector and sft overrides under build/device/trainer/profiles/P/). Staged files live
# while the machine stays warm (30 s between calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
# own folders: another device script (rl-proof.sh) may have staged on the same warm machine
STAGE=/tmp/stage-sft SITE=/tmp/site-sft D=build/device/trainer
case "$1" in
stage)
    mkdir -p $STAGE
    shift
    for dir in "$@"; do
        for f in "$dir"/*; do
            case "$f" in *.tar) tar xf "$f" -C $STAGE ;; *) cp "$f" $STAGE/ ;; esac
        done
    done
    ls $STAGE | wc -l
    exit 0 ;;
run) shift ;;
*) echo "usage: $0 stage DIR | run PROFILE..." >&2; exit 2 ;;
esac
t0=$(date +%s)
python3 - $D/payload.json $STAGE <<'PY'
import hashlib, json, pathlib, sys
payload, stage = json.load(open(sys.argv[1])), pathlib.Path(sys.argv[2])
for name, want in payload["sha256"].items():
    p = stage / name
    if not p.exists():
        parts = sorted(stage.glob(name + ".part*"))
        if not parts:
            sys.exit(f"missing: {name}")
        p.write_bytes(b"".join(q.read_bytes() for q in parts))
    got = hashlib.sha256(p.read_bytes()).hexdigest()
    if got != want:
        sys.exit(f"{name}: sha256 {got}, want {want}")
print(f"{len(payload['sha256'])} files at their sha256")
PY
rm -rf $SITE && mkdir -p $SITE
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE $STAGE/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -3 || true
export PYTHONPATH=$SITE
# the lock's pure-Python sdists (resolution.sdists: antlr4-python3-runtime)
for sd in $STAGE/*.tar.gz; do
    case "$(basename "$sd")" in src-*|transformer_engine_torch-*) continue ;; esac
    rm -rf /tmp/one
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/one "$sd" 2>&1 | tail -3 || true
    cp -r /tmp/one/. $SITE/
done
# each source into a folder of its own, then merged: pip --target skips a top-level folder that
# exists already (megatron/ is a namespace that Megatron-LM and Megatron-Bridge share)
for src in $STAGE/src-*.tar.gz; do
    rm -rf /tmp/src /tmp/one && mkdir /tmp/src && tar xzf "$src" -C /tmp/src
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/one /tmp/src/* 2>&1 | tail -3 || true
    cp -r /tmp/one/. $SITE/
done
echo "installed in $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
# The image's compiled extension wheels (trainer_payload.py --ext-wheels) when they were carried;
# otherwise the TE torch extension is built here from its sdist (and flash-attn, apex stay absent).
if ls $STAGE/transformer_engine_torch-*.whl >/dev/null 2>&1; then
    echo "the image's compiled extension wheels: $(cd $STAGE && ls transformer_engine_torch-*.whl apex-*.whl flash_attn-*.whl 2>/dev/null | tr '\n' ' ')"
else
    NVTE_FRAMEWORK=pytorch NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 MAX_JOBS=16 \
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/te-torch \
        $STAGE/transformer_engine_torch-*.tar.gz 2>&1 | tail -3
    cp -r /tmp/te-torch/. $SITE/
    echo "TE torch extension built in $(( $(date +%s) - t1 )) s"
fi
python3 -c "import transformer_engine.pytorch, megatron.core, megatron.bridge, megatron.energon, verl; print('imports ok')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
pids=()
for p in "$@"; do
    python3 images/checks/trainer_check.py --json --variants --work /tmp/w-$p \
        --version-vector $D/profiles/$p/version.json --overrides $D/profiles/$p/sft.overrides \
        > $OUT/$p.json 2> $OUT/$p.err &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
echo "trainer checks done in $(( $(date +%s) - t1 )) s (rc $rc)"
for p in "$@"; do
    python3 -c "
import json, sys
r = json.load(open('$OUT/$p.json'))
print('==', '$p', 'ok' if r['ok'] else 'FAILED', r['notes'])
for x in r['results']: print(' ', x['status'].upper(), x['id'], x['detail'][:300])
for x in r['runs']: print('  run', x['name'], 'rc', x['rc'], x['seconds'], 's peak', x['peak_gib'], 'GiB steps', x['step_seconds'])
" 2>&1 || tail -5 $OUT/$p.err
done
tar czf $OUT/runs.tar.gz --exclude=ckpt -C /tmp $(cd /tmp && ls -d w-*/runs) 2>/dev/null || true
exit $rc
