"""The generated image workflow, rehearsed: its run steps, read from images.yml as `ci`
generates it, run in order with bash as a push to main runs them, against a loopback
registry of this test's own, on the stand-in test profiles (tests/manifests).

  stack            on the host's dockerd: the shared stack built once and pushed (the pull
                   requests' cache)
  publish P1, P2   each on a FRESH dockerd (tests/fixtures/freshdocker.py: empty image store
                   and BuildKit cache, a bridge of its own without NAT): the image built bit
                   for bit by the reproducible engine (buildah, a clean builder), loaded there
                   for the in-image checks, pushed with gzip layers the tool made and its SBOM;
                   the job summary says how to verify it
  verify P1        the summary's `verify` line, run as a user would from the same revision
                   with an empty cache: identical
  sign P1, P2      `published` finds each digest (attestation and cosign need GitHub's OIDC
                   token and Sigstore: not run, workflow.RUNNER_ONLY_STEPS)

Each job gets a fresh tool cache and RUNNER_TEMP, as a new runner has. What differs from
GitHub, on purpose: `uses:` steps are not run (checkout: this checkout is copied and committed
as one revision; Python: this interpreter; login: the registry needs none), `sudo` is a shim
(this test runs as root), the free-disk step is not run (it prunes every image), buildah is
this host's (the install step finds it), and DISK_NEED_GB is the stand-in's need instead of
the real stack's. The figures of each profile's job are printed (docs/ci.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from mtpimage.demo.registry import private_registry
from mtpimage.engine import layercompress
from mtpimage.outputs import reproduce, workflow
from tests.fixtures.dockerhost import remove_session_images
from tests.fixtures.freshdocker import du_bytes, fresh_dockerd
from tests.fixtures.image_fixtures import REPO, copy_manifests, make_test_base

pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        shutil.which("buildah") is None, reason="buildah not installed (scripts/setup-test-host.sh)"
    ),
]

NAMESPACE = "rehearsal"
STANDIN_DISK_NEED_GB = "1"  # the stand-in stack is ~0.3 GB; the real stack's need is in ci.yaml
# GitHub's runner runs sudo; this test runs as root, so the shim drops sudo's options and runs
# the command as it is (the environment passes, as `sudo -E` keeps it)
SUDO_SHIM = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -E|--preserve-env|--preserve-env=*) shift ;; *) break ;; esac; done
exec "$@"
"""
PROJECT_URL = "https://github.com/acme/mtp-image-builder"  # GITHUB_SERVER_URL/GITHUB_REPOSITORY
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")
COPIED = ("build.py", "requirements.txt", "pyproject.toml", "mtpimage", "images")


def expand(value: str, context: dict) -> str:
    """A step's `env` value with its ${{ }} expressions replaced; an expression this
    rehearsal does not know fails the test (the workflow grew something unrehearsed)."""

    def one(m: re.Match) -> str:
        key = m.group(1)
        assert key in context, f"the rehearsal does not know the expression {key!r}"
        return context[key]

    return EXPR.sub(one, str(value))


@dataclasses.dataclass
class Runner:
    """One job's machine: its environment, its temp dir and what each step took."""

    name: str
    env: dict
    temp: Path
    steps: list = dataclasses.field(default_factory=list)  # (step name, seconds)

    def run_step(self, step: dict, context: dict, cwd: Path) -> str:
        env = {**self.env, **{k: expand(v, context) for k, v in (step.get("env") or {}).items()}}
        if "DISK_NEED_GB" in env:
            env["DISK_NEED_GB"] = STANDIN_DISK_NEED_GB
        t0 = time.monotonic()
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        self.steps.append((step.get("name", step.get("id", "run")), time.monotonic() - t0))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{self.name}: step {step.get('name')!r} failed:\n{out[-4000:]}"
        return out


def run_job(job: dict, runner: Runner, matrix: dict, cwd: Path) -> str:
    """Every run step of `job` but the runner-only ones, in order; the whole log."""
    output = Path(runner.env["GITHUB_OUTPUT"])
    log = []
    for step in job["steps"]:
        if "run" not in step or step.get("id") in workflow.RUNNER_ONLY_STEPS:
            continue
        outputs = dict(
            line.split("=", 1) for line in output.read_text().splitlines() if "=" in line
        )  # what earlier steps wrote to $GITHUB_OUTPUT (one step writes it here: `published`)
        context = {f"matrix.{k}": v for k, v in matrix.items()}
        context.update({f"steps.published.outputs.{k}": v for k, v in outputs.items()})
        for key in ("name", "digest", "sbom"):
            context.setdefault(f"steps.published.outputs.{key}", "")
        log.append(runner.run_step(step, context, cwd))
    return "\n".join(log)


