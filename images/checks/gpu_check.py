#!/usr/bin/env python3
"""In-image GPU check for verl + Megatron Multi-Token-Prediction (MTP) training.

Copied into every image at /opt/mtp/checks/gpu_check.py; also runnable by hand:

    python gpu_check.py --mode {load-only,full,mtp-only,cp-recompute,all} \
        [--version-vector PATH] [--json] [--cpu-only]
    torchrun --nproc-per-node 2 gpu_check.py --mode cp-recompute   # adds the CP=2 checks

It builds a tiny megatron-core GPTModel with one MTP layer on the installed stack,
applies the installed verl's own MTP patching (verl/models/mcore/mtp_patch.py, loaded
by file path so that all of verl is not imported) and runs an optimizer step in the
requested mode, asserting what that mode promises:

  load-only     MTP parameters exist (mtp.layers.0.*), are in the saved state dict,
                get no MTP loss and do not change after the step.
  full          the MTP loss alone gives non-zero gradients to trunk parameters.
  mtp-only      (verl detach_encoder) the MTP loss alone gives exactly zero gradients
                to the trunk (decoder + embedding) and non-zero gradients to every
                MTP parameter.
  cp-recompute  recompute_granularity=full, recompute_method=uniform,
                recompute_num_layers=1: the step completes and every MTP parameter still
                gets a non-zero gradient. Under a 2-rank torchrun also at
                context_parallel_size=2, in bf16 with TransformerEngine attention (CP=1
                stays fp32 with megatron's local attention; see precision_plan), compared
                with a CP=1 bf16 run of the same weights and tokens (CP_COMPARE_METRICS).
  rollout       (version vector only) checked like mtp-only; see docs/gpu.md.

Exit codes: 0 every check passed (SKIPs allowed), 1 a check failed, 2 usage error
(bad mode, unreadable version vector), 77 no CUDA device and --cpu-only not given
(the automake/ctest "skipped" convention).

Only the standard library is imported at module level: the pure logic (mode table,
version-vector parsing, exception -> rule id mapping, report formatting, exit codes)
is importable and testable without torch. torch and megatron.core are imported lazily.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_SKIP = 77

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

DEFAULT_VERSION_VECTOR = "/opt/mtp/version.json"

# The training contracts this script checks: load-only (MTP weights kept, not trained), full
# (the MTP loss reaches the trunk), mtp-only (it does not; verl detach_encoder).
CONTRACTS = ("load-only", "full", "mtp-only")
CLI_MODES = CONTRACTS + ("cp-recompute", "all")
# A profile's mode names its contract in the version vector (`mtp_contract`), derived by the
# builder from the mode's verl MtpConfig fields (mtpimage/manifests/modes.py), so a new mode needs no
# change here. Version vectors written before that field carry only `mode`, one of these;
# rollout (enable_rollout: MTP drafts tokens for SGLang/vLLM speculative decoding) extends
# mtp-only and is checked as such: the draft layers must keep learning. The speculative
# decoding itself is not exercised by this script.
CONTRACT_OF_OLD_VECTOR_MODE = {
    "load-only": "load-only",
    "full": "full",
    "mtp-only": "mtp-only",
    "rollout": "mtp-only",
}


RULE_RECOMPUTE_PADDING_MASK = "recompute-padding-mask"
RULE_MTP_NO_GRADIENT = "mtp-no-gradient"
MSG_MTP_NO_GRADIENT = "MTP parameters received no gradient"

_PADDING_MASK_RE = re.compile(r"_checkpointed_forward\(\) got an unexpected keyword argument 'padding_mask'")


# ----------------------------------------------------------------------------------
# Pure logic (no torch)
# ----------------------------------------------------------------------------------


class UsageError(Exception):
    """Bad command line or version vector (exit code 2)."""


class CheckFailure(Exception):
    """A check's assertion failed; carries the rule id where one exists."""

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


@dataclasses.dataclass(frozen=True)
class CheckSpec:
    """One check to run. kind: env | training."""

    name: str
    kind: str
    semantics: str | None = None  # load-only | full | mtp-only (training checks)
    recompute: bool = False
    cp: int = 1


@dataclasses.dataclass
class CheckResult:
    name: str
    status: str
    detail: str = ""
    rule: str | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "rule": self.rule}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to run: the resolved mode, where it came from, and the checks."""

    mode: str
    source: str  # "--mode" or the version-vector path
    checks: tuple[CheckSpec, ...]
    engine: dict
    settings: TrainingSettings | None = None  # the profile's, from its overrides


ENV_CHECKS = (
    CheckSpec("torch-cuda", "env"),
    CheckSpec("nccl-allreduce", "env"),
)


def _training(semantics: str, recompute: bool = False, cp: int = 1) -> CheckSpec:
    if not recompute:
        return CheckSpec(semantics, "training", semantics, False, 1)
    name = f"cp-recompute[{semantics}]" if cp == 1 else f"cp-recompute[{semantics},cp={cp}]"
    return CheckSpec(name, "training", semantics, True, cp)


def _recompute_checks(semantics: str, world_size: int, cp_requested: int) -> list[CheckSpec]:
    """CP=1 recompute check always; a CP>1 one when the launch has enough ranks."""
    out = [_training(semantics, recompute=True, cp=1)]
    if cp_requested > 1 and world_size >= cp_requested and world_size % cp_requested == 0:
        out.append(_training(semantics, recompute=True, cp=cp_requested))
    return out


def checks_for_mode(
    mode: str,
    *,
    contract: str | None = None,
    recompute: bool = False,
    world_size: int = 1,
    cp_requested: int | None = None,
) -> list[CheckSpec]:
    """The mode table: which checks a mode runs, in order.

    mode is a CLI mode (load-only, full, mtp-only, cp-recompute, all) or a version-vector
    mode with its contract (the vector's `mtp_contract`; older vectors: one of
    CONTRACT_OF_OLD_VECTOR_MODE). recompute=True (full recompute in the version vector) adds the
    cp-recompute check in the mode's semantics. cp_requested defaults to 2 for the
    cp-recompute/all modes (used only when world_size allows it).
    """
    contract = contract or CONTRACT_OF_OLD_VECTOR_MODE.get(mode)
    if mode not in CLI_MODES and contract not in CONTRACTS:
        known = sorted(set(CLI_MODES) | set(CONTRACT_OF_OLD_VECTOR_MODE))
        raise UsageError(f"unknown mode {mode!r}; expected one of {known}")
    checks = list(ENV_CHECKS)
    if mode == "all":
        cp = 2 if cp_requested is None else cp_requested
        checks += [_training(s) for s in ("load-only", "full", "mtp-only")]
        for s in ("load-only", "full", "mtp-only"):
            checks += _recompute_checks(s, world_size, cp)
        return checks
    if mode == "cp-recompute":
        cp = 2 if cp_requested is None else cp_requested
        for s in ("full", "mtp-only"):
            checks += _recompute_checks(s, world_size, cp)
        return checks
    semantics = contract
    checks.append(_training(semantics))
    if recompute:
        checks += _recompute_checks(semantics, world_size, cp_requested or 1)
    return checks


def parse_version_vector(data: Any, origin: str = "version vector") -> tuple[str, dict]:
    """Validate a version vector; return (mode, normalised engine dict).

    engine = {"context_parallel_size": int >= 1, "recompute": {"granularity": "full"|None,
    "method": str|None, "num_layers": int|None}}. Missing engine keys take defaults.
    """
    if not isinstance(data, dict):
        raise UsageError(f"{origin}: expected a JSON object, got {type(data).__name__}")
    mode = data.get("mode")
    if not isinstance(mode, str) or contract_of(data) not in CONTRACTS:
        raise UsageError(
            f"{origin}: 'mode' must be one of {list(CONTRACT_OF_OLD_VECTOR_MODE)} or come "
            f"with 'mtp_contract' (one of {list(CONTRACTS)}), got {mode!r}"
        )
    engine = data.get("engine") or {}
    if not isinstance(engine, dict):
        raise UsageError(f"{origin}: 'engine' must be an object")
    cp = engine.get("context_parallel_size", 1)
    if cp is None:
        cp = 1
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise UsageError(f"{origin}: engine.context_parallel_size must be an integer >= 1, got {cp!r}")
    rec = engine.get("recompute") or {}
    if not isinstance(rec, dict):
        raise UsageError(f"{origin}: engine.recompute must be an object or null")
    gran = rec.get("granularity")
    if gran not in (None, "full", "selective"):
        raise UsageError(
            f"{origin}: engine.recompute.granularity must be 'full', 'selective' or null, got {gran!r}"
        )
    norm = {
        "context_parallel_size": cp,
        "recompute": {"granularity": gran, "method": rec.get("method"), "num_layers": rec.get("num_layers")},
    }
    return mode, norm


def contract_of(data: dict) -> str | None:
    """The training contract a version vector's mode promises (see CONTRACTS)."""
    return data.get("mtp_contract") or CONTRACT_OF_OLD_VECTOR_MODE.get(data.get("mode"))


