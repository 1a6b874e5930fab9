"""The generated image workflow, rehearsed: its run steps, read from images.yml as `ci`
generates it, run in order with bash as a push to main runs them, against a loopback
registry of this test's own, on the stand-in test profiles (tests/manifests).

  stack            on the host's dockerd: the shared stack built once and pushed
  publish P1, P2   each on a FRESH dockerd (tests/fixtures/freshdocker.py: empty image store
                   and BuildKit cache, a bridge of its own without NAT): the
                   profile's layers come from the pushed stack, its mode layer is added, the
                   in-image checks run on the image in that engine, it is pushed with its SBOM
  sign P1, P2      `published` finds each digest (attestation and cosign need GitHub's OIDC
                   token and Sigstore: not run, workflow.RUNNER_ONLY_STEPS)

Each job gets a fresh tool cache and RUNNER_TEMP, as a new runner has. What differs from
GitHub, on purpose: `uses:` steps are not run (checkout: this checkout is copied; Python:
this interpreter; login: the registry needs none), the free-disk step is not run (it prunes
every image), and DISK_NEED_GB is the stand-in stack's need instead of the real stack's.
The figures of the second profile's job are printed (docs/ci.md).
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
from mtpimage.outputs import workflow
from tests.fixtures.dockerhost import remove_session_images
from tests.fixtures.freshdocker import du_bytes, fresh_dockerd
from tests.fixtures.image_fixtures import REPO, copy_manifests, make_test_base

pytestmark = pytest.mark.timeout(1800)

NAMESPACE = "rehearsal"
STANDIN_DISK_NEED_GB = "1"  # the stand-in stack is ~0.3 GB; the real stack's need is in ci.yaml
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
        (bindir / "python").chmod(0o755)
        gen = subprocess.run(
            [sys.executable, "build.py", "ci", "--registry", registry],
            cwd=checkout, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr
        text = (checkout / workflow.IMAGES_WORKFLOW).read_text()
        world = {
            "top": top,
            "checkout": checkout,
            "registry": registry,
            "address": address,
            "storage": top / "registry" / "storage",
            "workflow": yaml.load(text, Loader=yaml.BaseLoader),
            "env": {
                **os.environ,
                **git_world.env,
                "PATH": f"{bindir}:{os.environ['PATH']}",
                "MTP_DOCKER_CLI": host.cli,
                "MTP_NO_BOOTSTRAP": "1",
                "GITHUB_REPOSITORY": "acme/mtp-image-builder",
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


def manifest_layers(world: dict, tag: str) -> list[str]:
    url = f"http://{world['address']}/v2/{NAMESPACE}/mtp-verl/manifests/{tag}"
    accept = (
        "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    )
    resp = requests.get(url, headers={"Accept": accept}, timeout=30)
    assert resp.status_code == 200, (tag, resp.status_code)
    return [(layer["digest"], layer["size"]) for layer in resp.json()["layers"]]


def test_the_workflow_rehearsed_stack_once_then_two_profiles_on_fresh_engines(rehearsal):
    world = rehearsal
    jobs = world["workflow"]["jobs"]
    profiles = [e["profile"] for e in jobs["publish"]["strategy"]["matrix"]["include"]][:2]
    assert len(profiles) == 2

    # -- stack: the shared layers, once, on the host's engine
    stack_runner = new_runner(world, "stack")
    log = run_job(jobs["stack"], stack_runner, {}, world["checkout"])
    assert re.search(r"^stack   stack-[0-9a-f]{16} shared by 3 profile\(s\)", log, re.M), log[-3000:]
    assert re.search(r"^pushed  \S+:stack-[0-9a-f]{16}@sha256:", log, re.M)
    stack_tag = re.search(r"^stack   (stack-[0-9a-f]{16})", log, re.M).group(1)
    again = run_job(jobs["stack"], new_runner(world, "stack-again"), {}, world["checkout"])
    assert "nothing to build" in again and "\nbuild " not in again  # the registry has it
    stack_layers = manifest_layers(world, stack_tag)

    figures = {}
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
        identity = re.search(r"^image   mtp-verl:(\S+)$", log, re.M).group(1)
        layers = manifest_layers(world, identity)
        # every layer of the stack is the profile's, byte for byte (the same blobs: not
        # rebuilt, not uploaded again); the profile adds exactly its mode layer
        assert layers[:-1] == stack_layers, (profile, layers, stack_layers)
        assert layers[-1] not in stack_layers
        runs = run_steps_cached(log)
        assert runs and all(runs.values()), runs  # every RUN layer came from the stack
        figures[profile] = {
            "job_seconds": round(seconds, 1),
            "steps": [(n, round(s, 1)) for n, s in runner.steps],
            "registry_bytes_added": pushed,
            "mode_layer_bytes_compressed": layers[-1][1],
            "stack_bytes_compressed": sum(s for _, s in stack_layers),
            "fresh_engine_bytes": engine_bytes,
            "tool_cache_bytes": cache_bytes,
        }

    # -- sign: `published` names each digest (signing itself needs GitHub: not run here)
    for profile in profiles:
        runner = new_runner(world, f"sign-{profile}")
        log = run_job(jobs["sign"], runner, {"profile": profile}, world["checkout"])
        outputs = Path(runner.env["GITHUB_OUTPUT"]).read_text()
        assert re.search(r"^digest=sha256:[0-9a-f]{64}$", outputs, re.M), outputs
        assert f"name={world['registry']}/mtp-verl" in outputs and "\nsbom=" in outputs
        assert "cosign verify" in Path(runner.env["GITHUB_STEP_SUMMARY"]).read_text()

    print("\nREHEARSAL FIGURES " + json.dumps({"stack_steps": stack_runner.steps, **figures}, indent=1))
    second = figures[profiles[1]]
    # the second profile's job uploaded its mode layer, config, manifests and SBOM: far less
    # than the stack it reused (compressed sizes from the registry's manifests)
    assert second["registry_bytes_added"] < second["stack_bytes_compressed"] / 10, second


def run_steps_cached(log: str) -> dict[str, bool]:
    """BuildKit's RUN steps in a build log -> whether each was CACHED (not run)."""
    lines = log.splitlines()
    out = {}
    for line in lines:
        m = re.match(r"^(#\d+) \[.*\] RUN ", line)
        if m:
            out[line[:80]] = f"{m.group(1)} CACHED" in lines
    return out