@pytest.fixture(scope="module")
def rehearsal(docker_host, git_world, tmp_path_factory):
    top = tmp_path_factory.mktemp("rehearsal")
    (top / "registry").mkdir()
    with private_registry(top / "registry") as address:
        host = dataclasses.replace(docker_host, registry=address)
        base = make_test_base(host)
        checkout = top / "checkout"
        checkout.mkdir()
        for name in COPIED:
            src = REPO / name
            if src.is_dir():
                shutil.copytree(src, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, checkout / name)
        copy_manifests(checkout / "manifests", base)
        registry = f"{address}/{NAMESPACE}"
        bindir = top / "bin"
        bindir.mkdir()
        (bindir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (bindir / "sudo").write_text(SUDO_SHIM)
        for shim in ("python", "sudo"):
            (bindir / shim).chmod(0o755)
        gen = subprocess.run(
            [sys.executable, "build.py", "ci", "--registry", registry],
            cwd=checkout, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr
        # one revision, as actions/checkout leaves it: the images' revision label names it
        git = {
            "GIT_AUTHOR_NAME": "r",
            "GIT_AUTHOR_EMAIL": "r@example.invalid",
            "GIT_AUTHOR_DATE": "2026-12-05T00:00:00Z",
        }
        git = {**os.environ, **git, **{k.replace("AUTHOR", "COMMITTER"): v for k, v in git.items()}}
        for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "rehearsal"]):
            subprocess.run(["git", *argv], cwd=checkout, env=git, check=True, capture_output=True)
        revision = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=checkout, check=True, capture_output=True, text=True
        ).stdout.strip()
        text = (checkout / workflow.IMAGES_WORKFLOW).read_text()
        world = {
            "top": top,
            "checkout": checkout,
            "registry": registry,
            "address": address,
            "storage": top / "registry" / "storage",
            "revision": revision,
            "workflow": yaml.load(text, Loader=yaml.BaseLoader),
            "env": {
                **os.environ,
                **git_world.env,
                "PATH": f"{bindir}:{os.environ['PATH']}",
                "MTP_DOCKER_CLI": host.cli,
                "MTP_NO_BOOTSTRAP": "1",
                "GITHUB_SERVER_URL": PROJECT_URL.rsplit("/", 2)[0],
                "GITHUB_REPOSITORY": PROJECT_URL.split("/", 3)[3],
                "CI": "true",
            },
            "host": host,
        }
        try:
            yield world
        finally:
            remove_session_images(host.cli, [f"{address}/"])


def new_runner(world: dict, name: str, extra: dict | None = None) -> Runner:
    home = world["top"] / "runners" / name
    (home / "temp").mkdir(parents=True)
    for f in ("output", "summary"):
        (home / f).write_text("")
    env = {k: v for k, v in world["env"].items() if k != "DOCKER_HOST"}
    env.update(
        RUNNER_TEMP=str(home / "temp"),
        GITHUB_OUTPUT=str(home / "output"),
        GITHUB_STEP_SUMMARY=str(home / "summary"),
        MTP_CACHE_DIR=str(home / "cache"),  # a new runner has no tool cache
        **(extra or {}),
    )
    return Runner(name, env, home / "temp")


