#!/usr/bin/env bash
# Make a LOCAL STAND-IN for nvidia/cuda:13.0.2-devel-ubuntu24.04 (unreachable from here) and
# push it to the loopback registry, so the real stack can be built on it. Prints the digest-
# pinned reference on its last line (for MTP_SUBSTITUTE_BASE).
#
# What it has, and how it differs from the real base:
#   - Debian 13 (trixie) minbase from Debian's archive (Ubuntu's is unreachable): glibc 2.41
#     (the real base: 2.39), so every manylinux_2_39 wheel the lock picked installs.
#   - CUDA 13.0's toolkit as installed on this machine (nvcc, cupti, nvvm) under
#     /usr/local/cuda-13.0, with the real image's CUDA_VERSION/PATH/LD_LIBRARY_PATH/NVIDIA_*,
#     LIBRARY_PATH and ENTRYPOINT (/opt/nvidia/nvidia_entrypoint.sh, a banner and the command).
#   - The real base's NVIDIA packages beyond that, at its versions, from PyPI's nvidia-* wheel
#     files by sha256, as debs that own their files (add_nvidia_packages): libnccl2 and
#     libnccl-dev 2.28.3-1+cuda13.0 and libcublas-13-0 13.1.0.3-1, all three held with apt-mark
#     hold as NVIDIA holds them, and cuda-cudart-13-0 13.0.96-1 (libcudart.so.13.0.96, replacing
#     the host toolkit's plain copy). No cuDNN, as on the real base. A user `ubuntu` 1000:1000.
#     Still missing: cuda-compat, the devel base's other libraries and headers (cuSPARSE,
#     cuFFT, ... dev files, nsight-compute), the stubs under lib64/stubs (this toolkit has none),
#     the driver branches of NVIDIA_REQUIRE_CUDA (not read here).
#   - Python 3.12 from this machine's pyenv build (Ubuntu 24.04's python3.12 is unreachable),
#     registered with dpkg as python3.12, python3.12-dev, python3.12-venv and python3-pip, so
#     the Dockerfile's os layer sees them installed and apt does not pull Debian's 3.13.
# Settings: MTP_STANDIN_REGISTRY (127.0.0.1:5000), MTP_STANDIN_DIR (/var/lib/mtp-real-base),
#           MTP_STANDIN_PYTHON (pyenv prefix 3.12), MTP_STANDIN_CUDA (/usr/local/cuda-13.0)
#
# Made once, then reused. `docker import` stamps a creation time, so every import is a new
# digest: a new identity for every profile built on it, every layer rebuilt, and the previous
# import left behind untagged. So each step runs only when its inputs changed:
#   - the rootfs ($DIR/rootfs) when its key changes: build_rootfs below (its code, not its
#     comments), the Python and CUDA it copies (paths and versions); .complete holds the key;
#   - the import when the image's key changes (the rootfs's key, the reference, the import's
#     settings) or the digest in $DIR/standin.stamp is gone from the registry.
# Made before keys existed (an empty .complete, no stamp): the rootfs is taken as made from
# the current inputs, and the image under the reference is adopted when it has this script's
# label. Delete $DIR/rootfs/.complete to make everything again.
set -euo pipefail
REGISTRY=${MTP_STANDIN_REGISTRY:-127.0.0.1:5000}
DIR=${MTP_STANDIN_DIR:-/var/lib/mtp-real-base}
PY=${MTP_STANDIN_PYTHON:-$(pyenv prefix 3.12 2>/dev/null || true)}
CUDA=${MTP_STANDIN_CUDA:-/usr/local/cuda-13.0}
MIRROR=${MTP_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NAME=mtp-standin/cuda
TAG=13.0.2-devel-trixie-py3.12
REF=$REGISTRY/$NAME:$TAG
ROOT=$DIR/rootfs
STAMP=$DIR/standin.stamp
LABEL="nvidia/cuda:13.0.2-devel-ubuntu24.04 stand-in: Debian trixie + local CUDA 13.0 toolkit + Python 3.12"
IMPORT_CHANGES=(
    'ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    'ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64'
    'ENV CUDA_VERSION=13.0.2'
    'ENV NVIDIA_VISIBLE_DEVICES=all'
    'ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility'
    # the real value lists the driver branches too; only its CUDA part is known here
    'ENV NVIDIA_REQUIRE_CUDA=cuda>=13.0'
    'ENV LIBRARY_PATH=/usr/local/cuda/lib64/stubs'
    'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]'
    "LABEL io.mtp-image-builder.standin=\"$LABEL\""
)
# What the real base's base, runtime and devel layers hold beyond this machine's toolkit, at
# NVIDIA's versions (../shared/docs/real-stack.md, "The real base"), from PyPI's nvidia-* wheels
# (NVIDIA's apt repository is unreachable), each by sha256: file name, sha256, URL.
NVIDIA_WHEELS=(
    "nvidia_nccl_cu13-2.28.3-py3-none-manylinux_2_18_x86_64.whl 9f093dd7b97ddc90ef654676173a0c301d2434c431f17aa324e9c00039afb4c7 https://files.pythonhosted.org/packages/6e/38/bb5e182b08c8b53987224b7e67c1150a60219a99b8cf40ec8cb1ab6655d1/nvidia_nccl_cu13-2.28.3-py3-none-manylinux_2_18_x86_64.whl"
    "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171 https://files.pythonhosted.org/packages/e7/44/423ac00af4dd95a5aeb27207e2c0d9b7118702149bf4704c3ddb55bb7429/nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl"
    "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 https://files.pythonhosted.org/packages/2e/24/d1558f3b68b1d26e706813b1d10aa1d785e4698c425af8db8edc3dced472/nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
)
MANIFEST_TYPES='application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json'
log() { printf '[make-base] %s\n' "$*" >&2; }
sha256() { sha256sum | cut -d' ' -f1; }

build_rootfs() {
    [ "$(id -u)" -eq 0 ] || { echo "make-base: building the rootfs needs root" >&2; exit 1; }
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >&2
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
    add_nvidia_packages
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
}

# One deb that owns the files of a staging tree, installed in the rootfs, so `apt-get remove`
# there takes the files with it, as on the real base. Uncompressed (-Znone): each deb lives only
# for the dpkg -i that follows, and xz took over 5 minutes on cuBLAS's 600 MB.
deb_of() {
    local pkg=$1 version=$2 tree=$3
    mkdir -p "$tree/DEBIAN"
    printf 'Package: %s\nVersion: %s\nArchitecture: amd64\nMaintainer: mtp-image-builder\nDescription: stand-in: NVIDIA %s at its real-base version, from PyPI wheel files\n' \
        "$pkg" "$version" "$pkg" > "$tree/DEBIAN/control"
    dpkg-deb --root-owner-group -Znone -b "$tree" "$ROOT/tmp/$pkg.deb" >/dev/null
    chroot "$ROOT" dpkg -i "/tmp/$pkg.deb" >/dev/null; rm -f "$ROOT/tmp/$pkg.deb"
}

# The real base's NVIDIA packages beyond nvcc, at its versions, laid out as its debs lay them
# out: libnccl2 + libnccl-dev 2.28.3-1+cuda13.0 and libcublas-13-0 13.1.0.3-1, held with
# apt-mark hold as NVIDIA's Dockerfiles hold them; cuda-cudart-13-0 13.0.96-1 replaces the host
# toolkit's cudart (a plain libcudart.so.13 there: the real one carries its full version).
add_nvidia_packages() {
    local w=$DIR/wheels x=$DIR/wheel-files line name sha url t lib=/usr/local/cuda-13.0/lib64
    mkdir -p "$w"; rm -rf "$x"; mkdir -p "$x"
    for line in "${NVIDIA_WHEELS[@]}"; do
        read -r name sha url <<< "$line"
        if [ ! -f "$w/$name" ]; then
            curl -fsSL --retry 3 -o "$w/$name.part" "$url" && mv -f "$w/$name.part" "$w/$name"
        fi
        echo "$sha  $w/$name" | sha256sum -c --quiet || { echo "make-base: $name: sha256 mismatch" >&2; exit 1; }
        "$PY/bin/python3.12" -m zipfile -e "$w/$name" "$x"
    done
    log "NVIDIA packages at the real base's versions: libnccl2/libnccl-dev 2.28.3, libcublas 13.1.0.3, cudart 13.0.96"
    t=$(mktemp -d); mkdir -p "$t/usr/lib/x86_64-linux-gnu"
    cp "$x/nvidia/nccl/lib/libnccl.so.2" "$t/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3"
    ln -s libnccl.so.2.28.3 "$t/usr/lib/x86_64-linux-gnu/libnccl.so.2"
    deb_of libnccl2 2.28.3-1+cuda13.0 "$t"; rm -rf "$t"
    t=$(mktemp -d); mkdir -p "$t/usr/lib/x86_64-linux-gnu" "$t/usr/include"
    ln -s libnccl.so.2 "$t/usr/lib/x86_64-linux-gnu/libnccl.so"
    cp -r "$x/nvidia/nccl/include/." "$t/usr/include/"
    deb_of libnccl-dev 2.28.3-1+cuda13.0 "$t"; rm -rf "$t"
    t=$(mktemp -d); mkdir -p "$t$lib"
    for l in libcublas libcublasLt; do
        cp "$x/nvidia/cu13/lib/$l.so.13" "$t$lib/$l.so.13.1.0.3"; ln -s "$l.so.13.1.0.3" "$t$lib/$l.so.13"
    done
    deb_of libcublas-13-0 13.1.0.3-1 "$t"; rm -rf "$t"
    rm -f "$ROOT$lib"/libcudart.so "$ROOT$lib"/libcudart.so.13*
    t=$(mktemp -d); mkdir -p "$t$lib"
    cp "$x/nvidia/cu13/lib/libcudart.so.13" "$t$lib/libcudart.so.13.0.96"
    ln -s libcudart.so.13.0.96 "$t$lib/libcudart.so.13"; ln -s libcudart.so.13 "$t$lib/libcudart.so"
    deb_of cuda-cudart-13-0 13.0.96-1 "$t"; rm -rf "$t" "$x"
    chroot "$ROOT" apt-mark hold libnccl2 libnccl-dev libcublas-13-0 >/dev/null
    chroot "$ROOT" ldconfig
    # Ubuntu 24.04 has a user `ubuntu` (UID/GID 1000): an image's UID 1000 meets it there
    chroot "$ROOT" groupadd -g 1000 ubuntu && chroot "$ROOT" useradd -m -u 1000 -g 1000 -s /bin/bash ubuntu
    # NVIDIA's entrypoint (the image's own entrypoint.sh runs it when present): a banner, then
    # the command; the real one also warns about the driver, which the image's check does here
    mkdir -p "$ROOT/opt/nvidia"
    printf '#!/bin/bash\necho "== CUDA 13.0.2 (stand-in of nvidia/cuda:13.0.2-devel-ubuntu24.04) =="\nexec "$@"\n' \
        > "$ROOT/opt/nvidia/nvidia_entrypoint.sh"
    chmod 755 "$ROOT/opt/nvidia/nvidia_entrypoint.sh"
}

# HEAD by digest: the registry still serves that very image.
in_registry() {
    curl -fsS -o /dev/null --max-time 30 -I -H "Accept: $MANIFEST_TYPES" \
        "http://$REGISTRY/v2/$NAME/manifests/$1" 2>/dev/null
}

# The digest the tag points at when that image has this script's label; nothing otherwise.
labelled_tag_digest() {
    local digest config
    digest=$(curl -fsS --max-time 30 -I -H "Accept: $MANIFEST_TYPES" "http://$REGISTRY/v2/$NAME/manifests/$TAG" \
        2>/dev/null | tr -d '\r' | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: *//p') || return 0
    [ -n "$digest" ] || return 0
    config=$(curl -fsS --max-time 30 -H "Accept: $MANIFEST_TYPES" "http://$REGISTRY/v2/$NAME/manifests/$digest" \
        | "$PY/bin/python3.12" -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])') || return 0
    curl -fsS --max-time 30 "http://$REGISTRY/v2/$NAME/blobs/$config" | "$PY/bin/python3.12" -c '
import json, sys
labels = json.load(sys.stdin).get("config", {}).get("Labels") or {}
sys.exit(labels.get("io.mtp-image-builder.standin") != sys.argv[1])' "$LABEL" || return 0
    echo "$digest"
}

stamp() { echo "$image_key $1" > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"; }

[ -x "$PY/bin/python3.12" ] || { echo "make-base: no Python 3.12 at '$PY' (set MTP_STANDIN_PYTHON)" >&2; exit 1; }
[ -x "$CUDA/bin/nvcc" ] || { echo "make-base: no CUDA toolkit at $CUDA (set MTP_STANDIN_CUDA)" >&2; exit 1; }
curl -fsS -o /dev/null --max-time 10 "http://$REGISTRY/v2/" || {
    echo "make-base: registry $REGISTRY does not answer (scripts/setup-test-host.sh starts it)" >&2; exit 1; }

rootfs_key=$({
    declare -f build_rootfs deb_of add_nvidia_packages  # bash prints the code without its comments
    printf '%s\n' "${NVIDIA_WHEELS[@]}"
    echo "python $PY"; "$PY/bin/python3.12" -VV
    echo "cuda $CUDA"; "$CUDA/bin/nvcc" --version
} | sha256)
image_key=$(printf '%s\n' "$rootfs_key" "$REF" "${IMPORT_CHANGES[@]}" | sha256)

if [ -f "$ROOT/.complete" ] && [ ! -s "$ROOT/.complete" ]; then
    log "rootfs $ROOT was made before input keys: taken as made from the current inputs"
    echo "$rootfs_key" > "$ROOT/.complete"
fi
if [ "$(cat "$ROOT/.complete" 2>/dev/null)" != "$rootfs_key" ]; then
    build_rootfs
    echo "$rootfs_key" > "$ROOT/.complete"
fi

if [ -f "$STAMP" ]; then
    read -r key digest < "$STAMP" || true
    if [ "$key" != "$image_key" ]; then
        log "inputs changed since $STAMP: importing again"
    elif in_registry "$digest"; then
        log "inputs unchanged ($STAMP): reusing $REF@$digest"
        echo "$REF@$digest"
        exit 0
    else
        log "$digest is gone from $REGISTRY: importing again"
    fi
else
    digest=$(labelled_tag_digest)
    if [ -n "$digest" ]; then
        log "adopting $REF@$digest: it has this script's label and was made before stamps existed"
        stamp "$digest"
        echo "$REF@$digest"
        exit 0
    fi
fi

# What the tag names now: once the tag moves, an untagged 1 GB leftover (the registry keeps it).
previous=$(docker image inspect --format '{{.Id}}' "$REF" 2>/dev/null || true)
log "docker import -> $REF"
changes=()
for c in "${IMPORT_CHANGES[@]}"; do changes+=(--change "$c"); done
tar --exclude=./.complete -C "$ROOT" -c . | docker import "${changes[@]}" - "$REF" >/dev/null
docker push -q "$REF" >&2
digest=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$REF" | grep "^$REGISTRY/" | head -1 | cut -d@ -f2)
[ -n "$digest" ] || { echo "make-base: no registry digest for $REF after docker push" >&2; exit 1; }
stamp "$digest"
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect --format '{{.Id}}' "$REF")" ]; then
    # fails, and is left alone, while a container or another tag still uses it
    docker image rm "$previous" >/dev/null 2>&1 && log "removed the previous stand-in $previous" || true
fi
echo "$REF@$digest"
