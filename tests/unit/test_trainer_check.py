"""verl's own SFT trainer as an in-image check (issue 34): the tiny MTP model and data made at
test time, the runs planned from exactly the image's overrides (what `explain` prints), and the
mode's promises judged on recorded trainer logs, a passing and a failing one each."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mtpimage.assembly.render import IMAGES_DIR, render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest

CHECKS = IMAGES_DIR / "checks"
LOGS = Path(__file__).parent / "trainer_logs"
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, CHECKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tm():
    return _load("tinymimo")


@pytest.fixture(scope="module")
def tc(tm):
    return _load("trainer_check")


def _overrides(profile: str) -> list[str]:
    files = render(plan_for(manifest.load(MANIFESTS), profile, None), MANIFESTS).files
    return files["mtp/verl/sft.overrides"].decode().splitlines()


# ------------------------------------------------------------------------------ the model
def test_the_tiny_mimo_is_made_here_the_same_for_a_seed(tm, tmp_path):
    a = tm.make(tmp_path / "a")
    b = tm.make(tmp_path / "b")
    digest = [hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in (a, b)]
    assert digest[0] == digest[1]
    tensors = tm.read_safetensors(a / "model.safetensors")
    mtp = [k for k in tensors if k.startswith("model.mtp_layers.0.")]
    assert len(tensors) == 43 and len(mtp) == 16
    # the names Megatron-Bridge's MimoBridge maps (mimo_bridge.py at 51885cf1)
    for name in (
        "token_layernorm",
        "hidden_layernorm",
        "input_proj",
        "final_layernorm",
        "self_attn.q_proj.bias",
    ):
        assert any(f".{name}" in k for k in mtp), name
    dtype, shape, data = tensors["model.mtp_layers.0.input_proj.weight"]
    assert dtype == "BF16" and shape == (256, 512) and len(data) == 256 * 512 * 2
    config = json.loads((a / "config.json").read_text())
    assert config["model_type"] == "mimo" and config["num_nextn_predict_layers"] == 1
    assert config["auto_map"]["AutoConfig"] == "configuration_mimo.MiMoConfig"
    assert config["max_position_embeddings"] == 32768 and config["tie_word_embeddings"] is False
    assert "class MiMoConfig(Qwen2Config)" in (a / "configuration_mimo.py").read_text()


def test_the_tokenizer_and_the_chat_data_are_what_verls_dataset_reads(tm, tmp_path):
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    model = tm.make(tmp_path)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = tok.encode("<|im_start|>user\nWhat is one plus two?<|im_end|>").ids
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id("<|im_end|>")
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>" and "<|im_start|>" in cfg["chat_template"]
    rows = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    assert len(rows) == tm.ROWS
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant"]


def test_the_export_comparison_counts_mtp_and_trunk_tensors(tm, tmp_path):
    import array

    model = tm.make(tmp_path)
    initial = tm.read_safetensors(model / "model.safetensors")
    export = tmp_path / "ckpt" / "global_step_4" / "model" / "huggingface"
    export.mkdir(parents=True)
    tensors = {}
    for name, (dtype, shape, data) in initial.items():
        if name.startswith("model.layers.0."):
            continue  # missing from the export
        if name == "lm_head.weight":  # moved: one value changed
            data = bytes([data[0] ^ 0x01]) + data[1:]
        if name.startswith("model.mtp_layers."):  # kept, but exported as fp32: the same values
            tensors[name] = (shape, array.array("I", tm.as_float32_bits(dtype, data)).tobytes(), "F32")
            continue
        tensors[name] = (shape, data, "BF16")
    tm.write_safetensors(export / "model.safetensors", {k: (s, d) for k, (s, d, _) in tensors.items()})
    # write_safetensors writes BF16 headers: mark the fp32 ones as such
    raw = (export / "model.safetensors").read_bytes()
    import json as _json
    import struct

    (n,) = struct.unpack("<Q", raw[:8])
    header = _json.loads(raw[8 : 8 + n])
    for k, (_, _, dt) in tensors.items():
        header[k]["dtype"] = dt
    head = _json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    (export / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n :])
    result = tm.compare_export(model / "model.safetensors", tmp_path / "ckpt")
    assert result["mtp"] == {"same": 16, "changed": 0, "missing": 0}
    assert result["trunk"] == {"same": 14, "changed": 1, "missing": 12}
    assert tm.compare_export(model / "model.safetensors", tmp_path / "nothing") is None


# ------------------------------------------------------------------------------ the runs
@pytest.mark.parametrize(
    "profile, contract",
    [
        ("mtp-load-only", "load-only"),
        ("mtp-full", "full"),
        ("mtp-detach", "mtp-only"),
        ("mtp-cp-recompute", "mtp-only"),
    ],
)
def test_the_runs_use_exactly_the_images_overrides_and_only_test_size_settings_besides(
    tc, profile, contract, tmp_path
):
    lines = _overrides(profile)
    explain = __import__("tests.unit.helpers", fromlist=["run_main"]).run_main(
        "explain", "--profile", profile, "--target", "sft"
    )
    assert lines == [ln for ln in explain.stdout.splitlines() if not ln.startswith("#")]
    fitted, notes = tc.fit_to_node(lines, 1)
    runs = tc.plan_runs(contract, fitted, "p.", False)
    assert runs[0].overrides == tuple(fitted)
    own = {tc.setting_key(ln) for ln in tc.test_size(tmp_path, "train", 4, 1)}
    assert not own & {tc.setting_key(ln) for ln in lines}, "a test-size setting would override the mode's"
    if profile == "mtp-cp-recompute":
        assert "engine.context_parallel_size=1" in fitted and notes == [
            "engine.context_parallel_size: 2 -> 1 (this node has 1 GPU(s))"
        ]
    else:
        assert fitted == lines and notes == []


@pytest.mark.parametrize("profile", ["mtp-detach", "mtp-cp-recompute"])
def test_an_mtp_only_profile_is_compared_with_load_only_under_its_own_engine_settings(tc, profile):
    fitted, _ = tc.fit_to_node(_overrides(profile), 1)
    runs = {r.name: r for r in tc.plan_runs("mtp-only", fitted, "p.", False)}
    assert list(runs) == ["train", "mtp-loss-only", "load-only"]
    ref = runs["load-only"]
    assert not ref.zero_main_loss and not ref.variant
    # exactly what mtp-load-only's image says about MTP, everything of the engine kept
    assert [ln for ln in ref.overrides if ".mtp" in ln] == [
        ln for ln in _overrides("mtp-load-only") if ".mtp" in ln
    ]
    assert [ln for ln in ref.overrides if ".mtp" not in ln] == [
        ln for ln in fitted if ".mtp" not in ln and "mtp_detach_heads" not in ln
    ]
    if profile == "mtp-cp-recompute":
        assert "engine.override_transformer_config.recompute_granularity=full" in ref.overrides


def test_the_variants_are_the_recipes_mtp_only_had_before_issue_45(tc):
    prefix = "engine.override_transformer_config."
    for profile in ("mtp-detach", "mtp-cp-recompute"):
        lines = _overrides(profile)
        runs = tc.plan_runs("mtp-only", lines, prefix, True)
        variants = {r.name: r for r in runs if r.variant}
        assert list(variants) == [
            "mtp-loss-only:detach_encoder",
            "mtp-loss-only:detach_encoder+mtp_detach_heads",
        ], profile
        assert all(r.zero_main_loss for r in variants.values())
        alone, both = variants.values()
        assert tc.recipe_of(alone.overrides) == ("True", False)
        assert tc.recipe_of(both.overrides) == ("True", True)
        assert f"+{prefix}mtp_detach_heads=True" in both.overrides
        # only the recipe changes: the engine's settings (recompute) are the profile's
        keep = [ln for ln in lines if "detach" not in ln]
        assert [ln for ln in alone.overrides if "detach" not in ln] == keep
    # a stack on verl's detach alone (the recipe explain falls back to) keeps one variant
    old = [ln.replace("detach_encoder=False", "detach_encoder=True") for ln in _overrides("mtp-detach")]
    old = [ln for ln in old if "mtp_detach_heads" not in ln]
    names = [r.name for r in tc.plan_runs("mtp-only", old, prefix, True) if r.variant]
    assert names == ["mtp-loss-only:detach_encoder+mtp_detach_heads"]
    assert [r.name for r in tc.plan_runs("load-only", _overrides("mtp-load-only"), "p.", True)] == ["train"]


def test_stand_ins_only_where_an_extension_is_missing(tc):
    assert tc.stand_ins(True, True, "p.") == ([], [])
    lines, notes = tc.stand_ins(False, False, "p.")
    assert lines == ["p.attention_backend=fused", "+p.gradient_accumulation_fusion=False"]
    assert all("(stand-in)" in n for n in notes)


# ------------------------------------------------------------------------------ judging
def _recorded(tc, case: str) -> tuple[str, list[str], dict]:
    """A recorded trainer_check run: LOGS/CASE.json holds the contract, the overrides and, per
    run, verl's file-logger lines and the probe's gradient lines."""
    data = json.loads((LOGS / f"{case}.json").read_text())
    results = {
        name: tc.RunResult(
            name, r["rc"], r["seconds"], tuple(r["metrics"]), tuple(r["grads"]), r.get("export"), ""
        )
        for name, r in data["runs"].items()
    }
    return data["contract"], data["overrides"], results


def _verdicts(tc, case):
    contract, lines, results = _recorded(tc, case)
    return {f.id: f for f in tc.judge(contract, lines, results)}


@pytest.mark.parametrize(
    "case, failing",
    [
        ("mtp-detach-pass", set()),
        ("mtp-detach-output-layer-leak", {"output-layer-untouched-by-mtp-loss"}),
        # the recipe before issue 45 (detach_encoder alone): its output layer gets the MTP loss's
        # gradient, which the old judging only reported, and the main loss leaves load-only's
        (
            "cp-recompute-old-recipe",
            {"output-layer-untouched-by-mtp-loss+recompute", "main-loss-equals-load-only+recompute"},
        ),
        (
            "cp-recompute-silent-stop",
            {"mtp-params-get-gradient+recompute", "mtp-loss-alone-learns+recompute"},
        ),
        ("load-only-pass", set()),
        ("load-only-mtp-changed", {"export-keeps-mtp", "mtp-params-no-gradient", "no-mtp-loss"}),
        ("full-pass", set()),
        ("full-trunk-untouched", {"mtp-loss-reaches-trunk"}),
    ],
)
def test_the_promises_judged_on_recorded_trainer_logs(tc, case, failing):
    verdicts = _verdicts(tc, case)
    assert {k for k, f in verdicts.items() if f.status == "fail"} == failing, verdicts
    assert verdicts["loss-falls"].status == "pass"


def test_mtp_only_always_judges_the_output_layer_and_the_main_loss(tc):
    verdicts = _verdicts(tc, "mtp-detach-pass")
    assert verdicts["output-layer-untouched-by-mtp-loss"].status == "pass"
    assert "0/1 with gradient" in verdicts["output-layer-untouched-by-mtp-loss"].detail
    main = verdicts["main-loss-equals-load-only"]
    assert main.status == "pass" and "6.9544 6.0374 5.3234 4.9213" in main.detail
    # without its recipe's mtp_detach_heads in the overrides the output layer is judged all the same
    contract, lines, results = _recorded(tc, "mtp-detach-output-layer-leak")
    bare = [ln for ln in lines if "mtp_detach_heads" not in ln]
    got = {f.id: f.status for f in tc.judge(contract, bare, results)}
    assert got["output-layer-untouched-by-mtp-loss"] == "fail"


def test_the_main_loss_is_compared_to_the_printed_digits(tc):
    import dataclasses

    contract, lines, results = _recorded(tc, "mtp-detach-pass")
    ref = results["load-only"]

    def nudged(delta: float):
        rows = [dict(m, data=dict(m["data"])) for m in ref.metrics]
        rows[-1]["data"]["train/loss"] += delta
        return dataclasses.replace(results["train"], metrics=tuple(rows))

    # the same when printed (4 decimals), though not bit-identical: passes, and says so
    below = {**results, "train": nudged(1e-7)}
    main = {f.id: f for f in tc.judge(contract, lines, below)}["main-loss-equals-load-only"]
    assert main.status == "pass" and "not bit-identical" in main.detail
    # one unit in the fourth decimal (apex's fused accumulation gave 4.9214 against 4.9215)
    above = {**results, "train": nudged(1e-4)}
    assert {f.id: f for f in tc.judge(contract, lines, above)}["main-loss-equals-load-only"].status == "fail"
    # a step short is not equal
    short = dataclasses.replace(results["train"], metrics=results["train"].metrics[:-1])
    got = {f.id: f for f in tc.judge(contract, lines, {**results, "train": short})}
    assert got["main-loss-equals-load-only"].status == "fail"
    assert not tc.same_printed([], [])


def test_a_crashed_run_fails_with_its_exit_and_log(tc):
    contract, lines, results = _recorded(tc, "mtp-detach-pass")
    import dataclasses

    results["train"] = dataclasses.replace(results["train"], rc=1, log_tail="TypeError: padding_mask")
    verdicts = {f.id: f for f in tc.judge(contract, lines, results)}
    assert verdicts["run:train"].status == "fail" and "padding_mask" in verdicts["run:train"].detail


def test_the_image_checks_run_the_trainer_only_with_a_gpu_and_report_each_promise(tmp_path, monkeypatch):
    rc = _load("run_checks")
    assert rc.check_trainer(False, {"targets": ["rl", "sft"]})[0]["status"] == "skip"
    # an rl-only profile runs no SFT check; its RL check is test_rl_check.py's
    monkeypatch.setattr(rc.importlib.util, "find_spec", lambda name: None)
    assert [r["id"] for r in rc.check_trainer(True, {"targets": ["rl"]})] == ["trainer:rl"]
    monkeypatch.undo()
    fake = tmp_path / "trainer_check.py"
    report = {
        "ok": False,
        "notes": ["engine.context_parallel_size: 2 -> 1 (this node has 1 GPU(s))"],
        "results": [
            {"id": "loss-falls", "status": "pass", "detail": "loss 7 5"},
            {"id": "mtp-params-get-gradient+recompute", "status": "fail", "detail": "MTP block: 0/11"},
            {"id": "output-layer-gets-mtp-loss+recompute", "status": "info", "detail": "output layer: 1/1"},
        ],
    }
    fake.write_text(f"import json\nprint(json.dumps({report!r}))\n")
    monkeypatch.setattr(rc, "HERE", tmp_path)
    got = {r["id"]: r for r in rc.check_trainer(True, {"targets": ["sft"]})}
    assert got["trainer:loss-falls"]["status"] == "pass"
    assert got["trainer:mtp-params-get-gradient+recompute"]["status"] == "fail"
    assert got["trainer:output-layer-gets-mtp-loss+recompute"]["detail"].startswith("reported: ")
    assert "2 -> 1" in got["trainer:notes"]["detail"]


# ------------------------------------------------------------------------------ rl-only profiles
def _rendered(profile: str, name: str) -> list[str] | None:
    files = render(plan_for(manifest.load(MANIFESTS), profile, None), MANIFESTS).files
    data = files.get(f"mtp/verl/{name}")
    return None if data is None else data.decode().splitlines()


def test_an_rl_only_profiles_training_side_maps_to_sft_by_verls_own_keys():
    spec = importlib.util.spec_from_file_location(
        "trainer_payload", MANIFESTS.parent / "scripts" / "device" / "trainer_payload.py"
    )
    tp = importlib.util.module_from_spec(spec)
    sys.modules["trainer_payload"] = tp  # its dataclasses look their module up
    spec.loader.exec_module(tp)
    # a profile with both targets: its RL overrides map onto exactly its rendered SFT ones
    for profile in ("mtp-detach", "mtp-cp-recompute", "mtp-load-only"):
        assert tp.sft_of_rl(_rendered(profile, "rl.overrides")) == _rendered(profile, "sft.overrides"), (
            profile
        )
    assert _rendered("mtp-rollout", "sft.overrides") is None  # rl only
    sft = tp.sft_of_rl(_rendered("mtp-rollout", "rl.overrides"))
    assert "model.mtp.detach_encoder=False" in sft and "model.mtp.enable_rollout=True" in sft
    assert "+engine.override_transformer_config.mtp_detach_heads=True" in sft
    assert not any("rollout.name" in ln or ln.startswith("actor_rollout_ref.") for ln in sft)
    with pytest.raises(SystemExit):
        tp.sft_of_rl(["actor_rollout_ref.rollout.n=4"])
