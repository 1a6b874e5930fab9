#!/usr/bin/env bash
# The node preflight of issue 49 on a real GPU: images/runtime/driver-check.sh (the image's
# entrypoint runs it; so do the job scripts) against the real nvidia-smi, with the driver
# facts the tool renders for mtp-detach at three builds.cuda_archs: 90 (this GPU's code: goes
# on), 100 (no code for an sm_90 GPU: refused, one line, exit 1), 90,100 (goes on).
#   bash scripts/device/archcheck-gpu.sh prepare    here: renders build/device/archcheck/ARCHS/driver.facts
#   bash scripts/device/archcheck-gpu.sh run        on the device (carry build/device/archcheck):
#                                                   writes $OUT/archcheck.txt
set -u
D=build/device/archcheck
case ${1:-} in
prepare)
    for archs in 90 100 90,100; do
        out=$(mktemp -d)
        .venv/bin/python build.py render --profile mtp-detach --set builds.cuda_archs=$archs --out "$out" > /dev/null || exit 1
        mkdir -p "$D/$archs"
        cp "$out/mtp/runtime/driver.facts" "$D/$archs/driver.facts"
        rm -rf "$out"
    done
    ls -R "$D"
    ;;
run)
    S=$OUT/archcheck.txt
    nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader > "$S"
    for archs in 90 100 90,100; do
        MTP_DRIVER_FACTS=$D/$archs/driver.facts sh images/runtime/driver-check.sh --job -- echo "went on" \
            > "$OUT/out.txt" 2> "$OUT/err.txt"
        rc=$?
        { echo "cuda_archs=$archs: exit $rc"; sed 's/^/  stdout: /' "$OUT/out.txt"; sed 's/^/  stderr: /' "$OUT/err.txt"; } >> "$S"
    done
    rm -f "$OUT/out.txt" "$OUT/err.txt"
    cat "$S"
    ;;
*) echo "usage: archcheck-gpu.sh prepare|run" >&2; exit 2 ;;
esac
