#!/usr/bin/env bash
# Prepare a Debian 12 machine for the end-to-end tests of the MTP image builder.
#
# Run as root. Idempotent: every step first checks whether its result is already
# there, so a second run on a prepared host takes seconds.
#
#   1. apt packages: docker.io, docker-registry, debootstrap, squashfs-tools, git, curl,
#      python3-venv (stock Debian's python3 cannot make scripts/test.sh's .venv without it)
#   2. dockerd in the background (when `docker info` does not answer)
#   3. a real registry (distribution 2.8, `docker-registry serve`) on 127.0.0.1:5000
#   4. the base image mtp-test-base:bookworm, made with debootstrap + docker import
#      (no registry on the internet is reachable from these machines: nothing is pulled);
#      and its linux/arm64 twin mtp-test-base:bookworm-arm64 (debootstrap --arch arm64, its
#      second stage under qemu-user-static's binfmt handler; committed by buildah, since
#      docker 20.10's import ignores --platform), for the multi-arch e2e test (issue 49)
#   5. which docker CLI builds with BuildKit (checked with a tiny build that uses a
#      secret mount), written to $STATE_DIR/env.sh together with the other settings
#      the tests read (source it, or let tests/conftest.py detect the same things).
#
# Settings (environment):
#   MTP_TEST_STATE_DIR     state, logs, pid files and the registry's storage
#                          (default /var/lib/mtp-test-host)
#   MTP_TEST_REGISTRY      host:port of the registry   (default 127.0.0.1:5000)
#   MTP_TEST_BASE_IMAGE    base image name             (default mtp-test-base:bookworm)
#   MTP_TEST_ARM64_IMAGE   its linux/arm64 twin        (default mtp-test-base:bookworm-arm64)
#   MTP_TEST_DEBIAN_MIRROR debootstrap mirror          (default http://deb.debian.org/debian)
#   MTP_TEST_WAIT_S        seconds to wait per service (default 60)
set -euo pipefail

STATE_DIR=${MTP_TEST_STATE_DIR:-/var/lib/mtp-test-host}
REGISTRY=${MTP_TEST_REGISTRY:-127.0.0.1:5000}
BASE_IMAGE=${MTP_TEST_BASE_IMAGE:-mtp-test-base:bookworm}
ARM64_IMAGE=${MTP_TEST_ARM64_IMAGE:-mtp-test-base:bookworm-arm64}
MIRROR=${MTP_TEST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
WAIT_S=${MTP_TEST_WAIT_S:-60}
# Packages inside the base image: enough for test images to create a venv and
# pip-install local source trees with --no-build-isolation (setuptools + wheel) and
# without any network access.
BASE_INCLUDE=python3,python3-pip,python3-venv,python3-setuptools,python3-wheel,git,ca-certificates
APT_PACKAGES=(docker.io docker-registry debootstrap squashfs-tools git curl ca-certificates iptables iproute2 buildah python3-venv)
# The multi-node job tests (#27): a real Slurm controller (munge authenticates it) and shellcheck.
APT_PACKAGES+=(slurmctld slurm-client munge shellcheck)
# linux/arm64 under emulation (#49): qemu's user-mode emulators, registered with the kernel's
# binfmt_misc with the F flag (the interpreter opened at registration, so it runs inside
# containers and chroots that lack it), which RUN steps of an arm64 build and the arm64 base's
# debootstrap need
APT_PACKAGES+=(qemu-user-static binfmt-support)

export DEBIAN_FRONTEND=noninteractive

T0=$(date +%s.%N)
die() { echo "setup-test-host: ERROR: $*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[setup-test-host %6ss] %s\n' "$(elapsed "$T0")" "$*"; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts dockerd)"
[ -r /etc/debian_version ] || die "this script expects Debian 12 (bookworm)"

mkdir -p "$STATE_DIR"
chmod 0755 "$STATE_DIR"

# --------------------------------------------------------------------------- 1. packages
# A host that already runs a Docker engine from other packages (GitHub's runners ship
# docker-ce + containerd.io) must not get docker.io on top: the two conflict.
if command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1 \
        && ! dpkg-query -W -f='${Status}' docker.io 2>/dev/null | grep -q 'install ok installed'; then
    log "a Docker engine is already running (not Debian's docker.io): keeping it"
    APT_PACKAGES=("${APT_PACKAGES[@]/docker.io}")
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
    [ -n "$p" ] || continue
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing apt packages: ${missing[*]}"
    t=$(date +%s.%N)
    # No init system runs services in these machines: keep maintainer scripts from
    # trying to start dockerd/registry themselves (this script starts them below).
    policy_created=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        policy_created=1
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" > "$STATE_DIR/apt-install.log" 2>&1 || {
        tail -n 30 "$STATE_DIR/apt-install.log" >&2
        [ $policy_created -eq 1 ] && rm -f /usr/sbin/policy-rc.d
        die "apt-get install failed (log: $STATE_DIR/apt-install.log)"
    }
    [ $policy_created -eq 1 ] && rm -f /usr/sbin/policy-rc.d
    log "apt packages installed in $(elapsed "$t")s"
else
    log "apt packages already installed"
fi

# Debian's CLI (20.10) keeps the built-in BuildKit client; a newer CLI elsewhere on
# PATH (for example /usr/local/bin/docker, CLI 28 without buildx) may refuse it.
# Use Debian's CLI for everything this script does.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker) || die "no docker CLI after installing docker.io"

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    local end=$(( $(date +%s) + limit ))
    until "$@" > /dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.2
    done
}