def load_version_vector(path: str) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read version vector {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"version vector {path} is not valid JSON: {exc}") from exc
    return data


def resolve_plan(
    mode: str | None, version_vector: str | None, world_size: int = 1, overrides: str | None = None
) -> Plan:
    """--mode wins; without it the mode and engine come from the version vector. The profile's
    training settings come from its overrides (--overrides, else the image's own file); a --mode
    run takes them only from --overrides (else upstream's switch: detach_encoder for mtp-only)."""
    if mode is not None:
        engine = {"context_parallel_size": 2 if mode in ("cp-recompute", "all") else 1, "recompute": {}}
        settings = load_overrides(overrides) if overrides else None
        return Plan(mode, "--mode", tuple(checks_for_mode(mode, world_size=world_size)), engine, settings)
    path = version_vector or DEFAULT_VERSION_VECTOR
    data = load_version_vector(path)
    vmode, engine = parse_version_vector(data, origin=path)
    recompute = engine["recompute"]["granularity"] == "full"
    checks = checks_for_mode(
        vmode,
        contract=contract_of(data),
        recompute=recompute,
        world_size=world_size,
        cp_requested=engine["context_parallel_size"],
    )
    return Plan(vmode, path, tuple(checks), engine, load_overrides(overrides))


# -- the profile's own training settings, read from the overrides verl is started with ---------

DEFAULT_OVERRIDES = ("/opt/mtp/verl/sft.overrides", "/opt/mtp/verl/rl.overrides")
# TransformerConfig fields of a profile's override_transformer_config that change which
# parameters the MTP loss reaches (mtp_detach_heads) or how the MTP layer runs (recompute_*):
# the check's tiny model takes exactly these from the profile. The model's size, dtype and
# parallelism stay the check's own.
MODEL_SETTINGS = ("mtp_detach_heads", "recompute_granularity", "recompute_method", "recompute_num_layers")
TRANSFORMER_PREFIX = "override_transformer_config."


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """What the profile's verl overrides say about the MTP gradient path: MtpConfig's
    detach_encoder (verl then swaps in its _get_embeddings copy: patch_engine_mtp) and the
    TransformerConfig settings of MODEL_SETTINGS. source: the overrides file, or why none."""

    detach_encoder: bool
    transformer: tuple[tuple[str, Any], ...] = ()
    source: str = ""

    def config(self) -> dict:
        return dict(self.transformer)

    @property
    def recompute(self) -> bool:
        return self.config().get("recompute_granularity") == "full"

    def describe(self) -> str:
        parts = [f"detach_encoder={self.detach_encoder}"] + [f"{k}={v}" for k, v in self.transformer]
        return ", ".join(parts) + (f" ({self.source})" if self.source else "")


def _value(text: str) -> Any:
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def parse_overrides(lines: Iterable[str], source: str = "") -> TrainingSettings:
    """TrainingSettings from Hydra override lines (what `explain` prints, one per line)."""
    detach = False
    transformer: dict[str, Any] = {}
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.lstrip("+~").partition("=")
        if key.endswith(".mtp.detach_encoder"):
            detach = _value(value) is True
        elif TRANSFORMER_PREFIX in key:
            field = key.split(TRANSFORMER_PREFIX, 1)[1]
            if field in MODEL_SETTINGS:
                transformer[field] = _value(value)
    return TrainingSettings(detach, tuple(sorted(transformer.items())), source)


def load_overrides(path: str | None) -> TrainingSettings | None:
    """The profile's settings from --overrides, else the image's own overrides file; None
    where there is none (a --mode run outside an image)."""
    candidates = [path] if path else list(DEFAULT_OVERRIDES)
    for candidate in candidates:
        try:
            text = Path(candidate).read_text(encoding="utf-8")
        except OSError as exc:
            if path:
                raise UsageError(f"cannot read overrides {path}: {exc.strerror or exc}") from exc
            continue
        return parse_overrides(text.splitlines(), candidate)
    return None


# Parameter groups of the tiny GPTModel, by name prefix. The output layer is the main head's
# (untied embeddings): the MTP block's logits go through it too, so "the MTP loss reaches MTP
# parameters only" must count it.
GROUPS = ("embedding", "decoder", "output_layer", "mtp")
RULE_MTP_LOSS_LEAK = "mtp-loss-leak"


@dataclasses.dataclass(frozen=True)
class GradRecord:
    """Gradients of the MTP loss alone (the main loss scaled by 0), per parameter group:
    the L2 norm, and how many parameters got a non-zero gradient out of how many."""

    norms: tuple[tuple[str, float], ...]  # group -> L2 norm
    nonzero: tuple[tuple[str, int], ...]  # group -> parameters with a non-zero gradient
    total: tuple[tuple[str, int], ...]  # group -> parameters

    def norm(self, group: str) -> float:
        return dict(self.norms).get(group, 0.0)

    def count(self, group: str) -> tuple[int, int]:
        return dict(self.nonzero).get(group, 0), dict(self.total).get(group, 0)

    def describe(self) -> str:
        cells = []
        for g in GROUPS:
            n, t = self.count(g)
            cells.append(f"{g} {n}/{t} ({self.norm(g):.3e})")
        return "MTP-loss-only gradients: " + ", ".join(cells)

    def as_dict(self) -> dict:
        return {
            g: {"norm": self.norm(g), "with_grad": self.count(g)[0], "params": self.count(g)[1]}
            for g in GROUPS
        }

    @classmethod
    def from_dict(cls, d: dict) -> GradRecord:
        return cls(
            tuple((g, float(d[g]["norm"])) for g in GROUPS if g in d),
            tuple((g, int(d[g]["with_grad"])) for g in GROUPS if g in d),
            tuple((g, int(d[g]["params"])) for g in GROUPS if g in d),
        )


