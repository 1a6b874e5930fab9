"""Test stage: run the in-image checks (/opt/mtp/checks/run_checks.py) in a container.

The container is run through the engine seam (engine.py), which removes it whatever
happened; a missing image is pulled only from the registry its reference names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import EnvironmentProblem

CHECKS = "/opt/mtp/checks/run_checks.py"

# gpu_check.py's own tally in a result's detail. Images built before results carried
# `checked` report a gpu-check-cpu-part that ran no check as pass: its tally says so.
_TALLY = re.compile(r"\b(\d+) pass, (\d+) fail, \d+ skip\b")


def settle(r: dict) -> dict:
    """A pass that checked nothing is a skip: by the count the check reports (`checked`), or
    by its detail's pass/fail tally. images/checks/run_checks.py applies the same rule."""
    if r.get("status") != "pass":
        return r
    checked = r.get("checked")
    if checked is None:
        tally = _TALLY.search(r.get("detail", ""))
        checked = int(tally[1]) + int(tally[2]) if tally else None
    if checked == 0:
        return {**r, "status": "skip", "detail": "nothing checked: " + r.get("detail", "")}
    return r


@dataclass
class TestReport:
    image: str
    results: list
    exit_code: int
    output: str

    def __post_init__(self):
        self.results = [settle(r) for r in self.results]

    @property
    def ok(self) -> bool:
        return (
            self.exit_code == 0
            and bool(self.results)
            and not any(r["status"] == "fail" for r in self.results)
        )

    def table(self) -> str:
        if not self.results:
            return f"no check results from {self.image}: {self.output.strip()[-800:]}"
        width = max(len(r["id"]) for r in self.results)
        lines = [f"{'STATUS':<6} {'CHECK':<{width}}  DETAIL"]
        for r in self.results:
            lines.append(f"{r['status'].upper():<6} {r['id']:<{width}}  {r['detail']}")
        passed = sum(r["status"] == "pass" for r in self.results)
        failed = sum(r["status"] == "fail" for r in self.results)
        skipped = sum(r["status"] == "skip" for r in self.results)
        lines.append(f"{passed} passed, {failed} failed, {skipped} skipped")
        return "\n".join(lines)


def ensure_local(image: str, flag: str = "--image") -> None:
    """The image must be in the local engine, or pulled from the registry it names (never from
    docker.io): the engine seam's one rule (engine.ContainerEngine.ensure_local)."""
    from . import engine

    engine.current().ensure_local(image, flag)


GPU_UNAVAILABLE = ("could not select device driver", "nvidia-container-cli", "nvml error")


def run_checks(image: str, gpu: bool = False, timeout: float = 900) -> TestReport:
    from . import engine

    ensure_local(image)  # a missing image is pulled only from the registry it names
    eng = engine.current()
    cmd = ["python", CHECKS, "--json"] + (["--gpu"] if gpu else [])
    try:
        ran = eng.run(image, cmd, gpu=gpu, timeout=timeout)
    except engine.StartFailed as exc:
        reason = " ".join(exc.detail.split())
        if gpu and any(p in reason.lower() for p in GPU_UNAVAILABLE):
            raise EnvironmentProblem(
                f"--gpu: Docker cannot give the container a GPU on this host ({reason[-160:]}) (fix: "
                "on a GPU host install the NVIDIA driver and the NVIDIA Container Toolkit, run "
                "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd; or run "
                "without --gpu)"
            ) from None
        if exc.image_missing:
            raise EnvironmentProblem(
                f"image {image} not found locally (build it first, or pull it)"
            ) from None
        raise EnvironmentProblem(f"cannot start a container of {image}: {reason[-400:]}") from None
    code, stdout, stderr = ran.exit_code, ran.stdout, ran.stderr
    results = []
    for line in reversed(stdout.strip().splitlines()):
        try:
            results = json.loads(line)["results"]
            break
        except (ValueError, KeyError, TypeError):
            continue
    return TestReport(image, results, code, stdout + stderr)
