#!/usr/bin/env bash
# Preparation HERE (not on the device) for the extensions proof of issue 22: the payload the
# device needs, under build/device/ext/ (ignored by .gitignore's /build/; carried with the
# `run` tool's `carry`). Never commit build/device: it holds upstream wheels.
#   ext/te/     transformer_engine_cu13 2.12.0 (the PyPI wheel the lock pins by sha256) as tar.xz
#               in three parts (190 MB wheel > 64 MiB a call), transformer_engine 2.12.0 (meta)
#   ext/whl/    the compiled wheels exactly as the image installs them: from the wheel cache,
#               each checked against the sha256 the image records (/opt/mtp/installed/<name>.json)
#   ext/src/    megatron-core 5be96267 and verl 7bc80c00 wheels, built as the image builds them
#   ext/pyd/    pure-Python dependencies the device image lacks (pydantic for TE's recipes)
set -eu
cd "$(git rev-parse --show-toplevel)"
PY=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
D=build/device/ext
mkdir -p $D/te $D/whl $D/src $D/pyd $D/p1 $D/p2 $D/p3
PLAT="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
want=$(grep -A3 'transformer_engine_cu13-2.12.0-py3-none-manylinux_2_28_x86_64.whl' manifests/lock.yaml | grep -m1 sha256 | awk '{print $2}')
if [ ! -f $D/te/tecore.tar.xz ]; then
  $PY -m pip download -q --no-deps --only-binary=:all: $PLAT -d $D/te transformer_engine_cu13==2.12.0
  echo "$want  $D/te/transformer_engine_cu13-2.12.0-py3-none-manylinux_2_28_x86_64.whl" | sha256sum -c
  rm -rf /tmp/tecore && mkdir /tmp/tecore && (cd /tmp/tecore && unzip -q "$OLDPWD"/$D/te/transformer_engine_cu13-2.12.0-py3-none-manylinux_2_28_x86_64.whl)
  (cd /tmp/tecore && tar cf - .) | nice xz -9e -T0 > $D/te/tecore.tar.xz
  split -n 3 -d -a 1 $D/te/tecore.tar.xz $D/te/tecore.part.
  mv $D/te/tecore.part.0 $D/p1/; mv $D/te/tecore.part.1 $D/p2/; mv $D/te/tecore.part.2 $D/p3/
  sha256sum $D/te/tecore.tar.xz | cut -d' ' -f1 | tee $D/p3/tecore.sha256
  rm -f $D/te/transformer_engine_cu13-*.whl
fi
$PY -m pip download -q --no-deps --only-binary=:all: $PLAT --platform any -d $D/p1 transformer_engine==2.12.0
$PY -m pip download -q --no-deps --only-binary=:all: $PLAT --platform any -d $D/pyd \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
# the compiled wheels, by the keys of the profile's plan (wheels list names them)
.venv/bin/python build.py wheels list --json > $D/whl/cache.json