def judge_mtp_loss_gradients(contract: str, rec: GradRecord) -> CheckFailure | None:
    """The mode's gradient contract on the MTP loss alone; None when it holds.
      load-only no MTP loss: after the main loss's backward no MTP parameter has gradient
      full      every MTP parameter and the decoder get gradient (the loss reaches the trunk)
      mtp-only  every MTP parameter gets gradient; the embedding, the decoder and the output
                layer get exactly none (upstream's promise: MTP parameters only)
    A MTP parameter without gradient is the silent stop (rule mtp-no-gradient), whatever the mode."""
    with_grad, mtp_total = rec.count("mtp")
    if mtp_total == 0:
        return CheckFailure("model has no MTP parameters (mtp.*)")
    if contract == "load-only":
        if with_grad or rec.norm("mtp"):
            return CheckFailure(
                f"load-only: {with_grad}/{mtp_total} MTP parameters got gradient (an MTP loss is active); "
                + rec.describe().replace("MTP-loss-only", "main-loss")
            )
        return None
    if with_grad < mtp_total:
        return CheckFailure(
            f"{MSG_MTP_NO_GRADIENT}: {mtp_total - with_grad}/{mtp_total} without gradient; {rec.describe()}",
            RULE_MTP_NO_GRADIENT,
        )
    if contract == "full" and not rec.norm("decoder") > 0.0:
        return CheckFailure(f"full: the MTP loss gave no gradient to the decoder; {rec.describe()}")
    if contract == "mtp-only":
        leaked = [g for g in ("embedding", "decoder", "output_layer") if rec.count(g)[0] or rec.norm(g)]
        if leaked:
            return CheckFailure(
                f"mtp-only: the MTP loss reached {', '.join(leaked)}; {rec.describe()}", RULE_MTP_LOSS_LEAK
            )
    return None


def classify_exception(exc: BaseException) -> tuple[str | None, str]:
    """Map an exception raised by a check to (rule id or None, one-line detail)."""
    if isinstance(exc, CheckFailure):
        return exc.rule, str(exc)
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TypeError) and _PADDING_MASK_RE.search(str(exc)):
        return (
            RULE_RECOMPUTE_PADDING_MASK,
            text + " (megatron-core MTP full-recompute bug, NVIDIA/Megatron-LM#4933; fixed in 0.19.0)",
        )
    if MSG_MTP_NO_GRADIENT in str(exc):
        return RULE_MTP_NO_GRADIENT, text
    return None, text


def exit_code_for(results: Iterable[CheckResult], gpu_skipped: str | None, cpu_only: bool) -> int:
    results = list(results)
    if any(r.status == FAIL for r in results):
        return EXIT_FAIL
    if gpu_skipped is not None and not cpu_only:
        return EXIT_SKIP
    return EXIT_OK


def build_report(
    results: Iterable[CheckResult],
    env: dict,
    *,
    mode: str,
    source: str,
    gpu_skipped: str | None,
    cpu_only: bool,
) -> dict:
    results = list(results)
    code = exit_code_for(results, gpu_skipped, cpu_only)
    return {
        "schema": SCHEMA_VERSION,
        "mode": mode,
        "mode_source": source,
        "checks": [r.as_dict() for r in results],
        "env": env,
        "gpu_skipped": gpu_skipped,
        "exit_code": code,
        "ok": code == EXIT_OK,
    }


def format_table(report: dict) -> str:
    rows = [("CHECK", "STATUS", "RULE", "DETAIL")]
    for c in report["checks"]:
        rows.append((c["name"], c["status"], c["rule"] or "-", c["detail"]))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [f"mtp gpu_check: mode {report['mode']} (from {report['mode_source']})"]
    env = report.get("env") or {}
    env_keys = (
        "python",
        "torch",
        "cuda",
        "driver",
        "gpus",
        "megatron_core",
        "transformer_engine",
        "verl",
        "world_size",
        "mtp_patch",
    )
    for key in env_keys:
        if key in env and env[key] not in (None, "", []):
            val = env[key]
            if isinstance(val, list):
                val = ", ".join(str(v) for v in val)
            lines.append(f"  {key}: {val}")
    for r in rows:
        lines.append(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]:<{w2}}  {r[3]}")
    if report.get("gpu_skipped"):
        lines.append(f"GPU part skipped: {report['gpu_skipped']}")
    n_fail = sum(c["status"] == FAIL for c in report["checks"])
    n_pass = sum(c["status"] == PASS for c in report["checks"])
    n_skip = sum(c["status"] == SKIP for c in report["checks"])
    lines.append(
        f"result: {'OK' if report['ok'] else 'NOT OK'} ({n_pass} pass, {n_fail} fail, {n_skip} skip; "
        f"exit {report['exit_code']})"
    )
    return "\n".join(lines)


def static_env() -> dict:
    """Environment facts that need no torch import."""

    def ver(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": ver("torch"),
        "megatron_core": ver("megatron-core"),
        "verl": ver("verl"),
        "transformer_engine": ver("transformer-engine") or ver("transformer_engine"),
        "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
    }


def skipped_results(checks: Iterable[CheckSpec], reason: str) -> list[CheckResult]:
    return [CheckResult(c.name, SKIP, f"GPU part skipped: {reason}") for c in checks]


# -- precision and attention backend per context-parallel size ----------------------------

VOCAB = 128
SEQ = 32
BATCH = 2
HIDDEN = 64
HEADS = 4
NUM_LAYERS = 2
SEED = 1234

ATTN_LOCAL = "local"
ATTN_TE = "transformer_engine"


@dataclasses.dataclass(frozen=True)
class PrecisionPlan:
    """How a training check builds its model: parameter dtype and attention backend."""

    cp: int
    dtype: str  # "float32" | "bfloat16" (a torch dtype name)
    attention: str  # ATTN_LOCAL | ATTN_TE
    reason: str

    @property
    def needs_te(self) -> bool:
        return self.attention == ATTN_TE

    def label(self) -> str:
        dt = {"float32": "fp32", "bfloat16": "bf16"}.get(self.dtype, self.dtype)
        at = "TE attention" if self.needs_te else "local attention"
        return f"CP={self.cp} {dt} {at}"


def precision_plan(cp: int, *, reference: bool = False, te: bool = False) -> PrecisionPlan:
    """The dtype and attention backend of a training check at context-parallel size cp.

    CP=1: fp32 with megatron's local attention (no TransformerEngine needed), as always.
    CP>1: bf16 with TransformerEngine attention. megatron's local DotProductAttention asserts
    context_parallel_size == 1; of TE's backends the unfused one refuses context parallelism
    and the fused (cuDNN) one has no fp32 path, so an fp32 model at CP>1 fails with "No dot
    product attention backend is available" (seen on 2xH200, TE 2.12.0, cuDNN 9.19).
    reference=True: the CP=1 run a CP>1 check compares against, in the CP>1 run's precision
    and attention (bf16, TE) so that the comparison sees context parallelism, not dtype.
    te=True (--transformer-impl transformer_engine): CP=1 too runs TransformerEngine layers,
    in bf16, as a training job with Megatron's default transformer implementation does.
    """
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"context parallel size must be an integer >= 1, got {cp!r}")
    if cp == 1 and not reference and not te:
        return PrecisionPlan(1, "float32", ATTN_LOCAL, "CP=1: fp32, megatron's local attention")
    if cp == 1 and not reference:
        why = "CP=1 with TransformerEngine layers (--transformer-impl transformer_engine), bf16"
    elif cp == 1:
        why = "CP=1 reference for a CP>1 check: same precision and attention as the CP>1 run"
    else:
        why = "CP>1 needs TransformerEngine attention, which has no fp32 context-parallel backend"
    return PrecisionPlan(cp, "bfloat16", ATTN_TE, why)


def transformer_config_kwargs(
    plan: PrecisionPlan, recompute: bool, settings: TrainingSettings | None = None
) -> dict:
    """megatron TransformerConfig keyword arguments of the check's tiny model.

    params_dtype is a torch dtype NAME here (the GPU part maps it with getattr(torch, ...)),
    so this stays importable and testable without torch.
    """
    kw: dict[str, Any] = dict(
        num_layers=NUM_LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        ffn_hidden_size=2 * HIDDEN,
        mtp_num_layers=1,
        mtp_loss_scaling_factor=0.1,
        context_parallel_size=plan.cp,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=plan.dtype,
        bf16=plan.dtype == "bfloat16",
    )
    profile = settings.config() if settings is not None else {}
    if "mtp_detach_heads" in profile:
        kw["mtp_detach_heads"] = bool(profile["mtp_detach_heads"])
    if recompute:
        kw.update(
            recompute_granularity="full",
            recompute_method=profile.get("recompute_method", "uniform"),
            recompute_num_layers=profile.get("recompute_num_layers", 1),
        )
    return kw


