"""The CLI as users run it: list, check, explain, dry-run, --set, --json."""

from __future__ import annotations

import json
import re

import pytest

from .helpers import pin, run_main

PROFILES = {"mtp-load-only", "mtp-full", "mtp-detach", "mtp-cp-recompute", "mtp-rollout"}
UPSTREAM_DETACH = [  # examples/mtp_trainer/run_mimo_7b_mtp_megatron.sh, verl 7bc80c00, in its order
    "actor_rollout_ref.model.mtp.enable=True",
    "actor_rollout_ref.model.mtp.enable_train=True",
    "actor_rollout_ref.model.mtp.mtp_loss_scaling_factor=0.1",
    # issue 45: the shipped stack takes recipe megatron-detach-heads in place of upstream's
    # detach_encoder=True (verl's detach copy lacks Megatron's checkpoint guard)
    "actor_rollout_ref.model.mtp.detach_encoder=False",
]


def test_list_names_all_five_profiles():
    proc = run_main("list")
    assert proc.returncode == 0
    names = {line.split()[0] for line in proc.stdout.splitlines()}
    assert names == PROFILES
    assert "base" not in names  # abstract parents are not images
    rollout = next(l for l in proc.stdout.splitlines() if l.startswith("mtp-rollout"))
    assert "experimental" in rollout and "rl" in rollout


def test_list_json():
    rows = json.loads(run_main("list", "--json").stdout)
    assert {r["name"] for r in rows} == PROFILES
    modes = {r["name"]: r["mode"] for r in rows}
    assert modes == {
        "mtp-load-only": "load-only",
        "mtp-full": "full",
        "mtp-detach": "mtp-only",
        "mtp-cp-recompute": "mtp-only",
        "mtp-rollout": "rollout",
    }


def test_check_passes_for_all_profiles():
    proc = run_main("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in PROFILES:
        assert re.search(rf"^{name}: ok", proc.stdout, re.M), proc.stdout


def test_check_refuses_core_v018_with_full_recompute():
    proc = run_main(
        "check",
        "--profile",
        "mtp-cp-recompute",
        "--set",
        "megatron-lm.commit=ba7b5ebce12af60627a80985792a1449ce45f46c",
    )
    assert proc.returncode == 1
    assert "ERROR recompute-padding-mask" in proc.stdout
    assert "fix:" in proc.stdout and "core_v0.19.0" in proc.stdout


def test_check_accepts_core_v019_with_full_recompute():
    proc = run_main(
        "check",
        "--profile",
        "mtp-cp-recompute",
        "--json",
        "--set",
        "megatron-lm.commit=5be9626709af2722333bf54797c954c09edeada3",
    )
    assert proc.returncode == 0
    [report] = json.loads(proc.stdout)
    rule = next(r for r in report["rules"] if r["id"] == "recompute-padding-mask")
    assert rule["status"] == "pass" and report["ok"] is True


def test_explain_detach_rl_prints_upstream_lines_in_order():
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl")
    assert proc.returncode == 0
    lines = [l for l in proc.stdout.splitlines() if not l.startswith("#")]
    mtp = [l for l in lines if ".mtp." in l]
    assert mtp == UPSTREAM_DETACH
    assert "model_engine=megatron" in lines


def test_explain_detach_sft_uses_model_mtp_only():
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "sft")
    assert proc.returncode == 0
    assert "actor_rollout_ref" not in proc.stdout
    lines = [l for l in proc.stdout.splitlines() if not l.startswith("#")]
    assert [l for l in lines if l.startswith("model.mtp.")] == [
        l.replace("actor_rollout_ref.model.mtp.", "model.mtp.") for l in UPSTREAM_DETACH
    ]
    assert "engine=megatron" in lines


def test_explain_cp_recompute_has_engine_overrides():
    rl = run_main("explain", "--profile", "mtp-cp-recompute", "--target", "rl", "--json")
    data = json.loads(rl.stdout)
    tc = "actor_rollout_ref.actor.megatron.override_transformer_config."
    for line in (
        f"{tc}recompute_granularity=full",
        f"{tc}recompute_method=uniform",
        f"{tc}recompute_num_layers=1",
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
    ):
        assert line in data["overrides"]
    sft = json.loads(run_main("explain", "--profile", "mtp-cp-recompute", "--target", "sft", "--json").stdout)
    assert "engine.override_transformer_config.recompute_granularity=full" in sft["overrides"]
    assert "engine.context_parallel_size=2" in sft["overrides"]


