#!/bin/sh
# Does this node's NVIDIA driver fit the image's CUDA line? (issue 37, item 4; docs/site-checks.md)
#
#   driver-check.sh [--job] [-- COMMAND [ARG...]]
#
# Reads the driver version (nvidia-smi --query-gpu=driver_version, else
# /proc/driver/nvidia/version) and what the image needs (/opt/mtp/runtime/driver.facts,
# written at render from mtpimage/data/drivers.yaml), then one of:
#   - the driver is new enough: go on, WITHOUT the forward-compatibility libraries (forced on
#     a driver that is new enough they fail with CUDA error 803), taking them off
#     LD_LIBRARY_PATH if something put them there;
#   - the driver is older, every GPU is a data-center one and the image has the compat
#     libraries: prepend them to LD_LIBRARY_PATH, say so, go on;
#   - otherwise: one line (the driver found, the driver needed, the fix) and exit 1.
# Where the driver fits and the image has compiled extensions (driver.facts cuda_archs, the
# architectures of version.json's extensions), every GPU's compute capability (nvidia-smi
# --query-gpu=compute_cap) must be one those architectures run on (issue 49): otherwise one
# line (the GPU, its sm, the image's, the fix) and exit 1. MTP_SKIP_ARCH_CHECK=1 goes on anyway.
# "Go on" is exec COMMAND with that environment (exit 0 without one). No driver visible (a
# build or CPU machine): go on; with --job (a GPU job's preflight) it says so first.
# Messages go to stderr: stdout stays the command's. POSIX sh: bases without bash run it too.
# MTP_DRIVER_FACTS and MTP_DRIVER_PROC move the facts file and /proc/driver/nvidia (tests).
set -u

facts=${MTP_DRIVER_FACTS:-$(dirname "$0")/driver.facts}
proc=${MTP_DRIVER_PROC:-/proc/driver/nvidia}
job=0
while [ $# -gt 0 ]; do
    case $1 in
    --job) job=1 ;;
    --)
        shift
        break
        ;;
    *)
        echo "driver-check.sh: unknown option '$1' (usage: driver-check.sh [--job] [-- COMMAND...])" >&2
        exit 2
        ;;
    esac
    shift
done

say() { echo "mtp driver check: $*" >&2; }

go_on() {
    if [ $# -gt 0 ]; then
        exec "$@"
    fi
    exit 0
}

# LD_LIBRARY_PATH without DIR (and without empty entries)
without() {
    printf '%s' "${LD_LIBRARY_PATH:-}" | awk -v RS=: -v ORS= -v drop="$1" \
        '$0 != "" && $0 != drop && $0 != drop "/" { printf "%s%s", sep, $0; sep = ":" }'
}

cuda_line="" min_driver="" compat_dir="" datacenter_gpus="" cuda_archs="" profile=""
if [ -r "$facts" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in '#'* | '') continue ;; esac
        value=${line#*=}
        case ${line%%=*} in
        cuda_line) cuda_line=$value ;;
        min_driver) min_driver=$value ;;
        compat_dir) compat_dir=$value ;;
        datacenter_gpus) datacenter_gpus=$value ;;
        cuda_archs) cuda_archs=$value ;;
        profile) profile=$value ;;
        esac
    done < "$facts"
fi

# Does the image's compiled code run on a GPU of compute capability $1 (MAJOR.MINOR)? The
# extensions' wheels carry SASS only, no PTX the driver could compile for a newer GPU (gpu_archs
# in mtpimage/data/rules.yaml), and SASS for sm_XY runs on compute capability X.z with z >= Y
# (CUDA's binary compatibility; an arch-specific "a" target on X.Y alone): sm_90 does not run
# on a B200 (10.0), sm_100 does on a B300 (10.3).
runs_on() {
    cap_major=${1%%.*} cap_minor=${1#*.}
    for arch in $cuda_archs; do
        digits=${arch%[af]}
        arch_major=${digits%?} arch_minor=${digits#"${digits%?}"}
        [ "$cap_major" -eq "$arch_major" ] || continue
        case $arch in
        *a) [ "$cap_minor" -eq "$arch_minor" ] && return 0 ;;
        *) [ "$cap_minor" -ge "$arch_minor" ] && return 0 ;;
        esac
    done
    return 1
}

