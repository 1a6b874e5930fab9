#!/usr/bin/env bash
# A weekly bump session on real upstream history (issue #36), each bump on its own copy of
# manifests/ so none sees another's change and the checkout's manifests stay as they are:
#   scripts/real-stack/bump-session.sh [OUT [BUMP...]]   (default out/bump-session, every bump)
# Needs the git sources reachable (upstream, or mirrors through git's url.insteadOf;
# snapshots with absent blobs also MTP_GIT_ALLOW_MISSING_BLOBS=1) and PyPI. For each bump:
# the command, exit code, seconds, the files it changed (diff against the copy's start) and the
# report (--report), under OUT/<name>/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-out/bump-session}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
run() {  # NAME ARGS...
    local name=$1; shift
    local d="$OUT/$name"
    rm -rf "$d" && mkdir -p "$d" && cp -r manifests "$d/before" && cp -r manifests "$d/m"
    local t0; t0=$(date +%s)
    local report=()
    [ "$1" = bump ] && report=(--report "$d/report.md")  # lock prints its changes, no report
    "$PY" build.py --manifests "$d/m" "$@" "${report[@]}" > "$d/stdout.txt" 2> "$d/stderr.txt"
    local rc=$?
    local took=$(( $(date +%s) - t0 ))
    (cd "$d" && diff -ru before m > changes.diff; diff -rq before m | sed 's|^Files before/\([^ ]*\) and .*|\1|' > changed-files.txt) || true
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$took" "$(paste -sd, "$d/changed-files.txt")" "build.py $*" >> "$OUT/summary.tsv"
    echo "$name: exit $rc in $took s; changed: $(paste -sd' ' "$d/changed-files.txt")"
    echo "  first error: $(grep -m1 '^error:' "$d/stderr.txt" | cut -c1-300)"
}
if [ $# -gt 1 ]; then shift; else set -- verl-latest megatron-core_r0.19.0 megatron-main sglang-0.5.12.post1 sglang-0.5.13 cutoff-now; fi
for b in "$@"; do
    case "$b" in
    verl-latest) run "$b" bump verl --latest ;;
    megatron-core_r0.19.0) run "$b" bump megatron-lm --to core_r0.19.0 ;;
    megatron-main) run "$b" bump megatron-lm --to main ;;
    sglang-0.5.12.post1) run "$b" bump sglang --to 0.5.12.post1 ;;
    sglang-0.5.13) run "$b" bump sglang --to 0.5.13 ;;
    cutoff-now) run "$b" lock --exclude-newer now ;;
    *) echo "unknown bump $b" >&2; exit 2 ;;
    esac
done