# --------------------------------------------------------------------------- 2. dockerd
if "$DOCKER" info > /dev/null 2>&1; then
    log "dockerd already answering"
else
    t=$(date +%s.%N)
    command -v dockerd > /dev/null || die "dockerd not installed"
    # A pid file left by a dockerd that is gone would stop a new one from starting.
    for pidf in /var/run/docker.pid /run/docker/containerd/containerd.pid; do
        if [ -f "$pidf" ] && ! kill -0 "$(cat "$pidf" 2>/dev/null)" 2>/dev/null; then rm -f "$pidf"; fi
    done
    log "starting dockerd (log: $STATE_DIR/dockerd.log)"
    setsid nohup dockerd --host=unix:///var/run/docker.sock > "$STATE_DIR/dockerd.log" 2>&1 < /dev/null &
    echo $! > "$STATE_DIR/dockerd.pid"
    if ! wait_for "$WAIT_S" dockerd "$DOCKER" info; then
        tail -n 40 "$STATE_DIR/dockerd.log" >&2 || true
        die "dockerd did not answer within ${WAIT_S}s (log: $STATE_DIR/dockerd.log)"
    fi
    log "dockerd up in $(elapsed "$t")s (pid $(cat "$STATE_DIR/dockerd.pid"))"
fi

# --------------------------------------------------------------------------- 3. registry
registry_up() { curl -fsS -o /dev/null --max-time 2 "http://$REGISTRY/v2/" 2> /dev/null; }
if registry_up; then
    log "registry already answering on $REGISTRY"
else
    t=$(date +%s.%N)
    command -v docker-registry > /dev/null || die "docker-registry not installed"
    # Under STATE_DIR, not a fresh temp dir: a restarted registry (or one started after a
    # reboot) still serves every image pushed to it before.
    storage="$STATE_DIR/registry-storage"
    mkdir -p "$storage"
    cat > "$STATE_DIR/registry.yml" <<EOF
version: 0.1
log:
  level: info
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $storage
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: $REGISTRY
  headers:
    X-Content-Type-Options: [nosniff]
EOF
    log "starting registry on $REGISTRY, storage $storage (log: $STATE_DIR/registry.log)"
    setsid nohup docker-registry serve "$STATE_DIR/registry.yml" > "$STATE_DIR/registry.log" 2>&1 < /dev/null &
    echo $! > "$STATE_DIR/registry.pid"
    if ! wait_for "$WAIT_S" registry registry_up; then
        tail -n 40 "$STATE_DIR/registry.log" >&2 || true
        die "registry did not answer GET http://$REGISTRY/v2/ within ${WAIT_S}s"
    fi
    log "registry up in $(elapsed "$t")s (pid $(cat "$STATE_DIR/registry.pid"))"
fi

