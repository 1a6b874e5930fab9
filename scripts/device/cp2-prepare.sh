#!/usr/bin/env bash
# Preparation HERE (not on the device) for the CP=2 proof of issue 17: the commands this
# session ran, collected in one file (not re-run as one script). Everything goes to
# build/device/ (ignored by .gitignore's /build/; carried with the `run` tool's `carry`).
# Never commit build/device: it holds upstream sources' wheels and TransformerEngine.
set -eu
cd "$(git rev-parse --show-toplevel)"
PY=/root/.pyenv/versions/3.12.1/bin/python3.12
D=build/device
mkdir -p $D/whl $D/pyd $D/tesmall $D/dl $D/p1 $D/p2 $D/p3
PLAT="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"

# 1. megatron-core and verl wheels from the exact commits the image installs, built the way
#    its layers build git sources (pip --no-build-isolation with the components' build_requires:
#    setuptools==80.10.2, pybind11==3.1.0, wheel==0.48.0). Built from a git clone (outside this
#    repo) so megatron's local version label is the upstream commit (0.19.1+5be9626709).
$PY -m venv $D/bvenv
$D/bvenv/bin/pip install -q setuptools==80.10.2 pybind11==3.1.0 wheel==0.48.0 "packaging>=24.2"
git clone -q --shared --no-checkout "${MLM_REPO:?a local clone or mirror of NVIDIA/Megatron-LM}" /tmp/mlmclone
git clone -q --shared --no-checkout "${VERL_REPO:?a local clone or mirror of verl-project/verl}" /tmp/verlclone
for c in 5be9626709af2722333bf54797c954c09edeada3 ba7b5ebce12af60627a80985792a1449ce45f46c; do
  git -C /tmp/mlmclone checkout -q -f $c && git -C /tmp/mlmclone clean -qfdx
  $D/bvenv/bin/pip wheel -q --no-deps --no-build-isolation -w $D/whl/mlm-${c:0:8} /tmp/mlmclone
done
git -C /tmp/verlclone checkout -q -f 7bc80c00a07833e06797ecde08c7efc58f524aa2
$D/bvenv/bin/pip wheel -q --no-deps --no-build-isolation -w $D/whl/verl-7bc80c00 /tmp/verlclone

# 2. TransformerEngine 2.12.0 from PyPI (core wheel, meta wheel, torch-extension sdist) and
#    pydantic (TE's recipe module imports it; the device image lacks it).
$PY -m pip download -q --no-deps --only-binary=:all: $PLAT --platform any -d $D/dl transformer_engine_cu13==2.12.0
$PY -m pip download -q --no-deps --only-binary=:all: $PLAT --platform any -d $D/tesmall transformer_engine==2.12.0
curl -sSL -o $D/tesmall/transformer_engine_torch-2.12.0.tar.gz \
  https://files.pythonhosted.org/packages/b0/aa/5872f0944e88b9a7a0074f207178e18d183916bc05887bf1d76947769d94/transformer_engine_torch-2.12.0.tar.gz
$PY -m pip download -q --no-deps --only-binary=:all: $PLAT --platform any -d $D/pyd \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0

# 3. The core wheel (190 MB) is more than one call carries (64 MiB): its files as tar.xz
#    (137 MB, sha256 6837f9a1...; 3 minutes on 2 cores), split in three parts, one per call.
rm -rf /tmp/tecore && mkdir /tmp/tecore && (cd /tmp/tecore && unzip -q "$OLDPWD"/$D/dl/transformer_engine_cu13-2.12.0-py3-none-manylinux_2_28_x86_64.whl)
(cd /tmp/tecore && tar cf - .) | xz -9e -T0 > $D/dl/tecore.tar.xz
split -n 3 -d -a 1 $D/dl/tecore.tar.xz $D/dl/tecore.part.
mv $D/dl/tecore.part.0 $D/p1/; mv $D/dl/tecore.part.1 $D/p2/; mv $D/dl/tecore.part.2 $D/p3/
sha256sum $D/dl/tecore.tar.xz   # cp2-proof*.sh checks the reassembled file against this
