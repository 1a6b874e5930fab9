"""Output a person reads (issue 21 item 10): check prints the resolution once, not once per
profile; the plan's engine reads as key=value; resolution.routes are shown with their link;
the missing-base error names the way to build where the base's registry is unreachable."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from mtpimage.assembly import pipeline
from mtpimage.cli import plan_for
from mtpimage.errors import EnvironmentProblem
from mtpimage.manifests import manifest
from mtpimage.outputs import report
from mtpimage.publish import registryclient
from tests.unit.helpers import run_cli


@pytest.fixture(scope="module")
def plans():
    m = manifest.load()
    return {name: plan_for(m, name, None) for name in m.names()}


def test_check_prints_the_shared_resolution_once(plans):
    proc = run_cli("check", "--verbose")
    assert proc.returncode == 0, proc.stderr
    one = report.resolution_lines(next(iter(plans.values())))
    assert one
    assert proc.stdout.count("declared departures from upstream's declarations") == 1
    assert f"resolution, all {len(plans)} profiles ({len(one)} declared" in proc.stdout
    for line in one:
        assert proc.stdout.count(line) == 1, line
    # after every profile's verdict
    last_verdict = max(proc.stdout.index(f"{name}: ok") for name in plans)
    assert proc.stdout.index("resolution, all") > last_verdict


def test_profiles_that_differ_are_named(plans, capsys):
    a, b, c = list(plans.values())[:3]
    b = dataclasses.replace(b, substitutions=(("base image", "a local stand-in"),))
    report.print_checks([(a, []), (b, []), (c, [])])
    out = capsys.readouterr().out
    shared, only = out.split("resolution, all 3 profiles", 1)[1].split(f"resolution, only {b.profile} (1 ", 1)
    assert "SUBSTITUTED" not in shared
    assert only.splitlines()[1] == "    SUBSTITUTED base image: a local stand-in"


def test_one_profile_keeps_its_block_under_it(plans, capsys):
    plan = plans["mtp-detach"]
    report.print_checks([(plan, [])])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mtp-detach: ok")
    assert lines[1].startswith("  resolution (")


def test_the_plan_prints_the_engine_as_key_value():
    proc = run_cli("--profile", "mtp-cp-recompute", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    [engine] = [line for line in proc.stdout.splitlines() if line.startswith("engine ")]
    assert engine == (
        "engine    name=megatron bridge=megatron-bridge context_parallel_size=2 "
        "recompute.granularity=full recompute.method=uniform recompute.num_layers=1"
    )
    assert "{'" not in proc.stdout


def test_engine_text_says_none_and_nests():
    assert report.engine_text({"recompute": None, "name": "fsdp"}) == "name=fsdp recompute=none"


def test_routes_are_shown_with_their_link(plans):
    routes = manifest.load().catalogue.data["resolution"]["routes"]
    assert routes
    lines = report.resolution_lines(plans["mtp-detach"])
    for r in routes:
        choice, why = " ".join(r["choice"].split()), " ".join(r["why"].split())
        assert f"  route    {r['package']}: {choice}: {why} ({r['link']})" in lines


def test_a_routes_link_is_not_part_of_the_identity(plans):
    plan = plans["mtp-detach"]
    assert plan.route_links
    assert dataclasses.replace(plan, route_links=()).digest == plan.digest


def test_the_missing_base_error_points_to_the_stand_in(plans, monkeypatch):
    def unreachable(host, timeout=5):
        raise registryclient.RegistryUnreachable(host, "GET /v2/", ConnectionRefusedError())

    monkeypatch.setattr(registryclient, "answers", unreachable)
    no_images = SimpleNamespace(image_id=lambda ref: None)
    with pytest.raises(EnvironmentProblem) as err:
        pipeline.base_preflight(plans["mtp-detach"], no_images)
    assert "is not present locally" in str(err.value)
    # #50: the flag first (what a user types), the variable beside it
    assert "--substitute-base NAME:TAG@sha256:... (or MTP_SUBSTITUTE_BASE), see docs/real-stack.md" in str(
        err.value
    )


def test_dry_run_names_what_the_tool_compiles_and_keeps_its_columns(plans, capsys):
    """#36 item 13: apex, flash-attn and the TE torch extension are compiled here (apex from
    git): never labelled `[pypi]`; every name, the longest too, is followed by a space."""
    plan = plans["mtp-detach"]
    report.print_plan(plan, [], "img")
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.split("packages\n")[1].split("layers")[0].splitlines()}
    built = [p.name for p in plan.packages if p.build is not None]
    assert {"apex", "flash-attn", "transformer-engine-torch"} <= set(built)
    for name in built:
        assert "[pypi]" not in rows[name] and "[built here from " in rows[name], rows[name]
    assert "[built here from git https://github.com/NVIDIA/apex @ " in rows["apex"]
    assert rows["torch"].endswith("[pypi]")
    starts = {line.index(line.split()[1]) for line in rows.values()}
    assert len(starts) == 1, rows  # one column, however long the name


def test_the_main_jobs_base_error_comes_before_the_plan(tmp_path):
    """#38 item 5: the main job printed 65 lines of plan, then its one-line base error. The real
    profile's base is not here and docker.io does not answer on this machine or CI's: the
    error is the only output."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MTP_SUBSTITUTE_BASE": "", "MTP_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(root / "build.py"), "--profile", "mtp-cp-recompute"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if proc.returncode == 0 or "is not present locally" not in proc.stderr:
        pytest.skip("the real base is present or its registry answers here")
    assert proc.returncode == 3 and proc.stdout == "", proc.stdout[:500]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: base image ") and "(fix: " in line