def cp_chunk_positions(seq_len: int, cp: int, cp_rank: int) -> list[int]:
    """Sequence positions held by a CP rank: megatron's load-balanced split into 2*cp chunks,
    rank r holding chunks r and 2*cp-1-r (get_batch_on_this_cp_rank)."""
    if cp < 1 or not 0 <= cp_rank < cp or seq_len % (2 * cp):
        raise ValueError(f"cannot split {seq_len} positions over CP={cp} (rank {cp_rank})")
    c = seq_len // (2 * cp)
    return [
        *range(cp_rank * c, (cp_rank + 1) * c),
        *range((2 * cp - 1 - cp_rank) * c, (2 * cp - cp_rank) * c),
    ]


def mtp_token_counts(seq_len: int, batch: int, cp: int, cp_rank: int) -> tuple[int, int]:
    """(tokens with MTP loss on this CP rank, in the whole sequence) for an all-ones loss mask
    and one MTP layer. megatron's roll_tensor shifts labels and mask left by one (across CP
    ranks) and fills 0 at the sequence end; the last position lives in chunk 2*cp-1 (CP rank 0).
    megatron divides each rank's MTP loss by its OWN count, so the check scales each rank's MTP
    gradient by local/total to make the CP ranks' summed gradient the whole-sequence one."""
    local = sum(1 for p in cp_chunk_positions(seq_len, cp, cp_rank) if p < seq_len - 1)
    return batch * local, batch * (seq_len - 1)


# The CP>1 check compares against a CP=1 run of the same weights and tokens in the same
# precision (bf16, TE attention). Both differ only in rounding: the attention reduction order
# (CP merges per-chunk softmax results), GEMM shapes, and each CP rank's bf16 gradient being
# rounded before the ranks are summed. bf16 keeps 8 significant bits (eps 2**-8 = 3.9e-3):
# losses are reduced in fp32 from bf16 logits (1e-2 = 2.5 eps); gradients pass through more
# bf16 roundings (5e-2). mtp_grad_rel_l2 = ||g_cp - g_ref|| / ||g_ref|| over all MTP
# gradient elements: the sensitive one (a wrong split, chunk order or missing KV exchange
# gives O(1)), where a near-uniform tiny model's loss barely moves.
# (metric, how compared, tolerance, required)
CP_COMPARE_METRICS: tuple[tuple[str, str, float, bool], ...] = (
    ("main_loss", "rel", 1e-2, True),
    ("mtp_loss", "rel", 1e-2, False),
    ("mtp_grad_norm", "rel", 5e-2, True),
    ("decoder_grad_norm", "rel", 5e-2, False),
    ("mtp_grad_rel_l2", "abs", 5e-2, True),
)


@dataclasses.dataclass(frozen=True)
class Comparison:
    metric: str
    ref: float | None
    got: float | None
    diff: float
    tol: float
    kind: str  # "rel": |got-ref|/|ref|; "abs": |got-ref|
    ok: bool

    def describe(self) -> str:
        if self.ref is None or self.got is None:
            return f"{self.metric}: missing (ref {self.ref}, got {self.got}) FAIL"
        if self.kind == "abs":
            text = f"{self.metric} {self.got:.3e} (<= {self.tol:g})"
        else:
            text = f"{self.metric} {self.got:.5g} vs {self.ref:.5g} (rel {self.diff:.1e}, tol {self.tol:g})"
        return text if self.ok else text + " FAIL"


def relative_difference(ref: float, got: float) -> float:
    """|got - ref| / |ref|; 0 when both are 0, inf when only ref is 0; NaN in -> inf."""
    if any(v != v or v in (float("inf"), float("-inf")) for v in (ref, got)):
        return float("inf")
    if ref == got:
        return 0.0
    if ref == 0.0:
        return float("inf")
    return abs(got - ref) / abs(ref)


def compare_cp_metrics(
    ref: dict, got: dict, metrics: Iterable[tuple[str, str, float, bool]] = CP_COMPARE_METRICS
) -> list[Comparison]:
    """Compare a CP>1 run's metrics (got) with the CP=1 reference's (ref).

    A "rel" metric passes when |got-ref|/|ref| <= tol; an "abs" one (a distance the GPU part
    already computed, ref 0) when |got-ref| <= tol. A metric missing on both sides is
    left out unless required; one missing on one side, or NaN/inf, fails.
    """
    out = []
    for name, kind, tol, required in metrics:
        r, g = ref.get(name), got.get(name)
        if r is None and g is None and not required:
            continue
        if r is None or g is None:
            out.append(Comparison(name, r, g, float("inf"), tol, kind, False))
            continue
        r, g = float(r), float(g)
        if kind == "abs":
            diff = abs(g - r) if all(v == v and abs(v) != float("inf") for v in (r, g)) else float("inf")
        else:
            diff = relative_difference(r, g)
        out.append(Comparison(name, r, g, diff, tol, kind, diff <= tol))
    return out


