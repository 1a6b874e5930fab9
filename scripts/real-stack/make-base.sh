#!/usr/bin/env bash
# Make a LOCAL STAND-IN for nvidia/cuda:13.0.2-devel-ubuntu24.04 (unreachable from here) and
# push it to the loopback registry, so the real stack can be built on it. Prints the digest-
# pinned reference on its last line (for MTP_SUBSTITUTE_BASE).
#
# What it has, and how it differs from the real base:
#   - Debian 13 (trixie) minbase from Debian's archive (Ubuntu's is unreachable): glibc 2.41
#     (the real base: 2.39), so every manylinux_2_39 wheel the lock picked installs.
#   - CUDA 13.0's toolkit as installed on this machine (nvcc, cudart, cupti) under
#     /usr/local/cuda-13.0, with the real image's CUDA_VERSION/PATH/LD_LIBRARY_PATH/NVIDIA_*
#     environment. The real devel base has the full toolkit (cuBLAS, cuDNN dev files, ...).
#   - Python 3.12 from this machine's pyenv build (Ubuntu 24.04's python3.12 is unreachable),
#     registered with dpkg as python3.12, python3.12-dev, python3.12-venv and python3-pip, so
#     the Dockerfile's os layer sees them installed and apt does not pull Debian's 3.13.
# Settings: MTP_STANDIN_REGISTRY (127.0.0.1:5000), MTP_STANDIN_DIR (/var/lib/mtp-real-base),
#           MTP_STANDIN_PYTHON (pyenv prefix 3.12), MTP_STANDIN_CUDA (/usr/local/cuda-13.0)
set -euo pipefail
REGISTRY=${MTP_STANDIN_REGISTRY:-127.0.0.1:5000}
DIR=${MTP_STANDIN_DIR:-/var/lib/mtp-real-base}
PY=${MTP_STANDIN_PYTHON:-$(pyenv prefix 3.12 2>/dev/null || true)}
CUDA=${MTP_STANDIN_CUDA:-/usr/local/cuda-13.0}
MIRROR=${MTP_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
REF=$REGISTRY/mtp-standin/cuda:13.0.2-devel-trixie-py3.12
log() { printf '[make-base] %s\n' "$*" >&2; }

[ "$(id -u)" -eq 0 ] || { echo "make-base: run as root" >&2; exit 1; }
[ -x "$PY/bin/python3.12" ] || { echo "make-base: no Python 3.12 at '$PY' (set MTP_STANDIN_PYTHON)" >&2; exit 1; }
[ -x "$CUDA/bin/nvcc" ] || { echo "make-base: no CUDA toolkit at $CUDA (set MTP_STANDIN_CUDA)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >&2

ROOT=$DIR/rootfs
if [ ! -f "$ROOT/.complete" ]; then
    rm -rf "$ROOT"; mkdir -p "$ROOT"
    log "debootstrap trixie (minbase) into $ROOT"
    # The real base's runtime libraries for Python (libssl, libffi, sqlite, ...) and the
    # tools its devel flavour has (gcc/g++/make), plus what a pyenv-built Python links.
    debootstrap --variant=minbase \
        --include=ca-certificates,libssl3t64,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,libreadline8t64,libncursesw6,libgdbm6t64,libuuid1,gcc,g++,make,libc6-dev \
        trixie "$ROOT" "$MIRROR" > "$DIR/debootstrap.log" 2>&1 || { tail -20 "$DIR/debootstrap.log" >&2; exit 1; }
    log "Python 3.12 from $PY"
    mkdir -p "$ROOT$PY"; cp -a "$PY/." "$ROOT$PY/"
    # a fresh interpreter's site-packages holds pip only: drop whatever this host added
    find "$ROOT$PY/lib/python3.12/site-packages" -mindepth 1 -maxdepth 1 ! -name 'pip' ! -name 'pip-*.dist-info' \
        ! -name README.txt -exec rm -rf {} +
    for b in python3.12 python3.12-config; do ln -sf "$PY/bin/$b" "$ROOT/usr/bin/$b"; done
    echo "$PY/lib" > "$ROOT/etc/ld.so.conf.d/python3.12.conf"
    log "CUDA toolkit from $CUDA"
    mkdir -p "$ROOT/usr/local"; cp -a "$CUDA" "$ROOT/usr/local/cuda-13.0"; ln -sfn cuda-13.0 "$ROOT/usr/local/cuda"
    echo /usr/local/cuda/lib64 > "$ROOT/etc/ld.so.conf.d/cuda.conf"
    chroot "$ROOT" ldconfig
    # dpkg entries for the Python 3.12 that is really there (equivs-style: empty packages)
    for pkg in python3.12 python3.12-dev python3.12-venv python3-pip; do
        d=$(mktemp -d); mkdir -p "$d/DEBIAN"
        printf 'Package: %s\nVersion: 3.12.1-mtp-standin\nArchitecture: all\nMaintainer: mtp-image-builder\nDescription: stand-in: Python 3.12 from %s\n' "$pkg" "$PY" > "$d/DEBIAN/control"
        dpkg-deb -b "$d" "$ROOT/tmp/$pkg.deb" >/dev/null; rm -rf "$d"
        chroot "$ROOT" dpkg -i "/tmp/$pkg.deb" >/dev/null; rm -f "$ROOT/tmp/$pkg.deb"
    done
    chroot "$ROOT" python3.12 -c 'import ssl, sqlite3, ctypes, venv, ensurepip; print("python ok")' >&2
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
    touch "$ROOT/.complete"
fi
log "docker import -> $REF"
tar --exclude=./.complete -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64' \
    --change 'ENV CUDA_VERSION=13.0.2' \
    --change 'ENV NVIDIA_VISIBLE_DEVICES=all' \
    --change 'ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility' \
    --change 'LABEL io.mtp-image-builder.standin="nvidia/cuda:13.0.2-devel-ubuntu24.04 stand-in: Debian trixie + local CUDA 13.0 toolkit + Python 3.12"' \
    - "$REF" >/dev/null
docker push -q "$REF" >&2
digest=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$REF" | grep "^$REGISTRY/" | head -1 | cut -d@ -f2)
echo "$REF@$digest"
