"""The mtp-only recipes (issue 45): which overrides realise "the MTP loss reaches MTP parameters
only" on the pinned stack, chosen from facts about the pins (mtpimage/plan/mtponly.py,
verl.yaml mtp_only_recipes), and what explain, the image and its checks say of them."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest
from mtpimage.plan import mtponly
from mtpimage.plan.facts import tool_facts
from tests.unit.helpers import run_main

REPO = Path(__file__).resolve().parents[2]
HEADS = "mtp_detach_heads=True"
MTP_ONLY = ("mtp-detach", "mtp-cp-recompute", "mtp-rollout")
MEGATRON_018 = "ba7b5ebce12af60627a80985792a1449ce45f46c"  # core_v0.18.0: no mtp_detach_heads
VERL_PIN = "7bc80c00a07833e06797ecde08c7efc58f524aa2"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_settings", REPO / "images/checks/gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("profile", MTP_ONLY)
def test_every_mtp_only_profile_takes_megatrons_guarded_detach(profile):
    """verl 7bc80c00's detach copy lacks Megatron's checkpoint guard, so every mtp-only profile,
    with or without recompute, leaves verl's detach off and takes Megatron's mtp_detach_heads."""
    plan = plan_for(manifest.load(), profile, None)
    assert plan.mtp_recipe == "megatron-detach-heads"
    for target in plan.targets:
        lines = plan.verl_cli_overrides_for(target)
        assert [ln for ln in lines if ln.endswith(".mtp.detach_encoder=False")], lines
        assert not [ln for ln in lines if ln.endswith(".mtp.detach_encoder=True")], lines
        heads = [ln for ln in lines if ln.endswith(HEADS)]
        # not in verl's struct: Hydra needs `+` to add it
        assert len(heads) == 1 and heads[0].startswith("+") and ".override_transformer_config." in heads[0]


@pytest.mark.parametrize("profile", ["mtp-full", "mtp-load-only"])
def test_modes_without_mtp_only_semantics_take_no_recipe(profile):
    plan = plan_for(manifest.load(), profile, None)
    assert plan.mtp_recipe == "" and "mtp_recipe" not in plan.to_dict()
    for target in plan.targets:
        assert not [ln for ln in plan.verl_cli_overrides_for(target) if "detach" in ln]


def _component(plan, name, **changes):
    import dataclasses

    return tuple(dataclasses.replace(c, **changes) if c.name == name else c for c in plan.components)


def test_the_recipe_follows_the_facts_about_the_pins():
    plan = plan_for(manifest.load(), "mtp-cp-recompute", None)
    f = copy.deepcopy(tool_facts())
    # the pins: Megatron has the guarded mtp_detach_heads, verl's copy lacks the guard
    choice = mtponly.choose("mtp-only", plan.components, f)
    assert choice.recipe.id == "megatron-detach-heads" and choice.recipe.exact
    assert [(r.id, v.need, v.met) for r, v in choice.passed_over] == [
        ("verl-detach-with-heads", "verl-detach-guard", False)
    ]
    # a verl that fixes its copy is recognised: upstream's two switches then hold exactly
    f["verl"]["detach_guard"]["commits"][VERL_PIN] = True
    assert mtponly.choose("mtp-only", plan.components, f).recipe.id == "verl-detach-with-heads"
    # a Megatron without mtp_detach_heads: the fallback, not exact, never silently
    old = _component(plan, "megatron-lm", commit=MEGATRON_018)
    fallback = mtponly.choose("mtp-only", old, tool_facts())
    assert fallback.recipe.id == "verl-detach" and not fallback.recipe.exact and fallback.recipe.loses
    # an unknown commit is passed over as undecided, not assumed
    unknown = mtponly.choose("mtp-only", _component(plan, "megatron-lm", commit="1" * 40), tool_facts())
    assert unknown.recipe.id == "verl-detach" and unknown.undecided
    # PyPI megatron-core: by version
    pypi = _component(plan, "megatron-lm", source="pypi", commit=None, version="0.19.2")
    assert mtponly.choose("mtp-only", pypi, tool_facts()).recipe.id == "megatron-detach-heads"
    pypi_old = _component(plan, "megatron-lm", source="pypi", commit=None, version="0.18.2")
    assert mtponly.choose("mtp-only", pypi_old, tool_facts()).recipe.id == "verl-detach"
    assert mtponly.choose("full", plan.components, tool_facts()) is None


def test_a_bump_to_a_megatron_without_the_guard_warns_and_names_what_is_lost():
    out = run_main("check", "--profile", "mtp-detach", "--set", f"megatron-lm.commit={MEGATRON_018}")
    [line] = [ln for ln in out.stdout.splitlines() if "mtp-only-exact" in ln]
    assert line.strip().startswith("WARNING") and "recipe verl-detach taken, NOT exact" in line
    assert "the output layer (shared with the main head) gets MTP-loss gradient" in line
    assert "core_v0.18.0" in line  # the fact that decided it
    shipped = run_main("check", "--profile", "mtp-detach").stdout
    assert "mtp-only-exact" not in shipped


def test_explain_says_what_each_mtp_only_profile_guarantees_and_why():
    recompute = json.loads(
        run_main("explain", "--profile", "mtp-cp-recompute", "--target", "sft", "--json").stdout
    )
    full = json.loads(run_main("explain", "--profile", "mtp-full", "--target", "sft", "--json").stdout)
    assert (
        "the output layer (shared with the main head) get no MTP-loss gradient" in recompute["guarantees"][0]
    )
    assert "with or without full recompute" in recompute["guarantees"][0]
    r = recompute["recipe"]
    assert r["id"] == "megatron-detach-heads" and r["exact"] is True
    assert r["settings"] == ["detach_encoder=False", "+mtp_detach_heads=True"]
    links = " ".join(r["links"])
    assert (
        "verl/models/mcore/mtp_patch.py#L418-L484" in links
        and "multi_token_prediction.py#L1106-L1116" in links
    )
    assert [p["id"] for p in r["passed_over"]] == ["verl-detach-with-heads"]
    assert full["guarantees"] == [] and full["recipe"] is None
    text = run_main("explain", "--profile", "mtp-cp-recompute", "--target", "sft").stdout
    assert (
        "# mtp-only recipe megatron-detach-heads (exact): detach_encoder=False, +mtp_detach_heads=True"
        in text
    )
    assert "# mtp-only recipe verl-detach-with-heads not taken: verl 7bc80c00a0" in text


@pytest.mark.parametrize("profile", MTP_ONLY + ("mtp-full", "mtp-load-only"))
def test_the_overrides_explain_prints_are_the_ones_the_image_and_its_checks_use(profile):
    """explain's lines == the image's /opt/mtp/verl/<target>.overrides, and gpu_check.py reads
    from that file the settings the recipe chose (what the mtp-grad group trains with)."""
    m = manifest.load()
    plan = plan_for(m, profile, None)
    files = render(plan, m.root).files
    gc = _gpu_check()
    for target in plan.targets:
        shown = [
            ln
            for ln in run_main("explain", "--profile", profile, "--target", target).stdout.splitlines()
            if ln and not ln.startswith("#")
        ]
        image = files[f"mtp/verl/{target}.overrides"].decode().splitlines()
        assert shown == image == plan.verl_cli_overrides_for(target)
        got = gc.parse_overrides(image)
        if plan.mtp_recipe:
            recipe = mtponly.by_id(plan.mtp_recipe)
            assert got.detach_encoder is (recipe.detach_encoder == "True")
            assert got.config().get("mtp_detach_heads") is True
        else:
            assert got.detach_encoder is False and "mtp_detach_heads" not in got.config()
        assert got.recompute is bool(plan.recompute)
