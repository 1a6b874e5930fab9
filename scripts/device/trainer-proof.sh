#!/usr/bin/env bash
# ON THE DEVICE (an H200 machine of the `run` tool): issue 34's run of verl's own sft_trainer
# with the lock's packages, through the product's images/checks/trainer_check.py.
#   trainer-proof.sh stage DIR...   copy carries (build/device/trainer/carry/cN) to /tmp/stage
#   trainer-proof.sh run PROFILE... site-install.sh (every file at its sha256 and RECORD hash, the
#                                   sdists and git sources, the .pth path lines, the TE torch
#                                   extension: the image's wheel if carried and it loads, else built
#                                   from its sdist), then trainer_check.py --variants per profile
#   MTP_REUSE_SITE=1 trainer-proof.sh run PROFILE...
#                                   the same on a site an earlier call installed on this warm
#                                   machine (SITE/.env.sh), without installing again: the runs of
#                                   one session can be spread over calls of at most 10 minutes
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
if [ -n "${MTP_REUSE_SITE:-}" ] && [ -f $SITE/.env.sh ]; then
    . $SITE/.env.sh
    echo "site reused: $SITE (TE torch extension: $TE_FROM)"
else
    . scripts/device/site-install.sh
    install_site $D/payload.json $STAGE $SITE /tmp/sft-scratch
fi
t1=$(date +%s)
python3 -c "import transformer_engine.pytorch, megatron.core, megatron.bridge, megatron.energon, verl; print('imports ok')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
pids=()
for p in "$@"; do
    # MTP_NO_VARIANTS="P ...": these profiles without --variants (device time: a profile whose
    # recipe and engine settings another profile of the call already shows adds nothing there)
    case " ${MTP_NO_VARIANTS:-} " in *" $p "*) variants="" ;; *) variants=--variants ;; esac
    python3 images/checks/trainer_check.py --json $variants --work /tmp/w-$p \
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
# the run tool brings back at most 8 files a call: the stderr files go as one, and not at all
# where empty, so that they do not crowd out a report
for p in "$@"; do
    [ -s $OUT/$p.err ] && { echo "== $p"; cat $OUT/$p.err; } >> $OUT/stderr.txt
    rm -f $OUT/$p.err
done
find "$OUT" -maxdepth 1 -type f -empty -delete
exit $rc
