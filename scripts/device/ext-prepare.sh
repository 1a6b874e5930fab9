#!/usr/bin/env bash
# Preparation HERE (not on the device) for the extensions proof of issue 22: the payload the
# device needs, split into carries of at most 60 MiB (the `run` tool carries 64 MiB a call)
# under build/device/ext/carry/c1..cN (ignored by .gitignore's /build/). Never commit
# build/device: it holds upstream wheels. Needs the built image (IMAGE, default
# mtp-verl:mtp-detach) and the device's `pip list --format=freeze` (DEVICE_FREEZE).
#   tecore.tar.xz   transformer_engine_cu13 2.12.0, the PyPI wheel the lock pins by sha256, unpacked
#   autobridge.tar.xz  what `from megatron.bridge import AutoBridge` loads at the image's
#                   versions that the device lacks (scripts/device/autobridge_closure.py)
#   whl/            the compiled wheels exactly as the image installs them: from the wheel cache,
#                   each checked against the sha256 the image records (/opt/mtp/installed/*.json),
#                   plus transformer_engine 2.12.0 (meta) and verl (for gpu_check.py)
# Every file over 60 MiB travels in parts with its sha256; ext-proof.sh reassembles and checks.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
IMAGE=${IMAGE:-mtp-verl:mtp-detach}
DEVICE_FREEZE=${DEVICE_FREEZE:?the device pip freeze (run: python3 -m pip list --format=freeze)}
D=build/device/ext
PART=$((60 * 1024 * 1024))
mkdir -p $D/te $D/whl $D/src
rm -rf $D/carry $D/stage && mkdir -p $D/carry $D/stage/whl
PLAT="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"

# 1. TransformerEngine's core, by the lock's sha256
want=$(grep -A3 'transformer_engine_cu13-2.12.0-py3-none-manylinux_2_28_x86_64.whl' manifests/lock.yaml | grep -m1 sha256 | awk '{print $2}')
if [ ! -f $D/te/tecore.tar.xz ]; then
  $PY -m pip download -q --no-deps --only-binary=:all: $PLAT -d $D/te transformer_engine_cu13==2.12.0
  echo "$want  $D/te/transformer_engine_cu13-2.12.0-py3-none-manylinux_2_28_x86_64.whl" | sha256sum -c
  rm -rf /tmp/tecore && mkdir /tmp/tecore && (cd /tmp/tecore && unzip -q "$OLDPWD"/$D/te/transformer_engine_cu13-*.whl)
  (cd /tmp/tecore && tar cf - .) | nice xz -9e -T0 > $D/te/tecore.tar.xz
  rm -f $D/te/transformer_engine_cu13-*.whl
fi
cp $D/te/tecore.tar.xz $D/stage/
$PY -m pip download -q --no-deps --only-binary=:all: $PLAT --platform any -d $D/stage/whl transformer_engine==2.12.0

# 2. AutoBridge's closure, from the image
if [ ! -f $D/autobridge.tar.xz ] || [ "$DEVICE_FREEZE" -nt $D/autobridge.tar.xz ]; then
  cp "$DEVICE_FREEZE" $D/device-freeze.txt
  docker run --rm --network none -v "$PWD/$D":/out -v "$PWD/scripts/device":/s:ro "$IMAGE" \
    python /s/autobridge_closure.py /out/device-freeze.txt /out/autobridge.tar | tail -1 | cut -c1-400
  nice xz -6 -T0 -f $D/autobridge.tar
fi
cp $D/autobridge.tar.xz $D/stage/

# 3. the compiled wheels the image installed, by the sha256 it records
docker run --rm --network none "$IMAGE" sh -c 'cat /opt/mtp/installed/*.json' > $D/installed.json
.venv/bin/python build.py wheels list --json > $D/cache.json
.venv/bin/python - "$D" <<'PY'
import json, shutil, sys
from pathlib import Path
d = Path(sys.argv[1])
text = (d / "installed.json").read_text()
records, i, dec = [], 0, json.JSONDecoder()
while i < len(text):  # the records one after another
    if text[i].isspace():
        i += 1
        continue
    obj, i = dec.raw_decode(text, i)
    records.append(obj)
cache = json.loads((d / "cache.json").read_text())
for rec in (r for r in records if r.get("source") == "built"):
    hit = [e for e in cache["wheels"] if e["key"] == rec["key"] and e["sha256"] == rec["wheel_sha256"]]
    if not hit:
        sys.exit(f"{rec['name']}: the image's wheel (key {rec['key'][:12]}, sha256 {rec['wheel_sha256'][:12]}) is not in the wheel cache")
    src = Path(hit[0]["path"])
    shutil.copy(src, d / "stage" / "whl" / src.name)
    print("compiled wheel", src.name, rec["wheel_sha256"][:12], "key", rec["key"][:12])
PY
cp $D/src/verl-*.whl $D/stage/whl/

# 4. parts of at most 60 MiB, each group with its sha256; carries filled first-fit
( cd $D/stage
  for f in tecore.tar.xz autobridge.tar.xz whl/*.whl; do
    sha256sum "$f" | sed "s|  .*|  $(basename "$f")|" > "$(basename "$f").sha256"
    split -b $PART -d -a 2 "$f" "$(basename "$f").part."
    rm "$f"
  done )
n=0; used=$PART
for f in $(ls -S $D/stage/*.part.* ) $D/stage/*.sha256; do
  size=$(stat -c %s "$f")
  if [ $((used + size)) -gt $PART ]; then n=$((n + 1)); used=0; mkdir -p $D/carry/c$n; fi
  mv "$f" $D/carry/c$n/; used=$((used + size))
done
du -sh $D/carry/*
