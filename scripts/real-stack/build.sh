#!/usr/bin/env bash
# Build shipped profiles on the REAL stack here: real PyPI wheels from manifests/lock.yaml,
# real git sources at their pinned commits (served by a mirror through git's url.insteadOf),
# real patches. Exactly two substitutions, both recorded in the version vector and a label:
#   - the base image: a local stand-in (scripts/real-stack/make-base.sh);
#   - verl's wheelhouse extensions (transformer-engine, flash-attn, apex): omitted.
#
#   scripts/real-stack/build.sh [PROFILE ...]     (default: every shipped profile)
#
# Needs scripts/setup-test-host.sh (dockerd, registry on 127.0.0.1:5000). Git mirrors with
# missing blobs (snapshots) need MTP_GIT_ALLOW_MISSING_BLOBS=1; the paths they lack are
# recorded in each source's .mtp-source.json in the image.
set -euo pipefail
cd "$(dirname "$0")/../.."
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(mtp-load-only mtp-full mtp-detach mtp-cp-recompute mtp-rollout)
export MTP_CACHE_DIR=${MTP_CACHE_DIR:-/var/cache/mtp-real}
export MTP_SUBSTITUTE_BASE=${MTP_SUBSTITUTE_BASE:-$(bash scripts/real-stack/make-base.sh | tail -1)}
export MTP_OMIT_PACKAGES=${MTP_OMIT_PACKAGES:-transformer-engine,flash-attn,apex}
PY=${PYTHON:-.venv/bin/python}
CA=${MTP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
mkdir -p out/real-stack
for p in "${profiles[@]}"; do
    echo "== $p (base $MTP_SUBSTITUTE_BASE; omitted $MTP_OMIT_PACKAGES)"
    start=$(date +%s)
    set +e
    "$PY" build.py --profile "$p" --ca-bundle "$CA" --progress plain --summary-file "out/real-stack/$p.json" \
        > "out/real-stack/$p.log" 2>&1
    rc=$?
    set -e
    echo "$p: exit $rc in $(( $(date +%s) - start )) s (log: out/real-stack/$p.log)"
    tail -25 "out/real-stack/$p.log"
done