# ----------------------------------------------------------------------------------
# GPU part (torch and megatron.core imported lazily)
# ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver_version() -> str | None:
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            .stdout.strip()
            .splitlines()
        )
        if out:
            return out[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import pynvml  # type: ignore

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001 - optional source
        pass
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(\S+)", text)
        return m.group(1) if m else None
    except OSError:
        return None


class Runner:
    """Holds the process group, megatron parallel state and the patch source."""

    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]):
        self.args = args
        self.log = log
        self.cpu_debug = bool(args.debug_cpu_model)
        import torch

        self.torch = torch
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cpu") if self.cpu_debug else torch.device("cuda", self.local_rank)
        self.cp_now: int | None = None
        self.mtp_patch = None
        self.mtp_patch_source = "not loaded"
        self.settings: TrainingSettings | None = None  # the profile's (set by run_gpu_part)
        self.records: dict[str, GradRecord] = {}  # check name -> its MTP-loss-only gradients

    # -- process group / parallel state -------------------------------------------------
    def init_dist(self) -> None:
        torch = self.torch
        if not self.cpu_debug:
            torch.cuda.set_device(self.local_rank)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        backend = "gloo" if self.cpu_debug else "nccl"
        kwargs = {} if self.cpu_debug else {"device_id": self.device}
        try:
            torch.distributed.init_process_group(backend=backend, **kwargs)
        except TypeError:  # older torch without device_id
            torch.distributed.init_process_group(backend=backend)

    def cpu_debug_shims(self) -> None:
        """--debug-cpu-model only: megatron's local attention buffer and recompute RNG
        bookkeeping call CUDA unconditionally; point them at the CPU. Never used on a GPU."""
        torch = self.torch
        from megatron.core.tensor_parallel import random as mrandom

        torch.cuda.current_device = lambda: "cpu"
        mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
        mrandom._set_cuda_rng_state = lambda *a, **k: None

    def set_cp(self, cp: int) -> None:
        from megatron.core import parallel_state

        if self.cp_now == cp:
            return
        if self.cp_now is not None:
            parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=cp
        )
        from megatron.core import tensor_parallel

        if not self.cpu_debug:
            tensor_parallel.model_parallel_cuda_manual_seed(SEED)
        else:  # no CUDA RNG to fork on the CPU debug path
            tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
        self.cp_now = cp

    def shutdown(self) -> None:
        torch = self.torch
        try:
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        except Exception:  # noqa: BLE001
            pass
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    # -- verl's MTP patch -----------------------------------------------------------------
    def load_mtp_patch(self) -> None:
        """Load the installed verl's verl/models/mcore/mtp_patch.py by file path."""
        if self.args.no_verl:
            self.mtp_patch_source = "local fallback (--no-verl given)"
            return
        try:
            spec = importlib.util.find_spec("verl")  # finds the package without importing it
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            self.mtp_patch_source = "local fallback (verl not installed)"
            return
        path = Path(list(spec.submodule_search_locations)[0]) / "models" / "mcore" / "mtp_patch.py"
        if not path.is_file():
            self.mtp_patch_source = f"local fallback (verl installed but has no {path.name})"
            return
        mspec = importlib.util.spec_from_file_location("_mtp_check_verl_mtp_patch", path)
        mod = importlib.util.module_from_spec(mspec)
        with contextlib.redirect_stdout(sys.stderr):
            mspec.loader.exec_module(mod)
        self.mtp_patch = mod
        try:
            vv = importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            vv = "?"
        self.mtp_patch_source = f"verl {vv} mtp_patch (loaded by file path: {path})"

    # -- model ----------------------------------------------------------------------------
    def build_model(self, recompute: bool, plan: PrecisionPlan):
        torch = self.torch
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        kw = transformer_config_kwargs(plan, recompute, self.settings)
        kw["params_dtype"] = getattr(torch, kw["params_dtype"])
        config = TransformerConfig(**kw)
        if plan.needs_te:
            from megatron.core.models.gpt.gpt_layer_specs import (
                get_gpt_layer_with_transformer_engine_spec,
            )

            layer_spec = get_gpt_layer_with_transformer_engine_spec()
        else:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

            layer_spec = get_gpt_layer_local_spec()
        mtp_spec = get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=plan.needs_te)
        block_spec = layer_spec
        if self.cpu_debug:
            block_spec, mtp_spec = self.cpu_norm_specs(config, layer_spec, mtp_spec)
        torch.manual_seed(SEED)
        model = GPTModel(
            config=config,
            transformer_layer_spec=block_spec,
            vocab_size=VOCAB,
            max_sequence_length=SEQ,
            mtp_block_spec=mtp_spec,
            share_embeddings_and_output_weights=False,
            # rope on GPU (as the real models); megatron's rope moves its buffer to CUDA, so
            # the CPU debug path uses learned absolute positions instead.
            position_embedding_type="learned_absolute" if self.cpu_debug else "rope",
        ).to(self.device)
        if kw["params_dtype"] != torch.float32:
            # as megatron's Float16Module does for bf16 training: params_dtype leaves some
            # norms (the local spec's) in fp32
            model = model.to(kw["params_dtype"])
        wrong = sorted({str(p.dtype) for p in model.parameters()} - {str(kw["params_dtype"])})
        if wrong:
            raise CheckFailure(
                f"model parameters are {wrong}, expected {kw['params_dtype']} ({plan.label()})"
            )
        model.train()
        return model

    def cpu_norm_specs(self, config, layer_spec, mtp_spec):
        """--debug-cpu-model only: every norm as torch's own. Even megatron's local spec picks
        CUDA-only norms where they are installed: the block's final norm is TransformerEngine's
        TENorm wherever TE imports (transformer_block.py LayerNormImpl), and the layers' and MTP
        layers' norms are apex's FusedLayerNorm wherever apex does (gpt_layer_specs.py LNImpl).
        In a real image both are there, and the CPU model failed in TENorm ("CUDAGuardImpl
        initialized with non-CUDA DeviceType: cpu"). The gradient contract is about where the
        MTP loss flows, not which kernel normalises, so the swap changes nothing it checks."""
        from megatron.core.transformer.torch_norm import WrappedTorchNorm
        from megatron.core.transformer.transformer_block import (
            TransformerBlockSubmodules,
            get_num_layers_to_build,
        )

        cuda_only = {WrappedTorchNorm: WrappedTorchNorm}  # identity: the walk keeps it
        for module, name in (
            ("megatron.core.fusions.fused_layer_norm", "FusedLayerNorm"),
            ("megatron.core.extensions.transformer_engine", "TENorm"),
        ):
            with contextlib.suppress(ImportError, AttributeError):
                cuda_only[getattr(importlib.import_module(module), name)] = WrappedTorchNorm
        layer_spec = swap_classes(layer_spec, cuda_only)
        block = TransformerBlockSubmodules(
            layer_specs=[layer_spec] * get_num_layers_to_build(config), layer_norm=WrappedTorchNorm
        )
        return block, swap_classes(mtp_spec, cuda_only)

    def apply_patches(self, model, detach: bool) -> str:
        """Apply verl's engine patches (as verl's patch_engine_mtp does) or the local detach."""
        applied = []
        if self.mtp_patch is not None:
            p = self.mtp_patch
            with contextlib.redirect_stdout(sys.stderr):
                for fn in ("patch_postprocess", "patch_mtp_layer_checkpointed_forward"):
                    if hasattr(p, fn):
                        getattr(p, fn)(model)
                        applied.append(fn)
                if detach:
                    if not hasattr(p, "patch_mtp_layer_get_embeddings"):
                        raise CheckFailure("installed verl mtp_patch has no patch_mtp_layer_get_embeddings")
                    if not p.patch_mtp_layer_get_embeddings(model):
                        raise CheckFailure("verl patch_mtp_layer_get_embeddings found no MTP layer to patch")
                    applied.append("patch_mtp_layer_get_embeddings")
            how = "verl:" + "+".join(applied)
        elif detach:
            for layer in model.mtp.layers:
                _wrap_get_embeddings(layer, requires_grad=True)
            how = "LOCAL detach (verl not used): decoder_input.detach(), hidden_states.detach().requires_grad_()"
        else:
            how = "none needed (verl not used)"
        if detach and self.args.inject_broken_detach:
            for layer in model.mtp.layers:
                _wrap_get_embeddings(layer, requires_grad=False)
            how += " + INJECTED BROKEN DETACH (no MTP input requires grad)"
        return how

    def attn_mask(self):
        """None (causal mask made by the attention) on GPU; an explicit causal mask for
        --debug-cpu-model, where megatron would build its default mask on CUDA."""
        if not self.cpu_debug:
            return None
        torch = self.torch
        return torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]

    def full_batch(self, data_rank: int):
        """One data-parallel rank's whole-sequence batch (CPU tensors). Every CP rank of a
        data-parallel rank must see the same sequence, so it is seeded by the DP rank."""
        torch = self.torch
        g = torch.Generator().manual_seed(SEED + data_rank)
        input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        labels = torch.roll(input_ids, -1, dims=1)
        position_ids = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ).contiguous()
        loss_mask = torch.ones(BATCH, SEQ, dtype=torch.float32)
        return [input_ids, labels, position_ids, loss_mask]

    def batch(self, cp: int, full=None):
        """This rank's part of the batch: the whole sequence at CP=1, chunks r and 2cp-1-r at CP>1."""
        from megatron.core import parallel_state

        torch = self.torch
        tensors = full if full is not None else self.full_batch(parallel_state.get_data_parallel_rank())
        if cp > 1:
            cp_rank = parallel_state.get_context_parallel_rank()
            tensors = [_split_for_cp(torch, t, cp, cp_rank) for t in tensors]
        return [t.to(self.device) for t in tensors]

    # -- checks -----------------------------------------------------------------------------
    def run_env_check(self, spec: CheckSpec) -> CheckResult:
        torch = self.torch
        if spec.name == "torch-cuda":
            if self.cpu_debug:
                return CheckResult(spec.name, SKIP, "--debug-cpu-model: CUDA not used")
            n = torch.cuda.device_count()
            x = torch.arange(4, device=self.device, dtype=torch.float32)
            ok = float((x * 2).sum().item()) == 12.0
            name = torch.cuda.get_device_name(self.device)
            cap = torch.cuda.get_device_capability(self.device)
            if not ok:
                raise CheckFailure("a CUDA kernel gave a wrong result")
            return CheckResult(
                spec.name,
                PASS,
                f"{n} device(s); rank {self.rank} on cuda:{self.local_rank} {name} sm_{cap[0]}{cap[1]}",
            )
        if spec.name == "nccl-allreduce":
            if self.cpu_debug:
                return CheckResult(spec.name, SKIP, "--debug-cpu-model: gloo process group, NCCL not used")
            backend = torch.distributed.get_backend()
            t = torch.ones(1024, device=self.device) * (self.rank + 1)
            torch.distributed.all_reduce(t)
            torch.cuda.synchronize()
            want = self.world_size * (self.world_size + 1) / 2
            if backend != "nccl" or not torch.all(t == want):
                raise CheckFailure(f"all-reduce over {backend} gave {t[0].item()}, expected {want}")
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
            return CheckResult(
                spec.name, PASS, f"backend nccl {nccl}, {self.world_size} rank(s), sum {want:g}"
            )
        raise ValueError(spec.name)

    def record(self, named: dict) -> GradRecord:
        """The gradients now on the model's parameters, per group (see GradRecord)."""
        torch = self.torch
        groups = {g: [p for n, p in named.items() if n.startswith(g + ".")] for g in GROUPS}
        return GradRecord(
            tuple((g, _grad_norm(torch, ps)) for g, ps in groups.items()),
            tuple(
                (g, sum(p.grad is not None and bool(torch.any(p.grad != 0)) for p in ps))
                for g, ps in groups.items()
            ),
            tuple((g, len(ps)) for g, ps in groups.items()),
        )

    def step1_metrics(self, params: dict, main_parts, mtp_loss_local, n_local: int, n_total: int, group):
        """What a CP>1 check compares with its CP=1 reference, after the MTP-loss-only backward.

        Each CP rank holds part of every gradient (its own tokens' share, with the other ranks'
        share arriving through TE's attention backward), so gradients are summed over the CP
        group; the main loss is sum/count over all ranks; megatron's MTP loss (its logging
        tracker, a per-rank mean over the rank's own tokens) is re-weighted by token counts.
        Returns (metrics, the summed MTP gradient as one fp32 vector).
        """
        torch = self.torch

        def flat(prefix: str):
            parts = []
            for n in sorted(params):
                if n.startswith(prefix):
                    p = params[n]
                    g = (
                        p.grad.detach().float()
                        if p.grad is not None
                        else torch.zeros_like(p, dtype=torch.float32)
                    )
                    parts.append(g.reshape(-1))
            return torch.cat(parts) if parts else torch.zeros(1, device=self.device)

        g_mtp, g_dec = flat("mtp."), flat("decoder.")
        main_sum, main_cnt = main_parts
        have_mtp_loss = mtp_loss_local is not None
        stats = torch.tensor(
            [
                float(main_sum.detach()),
                float(main_cnt.detach()),
                (mtp_loss_local if have_mtp_loss else 0.0) * n_local,
                1.0 if have_mtp_loss else 0.0,
            ],
            dtype=torch.float64,
            device=self.device,
        )
        if group is not None and torch.distributed.get_world_size(group) > 1:
            for t in (g_mtp, g_dec, stats):
                torch.distributed.all_reduce(t, group=group)
        n_ranks = 1 if group is None else torch.distributed.get_world_size(group)
        metrics = {
            "main_loss": float(stats[0] / stats[1]),
            # only when every rank's tracker had the loss
            "mtp_loss": float(stats[2]) / n_total if int(round(float(stats[3]))) == n_ranks else None,
            "mtp_grad_norm": float(g_mtp.norm()),
            "decoder_grad_norm": float(g_dec.norm()),
        }
        return metrics, g_mtp

    def reference_metrics(self, spec: CheckSpec, init: dict, full, detach: bool):
        """The CP=1 reference of a CP>1 check: the same initial weights and the same whole
        sequences, bf16 with TE attention (precision_plan(1, reference=True)), same recompute
        and patches; MTP-loss-only backward. Leaves the parallel state at CP=1."""
        torch = self.torch
        from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

        plan = precision_plan(1, reference=True)
        self.set_cp(1)
        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0, device=self.device))
        model = self.build_model(spec.recompute, plan)
        named = dict(model.named_parameters())
        if set(named) != set(init):
            raise CheckFailure(
                f"the CP=1 reference model has other parameters than the CP={spec.cp} one: "
                f"{sorted(set(named) ^ set(init))[:3]}"
            )
        with torch.no_grad():
            for n, p in named.items():
                p.copy_(init[n])
        self.apply_patches(model, detach)
        input_ids, labels, position_ids, loss_mask = self.batch(1, full)
        _mtp_tracker_clean()
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self.attn_mask(),
            labels=labels,
            loss_mask=loss_mask,
        )
        mtp_loss = _mtp_tracker_loss()
        parts = _main_loss_parts(torch, out, labels, loss_mask)
        ((parts[0] / parts[1]) * 0.0).backward()
        _sync(torch, self.device)
        n_local, n_total = mtp_token_counts(SEQ, BATCH, 1, 0)
        metrics, g_mtp = self.step1_metrics(named, parts, mtp_loss, n_local, n_total, None)
        return plan, metrics, g_mtp

    def run_training_check(self, spec: CheckSpec) -> CheckResult:
        torch = self.torch
        sem = spec.semantics
        plan = precision_plan(spec.cp, te=self.args.transformer_impl == "transformer_engine")
        if plan.needs_te:
            if self.cpu_debug:
                return CheckResult(
                    spec.name, SKIP, f"{plan.label()} not run: --debug-cpu-model (TE attention needs CUDA)"
                )
            if importlib.util.find_spec("transformer_engine") is None:
                return CheckResult(
                    spec.name,
                    SKIP,
                    f"CP={spec.cp} not run: context parallelism needs TransformerEngine attention "
                    "(megatron's local DotProductAttention asserts context_parallel_size == 1) and "
                    "transformer_engine is not installed",
                )
        self.set_cp(spec.cp)
        from megatron.core import parallel_state
        from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0, device=self.device))
        model = self.build_model(spec.recompute, plan)
        # verl's detach_encoder as the profile sets it (patch_engine_mtp swaps in verl's
        # _get_embeddings copy only then); upstream's switch where no profile says
        detach = self.settings.detach_encoder if self.settings is not None else sem == "mtp-only"
        how = self.apply_patches(model, detach)
        named = dict(model.named_parameters())
        mtp = {n: p for n, p in named.items() if n.startswith("mtp.")}
        trunk = {n: p for n, p in named.items() if n.startswith(("decoder.", "embedding."))}
        if not mtp:
            raise CheckFailure("model has no MTP parameters (mtp.*)")
        bad_names = [n for n in mtp if not n.startswith("mtp.layers.0.")]
        if bad_names:
            raise CheckFailure(f"MTP parameters outside mtp.layers.0.*: {bad_names[:3]}")
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        full = self.full_batch(parallel_state.get_data_parallel_rank())
        input_ids, labels, position_ids, loss_mask = self.batch(spec.cp, full)
        before = {n: p.detach().clone() for n, p in named.items()}
        details = [plan.label() + (" recompute=full/uniform/1" if spec.recompute else ""), how]

        if sem == "load-only":
            # state dict round trip: MTP weights are saved
            buf = io.BytesIO()
            torch.save(model.state_dict(), buf)
            buf.seek(0)
            sd = torch.load(buf, weights_only=True)
            missing = [n for n in mtp if n not in sd]
            if missing:
                raise CheckFailure(f"MTP parameters missing from the saved state dict: {missing[:3]}")
            # no MTP loss: verl passes no labels when enable_train is off; its patched
            # _postprocess then skips the MTP block. Without verl, bypass the block likewise.
            with _mtp_bypassed(model, active=self.mtp_patch is None):
                logits = model(
                    input_ids=input_ids, position_ids=position_ids, attention_mask=self.attn_mask()
                )
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1)
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            record = self.record(named)
            self.records[spec.name] = record
            failure = judge_mtp_loss_gradients("load-only", record)
            if failure is not None:
                raise failure
            opt.step()
            _sync(torch, self.device)
            changed_mtp = [n for n, p in mtp.items() if not torch.equal(p.detach(), before[n])]
            changed_trunk = sum(not torch.equal(p.detach(), before[n]) for n, p in trunk.items())
            if changed_mtp:
                raise CheckFailure(
                    f"load-only: {len(changed_mtp)} MTP parameters changed after the step, e.g. {changed_mtp[0]}"
                )
            if changed_trunk == 0:
                raise CheckFailure("load-only: the optimizer step changed no trunk parameter")
            details.append(
                f"{len(mtp)} MTP params (mtp.layers.0.*) in state dict ({len(sd)} keys); loss {loss.item():.4f}; "
                f"MTP unchanged, {changed_trunk}/{len(trunk)} trunk params changed"
            )
            return CheckResult(spec.name, PASS, "; ".join(details))

        # full / mtp-only: 1) gradients of the MTP loss alone (main loss scaled by 0).
        # At CP>1 each rank's MTP gradient is scaled by its share of the MTP tokens, so that
        # the ranks' summed gradient is the whole-sequence one (see mtp_token_counts).
        if spec.cp > 1:
            n_local, n_total = mtp_token_counts(
                SEQ, BATCH, spec.cp, parallel_state.get_context_parallel_rank()
            )
        else:
            n_local, n_total = mtp_token_counts(SEQ, BATCH, 1, 0)
        MTPLossAutoScaler.set_loss_scale(torch.tensor(n_local / n_total, device=self.device))
        opt.zero_grad(set_to_none=True)
        _mtp_tracker_clean()
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self.attn_mask(),
            labels=labels,
            loss_mask=loss_mask,
        )
        mtp_loss_local = _mtp_tracker_loss()
        parts = _main_loss_parts(torch, out, labels, loss_mask)
        main = parts[0] / parts[1]
        (main * 0.0).backward()
        _sync(torch, self.device)
        record = self.record(named)
        self.records[spec.name] = record
        grads = record.describe() + (" (this rank)" if spec.cp > 1 else "")
        failure = judge_mtp_loss_gradients(sem, record)
        if failure is not None:
            raise CheckFailure(f"{failure}; {how}", failure.rule)
        details.append(grads)
        details.append(f"all {len(mtp)} MTP params non-zero")
        if self.settings is not None:
            details.append("profile settings: " + self.settings.describe())
        got = g_mtp = None
        if spec.cp > 1:
            got, g_mtp = self.step1_metrics(
                named, parts, mtp_loss_local, n_local, n_total, parallel_state.get_context_parallel_group()
            )
        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0, device=self.device))
        # 2) a real step on main + MTP loss
        opt.zero_grad(set_to_none=True)
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self.attn_mask(),
            labels=labels,
            loss_mask=loss_mask,
        )
        main = _main_loss(torch, out, labels, loss_mask)
        if not bool(torch.isfinite(main)):
            raise CheckFailure(f"main loss is not finite: {main.item()}")
        main.backward()
        opt.step()
        _sync(torch, self.device)
        unchanged = [n for n, p in mtp.items() if torch.equal(p.detach(), before[n])]
        if unchanged:
            raise CheckFailure(
                f"{MSG_MTP_NO_GRADIENT} in the training step: {len(unchanged)} MTP params unchanged (e.g. {unchanged[0]})",
                RULE_MTP_NO_GRADIENT,
            )
        details.append(f"step ok (loss {main.item():.4f}), MTP params updated")
        if spec.cp > 1:
            # 3) the same weights and whole sequences at CP=1 in the same precision
            del opt, model, out
            ref_plan, ref, g_ref = self.reference_metrics(spec, before, full, detach)
            ref_norm = float(g_ref.norm())
            got["mtp_grad_rel_l2"] = (
                float((g_mtp - g_ref).norm()) / ref_norm if ref_norm > 0 else float("inf")
            )
            ref["mtp_grad_rel_l2"] = 0.0
            comps = compare_cp_metrics(ref, got)
            text = "; ".join(c.describe() for c in comps)
            if not all(c.ok for c in comps):
                raise CheckFailure(
                    f"CP={spec.cp} differs from the {ref_plan.label()} reference (same weights and tokens) "
                    f"beyond tolerance: {text}"
                )
            details.append(
                f"CP={spec.cp} (all ranks) vs {ref_plan.label()} reference, same weights and tokens: {text}"
            )
        return CheckResult(spec.name, PASS, "; ".join(details))


