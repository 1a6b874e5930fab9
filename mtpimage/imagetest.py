"""Test stage: run the in-image checks (/opt/mtp/checks/run_checks.py) in a container.

Containers are started with testcontainers (Docker SDK underneath). Its reaper image
(ryuk) cannot be pulled on air-gapped machines, so it is disabled and the container is
removed here, in a finally block.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .errors import EnvironmentProblem

CHECKS = "/opt/mtp/checks/run_checks.py"


@dataclass
class TestReport:
    image: str
    results: list
    exit_code: int
    output: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and bool(self.results) and \
            not any(r["status"] == "fail" for r in self.results)

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


def run_checks(image: str, gpu: bool = False, timeout: float = 900) -> TestReport:
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    try:
        from testcontainers.core.container import DockerContainer
    except ImportError as exc:  # pragma: no cover - a dependency
        raise EnvironmentProblem(f"testcontainers is not installed ({exc}); pip install -r requirements.txt")
    import docker

    cmd = ["python", CHECKS, "--json"] + (["--gpu"] if gpu else [])
    container = DockerContainer(image).with_command(cmd)
    if gpu:
        container = container.with_kwargs(device_requests=[
            docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])], shm_size="2g")
    try:
        container.start()
    except docker.errors.ImageNotFound:
        raise EnvironmentProblem(f"image {image} not found locally (build it first, or pull it)")
    except docker.errors.DockerException as exc:
        raise EnvironmentProblem(f"cannot start a container of {image}: {exc}")
    try:
        wrapped = container.get_wrapped_container()
        status = wrapped.wait(timeout=timeout)
        code = int(status.get("StatusCode", 1))
        stdout = wrapped.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = wrapped.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        try:
            container.stop()
        except Exception:  # noqa: BLE001 - clean-up must not mask the result
            pass
    results = []
    for line in reversed(stdout.strip().splitlines()):
        try:
            results = json.loads(line)["results"]
            break
        except (ValueError, KeyError, TypeError):
            continue
    return TestReport(image, results, code, stdout + stderr)
