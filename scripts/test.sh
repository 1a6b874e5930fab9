#!/usr/bin/env bash
# The README's test command. On a fresh Debian 12 machine (as root) it installs every
# system package the tests need, starts dockerd and a registry on 127.0.0.1:5000, makes
# the local base image, creates .venv with the pinned dependencies and runs pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -q`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-test-host.sh

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt

exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
