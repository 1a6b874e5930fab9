#!/usr/bin/env python3
"""In-image trainer check: verl's own SFT trainer, Megatron engine, on a tiny MTP model.

Copied into every image at /opt/mtp/checks/trainer_check.py and run by `build.py test --gpu`
(run_checks.py --gpu); also by hand on any NVIDIA node that runs the image:

    python trainer_check.py [--json] [--steps 4] [--variants] [--work DIR]

It makes, at test time and without a hub, a random-init MiMo (Qwen2 + one MTP layer; its own
configuration_mimo.py, since transformers has no `mimo` type), a byte-level BPE tokenizer with a
ChatML template and a small chat data set; then runs `torchrun -m verl.trainer.sft_trainer`
(through trainer_probe.py, which only observes) with exactly the image's verl overrides
(/opt/mtp/verl/sft.overrides, what `explain --target sft` prints) plus test-size settings, and
asserts what the profile's mode promises (the contract in the version vector):

  every mode    exit 0; finite losses that fall from the first step to the last
  load-only     no mtp_1_loss; MTP parameters get no gradient, are in the exported HF
                checkpoint (model/huggingface) and unchanged there while the trunk moved
  full          mtp_1_loss logged and falling; with the main loss scaled to 0 the MTP loss
                alone reaches the trunk (decoder and embedding gradients non-zero)
  mtp-only      mtp_1_loss logged and falling; with the main loss at 0: exactly zero gradient
                in the decoder, the embedding and the output layer (shared with the main head),
                non-zero in every MTP parameter; the main loss equal, to every printed digit,
                to a load-only run with the same engine settings made in the same invocation
                (the image's overrides with the mode's MtpConfig lines but `enable` and
                mtp_detach_heads left out): the main model trains exactly as with MTP off
  + recompute   the same under full recompute (the overrides say so): every MTP parameter must
                still get gradient (a detach that leaves nothing requiring grad stops MTP
                training silently)

--variants adds, as evidence, the MTP-loss-only runs of the configurations mtp-only had before
issue 45, read off the image's own recipe (its `*.mtp.detach_encoder=` and `*mtp_detach_heads=`
lines), reported but not judged: verl's detach_encoder=True alone (the output layer gets MTP-loss
gradient) and detach_encoder=True with mtp_detach_heads (under full recompute the MTP block gets
none: verl's copy of _get_embeddings lacks Megatron's checkpoint guard). A variant that is the
image's own recipe is left out. Context parallelism above the GPU
count is lowered to what the node has, and said so. Where flash-attn or apex is absent (an
image built with them omitted), the stand-in settings verl's path then needs are added and
named in the report.

Exit codes: 0 every check passed, 1 a check failed, 2 usage error, 77 no CUDA device.
Only the standard library is imported at module level: the judging is testable without torch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tinymimo

HERE = Path(__file__).resolve().parent
PROBE = HERE / "trainer_probe.py"
DEFAULT_VECTOR = Path(os.environ.get("MTP_VERSION_VECTOR", "/opt/mtp/version.json"))
DEFAULT_OVERRIDES = Path("/opt/mtp/verl/sft.overrides")
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = 0, 1, 2, 77
PASS, FAIL, SKIP, INFO = "pass", "fail", "skip", "info"
RUN_TIMEOUT = float(os.environ.get("MTP_TRAINER_TIMEOUT") or 900)


# ------------------------------------------------------------------------------ the runs
@dataclasses.dataclass(frozen=True)
class Run:
    """One trainer run: its name, its Hydra overrides, whether the main loss is scaled to 0
    (then every gradient is the MTP loss's) and whether its checks count (a variant is evidence)."""

    name: str
    overrides: tuple[str, ...]
    zero_main_loss: bool = False
    variant: bool = False
    saves_hf: bool = False


@dataclasses.dataclass(frozen=True)
class RunResult:
    name: str
    rc: int
    seconds: float
    metrics: tuple[dict, ...]  # one per step: {"step": n, "data": {...}}, verl's file logger
    grads: tuple[dict, ...]  # one per step: trainer_probe.py's lines
    export: dict | None = None  # {"mtp": {same, changed, missing}, "trunk": {...}}
    log_tail: str = ""


@dataclasses.dataclass(frozen=True)
class Finding:
    id: str
    status: str
    detail: str


def setting_key(line: str) -> str:
    return line.split("=", 1)[0].lstrip("+")


def has_setting(lines: tuple[str, ...] | list[str], name: str, value: str = "True") -> bool:
    return any(setting_key(ln).endswith(f".{name}") and ln.split("=", 1)[1] == value for ln in lines)


def recompute_full(lines) -> bool:
    return has_setting(lines, "recompute_granularity", "full")


def fit_to_node(lines: list[str], gpus: int) -> tuple[list[str], list[str]]:
    """Lower a context parallel size above the node's GPU count (said in the notes)."""
    out, notes = [], []
    for ln in lines:
        key, _, value = ln.partition("=")
        if setting_key(ln).endswith("context_parallel_size") and value.isdigit() and int(value) > gpus:
            out.append(f"{key}={gpus}")
            notes.append(f"{setting_key(ln)}: {value} -> {gpus} (this node has {gpus} GPU(s))")
        else:
            out.append(ln)
    return out, notes


def stand_ins(have_flash_attn: bool, have_apex_fusion: bool, prefix: str) -> tuple[list[str], list[str]]:
    """Settings verl's Megatron path needs where an extension is missing from the image."""
    lines, notes = [], []
    if not have_flash_attn:
        # verl defaults attention_backend: flash (trainer/config/engine/megatron.yaml:93)
        lines.append(f"{prefix}attention_backend=fused")
        notes.append("flash-attn absent: attention_backend=fused (stand-in)")
    if not have_apex_fusion:
        # Bridge turns gradient_accumulation_fusion on whenever TE imports (utils/fusions.py:50)
        lines.append(f"+{prefix}gradient_accumulation_fusion=False")
        notes.append(
            "apex's fused_weight_gradient_mlp_cuda absent: gradient_accumulation_fusion=False (stand-in)"
        )
    return lines, notes


def test_size(work: Path, run: str, steps: int, gpus: int) -> list[str]:
    """The settings of a test-sized run: data, model, schedule, logging and checkpoints only;
    nothing of what the mode or the engine decides."""
    contents = "[model,optimizer,extra,hf_model]" if run == "train" else "[model]"
    return [
        f"data.train_files={work / 'data' / 'train.parquet'}",
        "data.val_files=null",
        "data.train_batch_size=16",
        "data.micro_batch_size_per_gpu=4",
        "data.max_length=256",
        "data.use_dynamic_bsz=True",
        "data.max_token_len_per_gpu=2048",
        "data.messages_key=messages",
        "data.num_workers=0",
        "data.ignore_input_ids_mismatch=True",
        f"model.path={work / 'model'}",
        "model.trust_remote_code=True",
        "optim.lr=1e-3",
        f"checkpoint.save_contents={contents}",
        "trainer.logger=[console,file]",
        "trainer.project_name=mtp-trainer-check",
        f"trainer.experiment_name={run}",
        f"trainer.default_local_dir={work / 'runs' / run / 'ckpt'}",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={gpus}",
    ]


def setting_value(lines, name: str) -> str | None:
    """The value of the last override whose key ends with `.NAME` (Hydra: the last one wins)."""
    found = None
    for ln in lines:
        if setting_key(ln).endswith(f".{name}"):
            found = ln.split("=", 1)[1]
    return found


def mtp_prefix(lines) -> str:
    """The MtpConfig key prefix of these overrides (`model.mtp.` for SFT), from their `enable` line."""
    for ln in lines:
        key = setting_key(ln)
        if key.endswith(".mtp.enable"):
            return key[: -len("enable")]
    return "model.mtp."


# The MtpConfig field that a load-only reference keeps: MTP built and loaded, not trained.
LOAD_ONLY_KEEPS = ("enable",)


def load_only_of(lines) -> tuple[str, ...]:
    """The same overrides as load-only: every MtpConfig line but `enable` dropped (enable_train
    then defaults to False) and Megatron's mtp_detach_heads with them; the engine's settings
    (recompute, context parallelism, stand-ins) stay, so only MTP training differs."""
    prefix = mtp_prefix(lines)
    out = []
    for ln in lines:
        key = setting_key(ln)
        if key.startswith(prefix) and key[len(prefix) :] not in LOAD_ONLY_KEEPS:
            continue
        if key.endswith(".mtp_detach_heads"):
            continue
        out.append(ln)
    return tuple(out)


def with_recipe(lines, detach_encoder: str, detach_heads: bool, transformer_prefix: str) -> tuple[str, ...]:
    """These overrides with verl's detach_encoder and Megatron's mtp_detach_heads set as given."""
    prefix = mtp_prefix(lines)
    out = [
        ln
        for ln in lines
        if not setting_key(ln).endswith(".mtp_detach_heads") and setting_key(ln) != f"{prefix}detach_encoder"
    ]
    out.append(f"{prefix}detach_encoder={detach_encoder}")
    if detach_heads:
        # not in verl's override_transformer_config struct: Hydra needs `+` to add it
        out.append(f"+{transformer_prefix}mtp_detach_heads=True")
    return tuple(out)


# The mtp-only configurations before issue 45 (detach_encoder, mtp_detach_heads), as evidence:
# verl's detach alone lets the MTP loss reach the output layer (megatron-core >= 0.19 detaches
# the output weight only under mtp_detach_heads); with mtp_detach_heads as well, full recompute
# leaves no input of the checkpointed MTP layer requiring grad (verl's _get_embeddings copy has
# no checkpoint guard) and the MTP block gets no gradient.
OLD_RECIPES = (
    ("detach_encoder", "True", False),
    ("detach_encoder+mtp_detach_heads", "True", True),
)


def recipe_of(lines) -> tuple[str, bool]:
    """(detach_encoder, mtp_detach_heads) as these overrides say (verl's default: False)."""
    return (setting_value(lines, "detach_encoder") or "False"), has_setting(lines, "mtp_detach_heads")


def plan_runs(contract: str, lines: list[str], prefix: str, variants: bool) -> list[Run]:
    """The runs a contract needs. `lines`: the image's overrides, adjusted to the node;
    `prefix`: the TransformerConfig override prefix."""
    base = tuple(lines)
    runs = [Run("train", base, saves_hf=True)]
    if contract in ("full", "mtp-only"):
        runs.append(Run("mtp-loss-only", base, zero_main_loss=True))
    if contract == "mtp-only":
        runs.append(Run("load-only", load_only_of(base)))
    if variants and contract == "mtp-only":
        own = recipe_of(base)
        for name, detach_encoder, heads in OLD_RECIPES:
            if (detach_encoder, heads) != own:
                flipped = with_recipe(base, detach_encoder, heads, prefix)
                runs.append(Run(f"mtp-loss-only:{name}", flipped, zero_main_loss=True, variant=True))
    return runs


# ------------------------------------------------------------------------------ judging
def series(metrics: tuple[dict, ...], suffix: str) -> list[float]:
    """One metric per step from verl's file logger, by the end of its key (`train/loss`,
    `train/mtp_losses/mtp_1_loss`): verl's key prefixes differ between versions."""
    out = []
    for row in sorted(metrics, key=lambda r: r.get("step", 0)):
        values = [v for k, v in (row.get("data") or {}).items() if k == suffix or k.endswith("/" + suffix)]
        if values:
            out.append(float(values[0]))
    return out


# A loss "falls" when its last step is at least this much below its first: 4 steps at lr 1e-3
# took the tiny model's losses down 28-37% on an H200, while an MTP block that got no gradient
# (mtp_detach_heads under full recompute) left mtp_1_loss flat within 0.3%.
MIN_DROP = 0.05


def falling(values: list[float]) -> bool:
    return (
        len(values) >= 2
        and all(math.isfinite(v) for v in values)
        and values[-1] <= values[0] * (1 - MIN_DROP)
    )


# The digits a loss is printed with (reports, docs/gpu.md): "equal to every printed digit" means
# equal when rounded to these many decimals.
PRINTED_DECIMALS = 4


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.{PRINTED_DECIMALS}f}" for v in values) or "none"


