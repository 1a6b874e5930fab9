"""Test stage: run the in-image checks (/opt/mtp/checks/run_checks.py) in a container.

The container is run through the engine seam (engine.py), which removes it whatever
happened; a missing image is pulled only from the registry its reference names.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from mtpimage import engine
from mtpimage.assembly import checkreuse
from mtpimage.assembly.checkreuse import REUSED
from mtpimage.errors import EnvironmentProblem, last_words
from mtpimage.gitfetch import cache_root

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
    # the run's wall time: each result's `seconds` is its own, and checks run side by side
    # (the entry checks in the import check's pool), so their sum says little
    seconds: float | None = None

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
        lines = [f"{'STATUS':<6} {'CHECK':<{width}} {'TIME':>8}  DETAIL"]
        for r in self.results:
            took = f"{r['seconds']:.1f}s" if isinstance(r.get("seconds"), (int, float)) else "-"
            proof = f"(proved by {short_id(r['proved_by'])}) " if r.get("proved_by") else ""
            lines.append(f"{r['status'].upper():<6} {r['id']:<{width}} {took:>8}  {proof}{r['detail']}")
        return "\n".join(lines + [self.summary_line()])

    def summary(self) -> dict:
        """For --summary-file: each check's status and time, and what was reused from where."""
        keep = ("id", "status", "seconds", "proved_by")
        return {
            "ok": self.ok,
            "line": self.summary_line(),
            "seconds": self.seconds,
            "results": [{k: r[k] for k in keep if k in r} for r in self.results],
        }

    def summary_line(self) -> str:
        count = {s: sum(r["status"] == s for r in self.results) for s in ("pass", "fail", "skip", REUSED)}
        line = f"{count['pass']} passed, {count['fail']} failed, {count['skip']} skipped"
        proofs = sorted({short_id(r["proved_by"]) for r in self.results if r.get("proved_by")})
        if count[REUSED]:
            line += f", {count[REUSED]} reused (inputs unchanged since {', '.join(proofs)} passed them)"
        if self.seconds is not None:
            line += f"; checks took {self.seconds:.1f} s"
        return line


def short_id(image_id: str) -> str:
    """sha256:<12 hex>, as docker prints image IDs."""
    algo, _, hexa = image_id.partition(":")
    return f"{algo}:{hexa[:12]}" if hexa else image_id[:19]


def ensure_local(eng, image: str, flag: str = "--image") -> None:
    """The image must be in the local engine `eng`, or pulled from the registry it names (never
    from docker.io): the engine seam's one rule (engine.ContainerEngine.ensure_local)."""
    eng.ensure_local(image, flag)


GPU_UNAVAILABLE = ("could not select device driver", "nvidia-container-cli", "nvml error")


def _reuse_record(eng, image: str) -> tuple[str | None, dict]:
    """(the key of the image's lower layers, the record of checks proved on them); no key
    for an image without this tool's mode layer on top, or an engine that cannot tell."""
    rootfs = eng.rootfs(image)
    if rootfs is None:
        return None, {"groups": {}}
    key = checkreuse.lower_key(*rootfs, eng.history(image))
    return key, (checkreuse.load(cache_root(), key) if key else {"groups": {}})


def _reused_and_recorded(eng, image: str, key: str | None, record: dict, results: list[dict]) -> list[dict]:
    """The results with reused groups filled in from the record; the groups that passed here
    recorded for the next image with the same lower layers."""
    results = checkreuse.expand(results, record)
    if key and checkreuse.remember(record, results, eng.image_id(image) or image):
        checkreuse.save(cache_root(), key, record)
    return results


def run_checks(image: str, eng, gpu: bool = False, timeout: float = 900, full: bool = False) -> TestReport:
    """The checks of `image`, run in a container of the engine `eng` (a ContainerEngine).
    full: run every check (--full-checks), even those whose inputs an image with the same
    lower layers already passed; their results are recorded either way."""
    ensure_local(eng, image)  # a missing image is pulled only from the registry it names
    key, record = _reuse_record(eng, image)
    reuse = [] if full else checkreuse.reuse_args(record)
    cmd = ["python", CHECKS, "--json"] + (["--gpu"] if gpu else []) + reuse
    started = time.monotonic()
    try:
        ran = eng.run(image, cmd, gpu=gpu, timeout=timeout)
    except engine.StartFailed as exc:
        reason = " ".join(exc.detail.split())
        if gpu and any(p in reason.lower() for p in GPU_UNAVAILABLE):
            raise EnvironmentProblem(
                f"--gpu: Docker cannot give the container a GPU on this host ({last_words(reason, 160)}) (fix: "
                "on a GPU host install the NVIDIA driver and the NVIDIA Container Toolkit, run "
                "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd; or run "
                "without --gpu)"
            ) from None
        if exc.image_missing:
            raise EnvironmentProblem(
                f"image {image} not found locally (build it first, or pull it)"
            ) from None
        raise EnvironmentProblem(f"cannot start a container of {image}: {last_words(reason, 400)}") from None
    if reuse and ran.exit_code == 2 and "--reuse" in ran.stderr:
        # run_checks.py from before reuse (an image built earlier): everything runs
        ran = eng.run(image, cmd[: len(cmd) - len(reuse)], gpu=gpu, timeout=timeout)
    code, stdout, stderr = ran.exit_code, ran.stdout, ran.stderr
    results = []
    for line in reversed(stdout.strip().splitlines()):
        try:
            results = json.loads(line)["results"]
            break
        except (ValueError, KeyError, TypeError):
            continue
    results = _reused_and_recorded(eng, image, key, record, results)
    return TestReport(image, results, code, stdout + stderr, round(time.monotonic() - started, 1))