# --------------------------------------------------------------------------- munged
# Slurm's authentication daemon, for the tests' own slurmctld (tests/e2e/test_multinode_slurm.py).
if munge -n > /dev/null 2>&1; then
    log "munged already answering"
else
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged || die "munged did not start (key: /etc/munge/munge.key)"
    wait_for "$WAIT_S" munged munge -n || die "munged did not answer within ${WAIT_S}s"
    log "munged up"
fi

# --------------------------------------------------------------------------- KubeRay CRD
# The RayJob CRD of the KubeRay version pinned in mtpimage/data/multinode.yaml, checked by its
# sha256, for tests/unit/test_rayjob_crd.py. It comes from GitHub only (no package registry
# ships it): over HTTPS, or else through git from KubeRay's repository at the version's tag,
# which a git mirror configured for GitHub (url.<mirror>.insteadOf) serves where GitHub is not
# reachable. Where neither works this step says so and that test is skipped.
CRD_DATA="$(dirname "$0")/../mtpimage/data/multinode.yaml"
crd_field() { awk -v k="$1:" '$1 == k { print $2; exit }' "$CRD_DATA"; }
CRD_URL=$(crd_field crd_url)
CRD_SHA=$(crd_field crd_sha256)
CRD_FILE="$STATE_DIR/kuberay/$CRD_SHA.yaml"
crd_by_git() {
    local repo tag path tmp
    repo=$(crd_field crd_repo) tag=$(crd_field version) path=$(crd_field crd_path)
    tmp=$(mktemp -d)
    # one commit, no blobs but the one file (fetched on demand): mirrors may lack other blobs
    git -C "$tmp" init -q && git -C "$tmp" remote add origin "$repo" \
        && timeout 120 git -C "$tmp" fetch -q --depth 1 --filter=blob:none origin "refs/tags/$tag" 2> /dev/null \
        && timeout 120 git -C "$tmp" show "FETCH_HEAD:$path" > "$CRD_FILE.part" 2> /dev/null
    local rc=$?
    rm -rf "$tmp"
    return $rc
}
crd_verified() { echo "$CRD_SHA  $CRD_FILE.part" | sha256sum -c --quiet 2> /dev/null; }
mkdir -p "$STATE_DIR/kuberay"
if [ -f "$CRD_FILE" ]; then
    log "KubeRay RayJob CRD already present"
elif curl -fsSL --max-time 60 -o "$CRD_FILE.part" "$CRD_URL" 2> /dev/null && crd_verified; then
    mv "$CRD_FILE.part" "$CRD_FILE"
    log "KubeRay RayJob CRD fetched and verified ($CRD_FILE)"
elif crd_by_git && crd_verified; then
    mv "$CRD_FILE.part" "$CRD_FILE"
    log "KubeRay RayJob CRD fetched through git from $(crd_field crd_repo) and verified ($CRD_FILE)"
else
    rm -f "$CRD_FILE.part"
    log "KubeRay RayJob CRD not fetched from $CRD_URL nor through git (unreachable or wrong sha256): the RayJob schema test will be skipped"
fi

# --------------------------------------------------------------------------- 4. base image
# The image records what it was made from; a change of the package list rebuilds it.
BASE_RECIPE="bookworm minbase $BASE_INCLUDE"
have_recipe=$("$DOCKER" image inspect --format '{{ index .Config.Labels "org.mtp-image-builder.test-base.recipe" }}' "$BASE_IMAGE" 2>/dev/null || true)
if [ "$have_recipe" = "$BASE_RECIPE" ]; then
    log "base image $BASE_IMAGE already present"
