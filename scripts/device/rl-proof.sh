#!/usr/bin/env bash
# ON THE DEVICE (an H200 machine of the `run` tool): issue 34's runs of verl's main_ppo with SGLang
# rollout and the Megatron actor on one GPU, with the lock's packages, through the product's
# images/checks/rl_check.py.
#   rl-proof.sh stage DIR...    copy carries (build/device/rl/carry/cN) to /tmp/rl-stage
#   rl-proof.sh run PROFILE...  site-install.sh (every file at its sha256, the sdists and git
#                               sources, the TE torch extension: the carried wheel if it loads, else
#                               built from its sdist), then rl_check.py for each profile at once;
#                               reports in $OUT
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
. scripts/device/site-install.sh
install_site $D/payload.json $STAGE $SITE /tmp/rl-scratch
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
# the run tool brings back at most 8 files a call: empty stderr files must not crowd out a report
find "$OUT" -maxdepth 1 -type f -empty -delete
exit $rc
