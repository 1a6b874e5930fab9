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

    publish_format = "gzip"  # what the engine's push writes (the docker engine's)

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

    def publish(*a, **k):
        state["published"] = (a[3], a[4], k.get("replace", False))  # content tag, profile tag
        calls.append("push")
        return DIGEST

    monkeypatch.setattr(release, "publish", publish)
    monkeypatch.setattr(
        registryclient.RegistryClient, "manifest_digest", lambda self, repo, tag: state["remote"]
    )
    # the content tag's manifest: `remote_layers` is its layers' media type (an OCI gzip image)
    state["remote_layers"] = "application/vnd.oci.image.layer.v1.tar+gzip"

    def remote_manifest(self, repo, tag, *a, **k):
        if state["remote"] is None:
            return None
        state.setdefault("asked", []).append(tag)
        return json.dumps({"layers": [{"mediaType": state["remote_layers"]}]}).encode(), state["remote"]

    monkeypatch.setattr(registryclient.RegistryClient, "manifest", remote_manifest)
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


# ----------------------------------------------------------------------------- layer formats (issue 48)
class _ZstdEngine(_Engine):
    publish_format = "zstd"


def test_another_layer_format_is_published_under_its_own_tags(steps, tmp_path):
    """The same image in zstd goes to <identity>.zstd and <profile>.zstd, beside the gzip
    tags every client reads: a second format in one namespace is published, not skipped as
    up to date because the gzip image's content tag exists."""
    calls, state = steps
    state["engine"] = _ZstdEngine(calls)
    job = _job(steps, tmp_path, "127.0.0.1:5000/ns")
    rendered = pipeline.render(job.plan, job.manifests.root)
    said: list[str] = []
    pipeline.run(job, say=said.append)
    assert state["published"] == (f"{rendered.identity}.zstd", "mtp-detach.zstd", False)
    # the pull lines say which clients read zstd: Debian 12's docker 20.10 does not
    docker = next(line for line in said if line.startswith("docker "))
    assert docker.endswith("   # needs docker 23.0.0 or later (zstd layers)"), docker
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["layer_format"] == "zstd"
    assert summary["references"] == [
        f"127.0.0.1:5000/ns/mtp-verl:{rendered.identity}.zstd",
        "127.0.0.1:5000/ns/mtp-verl:mtp-detach.zstd",
    ]


def test_the_default_format_keeps_the_plain_tags_and_asks_for_them(steps, tmp_path):
    calls, state = steps
    state["remote"] = DIGEST
    job = _job(steps, tmp_path, "127.0.0.1:5000/ns")
    rendered = pipeline.render(job.plan, job.manifests.root)
    pipeline.run(job, say=lambda _: None)
    assert state["asked"] == [rendered.identity] and calls == ["frozen"]


def test_a_content_tag_in_another_format_is_published_over_not_taken_as_up_to_date(steps, tmp_path):
    """An image pushed uncompressed under the plain tags (before gzip became the default) is
    the same content but not the gzip image the tag now promises: built and pushed over it,
    with replace (never deleted on a roll-back), and said."""
    calls, state = steps
    state["remote"] = DIGEST
    state["remote_layers"] = "application/vnd.oci.image.layer.v1.tar"
    said: list[str] = []
    job = _job(steps, tmp_path, "127.0.0.1:5000/ns")
    pipeline.run(job, say=said.append)
    assert "build" in calls and "push" in calls
    assert state["published"][2] is True
    assert any(line.startswith("note ") and "holds none layers" in line for line in said), said


def test_the_profiles_compression_field_picks_the_format_when_publishing(tmp_path):
    """builds.compression (a profile's, or --set) is --compression's default when publishing;
    with the docker engine a format other than gzip is one line naming the profile's field."""
    from mtpimage.commands.mainjob import main_job

    m = manifest.load()
    plan = plan_for(m, "mtp-detach", ["builds.compression=zstd"])
    assert plan.layer_compression == "zstd"
    assert plan.digest == plan_for(m, "mtp-detach", None).digest  # how it is published, not what

    def args(**k):
        base = dict(push=True, registry="127.0.0.1:5000/ns", engine="buildah", compression=None)
        return SimpleNamespace(**{**base, **k})

    assert main_job(args(), m, plan).build.engine.publish_format == "zstd"
    assert main_job(args(compression="gzip"), m, plan).build.engine.publish_format == "gzip"
    with pytest.raises(InputError) as err:
        main_job(args(engine="docker"), m, plan)
    assert str(err.value).startswith("profile mtp-detach: builds.compression: zstd: the docker engine")
    assert "--compression gzip for this run" in str(err.value)
    # a local build publishes nothing: the field does not stop the docker engine there
    local = main_job(args(engine="docker", push=False, registry=None), m, plan)
    assert local.build.engine.publish_format == "gzip"