else
    [ -z "$have_recipe" ] || log "base image $BASE_IMAGE was made from '$have_recipe': rebuilding"
    t=$(date +%s.%N)
    rootfs=$(mktemp -d /var/tmp/mtp-test-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    log "debootstrap --variant=minbase bookworm (include $BASE_INCLUDE; log: $STATE_DIR/debootstrap.log)"
    if ! debootstrap --variant=minbase --include="$BASE_INCLUDE" bookworm "$rootfs" "$MIRROR" \
            > "$STATE_DIR/debootstrap.log" 2>&1; then
        tail -n 30 "$STATE_DIR/debootstrap.log" >&2
        die "debootstrap failed (log: $STATE_DIR/debootstrap.log)"
    fi
    t_boot=$(elapsed "$t")
    # Keep the image small and reproducible-ish: no apt lists or caches.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
    t2=$(date +%s.%N)
    tar -C "$rootfs" --numeric-owner -c . | "$DOCKER" import \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        --change "LABEL org.mtp-image-builder.test-base.recipe=\"$BASE_RECIPE\"" \
        - "$BASE_IMAGE" > /dev/null
    rm -rf "$rootfs"
    trap - EXIT
    log "base image $BASE_IMAGE built: debootstrap ${t_boot}s, import $(elapsed "$t2")s"
fi

# --------------------------------------------------------------------------- 4b. arm64 base
# The same recipe for linux/arm64: debootstrap's second stage runs arm64 binaries, so qemu's
# binfmt handler must be registered (binfmt_misc mounted; update-binfmts enables it).
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2> /dev/null || true
fi
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 > /dev/null 2>&1 || true
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2> /dev/null \
    || die "qemu-aarch64 is not registered with binfmt_misc (fix: mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && update-binfmts --enable qemu-aarch64; a container needs --privileged)"
ARM64_RECIPE="bookworm minbase arm64 $BASE_INCLUDE"
have_recipe=$("$DOCKER" image inspect --format '{{ index .Config.Labels "org.mtp-image-builder.test-base.recipe" }}' "$ARM64_IMAGE" 2>/dev/null || true)
if [ "$have_recipe" = "$ARM64_RECIPE" ]; then
    log "base image $ARM64_IMAGE already present"
else
    t=$(date +%s.%N)
    work=$(mktemp -d /var/tmp/mtp-test-arm64.XXXXXX)
    trap 'buildah --root "$work/storage" --runroot "$work/run" rm --all > /dev/null 2>&1; rm -rf "$work"' EXIT
    log "debootstrap --arch arm64 --variant=minbase bookworm under qemu (log: $STATE_DIR/debootstrap-arm64.log)"
    if ! debootstrap --arch arm64 --variant=minbase --include="$BASE_INCLUDE" bookworm "$work/rootfs" "$MIRROR" \
            > "$STATE_DIR/debootstrap-arm64.log" 2>&1; then
        tail -n 30 "$STATE_DIR/debootstrap-arm64.log" >&2
        die "debootstrap --arch arm64 failed (log: $STATE_DIR/debootstrap-arm64.log)"
    fi
    t_boot=$(elapsed "$t")
    rm -rf "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/cache/apt/*.bin "$work"/rootfs/var/cache/apt/archives/*.deb
    tar -C "$work/rootfs" --numeric-owner -cf "$work/rootfs.tar" .
    rm -rf "$work/rootfs"
    b=(buildah --root "$work/storage" --runroot "$work/run")
    ctr=$("${b[@]}" from --arch arm64 scratch)
    "${b[@]}" add "$ctr" "$work/rootfs.tar" / > /dev/null
    "${b[@]}" config --os linux --arch arm64 --env LANG=C.UTF-8 --cmd '["/bin/bash"]' \
        --label "org.mtp-image-builder.test-base.recipe=$ARM64_RECIPE" "$ctr"
    "${b[@]}" commit --quiet --format docker "$ctr" "docker-archive:$work/image.tar:$ARM64_IMAGE" > /dev/null
    "$DOCKER" load -q -i "$work/image.tar" > /dev/null
    arch=$("$DOCKER" image inspect --format '{{.Os}}/{{.Architecture}}' "$ARM64_IMAGE")
    [ "$arch" = linux/arm64 ] || die "$ARM64_IMAGE was loaded as $arch, not linux/arm64"
    "${b[@]}" rm --all > /dev/null 2>&1 || true
    rm -rf "$work"
    trap - EXIT
    log "base image $ARM64_IMAGE built: debootstrap ${t_boot}s, in all $(elapsed "$t")s"
fi

# --------------------------------------------------------------------------- 5. BuildKit
# Find a CLI that really builds with BuildKit: try buildx first, then the built-in
# client (DOCKER_BUILDKIT=1), with a Dockerfile that needs BuildKit (a secret mount).
probe_dir=$(mktemp -d /tmp/mtp-buildkit-probe.XXXXXX)
cat > "$probe_dir/Dockerfile" <<EOF
FROM $BASE_IMAGE
RUN --mount=type=secret,id=probe test "\$(cat /run/secrets/probe)" = mtp-buildkit-probe && echo ok > /probe-ok
EOF
printf 'mtp-buildkit-probe' > "$probe_dir/secret"
BUILDKIT_CLI=""
BUILDKIT_MODE=""
REPORT=()
candidates=()
for c in /usr/bin/docker /usr/local/bin/docker "$(command -v docker 2>/dev/null || true)"; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    c=$(readlink -f "$c")
    case " ${candidates[*]-} " in *" $c "*) ;; *) candidates+=("$c") ;; esac
