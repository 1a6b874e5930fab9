"""The job scripts' preflight: before the trainer starts, inside the container and with the
job's own environment, the image's launch-env check (images/checks/run_checks.py) runs.
Users set PYTHONPATH in job scripts (verl's SFT example puts its own Megatron-LM and mbridge
checkouts there), which silently shadows the image's pinned copies; the check stops the job
in one line, naming the shadowing path, before any GPU time is spent."""

from __future__ import annotations

import shlex

from mtpimage.build.imagetest import CHECKS

LAUNCH_ENV_CHECK = f"python3 {CHECKS} --only launch-env"


def preflighted(entry: str) -> str:
    """`entry` (a shell command's words) run only after the launch-env check passed: the check's
    table goes to stderr, its failure ends the job with exit 1 before the trainer starts."""
    script = f"{LAUNCH_ENV_CHECK} >&2 || {{ echo 'mtp preflight failed: see the table above' >&2; exit 1; }}; exec \"$@\""
    return f"bash -c {shlex.quote(script)} mtp-preflight {entry}"
