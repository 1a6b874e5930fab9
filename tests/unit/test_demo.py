"""`build.py demo` without Docker: its manifests are the test catalogue and pass the tool's
own checks, what it needs is checked first and said in one line, a failed step ends the demo
with that step's error and status, and the teardown removes only what the demo made.
The demo itself runs in tests/e2e/test_demo_e2e.py."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from mtpimage import engine
from mtpimage.demo import hostcheck, manifests, run
from mtpimage.demo.gitrepos import build_fixture_repos
from mtpimage.demo.testbase import DOCKER_ENGINE, PushedBase
from mtpimage.errors import EnvironmentProblem

from .helpers import REPO, run_main

BASE = PushedBase("127.0.0.1:5999/mtp-test/base", "bookworm-py3.12", "sha256:" + "ab" * 32)


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return build_fixture_repos(tmp_path_factory.mktemp("standins"))


def test_the_demo_pins_what_the_test_catalogue_pins(repos):
    """The demo's catalogue is tests/manifests/'s (the e2e tests build that one every day):
    the same components, commits, versions and patch, and the same platform but the base."""
    demo = manifests.catalogue(repos, BASE)
    tests = yaml.safe_load((REPO / "tests" / "manifests" / "components.yaml").read_text())
    assert demo["components"] == tests["components"]
    assert {k: v for k, v in demo.items() if k != "platform"} == {
        k: v for k, v in tests.items() if k != "platform"
    }
    assert {k: v for k, v in demo["platform"].items() if k != "base_image"} == {
        k: v for k, v in tests["platform"].items() if k != "base_image"
    }
    assert demo["platform"]["base_image"] == {"name": BASE.name, "tag": BASE.tag, "digest": BASE.digest}


def test_the_demo_manifests_pass_check_and_dry_run(repos, tmp_path):
    m = manifests.write(tmp_path / "manifests", repos, BASE)
    proc = run_main("--manifests", str(m), "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # before `lock` the probe rules cannot decide the stand-ins' commits (no known list has
    # them): not decided, no error; the demo locks first, and its check then says ok
    assert "demo: not decided (" in proc.stdout and " 0 errors" in proc.stdout
    proc = run_main("--manifests", str(m), "--profile", manifests.PROFILE, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mode      mtp-only" in proc.stdout
    assert f"{BASE.name}:{BASE.tag}@{BASE.digest}" in proc.stdout


class _NoEngine:
    def image_id(self, ref):
        raise EnvironmentProblem(
            "the Docker engine cannot be reached at unix:///var/run/docker.sock (fix: start dockerd)"
        )


class _NoBuildah:
    def describe(self):
        raise EnvironmentProblem(
            "buildah not found: the reproducible engine builds with it (fix: apt-get ...)"
        )


def _nothing_here(monkeypatch):
    monkeypatch.setattr(hostcheck, "_git_daemon", lambda: "git not found")
    monkeypatch.setattr(hostcheck, "registry_binary", lambda: None)
    monkeypatch.setattr(engine, "named", lambda flag=None: _NoEngine())
    monkeypatch.setattr(engine, "reproducible", lambda: _NoBuildah())


def test_what_the_demo_needs_is_said_at_once_in_one_line_with_one_fix(monkeypatch):
    _nothing_here(monkeypatch)
    with pytest.raises(EnvironmentProblem) as caught:
        hostcheck.check("mtp-test-base:bookworm")
    line = caught.value.one_line()
    for missing in (
        "git not found",
        "no registry binary",
        "Docker engine cannot be reached",
        "buildah not found",
    ):
        assert missing in line, line
    assert line.count("(fix: ") == 1 and "scripts/setup-test-host.sh" in line
    assert "start dockerd)" not in line  # each problem's own fix is folded into the one


def test_a_missing_base_image_is_named(monkeypatch):
    images = {}

    class Docker:
        def image_id(self, ref):
            return images.get(ref)

        def describe(self):
            return "/usr/bin/docker (CLI 20.10, DOCKER_BUILDKIT=1 docker build)"

    class Buildah:
        def describe(self):
            return "/usr/bin/buildah (buildah 1.28.2)"

    monkeypatch.setattr(hostcheck, "_git_daemon", lambda: None)
    monkeypatch.setattr(hostcheck, "registry_binary", lambda: "/usr/bin/docker-registry")
    monkeypatch.setattr(engine, "named", lambda flag=None: Docker())
    monkeypatch.setattr(engine, "reproducible", lambda: Buildah())
    with pytest.raises(
        EnvironmentProblem, match=r"needs: the local base image my-base:1 is missing \(fix: run"
    ):
        hostcheck.check("my-base:1")
    images["my-base:1"] = "sha256:" + "0" * 64
    host = hostcheck.check("my-base:1")
    assert host.base == "my-base:1" and "buildah 1.28.2" in host.line()


def test_the_demo_command_stops_before_making_anything(monkeypatch):
    _nothing_here(monkeypatch)
    proc = run_main("demo")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: demo: this machine lacks what the demo needs: ") and "(fix: " in line
    assert "[ 2/12]" not in proc.stdout and "work directory" not in proc.stdout


def test_the_demo_takes_no_manifests():
    proc = run_main("--manifests", "elsewhere", "demo")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: --manifests: the demo writes and uses manifests of its own")


def test_a_failed_step_ends_the_demo_with_its_error_and_status(tmp_path):
    """A real CLI step that fails (no such manifests): its stderr's end is shown, and the demo
    stops with the step's one error line and exit status (2: bad input)."""
    said, warned = [], []
    demo = run.Demo("unused", said.append, warned.append)
    demo.work, demo.env = tmp_path, dict(os.environ)
    with pytest.raises(run.StepFailed) as caught:
        demo._cli("check", "the compatibility rules", "--manifests", "nowhere", "check")
    assert caught.value.exit_code == 2
    assert caught.value.one_line().startswith(
        "demo: step check failed (exit 2): nowhere: manifests directory not found"
    )
    assert "$ build.py --manifests nowhere check" in "\n".join(said)
    assert any("! error: " in line for line in warned), warned
    assert [s.name for s in demo.report.steps] == []  # not recorded as done


