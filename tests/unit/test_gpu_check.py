"""CPU-side logic of images/checks/gpu_check.py (the in-image GPU check, issue 5).

The script is imported by file path (it is copied into images, not part of the package).
None of these tests import torch: the GPU part is covered by the last test, which skips
with a visible reason where no CUDA device (or no torch) is present, as in CI.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "checks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


gc = _load()


def names(checks):
    return [c.name for c in checks]


# -- import hygiene ---------------------------------------------------------------------


def test_import_does_not_pull_torch_or_megatron():
    code = (
        "import importlib.util, sys;"
        f"s = importlib.util.spec_from_file_location('g', {str(SCRIPT)!r});"
        "m = importlib.util.module_from_spec(s); sys.modules['g'] = m; s.loader.exec_module(m);"
        "print(sorted(k for k in ('torch', 'megatron', 'verl') if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- mode table -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("load-only", ["torch-cuda", "nccl-allreduce", "load-only"]),
        ("full", ["torch-cuda", "nccl-allreduce", "full"]),
        ("mtp-only", ["torch-cuda", "nccl-allreduce", "mtp-only"]),
        ("rollout", ["torch-cuda", "nccl-allreduce", "mtp-only"]),
        ("cp-recompute", ["torch-cuda", "nccl-allreduce", "cp-recompute[full]", "cp-recompute[mtp-only]"]),
    ],
)
def test_mode_table_single_rank(mode, expected):
    assert names(gc.checks_for_mode(mode)) == expected


def test_mode_all_covers_every_mode_and_recompute():
    got = names(gc.checks_for_mode("all"))
    assert got == [
        "torch-cuda",
        "nccl-allreduce",
        "load-only",
        "full",
        "mtp-only",
        "cp-recompute[load-only]",
        "cp-recompute[full]",
        "cp-recompute[mtp-only]",
    ]


def test_cp2_checks_only_with_two_ranks():
    one = gc.checks_for_mode("cp-recompute", world_size=1)
    two = gc.checks_for_mode("cp-recompute", world_size=2)
    assert all(c.cp == 1 for c in one)
    assert "cp-recompute[mtp-only,cp=2]" in names(two)
    cp2 = next(c for c in two if c.name == "cp-recompute[mtp-only,cp=2]")
    assert (cp2.cp, cp2.recompute, cp2.semantics) == (2, True, "mtp-only")
    # 3 ranks cannot hold CP=2 evenly
    assert all(c.cp == 1 for c in gc.checks_for_mode("cp-recompute", world_size=3))


def test_recompute_checks_use_full_recompute_and_training_semantics():
    for c in gc.checks_for_mode("all"):
        if c.name.startswith("cp-recompute"):
            assert c.recompute and c.kind == "training"
        elif c.kind == "training":
            assert not c.recompute and c.name == c.semantics


def test_full_recompute_in_vector_adds_cp_recompute_in_same_semantics():
    got = names(gc.checks_for_mode("full", recompute=True))
    assert got == ["torch-cuda", "nccl-allreduce", "full", "cp-recompute[full]"]
    got = names(gc.checks_for_mode("rollout", recompute=True, world_size=2, cp_requested=2))
    assert got[-3:] == ["mtp-only", "cp-recompute[mtp-only]", "cp-recompute[mtp-only,cp=2]"]


def test_unknown_mode_is_a_usage_error():
    with pytest.raises(gc.UsageError, match="unknown mode"):
        gc.checks_for_mode("detach")


# -- version vector -----------------------------------------------------------------------


def vector(mode="mtp-only", cp=2, gran="full"):
    return {
        "mode": mode,
        "engine": {
            "context_parallel_size": cp,
            "recompute": {
                "granularity": gran,
                "method": "uniform" if gran else None,
                "num_layers": 1 if gran else None,
            },
        },
    }


def test_parse_version_vector_normalises():
    mode, engine = gc.parse_version_vector(vector())
    assert mode == "mtp-only"
    assert engine == {
        "context_parallel_size": 2,
        "recompute": {"granularity": "full", "method": "uniform", "num_layers": 1},
    }


def test_parse_version_vector_defaults_engine():
    mode, engine = gc.parse_version_vector({"mode": "load-only"})
    assert mode == "load-only"
    assert engine["context_parallel_size"] == 1
    assert engine["recompute"]["granularity"] is None


@pytest.mark.parametrize(
    "data, msg",
    [
        ([], "JSON object"),
        ({"mode": "detach"}, "'mode' must be one of"),
        ({"mode": "cp-recompute"}, "'mode' must be one of"),  # a CLI mode, not a profile mode
        ({"mode": "full", "engine": {"context_parallel_size": 0}}, "context_parallel_size"),
        ({"mode": "full", "engine": {"context_parallel_size": True}}, "context_parallel_size"),
        ({"mode": "full", "engine": {"recompute": {"granularity": "all"}}}, "granularity"),
    ],
)
def test_parse_version_vector_rejects(data, msg):
    with pytest.raises(gc.UsageError, match=msg):
        gc.parse_version_vector(data)


def test_resolve_plan_from_vector_file(tmp_path):
    p = tmp_path / "version.json"
    p.write_text(json.dumps(vector("full", cp=2, gran="full")))
    plan = gc.resolve_plan(None, str(p), world_size=1)
    assert plan.mode == "full" and plan.source == str(p)
    assert names(plan.checks)[2:] == ["full", "cp-recompute[full]"]
    plan2 = gc.resolve_plan(None, str(p), world_size=2)
    assert names(plan2.checks)[-1] == "cp-recompute[full,cp=2]"


def test_resolve_plan_without_recompute(tmp_path):
    p = tmp_path / "version.json"
    p.write_text(json.dumps(vector("load-only", cp=1, gran=None)))
    assert names(gc.resolve_plan(None, str(p)).checks) == ["torch-cuda", "nccl-allreduce", "load-only"]


def test_mode_flag_wins_over_vector(tmp_path):
    p = tmp_path / "version.json"
    p.write_text(json.dumps(vector("full")))
    plan = gc.resolve_plan("load-only", str(p))
    assert plan.mode == "load-only" and plan.source == "--mode"
    assert "full" not in names(plan.checks)


def test_resolve_plan_missing_or_bad_vector(tmp_path):
    with pytest.raises(gc.UsageError, match="cannot read version vector"):
        gc.resolve_plan(None, str(tmp_path / "absent.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(gc.UsageError, match="not valid JSON"):
        gc.resolve_plan(None, str(bad))


# -- exception -> rule id -----------------------------------------------------------------


def test_padding_mask_typeerror_maps_to_rule():
    exc = TypeError(
        "MultiTokenPredictionLayer._checkpointed_forward() got an unexpected keyword argument 'padding_mask'"
    )
    rule, detail = gc.classify_exception(exc)
    assert rule == "recompute-padding-mask"
    assert detail.startswith("TypeError: MultiTokenPredictionLayer._checkpointed_forward()")


def test_other_typeerrors_have_no_rule():
    rule, detail = gc.classify_exception(
        TypeError("forward() got an unexpected keyword argument 'padding_mask'")
    )
    assert rule is None
    rule, _ = gc.classify_exception(
        ValueError("_checkpointed_forward() got an unexpected keyword argument 'padding_mask'")
    )
    assert rule is None  # only the TypeError is the known bug
    assert gc.classify_exception(RuntimeError("CUDA error: out of memory")) == (
        None,
        "RuntimeError: CUDA error: out of memory",
    )


def test_no_gradient_failure_maps_to_rule():
    exc = gc.CheckFailure(f"{gc.MSG_MTP_NO_GRADIENT}: 19/19", gc.RULE_MTP_NO_GRADIENT)
    assert gc.classify_exception(exc) == ("mtp-no-gradient", "MTP parameters received no gradient: 19/19")
    assert gc.MSG_MTP_NO_GRADIENT == "MTP parameters received no gradient"
    # the message alone (e.g. re-raised as AssertionError) still maps
    assert (
        gc.classify_exception(AssertionError("MTP parameters received no gradient"))[0] == "mtp-no-gradient"
    )


# -- report / exit codes ------------------------------------------------------------------

R = gc.CheckResult


def test_exit_codes():
    ok = [R("a", gc.PASS), R("b", gc.SKIP)]
    bad = ok + [R("c", gc.FAIL, "x", "recompute-padding-mask")]
    assert gc.exit_code_for(ok, None, False) == 0
    assert gc.exit_code_for(bad, None, False) == 1
    assert gc.exit_code_for(ok, "no CUDA device", False) == 77
    assert gc.exit_code_for(ok, "--cpu-only given", True) == 0
    assert gc.exit_code_for(bad, "no CUDA device", False) == 1  # a failure beats a skip


def test_build_report_shape_and_ok():
    rep = gc.build_report(
        [
            R("torch-cuda", gc.PASS, "1 device"),
            R("cp-recompute[full]", gc.FAIL, "TypeError: ...", "recompute-padding-mask"),
        ],
        {"torch": "2.11.0"},
        mode="full",
        source="--mode",
        gpu_skipped=None,
        cpu_only=False,
    )
    assert rep["ok"] is False and rep["exit_code"] == 1
    assert rep["checks"][1] == {
        "name": "cp-recompute[full]",
        "status": "FAIL",
        "detail": "TypeError: ...",
        "rule": "recompute-padding-mask",
    }
    assert set(rep) >= {"checks", "env", "ok"}
    json.dumps(rep)  # serialisable


def test_format_table_lists_every_check_and_rule():
    rep = gc.build_report(
        [
            R("load-only", gc.PASS, "19 MTP params"),
            R("cp-recompute[mtp-only]", gc.FAIL, gc.MSG_MTP_NO_GRADIENT, "mtp-no-gradient"),
        ],
        {"driver": "580.159.04", "gpus": ["NVIDIA H200"]},
        mode="all",
        source="--mode",
        gpu_skipped=None,
        cpu_only=False,
    )
    text = gc.format_table(rep)
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("cp-recompute[mtp-only]"))
    assert row.split()[1:3] == ["FAIL", "mtp-no-gradient"]
    assert "driver: 580.159.04" in text and "gpus: NVIDIA H200" in text
    assert lines[-1].startswith("result: NOT OK (1 pass, 1 fail, 0 skip; exit 1)")


# -- the CLI without a GPU ----------------------------------------------------------------


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_cli_cpu_only_exits_0_with_visible_skip_line():
    proc = run_cli("--mode", "all", "--cpu-only")
    assert proc.returncode == 0, proc.stderr
    assert "GPU part skipped: --cpu-only given" in proc.stdout
    assert "cp-recompute[mtp-only]" in proc.stdout


def test_cli_cpu_only_json(tmp_path):
    p = tmp_path / "version.json"
    p.write_text(json.dumps(vector("rollout", cp=2, gran="full")))
    proc = run_cli("--version-vector", str(p), "--json", "--cpu-only")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["ok"] is True and rep["mode"] == "rollout" and rep["gpu_skipped"] == "--cpu-only given"
    assert [c["name"] for c in rep["checks"]] == [
        "torch-cuda",
        "nccl-allreduce",
        "mtp-only",
        "cp-recompute[mtp-only]",
    ]
    assert {c["status"] for c in rep["checks"]} == {"SKIP"}
    assert "GPU part skipped" in proc.stderr


def test_cli_usage_errors_exit_2(tmp_path):
    assert run_cli("--mode", "bogus", "--cpu-only").returncode == 2
    assert run_cli("--version-vector", str(tmp_path / "none.json"), "--cpu-only").returncode == 2


def _has_cuda() -> tuple[bool, str]:
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    return True, ""


def test_cli_without_gpu_exits_77():
    has, why = _has_cuda()
    if has:
        pytest.skip("a CUDA device is present; the no-GPU exit status is not observable here")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: without torch the script reports a FAIL, not a skip")
    proc = run_cli("--mode", "full")
    assert proc.returncode == 77
    assert "GPU part skipped: no CUDA device" in proc.stdout


def test_gpu_part_runs_on_a_gpu():
    has, why = _has_cuda()
    if not has:
        pytest.skip(f"GPU part skipped: {why}; run images/checks/gpu_check.py on a GPU host (docs/gpu.md)")
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("GPU part skipped: megatron-core is not installed")
    proc = run_cli("--mode", "full", "--json")
    rep = json.loads(proc.stdout)
    assert proc.returncode == 0, rep
    assert any(c["name"] == "full" and c["status"] == "PASS" for c in rep["checks"])


# -- precision and attention backend per CP size (issue 17) ---------------------------------


def test_cp1_checks_keep_fp32_local_attention():
    plan = gc.precision_plan(1)
    assert (plan.cp, plan.dtype, plan.attention, plan.needs_te) == (1, "float32", "local", False)
    assert plan.label() == "CP=1 fp32 local attention"


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_above_1_runs_bf16_with_transformer_engine_attention(cp):
    # No TE attention backend does context parallelism in fp32 (unfused refuses CP, fused
    # cuDNN needs bf16/fp16): an fp32 model at CP=2 fails with "No dot product attention
    # backend is available". The old check built every model in fp32.
    plan = gc.precision_plan(cp)
    assert (plan.dtype, plan.attention, plan.needs_te) == ("bfloat16", "transformer_engine", True)
    assert plan.label() == f"CP={cp} bf16 TE attention"


def test_cp1_reference_uses_the_cp_runs_precision():
    ref = gc.precision_plan(1, reference=True)
    assert (ref.cp, ref.dtype, ref.attention) == (1, "bfloat16", "transformer_engine")
    assert (ref.dtype, ref.attention) == (gc.precision_plan(2).dtype, gc.precision_plan(2).attention)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "2"])
def test_precision_plan_rejects_bad_cp(bad):
    with pytest.raises(ValueError):
        gc.precision_plan(bad)


def test_model_config_is_bf16_at_cp2_and_fp32_at_cp1():
    kw2 = gc.transformer_config_kwargs(gc.precision_plan(2), recompute=True)
    assert kw2["params_dtype"] == "bfloat16" and kw2["bf16"] is True
    assert kw2["context_parallel_size"] == 2
    assert (kw2["recompute_granularity"], kw2["recompute_method"], kw2["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    kw1 = gc.transformer_config_kwargs(gc.precision_plan(1), recompute=False)
    assert kw1["params_dtype"] == "float32" and kw1["bf16"] is False
    assert kw1["context_parallel_size"] == 1 and "recompute_granularity" not in kw1
    # same model otherwise: the CP=1 reference and the CP=2 run share weights by name
    ref = gc.transformer_config_kwargs(gc.precision_plan(1, reference=True), recompute=True)
    assert {k: v for k, v in ref.items() if k != "context_parallel_size"} == {
        k: v for k, v in kw2.items() if k != "context_parallel_size"
    }


def test_cp_chunk_positions_are_megatrons_load_balanced_split():
    assert gc.cp_chunk_positions(8, 1, 0) == list(range(8))
    assert gc.cp_chunk_positions(8, 2, 0) == [0, 1, 6, 7]
    assert gc.cp_chunk_positions(8, 2, 1) == [2, 3, 4, 5]
    for cp in (1, 2, 4):
        held = sorted(p for r in range(cp) for p in gc.cp_chunk_positions(32, cp, r))
        assert held == list(range(32))
    with pytest.raises(ValueError):
        gc.cp_chunk_positions(30, 4, 0)  # not divisible into 2*cp chunks
    with pytest.raises(ValueError):
        gc.cp_chunk_positions(32, 2, 2)


def test_mtp_token_counts_follow_the_rolled_mask():
    # one MTP layer: the last position of each sequence has no MTP label; it is in chunk
    # 2cp-1, held by CP rank 0
    assert gc.mtp_token_counts(32, 2, 1, 0) == (62, 62)
    assert gc.mtp_token_counts(32, 2, 2, 0) == (30, 62)
    assert gc.mtp_token_counts(32, 2, 2, 1) == (32, 62)
    for cp in (2, 4):
        assert sum(gc.mtp_token_counts(32, 2, cp, r)[0] for r in range(cp)) == 62


# -- CP=1 vs CP=2 comparison ------------------------------------------------------------------

REF = {
    "main_loss": 4.85,
    "mtp_loss": 4.86,
    "mtp_grad_norm": 0.1,
    "decoder_grad_norm": 0.12,
    "mtp_grad_rel_l2": 0.0,
}


def by_metric(comps):
    return {c.metric: c for c in comps}


def test_compare_passes_within_tolerance():
    got = {
        "main_loss": 4.85 * (1 + 9e-3),
        "mtp_loss": 4.86,
        "mtp_grad_norm": 0.1 * (1 - 4.9e-2),
        "decoder_grad_norm": 0.12,
        "mtp_grad_rel_l2": 0.049,
    }
    comps = gc.compare_cp_metrics(REF, got)
    assert [c.metric for c in comps] == [
        "main_loss",
        "mtp_loss",
        "mtp_grad_norm",
        "decoder_grad_norm",
        "mtp_grad_rel_l2",
    ]
    assert all(c.ok for c in comps), [c.describe() for c in comps]
    assert "FAIL" not in "; ".join(c.describe() for c in comps)


def test_compare_stated_tolerances():
    tol = {m: t for m, _, t, _ in gc.CP_COMPARE_METRICS}
    assert tol == {
        "main_loss": 1e-2,
        "mtp_loss": 1e-2,
        "mtp_grad_norm": 5e-2,
        "decoder_grad_norm": 5e-2,
        "mtp_grad_rel_l2": 5e-2,
    }


@pytest.mark.parametrize(
    "metric, value",
    [
        ("main_loss", 4.85 * 1.011),
        ("mtp_loss", 4.86 * 0.98),
        ("mtp_grad_norm", 0.1 * 1.06),
        ("decoder_grad_norm", 0.12 * 0.9),
        ("mtp_grad_rel_l2", 0.051),
        ("main_loss", float("nan")),
        ("mtp_grad_norm", float("inf")),
    ],
)
def test_compare_fails_outside_tolerance(metric, value):
    got = dict(REF, **{metric: value})
    comps = by_metric(gc.compare_cp_metrics(REF, got))
    assert not comps[metric].ok
    assert comps[metric].describe().endswith("FAIL")
    assert all(c.ok for m, c in comps.items() if m != metric)


def test_compare_zero_reference():
    # mtp-only: no decoder gradient on either side is a match; a leak on one side is not
    assert by_metric(
        gc.compare_cp_metrics(dict(REF, decoder_grad_norm=0.0), dict(REF, decoder_grad_norm=0.0))
    )["decoder_grad_norm"].ok
    assert not by_metric(
        gc.compare_cp_metrics(dict(REF, decoder_grad_norm=0.0), dict(REF, decoder_grad_norm=1e-6))
    )["decoder_grad_norm"].ok
    assert gc.relative_difference(0.0, 0.0) == 0.0
    assert gc.relative_difference(0.0, 1.0) == float("inf")
    assert gc.relative_difference(2.0, 2.1) == pytest.approx(0.05)


def test_compare_missing_metrics():
    # optional metrics missing on both sides are left out; required ones fail
    ref = {k: v for k, v in REF.items() if k != "mtp_loss"}
    comps = by_metric(gc.compare_cp_metrics(ref, dict(ref)))
    assert "mtp_loss" not in comps and all(c.ok for c in comps.values())
    comps = by_metric(gc.compare_cp_metrics(REF, {k: v for k, v in REF.items() if k != "mtp_grad_norm"}))
    assert not comps["mtp_grad_norm"].ok and "missing" in comps["mtp_grad_norm"].describe()
    comps = by_metric(gc.compare_cp_metrics(REF, dict(REF, mtp_loss=None)))  # one side only: fail
    assert not comps["mtp_loss"].ok
    comps = by_metric(gc.compare_cp_metrics({}, {}))
    assert {m for m, c in comps.items() if not c.ok} == {"main_loss", "mtp_grad_norm", "mtp_grad_rel_l2"}


class FakeTensor(list):
    """Just enough of a tensor for the tracker helpers: indexing and zero_()."""

    def zero_(self):
        self[:] = [0.0] * len(self)
        return self


@pytest.mark.parametrize("key", ["loss_values", "values"])  # megatron-core 0.19 / 0.18 layouts
def test_mtp_tracker_helpers_handle_both_layouts(key):
    tracker = {key: FakeTensor([4.88]), "reduce_group": None}
    assert gc.mtp_tracker_loss(tracker) == pytest.approx(4.88)
    gc.zero_mtp_tracker(tracker)
    assert tracker[key] == [0.0]


def test_mtp_tracker_helpers_before_anything_was_tracked():
    # megatron-core 0.18's own clean_loss_in_tracker raises KeyError('values') here
    for tracker in ({}, {"reduce_group": None, "avg_group": None}, None):
        gc.zero_mtp_tracker(tracker)
        assert gc.mtp_tracker_loss(tracker) is None


def test_transformer_engine_at_cp1_uses_te_layers_in_bf16():
    # --transformer-impl transformer_engine: CP=1 runs TE layers (bf16), as Megatron's default
    # transformer implementation trains; the default CP=1 path stays fp32 local attention
    te = gc.precision_plan(1, te=True)
    assert (te.cp, te.dtype, te.needs_te) == (1, "bfloat16", True)
    assert not gc.precision_plan(1).needs_te
    assert (
        gc.parse_args(["--transformer-impl", "transformer_engine"]).transformer_impl == "transformer_engine"
    )
    assert gc.parse_args([]).transformer_impl == "local"


# -- issue 45: the gradient contract judged on recorded results ------------------------------
# tests/fixtures/gradcheck/*.json: gpu_check.py --cpu-model --json reports recorded 2026-12-05 on
# this machine's CPU (torch 2.13.0+cpu, megatron-core 0.19.1 = Megatron-LM 5be96267, verl 0.9.1's
# mtp_patch.py, byte-identical to verl 7bc80c00's), each with the overrides its name says.
GRADS = ROOT / "tests" / "fixtures" / "gradcheck"
# (record file, check, contract, rule the judge must give; None: the contract holds)
RECORDED = [
    ("load-only.json", "load-only", "load-only", None),
    ("full-recompute.json", "full", "full", None),
    ("full-recompute.json", "cp-recompute[full]", "full", None),
    ("mtp-detach.json", "mtp-only", "mtp-only", None),
    ("mtp-cp-recompute.json", "mtp-only", "mtp-only", None),
    ("mtp-cp-recompute.json", "cp-recompute[mtp-only]", "mtp-only", None),
    # today's (2026-12-03) mtp-cp-recompute overrides: verl's detach alone, the output layer leaks
    ("mtp-cp-recompute-2026-12-03.json", "mtp-only", "mtp-only", "mtp-loss-leak"),
    ("mtp-cp-recompute-2026-12-03.json", "cp-recompute[mtp-only]", "mtp-only", "mtp-loss-leak"),
    # detach_encoder + mtp_detach_heads: exact without recompute, MTP silently stops under it
    ("detach-encoder-heads-recompute.json", "mtp-only", "mtp-only", None),
    ("detach-encoder-heads-recompute.json", "cp-recompute[mtp-only]", "mtp-only", "mtp-no-gradient"),
]


def _record(name: str, check: str):
    report = json.loads((GRADS / name).read_text())
    return report, gc.GradRecord.from_dict(report["env"]["gradients"][check])


@pytest.mark.parametrize("name, check, contract, rule", RECORDED, ids=lambda v: str(v))
def test_the_gradient_contract_is_judged_on_recorded_results(name, check, contract, rule):
    report, rec = _record(name, check)
    failure = gc.judge_mtp_loss_gradients(contract, rec)
    got = None if failure is None else (failure.rule or "fail")
    assert got == rule, (failure, rec.describe())
    # the script's own verdict in that run was the judge's
    [row] = [c for c in report["checks"] if c["name"] == check]
    assert row["status"] == ("PASS" if rule is None else "FAIL") and row["rule"] == rule


def test_each_contract_fails_on_a_record_that_breaks_it():
    _, full = _record("full-recompute.json", "full")
    _, exact = _record("mtp-cp-recompute.json", "mtp-only")
    _, leak = _record("mtp-cp-recompute-2026-12-03.json", "mtp-only")
    _, lo = _record("load-only.json", "load-only")
    # full's record is a leak for mtp-only (the decoder and the embedding got gradient)...
    assert gc.judge_mtp_loss_gradients("mtp-only", full).rule == "mtp-loss-leak"
    # ...and the exact mtp-only record fails full (no gradient reached the decoder)
    assert "decoder" in str(gc.judge_mtp_loss_gradients("full", exact))
    # load-only: a record with MTP gradient means an MTP loss is active
    assert "load-only" in str(gc.judge_mtp_loss_gradients("load-only", exact))
    assert gc.judge_mtp_loss_gradients("load-only", lo) is None
    # the output layer alone is enough to fail mtp-only
    assert "output_layer" in str(gc.judge_mtp_loss_gradients("mtp-only", leak))


def test_the_profile_settings_are_read_from_its_overrides(tmp_path):
    lines = [
        "model.mtp.enable=True",
        "model.mtp.detach_encoder=False",
        "engine.override_transformer_config.recompute_granularity=full",
        "engine.override_transformer_config.recompute_num_layers=1",
        "+engine.override_transformer_config.mtp_detach_heads=True",
        "+engine.override_transformer_config.gradient_accumulation_fusion=False",  # not a model setting
    ]
    s = gc.parse_overrides(lines)
    assert s.detach_encoder is False and s.recompute
    assert s.config() == {
        "mtp_detach_heads": True,
        "recompute_granularity": "full",
        "recompute_num_layers": 1,
    }
    kw = gc.transformer_config_kwargs(gc.precision_plan(1), True, s)
    assert kw["mtp_detach_heads"] is True and kw["recompute_num_layers"] == 1
    rl = gc.parse_overrides(["actor_rollout_ref.model.mtp.detach_encoder=True"])
    assert rl.detach_encoder is True and rl.config() == {}
    path = tmp_path / "sft.overrides"
    path.write_text("\n".join(lines) + "\n")
    vv = tmp_path / "version.json"
    vv.write_text(json.dumps({"mode": "mtp-only", "mtp_contract": "mtp-only", "engine": {}}))
    plan = gc.resolve_plan(None, str(vv), overrides=str(path))
    assert plan.settings.detach_encoder is False and plan.settings.source == str(path)
    with pytest.raises(gc.UsageError):
        gc.resolve_plan(None, str(vv), overrides=str(tmp_path / "missing"))


def test_the_cpu_model_swaps_every_cuda_only_norm_in_a_spec():
    """--cpu-model in a real image: TE's TENorm and apex's FusedLayerNorm are installed and
    megatron picks them even for its local spec; the CPU model swaps each for torch's norm,
    wherever it sits in the spec (a ModuleSpec's module, a submodules field, a list of layers)."""

    class TENorm: ...

    class FusedLayerNorm: ...

    class TorchNorm: ...

    class Attention: ...

    @dataclasses.dataclass
    class Spec:
        module: type
        params: dict = dataclasses.field(default_factory=dict)
        submodules: object = None

    @dataclasses.dataclass
    class LayerSubmodules:
        input_layernorm: object = None
        self_attention: object = None
        pre_mlp_layernorm: object = None

    @dataclasses.dataclass
    class MtpBlock:
        layer_specs: list

    layer = Spec(Attention, {"k": 1}, LayerSubmodules(FusedLayerNorm, Spec(Attention), Spec(TENorm)))
    swap = {TENorm: TorchNorm, FusedLayerNorm: TorchNorm}
    out = gc.swap_classes(MtpBlock([layer, layer]), swap)
    for spec in out.layer_specs:
        assert spec.module is Attention and spec.params == {"k": 1}
        assert spec.submodules.input_layernorm is TorchNorm
        assert spec.submodules.pre_mlp_layernorm.module is TorchNorm
        assert spec.submodules.self_attention.module is Attention
    assert layer.submodules.input_layernorm is FusedLayerNorm  # a copy: the original spec is kept
