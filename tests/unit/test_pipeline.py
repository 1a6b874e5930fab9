"""The main job as one explicit sequence: frozen check -> build -> test -> tag -> push,
with every step replaced by a recorder (no Docker, no registry)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from mtpimage.assembly import pipeline, release
from mtpimage.commands.load import plan_for
from mtpimage.errors import InputError
from mtpimage.imageref import Registry
from mtpimage.manifests import manifest
from mtpimage.publish import registryclient

DIGEST = "sha256:" + "e" * 64
IMAGE_ID = "sha256:" + "1" * 64


class _Engine:
    """The job's engine, passed in its options: no local image; tags recorded."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def image_id(self, ref):
        return None

    def tag(self, src, ref):
        self.calls.append(f"tag {ref.split(':')[-1].split('-')[0]}")

    def untag(self, ref):
        self.calls.append("untag")


@pytest.fixture
def steps(monkeypatch):
    calls: list[str] = []
    state = {"tests_ok": True, "remote": None, "engine": _Engine(calls)}
    monkeypatch.setattr(pipeline, "check_frozen", lambda job, warn: calls.append("frozen"))
    monkeypatch.setattr(
        pipeline, "build_image", lambda plan, rendered, options, say: calls.append("build") or IMAGE_ID
    )
    monkeypatch.setattr(
        pipeline,
        "run_tests",
        lambda image, gpu, eng, say, full=False: (
            calls.append(f"test {image}" + (" full" if full else ""))
            or SimpleNamespace(ok=state["tests_ok"], summary=lambda: {"ok": state["tests_ok"]})
        ),
    )
    monkeypatch.setattr(release, "publish", lambda *a, **k: calls.append("push") or DIGEST)
    monkeypatch.setattr(
        registryclient.RegistryClient, "manifest_digest", lambda self, repo, tag: state["remote"]
    )
    return calls, state


def _job(steps, tmp_path, registry=None):
    m = manifest.load()
    return pipeline.MainJob(
        manifests=m,
        plan=plan_for(m, "mtp-detach", None),
        registry=Registry.parse(registry) if registry else None,
        build=pipeline.BuildOptions(engine=steps[1]["engine"]),
        summary_file=tmp_path / "summary.json",
    )


def test_steps_run_in_order(steps, tmp_path):
    calls, _ = steps
    said: list[str] = []
    assert pipeline.run(_job(steps, tmp_path, "127.0.0.1:5000/ns"), say=said.append).exit_code == 0
    assert calls == ["frozen", "build", f"test {IMAGE_ID}", "tag mtp", "tag mtp", "push"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pushed"] and summary["digest"] == DIGEST
    assert f"pyxis     srun --container-image=127.0.0.1:5000#ns/mtp-verl@{DIGEST}" in said


def test_full_checks_reach_the_test_step_and_the_summary_has_the_checks(steps, tmp_path):
    calls, _ = steps
    job = dataclasses.replace(_job(steps, tmp_path), full_checks=True)
    pipeline.run(job, say=lambda _: None)
    assert f"test {IMAGE_ID} full" in calls
    assert json.loads((tmp_path / "summary.json").read_text())["checks"] == {"ok": True}


def test_failed_tests_tag_nothing_and_still_write_the_summary(steps, tmp_path):
    calls, state = steps
    state["tests_ok"] = False
    with pytest.raises(pipeline.TestsFailed):
        pipeline.run(_job(steps, tmp_path, "127.0.0.1:5000/ns"), say=lambda _: None)
    assert calls == ["frozen", "build", f"test {IMAGE_ID}"]
    assert json.loads((tmp_path / "summary.json").read_text())["pushed"] is False


def test_frozen_check_comes_first(steps, tmp_path, monkeypatch):
    calls, _ = steps

    def drifted(job, warn):
        raise InputError("manifests/lock.yaml", None, "drifted")

    monkeypatch.setattr(pipeline, "check_frozen", drifted)
    with pytest.raises(InputError):
        pipeline.run(_job(steps, tmp_path), say=lambda _: None)
    assert calls == []


def test_up_to_date_in_the_registry_builds_nothing(steps, tmp_path):
    calls, state = steps
    state["remote"] = DIGEST  # both tags already name the tested image
    said: list[str] = []
    assert pipeline.run(_job(steps, tmp_path, "127.0.0.1:5000/ns"), say=said.append).exit_code == 0
    assert calls == ["frozen"]
    assert any(line.startswith("up to date:") for line in said)
    assert json.loads((tmp_path / "summary.json").read_text())["up_to_date"] is True