# Every GPU against the image's architectures: sets arch_note for the go-on line, or says which
# GPU the image cannot run on and exits 1. An image without compiled extensions has nothing to
# compare (torch carries its own architectures).
arch_note=""
check_archs() {
    [ -n "$cuda_archs" ] || return 0
    sms=$(for arch in $cuda_archs; do printf 'sm_%s, ' "$arch"; done)
    sms=${sms%, }
    caps=""
    if command -v nvidia-smi > /dev/null 2>&1; then
        caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null) || caps=""
    fi
    caps=$(printf '%s\n' "$caps" | awk '{ gsub(/[ \t\r]/, "") } /^[0-9]+\.[0-9]+$/ { print }')
    if [ -z "$caps" ]; then
        arch_note="; the GPUs' compute capability could not be read (nvidia-smi --query-gpu=compute_cap), so the image's $sms was not compared with it"
        return 0
    fi
    index=0
    for cap in $caps; do
        if ! runs_on "$cap"; then
            digits=$(printf '%s' "$cap" | tr -d .)
            want=${cap%%.*}0
            gpu=$(printf '%s\n' "$gpus" | awk -v n=$((index + 1)) 'NR == n { print; exit }')
            if [ "${MTP_SKIP_ARCH_CHECK:-}" = 1 ]; then
                arch_note="; GPU $index${gpu:+ ($gpu)} is sm_$digits and the image's extensions carry code for $sms only: going on as MTP_SKIP_ARCH_CHECK=1 asks (their first fused kernel will fail)"
                return 0
            fi
            say "GPU $index${gpu:+ ($gpu)} has compute capability $cap: this image's compiled extensions carry code for $sms only, and none of it runs on an sm_$digits GPU (fix: use an image built with builds.cuda_archs including \"$want\" (python3 build.py --profile ${profile:-PROFILE} --set builds.cuda_archs=$(printf '%s' "$cuda_archs" | tr ' ' ,),$want), or run this one on GPUs of $sms)"
            exit 1
        fi
        index=$((index + 1))
    done
    arch_note="; every GPU here (compute capability $(printf '%s\n' "$caps" | sort -u | paste -sd ' ' -)) has code among the image's $sms"
}
case $min_driver in
'' | *[!0-9]*) go_on "$@" ;; # an image that states no requirement: nothing to check
esac

driver="" gpus="" source=""
if command -v nvidia-smi > /dev/null 2>&1; then
    answer=$(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2> /dev/null) || answer=""
    driver=$(printf '%s\n' "$answer" | awk -F', *' 'NR == 1 && $1 ~ /^[0-9]+(\.[0-9]+)*$/ { print $1 }')
    gpus=$(printf '%s\n' "$answer" | awk -F', *' 'NF > 1 { sub(/^[^,]*, */, ""); print }')
    source=nvidia-smi
fi
if [ -z "$driver" ] && [ -r "$proc/version" ]; then
    driver=$(awk '/^NVRM version:/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\.[0-9]+(\.[0-9]+)*$/) { print $i; exit } }' "$proc/version")
    gpus=$(cat "$proc"/gpus/*/information 2> /dev/null | awk '/^Model:/ { sub(/^Model:[ \t]*/, ""); print }')
    source=$proc/version
fi
if [ -z "$driver" ]; then
    if [ "$job" = 1 ]; then
        say "no NVIDIA driver visible (no answer from nvidia-smi, no $proc/version): nothing to check; a GPU job needs the driver in the container (pyxis/enroot's NVIDIA hook, apptainer --nv, docker --gpus)"
    fi
    go_on "$@"
fi

major=${driver%%.*}
if [ "$major" -ge "$min_driver" ]; then
    check_archs
    if [ -n "$compat_dir" ] && [ "$(without "$compat_dir")" != "${LD_LIBRARY_PATH:-}" ]; then
        LD_LIBRARY_PATH=$(without "$compat_dir")
        export LD_LIBRARY_PATH
        say "driver $driver fits CUDA $cuda_line (needs >= $min_driver): took $compat_dir off LD_LIBRARY_PATH (compat libraries on a driver that is new enough fail with CUDA error 803)$arch_note"
    else
        say "driver $driver fits CUDA $cuda_line (needs >= $min_driver); forward-compatibility libraries not used$arch_note"
    fi
    go_on "$@"
fi

# Older than the CUDA line needs: the compat libraries, where allowed and present.
datacenter=1
if [ -z "$gpus" ] || [ -z "$datacenter_gpus" ]; then
    datacenter=0
else
    # every GPU must be a data-center one
    if printf '%s\n' "$gpus" | grep -Evq -- "$datacenter_gpus"; then
        datacenter=0
    fi
fi
first_gpu=$(printf '%s\n' "$gpus" | awk 'NF { print; exit }')
has_compat=0
for lib in "$compat_dir"/libcuda.so.*; do
    [ -e "$lib" ] && has_compat=1
done
found="NVIDIA driver $driver found ($source), CUDA $cuda_line needs >= $min_driver"
if [ "$datacenter" = 1 ] && [ "$has_compat" = 1 ]; then
    check_archs
    LD_LIBRARY_PATH=$compat_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
    say "$found: data-center GPU ($first_gpu), so the image's forward-compatibility libraries are used ($compat_dir prepended to LD_LIBRARY_PATH)$arch_note"
    go_on "$@"
fi
if [ "$datacenter" = 0 ] && [ -z "$gpus" ]; then
    why="the GPU's model could not be read, so forward compatibility was not tried"
elif [ "$datacenter" = 0 ]; then
    why="forward compatibility is for data-center GPUs only, and this is $first_gpu"
else
    why="or use an image with NVIDIA's forward-compatibility libraries in $compat_dir (cuda-compat); this one has none"
fi
say "$found (fix: update the node's NVIDIA driver to $min_driver or newer; $why)"
exit 1
