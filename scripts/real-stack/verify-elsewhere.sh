#!/usr/bin/env bash
# Rebuild a published real-stack image somewhere else and compare it bit for bit (issues 35, 37):
# a second checkout at REV, its cache in a fresh folder under /var/tmp (not ~/.cache), umask 077,
# another TZ and locale, every Python file through a loopback proxying PyPI mirror
# (scripts/real-stack/mirror.sh), the compiled extension wheels from the registry share by their
# key. `build.py verify` then rebuilds with the reproducible engine and compares every layer
# and the config with the published image; exit status is verify's.
#
#   scripts/real-stack/verify-elsewhere.sh PROFILE IMAGE@sha256:... REV [WHEEL_SHARE]
#
#   WHEEL_SHARE   HOST[:PORT]/NS/NAME of the wheels (default: $MTP_WHEEL_CACHE_REPO)
# Needs what scripts/real-stack/build.sh needs (the stand-in base, git mirrors through
# GIT_CONFIG_GLOBAL when github.com is unreachable). Log: $MTP_REAL_STACK_OUT/verify-PROFILE.log.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,12p "$0" >&2; exit 2; }
profile=$1 image=$2 rev=$3 share=${4:-${MTP_WHEEL_CACHE_REPO:-}}
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${MTP_REAL_STACK_OUT:-$root/out/real-stack}
mkdir -p "$OUT"
if [ -z "${MTP_SUBSTITUTE_BASE:-}" ]; then
    MTP_SUBSTITUTE_BASE=$(bash "$root/scripts/real-stack/make-base.sh" | tail -1)
fi
export MTP_SUBSTITUTE_BASE MTP_OMIT_PACKAGES=${MTP_OMIT_PACKAGES:-}
eval "$(bash "$root/scripts/real-stack/mirror.sh" start)"   # exports MTP_INDEX_REWRITE
export MTP_INDEX_REWRITE
where=$(mktemp -d /var/tmp/mtp-verify-elsewhere.XXXXXX)
git clone -q "$root" "$where/checkout"
git -C "$where/checkout" checkout -q "$rev"
export MTP_CACHE_DIR=$where/cache MTP_WHEEL_CACHE_REPO=$share
export TZ=Asia/Kolkata LC_ALL=C.UTF-8 LANG=C.UTF-8
umask 077
echo "verify $profile $image at $rev from $where/checkout (cache $MTP_CACHE_DIR, umask 077, TZ $TZ, $MTP_INDEX_REWRITE, wheels from ${share:-nowhere})"
before=$(bash "$root/scripts/real-stack/mirror.sh" served | tr '\n' ' ')
start=$(date +%s)
set +e
(cd "$where/checkout" && "${PYTHON:-$root/.venv/bin/python}" build.py verify --profile "$profile" --image "$image" \
    --ca-bundle "${MTP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}") >"$OUT/verify-$profile.log" 2>&1
rc=$?
set -e
echo "verify: exit $rc in $(( $(date +%s) - start )) s (log $OUT/verify-$profile.log)"
echo "mirror before: $before"
echo "mirror after:  $(bash "$root/scripts/real-stack/mirror.sh" served | tr '\n' ' ')"
tail -30 "$OUT/verify-$profile.log"
exit $rc
