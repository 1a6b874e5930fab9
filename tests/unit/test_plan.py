"""The Plan is deterministic and its hash follows every input."""

from __future__ import annotations

import json

from mtpimage.manifests import manifest
from mtpimage.plan.model import build_plan

from .helpers import run_main


def plan(profile, sets=None):
    from mtpimage.cli import plan_for

    return plan_for(manifest.load(), profile, sets)


def test_same_inputs_same_bytes_across_processes():
    a = run_main("--profile", "mtp-detach", "--dry-run", "--json").stdout
    b = run_main("--profile", "mtp-detach", "--dry-run", "--json").stdout
    assert a == b
    assert json.loads(a)["digest"] == plan("mtp-detach").digest


def test_hash_changes_with_a_pin():
    base = plan("mtp-detach")
    moved = plan("mtp-detach", ["verl.commit=" + "a" * 40])
    assert base.digest != moved.digest
    assert base.digest != moved.digest


def test_layers_follow_catalogue_order_and_end_with_mode():
    p = plan("mtp-cp-recompute")
    names = [layer.name for layer in p.layers]
    assert names == ["os", "torch", "extensions", "megatron", "bridges", "sglang", "verl", "mode"]
    assert dict((l.name, l.items) for l in p.layers)["megatron"] == ("megatron-lm",)


def test_profiles_with_equal_pins_share_everything_but_mode():
    a, b = plan("mtp-detach").to_dict(), plan("mtp-cp-recompute").to_dict()
    for key in ("components", "packages", "layers", "base_image", "python", "cuda", "indexes"):
        assert a[key] == b[key], key
    assert a["engine"] != b["engine"] and a["verl_overrides"] != b["verl_overrides"]


def test_inheritance_states_only_differences():
    p = plan("mtp-cp-recompute")
    assert p.mode == "mtp-only"  # from mtp-detach
    assert p.training_engine_dict()["context_parallel_size"] == 2  # its own
    assert p.rollout_engine == "sglang"  # from base


def test_build_requires_are_installed_right_before_their_source():
    """Megatron-LM 0.19 builds with setuptools>=80, Megatron-Bridge 0.6 with setuptools<80:
    each source is built in its own venv holding only its locked, hashed build backends."""
    from mtpimage.assembly.render import render

    files = render(plan("mtp-cp-recompute"), manifest.DEFAULT_MANIFESTS).files
    mega = files["build/requirements/build-megatron-lm.txt"].decode()
    bridge = files["build/requirements/build-megatron-bridge.txt"].decode()
    assert "setuptools==80.10.2 --hash=sha256:" in mega and "setuptools==79.0.1 --hash=sha256:" in bridge
    dockerfile = files["Dockerfile"].decode()
    assert "build-source --name megatron-lm --src /tmp/mtp-src/megatron-lm" in dockerfile
    assert "--build-requirements /tmp/mtp-build/requirements/build-megatron-bridge.txt" in dockerfile


def test_build_requires_must_be_exact():
    proc = run_main("check", "--profile", "mtp-detach", "--set", "verl.build_requires=setuptools")
    assert proc.returncode == 2


def test_the_image_installs_exactly_the_lock_and_resolves_nothing():
    from mtpimage.assembly.render import render

    p = plan("mtp-cp-recompute")
    assert len(p.locked) > 200  # the whole resolved set, with files
    names = {x.name for x in p.locked}
    assert {"torch", "sglang", "transformers", "triton", "setuptools"} <= names
    assert not names & {"verl", "megatron-core", "megatron-bridge", "mbridge"}  # built from git
    files = render(p, manifest.DEFAULT_MANIFESTS).files
    dockerfile = files["Dockerfile"].decode()
    for line in dockerfile.splitlines():
        if line.strip().startswith("pip install") and "--no-binary" not in line:
            assert "--no-deps" in line and "--only-binary=:all:" in line, line
    assert "--constraint" not in dockerfile and "pip check" not in dockerfile.replace("pip-check", "")
    reqs = {k: v.decode() for k, v in files.items() if k.startswith("build/requirements/")}
    hashed = [l for text in reqs.values() for l in text.splitlines()]
    assert all(" --hash=sha256:" in l for l in hashed)
    torch_layer = reqs["build/requirements/torch-pypi.txt"]
    # torch's own requirements stay below it (setuptools<82, triton==3.6.0), never above
    assert "torch==2.11.0 " in torch_layer and "triton==3.6.0 " in torch_layer
    assert "setuptools==81." in torch_layer
    assert (
        p.digest
        != build_plan(manifest.load(), manifest.resolve_profile(manifest.load(), "mtp-cp-recompute")).digest
    )


def test_lock_pins_are_dropped_when_the_plan_drifts_from_the_lock():
    assert plan("mtp-cp-recompute", ["verl.commit=" + "a" * 40]).locked == ()


def test_one_identity_everywhere():
    """list, check --json, explain, --dry-run and render print the tag the build creates
    (plan + rendered context), not a plan-only hash that never exists (issue 14 item 1)."""
    from mtpimage.assembly.render import render

    want = render(plan("mtp-detach"), manifest.DEFAULT_MANIFESTS).image()
    dry = json.loads(run_main("--profile", "mtp-detach", "--dry-run", "--json").stdout)["image"]
    listed = {r["name"]: r["image"] for r in json.loads(run_main("list", "--json").stdout)}["mtp-detach"]
    checked = {r["profile"]: r["image"] for r in json.loads(run_main("check", "--json").stdout)}["mtp-detach"]
    explained = run_main("explain", "--profile", "mtp-detach", "--target", "rl").stdout
    assert dry == listed == checked == want
    assert f"# image: {want}" in explained
    assert not hasattr(plan("mtp-detach"), "tag")
