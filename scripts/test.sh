#!/usr/bin/env bash
# The README's test command. On a fresh Debian 12 machine (as root) it installs every
# system package the tests need, starts dockerd and a registry on 127.0.0.1:5000, makes
# the local base image, creates .venv with the pinned dependencies and runs pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -q`.
#
# Without arguments (CI) the unit tests run beside the end-to-end tests, in a second pytest:
# the e2e modules spend much of their time waiting on dockerd, buildah and the registries, so
# the unit suite fits into that (a full run took 39 min one after the other on 2 cores). Each
# pytest has its own temporary root; the e2e output streams, the unit output follows it (its
# log is kept in $MTP_TEST_LOGS, default a new /tmp/mtp-test-logs.XXXXXX), and the run fails if either does.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-test-host.sh

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt

PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ "$#" -gt 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi

# one folder per run: two runs at once (two clones on one machine) must not share temp roots
logs=${MTP_TEST_LOGS:-$(mktemp -d /tmp/mtp-test-logs.XXXXXX)}
mkdir -p "$logs"
unit_log=$logs/unit.log
"${PYTEST[@]}" --basetemp "$logs/tmp-unit" tests/unit >"$unit_log" 2>&1 &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null || true' EXIT INT TERM
echo "unit tests: running beside the e2e tests (pid $unit_pid, log $unit_log)"
e2e_rc=0
# the slowest e2e tests are listed at the end: where CI time goes, in every CI log
"${PYTEST[@]}" --basetemp "$logs/tmp-e2e" --durations=25 --durations-min=20 tests/e2e || e2e_rc=$?
unit_rc=0
wait "$unit_pid" || unit_rc=$?
trap - EXIT INT TERM
echo
echo "=== unit tests (tests/unit, run beside the e2e tests; log $unit_log) ==="
cat "$unit_log"
echo "e2e exit $e2e_rc, unit exit $unit_rc"
[ "$e2e_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ]
