"""The job scripts' preflight: before the trainer starts, inside the container and with the
job's own environment, two checks of the image run.

- The driver check (images/runtime/driver-check.sh, issue 37): does this node's NVIDIA driver
  fit the image's CUDA line; the forward-compatibility libraries only where they are needed
  and allowed; otherwise one line (driver found, driver needed, the fix) and the job stops.
  It also holds every GPU's compute capability to the architectures the image's compiled
  extensions carry (issue 49): a B200 under an sm_90 image stops the job in one line naming
  the GPU and the builds.cuda_archs that would serve it.
  Job runtimes skip the image's ENTRYPOINT (pyxis without --container-entrypoint, apptainer
  exec, KubeRay's own ray start command), so the job runs the check itself.
- The launch-env check (images/checks/run_checks.py): users set PYTHONPATH in job scripts
  (verl's SFT example puts its own Megatron-LM and mbridge checkouts there), which silently
  shadows the image's pinned copies; its one-copy part stops the job in one line, naming the
  shadowing path, before any GPU time is spent.
"""

from __future__ import annotations

import shlex

from mtpimage.assembly.driver import DRIVER_CHECK as DRIVER_CHECK_SCRIPT
from mtpimage.assembly.imagetest import CHECKS

LAUNCH_ENV_CHECK = f"python3 {CHECKS} --only launch-env"
# what runs the rest of the preflight, with the environment the driver check settled on
DRIVER_CHECK = f"{DRIVER_CHECK_SCRIPT} --job --"


def preflighted(entry: str) -> str:
    """`entry` (a shell command's words) run only after both checks passed: the driver check
    execs the launch-env check's shell (compat libraries on LD_LIBRARY_PATH where it enabled
    them), whose table goes to stderr; either failure ends the job with exit 1 before the
    trainer starts."""
    script = f"{LAUNCH_ENV_CHECK} >&2 || {{ echo 'mtp preflight failed: see the table above' >&2; exit 1; }}; exec \"$@\""
    return f"{DRIVER_CHECK} bash -c {shlex.quote(script)} mtp-preflight {entry}"
