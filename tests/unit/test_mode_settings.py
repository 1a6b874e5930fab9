"""Each profile's transformer settings, chosen from verl trainer runs on an H200 (issue 34
item 3): mtp-only takes mtp_detach_heads (the output layer then gets no MTP-loss gradient)
except under full recompute, where that setting silently stops MTP training."""

from __future__ import annotations

import json

import pytest

from mtpimage.manifests import manifest
from mtpimage.plan.load import plan_for
from tests.unit.helpers import run_main

HEADS = "mtp_detach_heads=True"


@pytest.mark.parametrize(
    "profile, heads",
    [
        ("mtp-detach", True),
        ("mtp-rollout", True),
        ("mtp-cp-recompute", False),
        ("mtp-full", False),
        ("mtp-load-only", False),
    ],
)
def test_mtp_detach_heads_where_it_keeps_mtp_learning(profile, heads):
    plan = plan_for(manifest.load(), profile, None)
    for target in plan.targets:
        lines = [ln for ln in plan.verl_cli_overrides_for(target) if ln.endswith(HEADS)]
        assert bool(lines) is heads, (profile, target, plan.verl_cli_overrides_for(target))
        # not in verl's struct: Hydra needs `+` to add it
        assert all(ln.startswith("+") and ".override_transformer_config." in ln for ln in lines)


def test_explain_says_what_each_mtp_only_profile_guarantees_and_why():
    detach = run_main("explain", "--profile", "mtp-detach", "--target", "sft", "--json")
    recompute = run_main("explain", "--profile", "mtp-cp-recompute", "--target", "sft", "--json")
    full = run_main("explain", "--profile", "mtp-full", "--target", "sft", "--json")
    d, r, f = (json.loads(p.stdout) for p in (detach, recompute, full))
    assert "output layer (shared with the main head) get no MTP-loss gradient" in d["guarantees"][0]
    assert [s["key"] for s in d["settings"]] == ["mtp_detach_heads"] and d["settings"][0]["link"].startswith(
        "https://github.com/NVIDIA/Megatron-LM/"
    )
    assert "the output layer (shared with the main head) does" in r["guarantees"][0] and r["settings"] == []
    assert f["guarantees"] == [] and f["settings"] == []
    text = run_main("explain", "--profile", "mtp-cp-recompute", "--target", "sft").stdout
    assert "# guarantees: the trunk and the embedding get no MTP-loss gradient" in text
