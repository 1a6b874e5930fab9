#!/bin/sh
# The image's ENTRYPOINT (images/partials/mode.j2): the driver check before any command
# (driver-check.sh: go on, go on with the forward-compatibility libraries, or stop with one
# line), then NVIDIA's own entrypoint where the base has one (nvidia/cuda images:
# /opt/nvidia/nvidia_entrypoint.sh, its banner and checks), then the command; bash (sh
# where there is no bash) when none is given, as the base's CMD was (an ENTRYPOINT clears it).
# Job runtimes that skip the ENTRYPOINT (pyxis, apptainer exec, KubeRay) run driver-check.sh
# themselves: the generated job scripts' preflight.
here=$(dirname "$0")
if [ $# -eq 0 ]; then
    if command -v bash > /dev/null 2>&1; then
        set -- bash
    else
        set -- sh
    fi
fi
nvidia=${MTP_NVIDIA_ENTRYPOINT:-/opt/nvidia/nvidia_entrypoint.sh}
if [ -x "$nvidia" ]; then
    set -- "$nvidia" "$@"
fi
exec "$here/driver-check.sh" -- "$@"