def test_explain_modes_differ_as_documented():
    def mtp_fields(profile):
        data = json.loads(run_main("explain", "--profile", profile, "--target", "rl", "--json").stdout)
        return [l.split("mtp.")[1] for l in data["overrides"] if ".mtp." in l]

    assert mtp_fields("mtp-load-only") == ["enable=True"]
    assert mtp_fields("mtp-full") == ["enable=True", "enable_train=True", "mtp_loss_scaling_factor=0.1"]
    rollout = mtp_fields("mtp-rollout")
    assert "enable_rollout=True" in rollout and "speculative_algorithm=EAGLE" in rollout


def test_explain_fails_first_for_a_model_without_mtp(tmp_path):
    """#50 item 5: verl raises ValueError with these overrides: a failed check, said first in
    one error line (file, field, fix), exit 1; not a warning at the end with exit 0."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen2", "num_nextn_predict_layers": 0}))
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: {cfg}: num_nextn_predict_layers is 0: the model has no MTP layers"), line
    assert "no-op" in line and "(fix: " in line
    assert "no MTP layers" not in proc.stdout  # not repeated among the warnings
    as_json = run_main(
        "explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg), "--json"
    )
    assert as_json.returncode == 1
    assert "no MTP layers" in json.loads(as_json.stdout)["failures"][0]


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "qwen3_next", "mtp_num_hidden_layers": 1},  # Qwen3-Next: top level
        {"model_type": "qwen3_5_moe", "text_config": {"mtp_num_hidden_layers": 1}},  # Qwen3.5: nested
        {"model_type": "deepseek_v3", "num_nextn_predict_layers": 1},
        # verl takes the first count > 0 (num_nextn_predict_layers 0 does not hide the other)
        {"model_type": "x", "num_nextn_predict_layers": 0, "mtp_num_hidden_layers": 2},
    ],
)
def test_explain_reads_the_mtp_layer_counts_verl_reads(tmp_path, config):
    """#36 item 8: verl 7bc80c00 (megatron_utils.py _get_mtp_num_layers) reads
    num_nextn_predict_layers, mtp_num_hidden_layers and text_config.mtp_num_hidden_layers."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "no MTP layers" not in proc.stdout, proc.stdout


def test_explain_names_every_key_it_read_when_there_are_no_mtp_layers(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen3_5", "text_config": {"mtp_num_hidden_layers": 0}}))
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert "text_config.mtp_num_hidden_layers is 0: the model has no MTP layers" in proc.stderr
    cfg.write_text(json.dumps({"model_type": "qwen2"}))
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert (
        "none of num_nextn_predict_layers, mtp_num_hidden_layers, text_config.mtp_num_hidden_layers"
        in proc.stderr
    )


def test_explain_warns_about_mimo_position_embeddings(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps({"model_type": "mimo", "num_nextn_predict_layers": 1, "max_position_embeddings": 4096})
    )
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert "32768" in proc.stdout and "no MTP layers" not in proc.stdout
    cfg.write_text(
        json.dumps({"model_type": "mimo", "num_nextn_predict_layers": 1, "max_position_embeddings": 32768})
    )
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert "32768" not in proc.stdout and "no MTP layers" not in proc.stdout


def test_explain_bad_model_config_is_input_error(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text("{not json")
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert proc.returncode == 2 and "config.json" in proc.stderr and "Traceback" not in proc.stderr


def test_explain_unsupported_target():
    proc = run_main("explain", "--profile", "mtp-rollout", "--target", "sft")
    assert proc.returncode == 2 and "supports rl only" in proc.stderr


def test_dry_run_prints_plan_without_docker():
    proc = run_main(
        "--profile",
        "mtp-cp-recompute",
        "--dry-run",
        env={"DOCKER_HOST": "unix:///nonexistent.sock", "PATH": "/nonexistent"},
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert pin("megatron-lm") in out
    assert re.search(r"image\s+mtp-verl:mtp-cp-recompute-[0-9a-f]{12}", out)
    layer_names = re.findall(r"^\s+\d+ (\S+)", out, re.M)
    assert layer_names[0] == "os" and layer_names[-1] == "mode"


def test_dry_run_json_and_set():
    proc = run_main(
        "--profile",
        "mtp-cp-recompute",
        "--dry-run",
        "--json",
        "--set",
        "megatron-lm.commit=ba7b5ebce12af60627a80985792a1449ce45f46c",
    )
    assert proc.returncode == 1  # the plan is printed, and refused
    data = json.loads(proc.stdout)
    assert data["ok"] is False
    comp = next(c for c in data["plan"]["components"] if c["name"] == "megatron-lm")
    assert comp["commit"] == "ba7b5ebce12af60627a80985792a1449ce45f46c"
    assert comp["version"] is None  # the catalogue's version described another commit
    assert data["plan"]["overridden"] == {"megatron-lm": ["commit"]}
