"""Test stage: run the in-image checks (/opt/mtp/checks/run_checks.py) in a container.

Containers are started with testcontainers (Docker SDK underneath). Its reaper image
(ryuk) cannot be pulled on air-gapped machines, so it is disabled and the container is
removed here, in a finally block.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from .errors import EnvironmentProblem, InputError

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


def _registry_host(ref: str) -> str | None:
    """The registry a reference names explicitly (`host[:port]/...`), or None for a bare name
    (which docker would look up on docker.io)."""
    from .registry import ImageRef

    try:
        parsed = ImageRef.parse(ref)
    except InputError:
        return None  # not a reference docker could pull either: reported as not found
    return parsed.host if parsed.explicit_host else None


def ensure_local(image: str, flag: str = "--image") -> None:
    """The image must be in the local engine. A bare name is never looked up on docker.io
    (from air-gapped machines that only ends in a DNS error); a reference that names its
    registry is pulled from there once."""
    from . import engine

    if engine.docker("image", "inspect", "--format", "{{.Id}}", image, check=False).returncode == 0:
        return
    host = _registry_host(image)
    if host is None:
        raise InputError(
            flag,
            image,
            "no such image in the local Docker engine (a name without a "
            "registry host is not looked up on docker.io)",
            "build it with python build.py --profile NAME, `docker load` or `docker pull` "
            "it, or give the registry: HOST[:PORT]/NAME:TAG",
        )
    proc = engine.docker("pull", "--quiet", image, check=False, timeout=3600)
    if proc.returncode == 0:
        return
    err = " ".join(proc.stderr.decode(errors="replace").split())
    low = err.lower()
    if any(p in low for p in ("not found", "manifest unknown", "name unknown", "does not exist")):
        raise InputError(
            flag,
            image,
            f"not in the local Docker engine, nor in registry {host}",
            "check the name and tag, or push it there first",
        )
    if any(p in low for p in ("unauthorized", "denied", "authentication required")):
        raise EnvironmentProblem(
            f"{image} is not in the local Docker engine and registry {host} "
            f"refuses to serve it: {err[-200:]} (fix: docker login {host})"
        )
    raise EnvironmentProblem(
        f"{image} is not in the local Docker engine and registry {host} cannot "
        f"be reached: {err[-200:]} (fix: check that the registry runs and is "
        f"reachable from this machine, or docker load the image)"
    )


GPU_UNAVAILABLE = ("could not select device driver", "nvidia-container-cli", "nvml error")


def run_checks(image: str, gpu: bool = False, timeout: float = 900) -> TestReport:
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    try:
        from testcontainers.core.container import DockerContainer
    except ImportError as exc:  # pragma: no cover - a dependency
        raise EnvironmentProblem(
            f"testcontainers is not installed ({exc}); pip install -r requirements.txt"
        ) from exc
    import docker
    import requests

    from . import engine

    ensure_local(image)  # testcontainers would pull a missing image (from docker.io)
    cmd = ["python", CHECKS, "--json"] + (["--gpu"] if gpu else [])
    try:
        container = DockerContainer(image).with_command(cmd)
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise engine.unreachable(str(exc)) or EnvironmentProblem(f"docker does not answer: {exc}") from None
    if gpu:
        container = container.with_kwargs(
            device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])], shm_size="2g"
        )
    try:
        try:
            container.start()
        except BaseException as exc:
            # start() = create + start: a container that was created but could not start
            # (no GPU, no such runtime) must not be left behind.
            try:
                container.stop()
            except Exception:  # noqa: BLE001 - clean-up must not mask the cause
                pass
            if not isinstance(exc, Exception):
                raise
            text = " ".join(str(exc).split())
            reason = " ".join(str(getattr(exc, "explanation", None) or text).split())
            down = engine.unreachable(text)
            if down is not None:
                raise down from None
            if gpu and any(p in text.lower() for p in GPU_UNAVAILABLE):
                raise EnvironmentProblem(
                    f"--gpu: Docker cannot give the container a GPU on this host ({reason[-160:]}) (fix: "
                    "on a GPU host install the NVIDIA driver and the NVIDIA Container Toolkit, run "
                    "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd; or run "
                    "without --gpu)"
                ) from None
            if isinstance(exc, docker.errors.ImageNotFound):
                raise EnvironmentProblem(
                    f"image {image} not found locally (build it first, or pull it)"
                ) from None
            raise EnvironmentProblem(f"cannot start a container of {image}: {reason[-400:]}") from None
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