def registry_manifest(world: dict, tag: str) -> dict:
    url = f"http://{world['address']}/v2/{NAMESPACE}/mtp-verl/manifests/{tag}"
    accept = (
        "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    )
    resp = requests.get(url, headers={"Accept": accept}, timeout=30)
    assert resp.status_code == 200, (tag, resp.status_code)
    return resp.json()


def registry_labels(world: dict, manifest: dict) -> dict:
    url = f"http://{world['address']}/v2/{NAMESPACE}/mtp-verl/blobs/{manifest['config']['digest']}"
    resp = requests.get(url, timeout=30)
    assert resp.status_code == 200, resp.status_code
    return resp.json()["config"].get("Labels") or {}


def summary_block(summary: str) -> list[str]:
    """The shell lines of the publish summary's "Verify it" section."""
    assert "#### Verify it" in summary, summary
    return summary.split("#### Verify it", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()


def test_the_workflow_rehearsed_stack_once_then_two_reproducible_profiles_on_fresh_engines(rehearsal):
    world = rehearsal
    jobs = world["workflow"]["jobs"]
    profiles = [e["profile"] for e in jobs["publish"]["strategy"]["matrix"]["include"]][:2]
    assert len(profiles) == 2

    # -- stack: the shared layers, once, on the host's engine (the pull requests' cache)
    stack_runner = new_runner(world, "stack")
    log = run_job(jobs["stack"], stack_runner, {}, world["checkout"])
    assert re.search(r"^stack   stack-[0-9a-f]{16} shared by 3 profile\(s\)", log, re.M), log[-3000:]
    assert re.search(r"^pushed  \S+:stack-[0-9a-f]{16}@sha256:", log, re.M)
    stack_tag = re.search(r"^stack   (stack-[0-9a-f]{16})", log, re.M).group(1)
    again = run_job(jobs["stack"], new_runner(world, "stack-again"), {}, world["checkout"])
    assert "nothing to build" in again and "\nbuild " not in again  # the registry has it
    stack_layers = registry_manifest(world, stack_tag)["layers"]

    figures, pushed_digests, summaries = {}, {}, {}
    for i, profile in enumerate(profiles):
        before = du_bytes(world["storage"])
        with fresh_dockerd(world["host"].cli, f"r{i}") as engine:
            runner = new_runner(world, f"publish-{profile}", {"DOCKER_HOST": engine["DOCKER_HOST"]})
            t0 = time.monotonic()
            log = run_job(jobs["publish"], runner, {"profile": profile}, world["checkout"])
            seconds = time.monotonic() - t0
            engine_bytes = du_bytes(Path(engine["root"]))
            cache_bytes = du_bytes(Path(runner.env["MTP_CACHE_DIR"]))
        pushed = du_bytes(world["storage"]) - before
        assert re.search(r"^pushed  \S+ and moved \S+:" + re.escape(profile) + "$", log, re.M), log[-3000:]
        assert "buildah version" in log  # the install step found it and said which
        identity = re.search(r"^image   mtp-verl:(\S+)$", log, re.M).group(1)
        digest = re.search(r"^digest  (sha256:[0-9a-f]{64})$", log, re.M).group(1)
        manifest = registry_manifest(world, identity)
        # what users pull: the reproducible engine's image, its layers gzip made by the tool
        assert manifest["annotations"][layercompress.ANNOTATION].startswith("gzip "), manifest
        assert {x["mediaType"] for x in manifest["layers"]} == {layercompress.named("gzip").media_type}
        assert len(manifest["layers"]) == len(stack_layers) + 1  # the stack's layers and the mode layer
        labels = registry_labels(world, manifest)
        assert labels[reproduce.REVISION_LABEL] == world["revision"], labels
        assert labels[reproduce.SOURCE_LABEL] == PROJECT_URL
        summaries[profile] = Path(runner.env["GITHUB_STEP_SUMMARY"]).read_text()
        block = summary_block(summaries[profile])
        image = f"{world['registry']}/mtp-verl@{digest}"
        assert block[2] == f"git checkout {world['revision']}", block
        assert block[-1] == f"python3 build.py verify --profile {profile} --image {image}", block
        pushed_digests[profile] = digest
        figures[profile] = {
            "job_seconds": round(seconds, 1),
            "steps": [(n, round(s, 1)) for n, s in runner.steps],
            "registry_bytes_added": pushed,
            "layers_bytes_compressed": sum(x["size"] for x in manifest["layers"]),
            "fresh_engine_bytes": engine_bytes,
            "tool_cache_bytes": cache_bytes,
        }

    # -- verify: the first summary's verify line, as a user runs it at that revision, with an
    # empty cache of its own (the checkout is that revision already: clone and checkout are git's)
    first = profiles[0]
    block = summary_block(summaries[first])
    assert block[3].startswith("export MTP_WHEEL_CACHE_REPO=")  # the wheels the workflow shared
    # `python`: the runner's interpreter (the shim); the user's `python3` would make .venv first
    line = "\n".join(block[3:]).replace("python3 build.py", "python build.py", 1)
    verifier = new_runner(world, f"verify-{first}")
    t0 = time.monotonic()
    log = verifier.run_step({"name": "verify", "run": line}, {}, world["checkout"])
    assert f"identical: {world['registry']}/mtp-verl@{pushed_digests[first]}" in log, log[-3000:]
    figures["verify_seconds"] = round(time.monotonic() - t0, 1)

    # -- sign: `published` names each digest (signing itself needs GitHub: not run here)
    for profile in profiles:
        runner = new_runner(world, f"sign-{profile}")
        log = run_job(jobs["sign"], runner, {"profile": profile}, world["checkout"])
        outputs = Path(runner.env["GITHUB_OUTPUT"]).read_text()
        assert f"digest={pushed_digests[profile]}\n" in outputs, outputs  # what publish pushed
        assert f"name={world['registry']}/mtp-verl" in outputs and "\nsbom=" in outputs
        assert "cosign verify" in Path(runner.env["GITHUB_STEP_SUMMARY"]).read_text()

    print("\nREHEARSAL FIGURES " + json.dumps({"stack_steps": stack_runner.steps, **figures}, indent=1))