def same_printed(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) > 0 and _fmt(a) == _fmt(b)


def _group(r: RunResult, name: str) -> dict:
    first = r.grads[0]["groups"] if r.grads else {}
    return first.get(name) or {"params": 0, "nonzero": 0, "norm": 0.0}


def _grad_line(g: dict) -> str:
    return f"{g['nonzero']}/{g['params']} with gradient (norm {g['norm']:.6g})"


def judge(contract: str, lines: list[str], results: dict[str, RunResult]) -> list[Finding]:
    """What the mode promises, judged on the recorded runs (verl's metrics, the probe's
    gradients, the export comparison). Pure: tests feed it recorded logs."""
    out: list[Finding] = []
    trains = contract in ("full", "mtp-only")
    recompute = recompute_full(lines)
    tag = "+recompute" if recompute else ""
    for name, r in results.items():
        if r.rc != 0:
            out.append(
                Finding(f"run:{name}", FAIL, f"exit {r.rc} after {r.seconds:.0f} s: {r.log_tail[-400:]}")
            )
    train = results.get("train")
    if train is not None and train.rc == 0:
        loss = series(train.metrics, "loss")
        ok = falling(loss)
        out.append(Finding("loss-falls", PASS if ok else FAIL, f"loss steps 1-{len(loss)}: {_fmt(loss)}"))
        mtp = series(train.metrics, "mtp_1_loss")
        if trains:
            ok = falling(mtp)
            out.append(Finding("mtp-loss-logged-and-falls", PASS if ok else FAIL, f"mtp_1_loss: {_fmt(mtp)}"))
        else:
            out.append(
                Finding(
                    "no-mtp-loss",
                    PASS if not any(v > 0 for v in mtp) else FAIL,
                    f"mtp_1_loss: {_fmt(mtp)} (load-only trains no MTP)",
                )
            )
        g = _group(train, "mtp")
        if contract == "load-only":
            ok = g["params"] > 0 and g["nonzero"] == 0
            out.append(Finding("mtp-params-no-gradient", PASS if ok else FAIL, "MTP block: " + _grad_line(g)))
            exp = train.export
            if exp is None:
                out.append(
                    Finding("export-keeps-mtp", FAIL, "no HF checkpoint found under model/huggingface")
                )
            else:
                m, t = exp["mtp"], exp["trunk"]
                ok = m["missing"] == 0 and m["changed"] == 0 and m["same"] > 0 and t["changed"] > 0
                out.append(
                    Finding(
                        "export-keeps-mtp",
                        PASS if ok else FAIL,
                        f"exported HF checkpoint: MTP tensors {m['same']} unchanged, {m['changed']} changed, "
                        f"{m['missing']} missing; trunk {t['changed']} of {t['changed'] + t['same']} changed",
                    )
                )
    zero = results.get("mtp-loss-only")
    if trains and zero is not None and zero.rc == 0:
        mtp = series(zero.metrics, "mtp_1_loss")
        loss = series(zero.metrics, "loss")
        out.append(
            Finding(
                f"mtp-loss-alone-learns{tag}",
                PASS if falling(mtp) and all(v == 0 for v in loss) else FAIL,
                f"main loss scaled to 0: loss {_fmt(loss)}; mtp_1_loss {_fmt(mtp)}",
            )
        )
        g = _group(zero, "mtp")
        ok = g["params"] > 0 and g["nonzero"] == g["params"]
        out.append(
            Finding(f"mtp-params-get-gradient{tag}", PASS if ok else FAIL, "MTP block: " + _grad_line(g))
        )
        dec, emb, head = (_group(zero, k) for k in ("decoder", "embedding", "output_layer"))
        trunk = f"decoder {_grad_line(dec)}; embedding {_grad_line(emb)}"
        if contract == "full":
            ok = dec["nonzero"] > 0 and emb["nonzero"] > 0
            out.append(Finding("mtp-loss-reaches-trunk", PASS if ok else FAIL, trunk))
        else:
            ok = dec["params"] > 0 and dec["nonzero"] == 0 and emb["nonzero"] == 0
            out.append(Finding(f"trunk-untouched-by-mtp-loss{tag}", PASS if ok else FAIL, trunk))
            # the output layer is shared with the main head: an MTP-loss gradient there trains
            # the main model (verl's detach_encoder alone leaves it, megatron-core >= 0.19)
            ok = head["params"] > 0 and head["nonzero"] == 0
            detach_encoder, detach_heads = recipe_of(lines)
            out.append(
                Finding(
                    f"output-layer-untouched-by-mtp-loss{tag}",
                    PASS if ok else FAIL,
                    f"output layer: {_grad_line(head)} "
                    f"(detach_encoder={detach_encoder}, mtp_detach_heads={detach_heads})",
                )
            )
    ref = results.get("load-only")
    if contract == "mtp-only" and train is not None and train.rc == 0 and ref is not None and ref.rc == 0:
        main, base = series(train.metrics, "loss"), series(ref.metrics, "loss")
        ok = same_printed(main, base)
        exact = "bit-identical" if main == base else "not bit-identical"
        out.append(
            Finding(
                f"main-loss-equals-load-only{tag}",
                PASS if ok else FAIL,
                f"loss {_fmt(main)}; load-only with the same engine settings {_fmt(base)} ({exact})",
            )
        )
    for name, r in results.items():
        if r.rc == 0 and name.startswith("mtp-loss-only:"):
            g, head = _group(r, "mtp"), _group(r, "output_layer")
            mtp = series(r.metrics, "mtp_1_loss")
            out.append(
                Finding(
                    f"variant:{name.split(':', 1)[1]}{tag}",
                    INFO,
                    f"MTP block {_grad_line(g)}; output layer {_grad_line(head)}; mtp_1_loss {_fmt(mtp)}",
                )
            )
    return out


