"""The Plan is deterministic and its hash follows every input."""
from __future__ import annotations

import json

from mtpimage import manifest
from mtpimage.plan import build_plan

from .helpers import run_cli


def plan(profile, sets=None):
    from mtpimage.cli import plan_for
    return plan_for(manifest.load(), profile, sets)


def test_same_inputs_same_bytes_across_processes():
    a = run_cli("--profile", "mtp-detach", "--dry-run", "--json").stdout
    b = run_cli("--profile", "mtp-detach", "--dry-run", "--json").stdout
    assert a == b
    assert json.loads(a)["digest"] == plan("mtp-detach").digest


def test_hash_changes_with_a_pin():
    base = plan("mtp-detach")
    moved = plan("mtp-detach", ["verl.commit=" + "a" * 40])
    assert base.digest != moved.digest
    assert base.tag.startswith("mtp-detach-") and len(base.tag) == len("mtp-detach-") + 12


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
    assert p.mode == "mtp-only"                     # from mtp-detach
    assert p.engine_dict()["context_parallel_size"] == 2   # its own
    assert p.rollout_engine == "sglang"             # from base


def test_build_requires_are_installed_right_before_their_source(tmp_path):
    """Megatron-LM 0.19 builds with setuptools>=80, Megatron-Bridge 0.6 with setuptools<80:
    each gets its own pinned build backend just before its --no-build-isolation install."""
    from mtpimage.render import render

    p = plan("mtp-cp-recompute")
    dockerfile = render(p, manifest.DEFAULT_MANIFESTS).files["Dockerfile"].decode()
    lines = dockerfile.splitlines()

    def first(text, start=0):
        return next(i for i, l in enumerate(lines) if i >= start and text in l)
    mega_pins = first("setuptools==80.10.2")
    mega_src = first("/tmp/mtp-src/megatron-lm", mega_pins)
    bridge_pins = first("setuptools==79.0.1")
    bridge_src = first("--no-build-isolation", bridge_pins)
    assert mega_pins < mega_src < bridge_pins < bridge_src
    assert "/tmp/mtp-src/megatron-bridge" in lines[bridge_src + 1]


def test_build_requires_must_be_exact():
    proc = run_cli("check", "--profile", "mtp-detach", "--set", "verl.build_requires=setuptools")
    assert proc.returncode == 2


def test_lock_pins_transitive_dependencies_of_source_layers():
    from mtpimage.render import render

    p = plan("mtp-cp-recompute")
    assert len(p.locked) > 50                      # lock.yaml's resolved set, minus own pins
    names = {x.split("==")[0] for x in p.locked}
    assert not names & {"verl", "megatron-core", "sglang", "torch"}
    files = render(p, manifest.DEFAULT_MANIFESTS).files
    verl_layer = files["build/constraints/verl.txt"].decode().splitlines()
    torch_layer = files["build/constraints/torch.txt"].decode().splitlines()
    assert set(p.locked) <= set(verl_layer)
    assert not set(p.locked) & set(torch_layer)    # package-only layers keep their cache
    assert p.digest != build_plan(manifest.load(), manifest.resolve_profile(manifest.load(), "mtp-cp-recompute")).digest


def test_lock_pins_are_dropped_when_the_plan_drifts_from_the_lock():
    assert plan("mtp-cp-recompute", ["verl.commit=" + "a" * 40]).locked == ()