def zero_mtp_tracker(tracker) -> None:
    """Zero the loss (and acceptance) values in megatron's MTP logging tracker, whichever
    layout it has (0.19: loss_values/correct_values/total_values; 0.18: values), so that it
    holds one forward's MTP loss. Done here rather than with megatron's own clean function:
    0.18's clean_loss_in_tracker raises KeyError while nothing has been tracked yet."""
    if not isinstance(tracker, dict):
        return
    for key in ("loss_values", "values", "correct_values", "total_values"):
        v = tracker.get(key)
        if v is not None:
            v.zero_()


def mtp_tracker_loss(tracker) -> float | None:
    """The first MTP layer's loss in megatron's logging tracker (this rank's mean over its own
    MTP tokens), or None where the tracker holds none."""
    if not isinstance(tracker, dict):
        return None
    v = tracker.get("loss_values")
    if v is None:
        v = tracker.get("values")
    return None if v is None else float(v[0])


def _mtp_tracker():
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    return getattr(MTPLossLoggingHelper, "tracker", None)


def _mtp_tracker_clean() -> None:
    zero_mtp_tracker(_mtp_tracker())


def _mtp_tracker_loss() -> float | None:
    return mtp_tracker_loss(_mtp_tracker())


def _split_for_cp(torch, t, cp: int, cp_rank: int):
    """Megatron's load-balanced CP split along the sequence (dim 1): chunks r and 2cp-1-r."""
    idx = torch.tensor(cp_chunk_positions(t.shape[1], cp, cp_rank))
    return t.index_select(1, idx).contiguous()