done
for c in "${candidates[@]}"; do
    ver=$("$c" version --format '{{.Client.Version}}' 2>/dev/null || echo '?')
    if "$c" buildx version > /dev/null 2>&1 &&
       "$c" buildx build -q --secret id=probe,src="$probe_dir/secret" -t mtp-buildkit-probe:latest --load "$probe_dir" > "$probe_dir/log" 2>&1; then
        REPORT+=("$c (CLI $ver): buildx build works")
        [ -n "$BUILDKIT_CLI" ] || { BUILDKIT_CLI=$c; BUILDKIT_MODE=buildx; }
        continue
    fi
    if DOCKER_BUILDKIT=1 "$c" build -q --secret id=probe,src="$probe_dir/secret" -t mtp-buildkit-probe:latest "$probe_dir" > "$probe_dir/log" 2>&1; then
        REPORT+=("$c (CLI $ver): DOCKER_BUILDKIT=1 docker build works")
        [ -n "$BUILDKIT_CLI" ] || { BUILDKIT_CLI=$c; BUILDKIT_MODE=DOCKER_BUILDKIT=1; }
    else
        REPORT+=("$c (CLI $ver): no BuildKit ($( (grep -m1 -i 'error' "$probe_dir/log" || tail -n 1 "$probe_dir/log") | sed 's/^ *//' | cut -c1-100))")
    fi
done
rm -rf "$probe_dir"
"$DOCKER" image rm -f mtp-buildkit-probe:latest > /dev/null 2>&1 || true
[ -n "$BUILDKIT_CLI" ] || { printf '  %s\n' "${REPORT[@]}" >&2; die "no docker CLI here builds with BuildKit"; }

cat > "$STATE_DIR/env.sh" <<EOF
# Written by scripts/setup-test-host.sh; source it before running the tests.
export MTP_TEST_REGISTRY=$REGISTRY
export MTP_TEST_BASE_IMAGE=$BASE_IMAGE
export MTP_DOCKER_BUILDKIT_CLI=$BUILDKIT_CLI
export MTP_DOCKER_BUILDKIT_MODE=$BUILDKIT_MODE
EOF

# --------------------------------------------------------------------------- summary
dockerd_pid=$(cat /var/run/docker.pid 2>/dev/null || cat "$STATE_DIR/dockerd.pid" 2>/dev/null || echo '?')
registry_pid=$(cat "$STATE_DIR/registry.pid" 2>/dev/null || echo '?')
echo
echo "MTP test host ready in $(elapsed "$T0")s"
echo "  dockerd     $("$DOCKER" version --format '{{.Server.Version}}' 2>/dev/null) pid $dockerd_pid, log $STATE_DIR/dockerd.log"
echo "  registry    http://$REGISTRY/v2/ pid $registry_pid, log $STATE_DIR/registry.log"
echo "  base image  $BASE_IMAGE $("$DOCKER" image inspect --format '{{.Id}}' "$BASE_IMAGE" | cut -c1-19)"
echo "  arm64 base  $ARM64_IMAGE $("$DOCKER" image inspect --format '{{.Id}}' "$ARM64_IMAGE" | cut -c1-19) (qemu-aarch64 binfmt)"
echo "  BuildKit    $BUILDKIT_CLI ($BUILDKIT_MODE)"
printf '              %s\n' "${REPORT[@]}"
echo "  tests       source $STATE_DIR/env.sh"