class _Tags:
    """A local engine's tags, as a dict."""

    def __init__(self, tags):
        self.tags = dict(tags)

    def image_id(self, ref):
        return self.tags.get(ref, ref if ref in self.tags.values() else None)

    def untag(self, ref):
        self.tags.pop(ref, None)


def test_the_teardown_removes_what_the_demo_made_and_no_moved_human_tag(monkeypatch, tmp_path):
    mine, theirs = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    tags = _Tags(
        {
            "127.0.0.1:5999/mtp-test/base:bookworm-py3.12": "sha256:" + "3" * 64,
            "mtp-verl:demo-abc": mine,
            "mtp-verl:demo": theirs,  # another demo run moved it since
            "127.0.0.1:5999/demo/mtp-verl:demo": mine,
            "someone/else:1": theirs,
        }
    )
    said = []
    demo = run.Demo("unused", said.append, said.append)
    demo.engine = tags
    demo.built_id = mine
    demo.work = tmp_path / "work"
    demo.work.mkdir()
    demo.made = [
        "127.0.0.1:5999/mtp-test/base:bookworm-py3.12",
        "mtp-verl:demo-abc",
        "mtp-verl:demo",
        "127.0.0.1:5999/demo/mtp-verl:demo",
    ]
    demo._teardown()
    assert set(tags.tags) == {"mtp-verl:demo", "someone/else:1"}
    assert not demo.work.exists()
    assert said[-1].startswith("teardown: removed ") and "mtp-verl:demo-abc" in said[-1]


def test_steps_run_without_what_would_change_the_plan(tmp_path, monkeypatch):
    for name in run.DROPPED:
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("MTP_NET_RETRIES", "5")  # a site's network settings pass through
    env = run.child_env(tmp_path, {"GIT_CONFIG_GLOBAL": "/g"})
    assert not set(run.DROPPED) & set(env)
    assert env["MTP_CACHE_DIR"] == str(tmp_path / "cache") and env["GIT_CONFIG_GLOBAL"] == "/g"
    assert env["MTP_NET_RETRIES"] == "5"


def test_the_last_error_line_is_the_steps_own():
    assert (
        run.last_error(["progress", "error: base: missing (fix: x)", "trailing"]) == "base: missing (fix: x)"
    )
    assert run.last_error(["a", "internal error: KeyError: 1 (rerun ...)"]).startswith("internal error:")
    assert run.last_error(["a", "b", ""]) == "b"


def test_the_demo_names_a_real_engine():
    assert DOCKER_ENGINE in engine.ENGINES


def test_steps_run_this_checkout_or_the_installed_tool():
    argv, shown = run.program()
    assert argv[0] == sys.executable and shown == "build.py" and argv[1].endswith("build.py")