# ------------------------------------------------------------------------------ running
def _jsonl(path: Path) -> tuple[dict, ...]:
    if not path.is_file():
        return ()
    return tuple(json.loads(ln) for ln in path.read_text().splitlines() if ln.strip())


def launch(run: Run, work: Path, gpus: int, extra: list[str], steps: int) -> RunResult:
    """One torchrun of verl's trainer through the probe, its log in runs/NAME/trainer.log."""
    rundir = work / "runs" / run.name.replace(":", "_")
    rundir.mkdir(parents=True, exist_ok=True)
    metrics, grads, log = rundir / "metrics.jsonl", rundir / "grads.jsonl", rundir / "trainer.log"
    for p in (metrics, grads):
        p.unlink(missing_ok=True)
    args = list(run.overrides) + extra + test_size(work, run.name.replace(":", "_"), steps, gpus)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={gpus}",
    ]
    env = {
        **os.environ,
        "MTP_PROBE_OUT": str(grads),
        "MTP_PROBE_ZERO_MAIN_LOSS": "1" if run.zero_main_loss else "0",
        "VERL_FILE_LOGGER_PATH": str(metrics),
        "PYTHONUNBUFFERED": "1",
    }
    (rundir / "command.json").write_text(json.dumps(cmd + [str(PROBE)] + args, indent=1))
    started = time.monotonic()
    with open(log, "wb") as out:
        try:
            rc = subprocess.run(
                cmd + [str(PROBE)] + args,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=rundir,
                env=env,
                timeout=RUN_TIMEOUT,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    seconds = time.monotonic() - started
    tail = log.read_text(errors="replace")[-2000:]
    export = None
    if run.saves_hf and rc == 0:
        export = tinymimo.compare_export(work / "model" / "model.safetensors", rundir / "ckpt")
    return RunResult(run.name, rc, seconds, _jsonl(metrics), _jsonl(grads), export, tail)


def summary(r: RunResult) -> dict:
    peak = max((g.get("peak_gib") or 0 for g in r.grads), default=None)
    return {
        "name": r.name,
        "rc": r.rc,
        "seconds": round(r.seconds, 1),
        "loss": series(r.metrics, "loss"),
        "mtp_1_loss": series(r.metrics, "mtp_1_loss"),
        "step_seconds": [g.get("seconds") for g in r.grads],
        "peak_gib": peak,
        "grads_step1": r.grads[0]["groups"] if r.grads else {},
        "export": r.export,
    }


# ------------------------------------------------------------------------------ main
def contract_of(vector: dict) -> str:
    return vector.get("mtp_contract") or {"mtp-only": "mtp-only", "rollout": "mtp-only"}.get(
        vector.get("mode", ""), vector.get("mode", "")
    )


def table(findings: list[Finding]) -> str:
    width = max((len(f.id) for f in findings), default=10)
    return "\n".join(f"{f.status.upper():5} {f.id:<{width}}  {f.detail}" for f in findings)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--variants", action="store_true", help="also the runs with the mode's settings flipped")
    ap.add_argument("--work", type=Path, help="where the model, data and runs go (default: a temp dir)")
    ap.add_argument("--version-vector", type=Path, default=DEFAULT_VECTOR)
    ap.add_argument("--overrides", type=Path, default=DEFAULT_OVERRIDES)
    ap.add_argument("--jobs", type=int, default=0, help="runs at once (default: all)")
    args = ap.parse_args(argv)
    try:
        vector = json.loads(args.version_vector.read_text())
        lines = [ln for ln in args.overrides.read_text().splitlines() if ln.strip()]
    except (OSError, ValueError) as exc:
        print(f"trainer_check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    contract = contract_of(vector)
    if contract not in ("load-only", "full", "mtp-only"):
        print(f"trainer_check: unknown MTP contract {contract!r} in {args.version_vector}", file=sys.stderr)
        return EXIT_USAGE
    import importlib.util

    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print("trainer_check: no CUDA device", file=sys.stderr)
        return EXIT_SKIP
    prefix = "engine.override_transformer_config."
    lines, notes = fit_to_node(lines, gpus)
    extra, more = stand_ins(
        importlib.util.find_spec("flash_attn") is not None,
        importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None,
        prefix,
    )
    notes += more
    work = args.work or Path(tempfile.mkdtemp(prefix="mtp-trainer-check-"))
    tinymimo.make(work)
    runs = plan_runs(contract, lines, prefix, args.variants)
    with concurrent.futures.ThreadPoolExecutor(args.jobs or len(runs)) as pool:
        futures = {r.name: pool.submit(launch, r, work, gpus, extra, args.steps) for r in runs}
        results = {name: f.result() for name, f in futures.items()}
    findings = judge(contract, lines, results)
    failed = any(f.status == FAIL for f in findings)
    report = {
        "ok": not failed,
        "contract": contract,
        "profile": vector.get("profile"),
        "overrides": lines,
        "stand_ins": extra,
        "notes": notes,
        "gpus": gpus,
        "runs": [summary(r) for r in results.values()],
        "results": [dataclasses.asdict(f) for f in findings],
        "work": str(work),
    }
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        for note in notes:
            print(f"note: {note}")
        print(table(findings))
    return EXIT_FAIL if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
