#!/usr/bin/env bash
# A loopback proxying PyPI mirror for real-stack builds through a site's mirror (issue 37):
# proxpi on 127.0.0.1:PORT fetches each index page and file from pypi.org once and serves it
# from its cache, as a site's pull-through mirror does. Builds reach it through
# MTP_INDEX_REWRITE (pip inside the build steps and `lock`); the lock's sha256 still decide
# what is installed, so a build through it must give the same image bytes as one without.
#
#   scripts/real-stack/mirror.sh start    start it (idempotent); prints the export line to use
#   scripts/real-stack/mirror.sh stop
#   scripts/real-stack/mirror.sh served   how many index pages and files it has served
#
# Settings: MTP_MIRROR_PORT (5011), MTP_MIRROR_STATE (/var/tmp/mtp-pypi-mirror: venv, cache, log, pid).
set -euo pipefail
PORT=${MTP_MIRROR_PORT:-5011}
STATE=${MTP_MIRROR_STATE:-/var/tmp/mtp-pypi-mirror}
URL=http://127.0.0.1:$PORT/index
# proxpi and what it runs on, pinned (proxpi 1.3.1 declares flask<4, jinja2~=3, lxml<7, requests~=2.27)
PINS=(proxpi==1.3.1 flask==3.1.2 werkzeug==3.1.3 jinja2==3.1.6 markupsafe==3.0.3 itsdangerous==2.2.0
      click==8.3.1 blinker==1.9.0 lxml==6.0.2 requests==2.32.5 urllib3==2.5.0 idna==3.11
      certifi==2025.11.12 charset-normalizer==3.4.4)
running() { [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; }
case "${1:-}" in
start)
    mkdir -p "$STATE/cache"
    if ! running; then
        if [ ! -x "$STATE/venv/bin/python" ]; then
            python3 -m venv "$STATE/venv"
            "$STATE/venv/bin/pip" install -q --disable-pip-version-check "${PINS[@]}"
        fi
        PROXPI_CACHE_DIR=$STATE/cache PROXPI_INDEX_URL=https://pypi.org/simple/ \
            nohup "$STATE/venv/bin/python" -m flask --app proxpi.server run --host 127.0.0.1 \
            --port "$PORT" --with-threads >"$STATE/log" 2>&1 &
        echo $! >"$STATE/pid"
        for _ in $(seq 60); do curl -fs -o /dev/null "$URL/" && break; sleep 1; done
        curl -fs -o /dev/null "$URL/" || { tail -5 "$STATE/log" >&2; echo "mirror did not answer on $URL" >&2; exit 1; }
    fi
    echo "export MTP_INDEX_REWRITE=https://pypi.org/simple=$URL"
    ;;
stop) running && kill "$(cat "$STATE/pid")"; rm -f "$STATE/pid" ;;
served)
    echo "index pages: $(grep -c 'GET /index/[^/ ]*/ HTTP' "$STATE/log" || true)"
    echo "files:       $(grep -cE 'GET /index/[^/ ]+/[^/ ]+ HTTP' "$STATE/log" || true)"
    ;;
*) echo "usage: $0 start|stop|served" >&2; exit 2 ;;
esac
