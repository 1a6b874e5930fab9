#!/usr/bin/env bash
# The README's test command. On a fresh Debian 12 machine (as root) it installs every
# system package the tests need, starts dockerd and a registry on 127.0.0.1:5000, makes
# the local base image, creates .venv with the pinned dependencies and runs pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -q`.
#
# Without arguments (CI) the unit tests run beside the end-to-end tests, in a second pytest:
# the e2e modules spend much of their time waiting on dockerd, buildah and the registries, so
# the unit suite fits into that (a full run took 39 min one after the other on 2 cores). The
# e2e output streams, a line per test (-v: the running test is named, never minutes of
# silence); the unit output follows it; the run fails if either does.
#
# Temporary files: everything a run writes outside the caches goes under one folder per run,
# $TMPDIR/mtp-test.XXXXXX (the pytest sessions' temp roots with their registries, source trees
# and builds; TMPDIR of every test and tool they start; the unit log). A run that passes removes
# it; a run that fails keeps it for a look and names it with its size. Caches stay where
# docs/testing.md says. Two runs at once (two clones on one machine) share nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-test-host.sh

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/mtp-test.XXXXXX")
# MTP_TEST_LOGS: a folder of your own for unit.log, kept (the rest of the run still goes)
logs=${MTP_TEST_LOGS:-$run_dir}
mkdir -p "$logs"
status=1  # until a session says otherwise (an interrupted run keeps its folder too)
unit_pid=
finish() {
  if [ -n "$unit_pid" ]; then kill "$unit_pid" 2>/dev/null || true; wait "$unit_pid" 2>/dev/null || true; fi
  if [ "$status" -eq 0 ]; then
    # --one-file-system: a mount a failed teardown left behind is not followed into
    rm -rf --one-file-system "$run_dir" || echo "test.sh: could not remove all of $run_dir" >&2
  else
    echo "test.sh: kept $run_dir ($(du -sh "$run_dir" 2>/dev/null | cut -f1)) for a look at the failure; remove it with: rm -rf $run_dir" >&2
  fi
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -rs: every skip says why; -p no:cacheprovider: no .pytest_cache in the checkout
PYTEST=(env "TMPDIR=$run_dir" .venv/bin/python -m pytest -p no:cacheprovider -rs)
if [ "$#" -gt 0 ]; then
  status=0
  "${PYTEST[@]}" --basetemp "$run_dir/tmp" "$@" || status=$?
  exit "$status"
fi

unit_log=$logs/unit.log
"${PYTEST[@]}" -q --basetemp "$run_dir/tmp-unit" tests/unit >"$unit_log" 2>&1 &
unit_pid=$!
echo "unit tests: running beside the e2e tests (pid $unit_pid, log $unit_log)"
e2e_rc=0
# the slowest e2e tests are listed at the end: where CI time goes, in every CI log
"${PYTEST[@]}" -v --basetemp "$run_dir/tmp-e2e" --durations=25 --durations-min=20 tests/e2e || e2e_rc=$?
unit_rc=0
wait "$unit_pid" || unit_rc=$?
unit_pid=
echo
echo "=== unit tests (tests/unit, run beside the e2e tests; log $unit_log) ==="
cat "$unit_log"
echo "e2e exit $e2e_rc, unit exit $unit_rc"
status=0
[ "$e2e_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ] || status=1
exit "$status"