def _main_loss_parts(torch, out, labels, loss_mask):
    """(sum of masked per-token LM losses, number of loss tokens) of this rank. Native megatron
    returns per-token losses [b, s] when labels are given; verl's patched _postprocess always
    returns logits [b, s, v] (verl computes the loss)."""
    if out.dim() == 3:
        per_token = torch.nn.functional.cross_entropy(
            out.float().reshape(-1, out.shape[-1]), labels.reshape(-1), reduction="none"
        ).view_as(labels)
    else:
        per_token = out.float()
    return (per_token * loss_mask).sum(), loss_mask.sum()


def _main_loss(torch, out, labels, loss_mask):
    """Mean LM loss over this rank's loss tokens."""
    total, count = _main_loss_parts(torch, out, labels, loss_mask)
    return total / count


def _grad_norm(torch, params) -> float:
    total = 0.0
    for p in params:
        if p.grad is not None:
            total += float(p.grad.detach().float().pow(2).sum().item())
    return total**0.5


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wrap_get_embeddings(layer, requires_grad: bool) -> None:
    """Detach the MTP layer's inputs after whatever _get_embeddings is in place.

    requires_grad=True: the local stand-in for verl's detach_encoder (trunk hidden states
    re-created as a leaf that requires grad). requires_grad=False: the deliberately broken
    detach for --inject-broken-detach; under full recompute no input of the checkpointed
    MTP block then requires grad, so its parameters silently get no gradient.
    """
    inner = layer._get_embeddings

    def _get_embeddings(*args, **kwargs):
        out = list(inner(*args, **kwargs))
        out[-2] = out[-2].detach()  # decoder_input (token embeddings)
        hs = out[-1].detach()  # trunk hidden states
        out[-1] = hs.requires_grad_(True) if requires_grad else hs
        return tuple(out)

    layer._get_embeddings = _get_embeddings


