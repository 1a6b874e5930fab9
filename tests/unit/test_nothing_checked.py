"""A check that checked nothing is a skip, not a pass (issue 21 item 8): in the image
(images/checks/run_checks.py, run here on this interpreter with a version vector of our own)
and on the host (mtpimage/assembly/imagetest.py), also for images built before results had counts."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from mtpimage.assembly import imagetest
from mtpimage.assembly.render import IMAGES_DIR


@pytest.fixture
def run_checks(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "run_checks_nothing_checked", IMAGES_DIR / "checks" / "run_checks.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)

    def with_vector(vector: dict):
        path = tmp_path / "version.json"
        path.write_text(json.dumps(vector))
        monkeypatch.setattr(mod, "VECTOR", path)
        return mod

    return with_vector


VECTOR = {
    "mode": "mtp-only",
    "engine": {"context_parallel_size": 1, "recompute": {"granularity": None}},
    "components": [],
    "packages": [],
    "python_packages": {},
}


def test_the_gpu_checks_cpu_part_is_a_skip(run_checks):
    # the real gpu_check.py --cpu-only: it resolves the mode's checks and runs none of them
    [res] = run_checks(VECTOR).run(gpu=False, only=["gpu"])
    assert res["id"] == "gpu-check-cpu-part"
    assert res["status"] == "skip", res
    assert res["detail"].startswith("nothing checked: mode mtp-only: 0 pass, 0 fail, ")
    assert res["checked"] == 0


def test_a_gpu_check_without_a_report_still_fails(run_checks):
    [res] = run_checks({**VECTOR, "mode": "no-such-mode"}).run(gpu=False, only=["gpu"])
    assert res["status"] == "fail" and "exit 2, no report" in res["detail"], res


def test_any_check_that_counts_zero_is_a_skip(run_checks):
    # nothing in the vector to compare: the versions check looked at nothing
    [res] = run_checks(VECTOR).run(only=["versions"])
    assert (res["status"], res["checked"]) == ("skip", 0), res
    assert res["detail"].startswith("nothing checked: ")


def test_a_check_with_a_count_keeps_its_pass(run_checks):
    mod = run_checks(VECTOR)
    assert mod.settle(mod.result("x", mod.PASS, "3 things", 3))["status"] == "pass"
    assert mod.settle(mod.result("x", mod.PASS, "no count"))["status"] == "pass"
    assert mod.settle(mod.result("x", mod.FAIL, "0 things", 0))["status"] == "fail"


# What images built before this change report for the CPU part: a pass, with its own tally.
OLD_CPU_PART = {
    "id": "gpu-check-cpu-part",
    "status": "pass",
    "detail": "GPU part skipped (no --gpu): GPU part skipped: --cpu-only given | "
    "result: OK (0 pass, 0 fail, 4 skip; exit 0)",
}


def test_the_host_reports_a_pass_that_checked_nothing_as_skip():
    report = imagetest.TestReport(
        "img", [OLD_CPU_PART, {"id": "n", "status": "pass", "detail": "x", "checked": 0}], 0, ""
    )
    assert [r["status"] for r in report.results] == ["skip", "skip"]
    assert report.table().splitlines()[-1] == "0 passed, 0 failed, 2 skipped"
    assert report.ok


def test_the_host_keeps_passes_that_checked_something():
    ran = {**OLD_CPU_PART, "detail": "result: OK (4 pass, 0 fail, 0 skip; exit 0)"}
    counted = {"id": "imports", "status": "pass", "detail": "12/12 import", "checked": 12}
    report = imagetest.TestReport(
        "img", [ran, counted, {"id": "pip-check", "status": "pass", "detail": "ok"}], 0, ""
    )
    assert [r["status"] for r in report.results] == ["pass", "pass", "pass"]


def test_the_summary_line_gives_the_runs_wall_time_not_the_sum_of_overlapping_checks():
    """The entry checks run in the import check's pool: their times overlap its own."""
    results = [
        {"id": "imports", "status": "pass", "detail": "x", "seconds": 80.0},
        {"id": "entry:a", "status": "pass", "detail": "x", "seconds": 30.0},
    ]
    report = imagetest.TestReport("img", results, 0, "", seconds=84.5)
    assert report.summary_line() == "2 passed, 0 failed, 0 skipped; checks took 84.5 s"
    assert report.summary()["seconds"] == 84.5
