#!/usr/bin/env bash
# Build shipped profiles on the REAL stack here: real PyPI wheels from manifests/lock.yaml,
# real git sources at their pinned commits (served by a mirror through git's url.insteadOf),
# real patches. At most two substitutions, both recorded in the version vector and a label:
#   - the base image: a local stand-in (scripts/real-stack/make-base.sh);
#   - only where asked for, MTP_OMIT_PACKAGES (the compiled extensions are built, not omitted).
#
#   scripts/real-stack/build.sh [PROFILE ...]     (default: every shipped profile)
#   MTP_REAL_STACK_BUILD_ARGS="--reproducible --push --registry 127.0.0.1:5000/NS" scripts/real-stack/build.sh P
#                                                 (more main-job options, split on spaces)
#
# Every profile runs; the exit status is 1 when any failed, each named on stderr as
# `failed: PROFILE (exit N)`. Logs and summaries go to $MTP_REAL_STACK_OUT (out/real-stack).
#
# Needs scripts/setup-test-host.sh (dockerd, registry on 127.0.0.1:5000). Git mirrors with
# missing blobs (snapshots) need MTP_GIT_ALLOW_MISSING_BLOBS=1; the paths they lack are
# recorded in each source's .mtp-source.json in the image.
set -euo pipefail
cd "$(dirname "$0")/../.."
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(mtp-load-only mtp-full mtp-detach mtp-cp-recompute mtp-rollout)
# The tool's own cache root (MTP_CACHE_DIR, default ~/.cache/mtp-image-builder): the compiled
# extensions' wheels and compile cache that `python build.py` made are found here too (a
# separate root made this script compile TransformerEngine again from nothing).
# Assigned before export: `export X=$(cmd)` is export's status, and a failed make-base
# would go unnoticed.
if [ -z "${MTP_SUBSTITUTE_BASE:-}" ]; then
    MTP_SUBSTITUTE_BASE=$(bash scripts/real-stack/make-base.sh | tail -1)
fi
export MTP_SUBSTITUTE_BASE
export MTP_OMIT_PACKAGES=${MTP_OMIT_PACKAGES:-}
PY=${PYTHON:-.venv/bin/python}
CA=${MTP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
OUT=${MTP_REAL_STACK_OUT:-out/real-stack}
mkdir -p "$OUT"
failed=()
for p in "${profiles[@]}"; do
    echo "== $p (base $MTP_SUBSTITUTE_BASE; omitted $MTP_OMIT_PACKAGES)"
    start=$(date +%s)
    set +e
    # shellcheck disable=SC2086  # the extra options are meant to split on spaces
    "$PY" build.py --profile "$p" --ca-bundle "$CA" --progress plain --summary-file "$OUT/$p.json" \
        ${MTP_REAL_STACK_BUILD_ARGS:-} > "$OUT/$p.log" 2>&1
    rc=$?
    set -e
    echo "$p: exit $rc in $(( $(date +%s) - start )) s (log: $OUT/$p.log)"
    tail -25 "$OUT/$p.log"
    # every profile still runs: one failure should not hide how the others fare
    [ "$rc" -eq 0 ] || failed+=("$p (exit $rc)")
done
if [ ${#failed[@]} -gt 0 ]; then
    for f in "${failed[@]}"; do echo "failed: $f" >&2; done
    echo "${#failed[@]} of ${#profiles[@]} profiles failed" >&2
    exit 1
fi
echo "all ${#profiles[@]} profiles built"