@contextlib.contextmanager
def _mtp_bypassed(model, active: bool):
    """Skip the MTP block in one forward (local stand-in for verl's label-less postprocess)."""
    if not active:
        yield
        return
    saved = (model.mtp_process, model.config.mtp_num_layers)
    model.mtp_process = False
    model.config.mtp_num_layers = None
    try:
        yield
    finally:
        model.mtp_process, model.config.mtp_num_layers = saved


def gpu_env(runner: Runner) -> dict:
    torch = runner.torch
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "world_size": runner.world_size,
        "mtp_patch": runner.mtp_patch_source,
    }
    if not runner.cpu_debug:
        env["driver"] = driver_version()
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        import megatron.core as mc

        env["megatron_core"] = getattr(mc, "__version__", None) or importlib.metadata.version("megatron-core")
        env["megatron_core_path"] = str(Path(mc.__file__).parent)
    except Exception as exc:  # noqa: BLE001
        env["megatron_core"] = f"import failed: {type(exc).__name__}: {exc}"
    try:  # located, not imported (CP>1 checks import it through megatron's TE spec)
        te = importlib.util.find_spec("transformer_engine")
    except (ImportError, ValueError):
        te = None
    if te is not None and te.submodule_search_locations:
        env["transformer_engine_path"] = str(list(te.submodule_search_locations)[0])
    return env


def run_gpu_part(plan: Plan, args: argparse.Namespace, log) -> tuple[list[CheckResult], dict]:
    runner = Runner(args, log)
    results: list[CheckResult] = []
    t0 = time.time()
    with contextlib.redirect_stdout(sys.stderr):
        runner.init_dist()
        try:
            import megatron.core  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            rule, detail = classify_exception(exc)
            env = gpu_env(runner)
            for spec in plan.checks:
                if spec.kind == "env":
                    results.append(_run_one(runner.run_env_check, spec, log))
                else:
                    results.append(
                        CheckResult(spec.name, FAIL, f"megatron.core import failed: {detail}", rule)
                    )
            runner.shutdown()
            return results, env
        if runner.cpu_debug:
            runner.cpu_debug_shims()
        runner.load_mtp_patch()
        runner.settings = plan.settings
        env = gpu_env(runner)
        for spec in plan.checks:
            fn = runner.run_env_check if spec.kind == "env" else runner.run_training_check
            results.append(_run_one(fn, spec, log))
        runner.shutdown()
    env["gradients"] = {name: rec.as_dict() for name, rec in runner.records.items()}
    env["seconds"] = round(time.time() - t0, 2)
    return results, env


def _run_one(fn, spec: CheckSpec, log) -> CheckResult:
    t = time.time()
    try:
        res = fn(spec)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a report row
        rule, detail = classify_exception(exc)
        res = CheckResult(spec.name, FAIL, detail, rule)
        if not isinstance(exc, CheckFailure):
            import traceback

            log(f"[{spec.name}] traceback:\n" + "".join(traceback.format_exception(exc)))
    log(f"[{spec.name}] {res.status} in {time.time() - t:.2f}s: {res.detail}")
    return res


# ----------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------


def swap_classes(spec: Any, swap: dict[type, type]) -> Any:
    """A copy of a megatron module spec (ModuleSpec, *Submodules dataclasses, lists of them)
    with every class that is a key of `swap` replaced by its value; the rest as it was."""
    if isinstance(spec, type):
        return swap.get(spec, spec)
    if isinstance(spec, (list, tuple)):
        return type(spec)(swap_classes(s, swap) for s in spec)
    if dataclasses.is_dataclass(spec):
        changes = {
            f.name: swap_classes(getattr(spec, f.name), swap) for f in dataclasses.fields(spec) if f.init
        }
        return dataclasses.replace(spec, **changes)
    return spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="In-image GPU check for verl + Megatron MTP training (see docs/gpu.md).",
        epilog="exit codes: 0 all checks passed, 1 a check failed, 2 usage error, "
        "77 no CUDA device (GPU part skipped; use --cpu-only to make that exit 0)",
    )
    ap.add_argument("--mode", choices=CLI_MODES, help="checks to run; default: the version vector's mode")
    ap.add_argument(
        "--version-vector",
        help=f"version vector JSON (keys mode, engine); read when --mode is absent (default {DEFAULT_VERSION_VECTOR})",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument(
        "--transformer-impl",
        choices=["local", "transformer_engine"],
        default="local",
        help="CP=1 model layers: megatron's local spec in fp32 (default; needs no TransformerEngine) "
        "or TransformerEngine's in bf16 (CP>1 always uses TransformerEngine)",
    )
    ap.add_argument("--cpu-only", action="store_true", help="CPU-side logic only; skip the GPU part, exit 0")
    ap.add_argument(
        "--inject-broken-detach",
        action="store_true",
        help="debug: detach the MTP inputs so none requires grad (shows the silent no-gradient hazard)",
    )
    ap.add_argument(
        "--no-verl", action="store_true", help="debug: use the local detach even if verl is installed"
    )
    ap.add_argument(
        "--cpu-model",
        "--debug-cpu-model",
        dest="debug_cpu_model",
        action="store_true",
        help="run the model checks on the CPU with a gloo group (no CUDA/NCCL checks, CP=1 only): the "
        "gradient contract on a builder without a GPU (run_checks.py's mtp-grad group)",
    )
    ap.add_argument(
        "--overrides",
        help="the profile's verl overrides (detach_encoder, override_transformer_config.*) the model "
        f"takes; default: the image's own ({', '.join(DEFAULT_OVERRIDES)}), only without --mode",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: 0 for --help, 2 for errors
        return int(exc.code or 0)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    try:
        plan = resolve_plan(args.mode, args.version_vector, world_size, args.overrides)
    except UsageError as exc:
        log(f"gpu_check: error: {exc}")
        return EXIT_USAGE

    env = static_env()
    env["engine"] = plan.engine
    env["settings"] = (
        plan.settings.describe() if plan.settings is not None else "upstream's switches (no overrides)"
    )
    gpu_skipped: str | None = None
    if args.cpu_only:
        gpu_skipped = "--cpu-only given"
        results = skipped_results(plan.checks, gpu_skipped)
    else:
        try:
            import torch
        except Exception as exc:  # noqa: BLE001
            results = [CheckResult("torch-cuda", FAIL, f"import torch failed: {type(exc).__name__}: {exc}")]
            results += [
                CheckResult(c.name, SKIP, "torch missing") for c in plan.checks if c.name != "torch-cuda"
            ]
        else:
            if not args.debug_cpu_model and not torch.cuda.is_available():
                gpu_skipped = (
                    f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
                )
                results = skipped_results(plan.checks, gpu_skipped)
            else:
                results, genv = run_gpu_part(plan, args, log)
                env.update(genv)
    report = build_report(
        results, env, mode=plan.mode, source=plan.source, gpu_skipped=gpu_skipped, cpu_only=args.cpu_only
    )
    rank = int(os.environ.get("RANK", "0") or 0)
    if args.json:
        if rank == 0 or not report["ok"]:
            print(json.dumps(report, sort_keys=False))
        if gpu_skipped:
            log(f"GPU part skipped: {gpu_skipped}")
    elif rank == 0 or not report["ok"]:
        print(format_table(report) if rank == 0 else f"[rank {rank}]\n" + format_table(report))
    sys.stdout.flush()
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
