"""An MTP mode is declared in one place (mtpimage/data/verl.yaml `modes`); the rules, the
profile schema, the version vector and the in-image GPU check derive what they need from
its MtpConfig fields (issue 14 item 5)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from mtpimage.assembly.render import IMAGES_DIR, render
from mtpimage.manifests import manifest, modes, schema
from mtpimage.plan import rules
from mtpimage.plan.model import build_plan

from .helpers import copy_manifests, edit_yaml


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_modes", IMAGES_DIR / "checks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


def test_shipped_modes_and_what_follows_from_their_fields():
    got = {
        m: (
            modes.get(m).trains_mtp,
            modes.get(m).loss_reaches_trunk,
            modes.get(m).rollout,
            modes.get(m).contract,
        )
        for m in modes.names()
    }
    assert got == {
        "load-only": (False, False, False, "load-only"),
        "full": (True, True, False, "full"),
        "mtp-only": (True, False, False, "mtp-only"),
        "rollout": (True, False, True, "mtp-only"),
    }


def test_the_profile_schema_takes_its_modes_from_verl_yaml():
    assert schema.load_schema("profile")["properties"]["mode"]["enum"] == modes.names()


def test_the_gpu_check_knows_every_contract_a_mode_can_have():
    gc = _gpu_check()
    assert {modes.get(m).contract for m in modes.names()} <= set(gc.CONTRACTS)


@pytest.fixture
def new_mode(monkeypatch):
    """A mode added to verl.yaml's data only: mtp-only with a heavier MTP loss."""
    monkeypatch.setitem(
        modes.verl_facts()["modes"],
        "mtp-only-heavy",
        {"extends": "mtp-only", "overrides": [["mtp_loss_scaling_factor", "0.3"]]},
    )
    schema.load_schema.cache_clear()
    yield "mtp-only-heavy"
    schema.load_schema.cache_clear()
    modes.get.cache_clear()


def test_a_mode_added_to_verl_yaml_alone_works_everywhere(new_mode, tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(root / "profiles" / "mtp-cp-recompute.yaml", lambda d: d.update(mode=new_mode))
    m = manifest.load(root)  # the schema accepts it
    plan = build_plan(m, manifest.resolve_profile(m, "mtp-cp-recompute", None))
    # an mtp-only mode: the pins' recipe (issue 45) sets detach_encoder=False + mtp_detach_heads
    assert plan.mtp_recipe == "megatron-detach-heads"
    assert "actor_rollout_ref.model.mtp.detach_encoder=False" in plan.verl_cli_overrides_for("rl")
    assert "actor_rollout_ref.model.mtp.mtp_loss_scaling_factor=0.3" in plan.verl_cli_overrides_for("rl")
    by_id = {r.rule.id: r for r in rules.evaluate(plan)}
    assert by_id["recompute-padding-mask"].status == rules.PASS  # a training mode: the rule applies
    assert by_id["full-mode-changes-training"].status == rules.NA  # detached: the trunk is untouched
    assert by_id["sglang-rollout-fix"].status == rules.NA
    vv = json.loads(render(plan, root).files["mtp/version.json"])
    assert (vv["mode"], vv["trains_mtp"], vv["mtp_contract"]) == (new_mode, True, "mtp-only")
    assert "recompute-padding-mask" in vv["probes"]
    checks = _gpu_check().resolve_plan(None, str(_write(tmp_path, vv))).checks
    assert [c.name for c in checks][2:3] == ["mtp-only"]  # checked as its contract
    assert all(c.semantics == "mtp-only" for c in checks[2:])


def test_an_undeclared_mode_is_refused_naming_the_declared_ones(tmp_path):
    root = copy_manifests(tmp_path)
    edit_yaml(root / "profiles" / "mtp-detach.yaml", lambda d: d.update(mode="detach"))
    with pytest.raises(Exception) as err:
        manifest.resolve_profile(manifest.load(root), "mtp-detach", None)
    assert "mtp-only" in str(err.value) and "load-only" in str(err.value)


def _write(tmp_path, vv):
    path = tmp_path / "version.json"
    path.write_text(json.dumps(vv))
    return path
