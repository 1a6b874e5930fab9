"""The source probes behind the mtp-only recipe and the CP roll hazard (issue 45 items 1 and 5),
on small source trees written here: each probe passes where the code has what it looks for and
fails, naming file:line, where it does not; the recipe probe refuses a plan whose recipe relies
on what its sources lack, and names a better recipe the sources allow."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpimage.commands.load import plan_for
from mtpimage.lock import probes
from mtpimage.manifests import manifest
from mtpimage.plan import mtponly

GUARD = """
    def _get_embeddings(self, input_ids, position_ids, embedding, hidden_states):
        if not hidden_states.requires_grad:
            hidden_states.requires_grad_()
        return embedding(input_ids, position_ids), hidden_states
"""
NO_GUARD = """
    def _get_embeddings(self, input_ids, position_ids, embedding, hidden_states):
        return embedding(input_ids, position_ids), hidden_states
"""
ROLL_ON_GROUP = """
def roll_tensor(tensor, cp_group=None):
    ops = [P2POp(dist.isend, tensor, 1, group=cp_group), P2POp(dist.irecv, tensor, 0, group=cp_group)]
    return ops
"""
ROLL_DEFAULT = """
def roll_tensor(tensor, cp_group=None):
    req = dist.isend(tensor, 1)
    dist.irecv(tensor, 0, group=cp_group)
    return req
"""


def _megatron(
    tmp_path: Path, *, field: bool = True, get_embeddings: str = GUARD, roll: str = ROLL_ON_GROUP
) -> Path:
    root = tmp_path / "megatron-lm"
    core = root / "megatron" / "core" / "transformer"
    core.mkdir(parents=True)
    (core / "transformer_config.py").write_text(
        "class TransformerConfig:\n    hidden_size: int = 0\n"
        + ("    mtp_detach_heads: bool = False\n" if field else "")
    )
    (core / "multi_token_prediction.py").write_text(
        roll + "\n\nclass MultiTokenPredictionLayer:\n" + get_embeddings
    )
    return root


def _verl(tmp_path: Path, *, guard: bool) -> Path:
    root = tmp_path / "verl"
    mcore = root / "verl" / "models" / "mcore"
    mcore.mkdir(parents=True)
    body = (
        "    if not hidden_states.requires_grad:\n        hidden_states.requires_grad_()\n" if guard else ""
    )
    (mcore / "mtp_patch.py").write_text(
        "def _patched_get_embeddings_for_detach(self, input_ids, position_ids, embedding, hidden_states):\n"
        f"{body}    return embedding(input_ids, position_ids), hidden_states.detach()\n"
    )
    return root


def test_megatron_detach_heads_passes_with_the_field_and_the_guard(tmp_path):
    v = probes.megatron_detach_heads_source(_megatron(tmp_path))
    assert v.status == probes.PASS and "multi_token_prediction.py:" in v.detail, v


def test_megatron_without_the_field_or_the_guard_fails(tmp_path):
    no_field = probes.megatron_detach_heads_source(_megatron(tmp_path / "a", field=False))
    assert no_field.status == probes.FAIL and "no mtp_detach_heads" in no_field.detail
    no_guard = probes.megatron_detach_heads_source(_megatron(tmp_path / "b", get_embeddings=NO_GUARD))
    assert (
        no_guard.status == probes.FAIL and "_get_embeddings() lacks the checkpoint guard" in no_guard.detail
    )
    assert "multi_token_prediction.py:" in no_guard.detail


def test_an_unreadable_megatron_is_unknown_not_passed(tmp_path):
    tmp_path.joinpath("empty").mkdir()
    assert probes.megatron_detach_heads_source(tmp_path / "empty").status == probes.UNKNOWN


@pytest.mark.parametrize("guard, status", [(True, probes.PASS), (False, probes.FAIL)])
def test_verl_detach_guard(tmp_path, guard, status):
    v = probes.verl_detach_guard_source(_verl(tmp_path, guard=guard))
    assert v.status == status, v
    assert "mtp_patch.py:" in v.detail


def test_cp_roll_on_the_default_group_fails_with_its_lines(tmp_path):
    assert probes.cp_roll_group_source(_megatron(tmp_path / "a")).status == probes.PASS
    bare = probes.cp_roll_group_source(_megatron(tmp_path / "b", roll=ROLL_DEFAULT))
    assert bare.status == probes.FAIL and "multi_token_prediction.py:3:" in bare.detail, bare


@pytest.fixture(scope="module")
def cp_recompute_plan():
    m = manifest.load()
    plan = plan_for(m, "mtp-cp-recompute", None)
    assert plan.mtp_recipe == "megatron-detach-heads"
    return plan


def test_the_recipe_probe_refuses_a_megatron_that_lacks_the_guard(tmp_path, cp_recompute_plan):
    trees = {
        mtponly.MEGATRON: _megatron(tmp_path, get_embeddings=NO_GUARD),
        mtponly.VERL: _verl(tmp_path, guard=False),
    }
    v = probes.mtp_only_recipe_probe(cp_recompute_plan, trees)
    assert (
        v.status == probes.FAIL
        and "megatron-detach-heads" in v.detail
        and "lacks the checkpoint guard" in v.detail
    )


def test_the_recipe_probe_holds_and_names_a_better_recipe_a_fixed_verl_allows(tmp_path, cp_recompute_plan):
    megatron = _megatron(tmp_path)
    held = probes.mtp_only_recipe_probe(
        cp_recompute_plan, {mtponly.MEGATRON: megatron, mtponly.VERL: _verl(tmp_path, guard=False)}
    )
    assert held.status == probes.PASS and "also allows" not in held.detail, held
    fixed = probes.mtp_only_recipe_probe(
        cp_recompute_plan, {mtponly.MEGATRON: megatron, mtponly.VERL: _verl(tmp_path / "v2", guard=True)}
    )
    assert fixed.status == probes.PASS and "also allows verl-detach-with-heads" in fixed.detail, fixed


def test_the_recipe_probe_without_sources_is_unknown(cp_recompute_plan):
    v = probes.mtp_only_recipe_probe(cp_recompute_plan, {})
    assert v.status == probes.UNKNOWN and "not read" in v.detail
