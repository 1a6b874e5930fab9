#!/usr/bin/env python3
"""In-image RL check: verl's main_ppo (GRPO, SGLang rollout, Megatron actor) on a tiny MTP model.

Copied into every image at /opt/mtp/checks/rl_check.py and run by `build.py test --gpu`
(run_checks.py's `trainer` group, where the profile has the rl target and the image has sglang);
also by hand on any NVIDIA node that runs the image:

    python rl_check.py [--json] [--steps 3] [--work DIR]

It makes, at test time and without a hub, the random-init MiMo of tinymimo.py (which SGLang serves
as MiMoForCausalLM, with MiMoMTP as its EAGLE draft) and a parquet of short prompts in verl's RL
format, then runs `python3 -m verl.trainer.main_ppo` on one node with exactly the image's verl
overrides (/opt/mtp/verl/rl.overrides, what `explain --target rl` prints) plus test-size settings
that decide nothing of the mode (data, batch, lengths, parallel sizes 1, no offload, no wandb, a
reward function of its own, rl_reward.py). The interpreter is plain python3 and every Ray worker
the same one (`ray_kwargs.ray_init.runtime_env.py_executable=null`: verl's VERL_USE_UV=0 path).

Judged on verl's own metrics (its file logger, one JSON line per step):

  every mode      exit 0; every step logged; a finite policy loss; the actor updated (a finite,
                  non-zero grad norm: verl skips the optimizer step on a non-finite one)
  trains MTP      actor/mtp_losses/mtp_1_loss logged and finite at every step
  load-only       no MTP loss
  rollout mode    SGLang decoded speculatively with the MTP draft: rollout/spec_accept_length
                  (verl's mean of 1 + accepted/verify steps, from SGLang's spec_verify_ct and
                  spec_accept_token_num per request) logged at every step and >= 1, i.e. verify
                  steps happened
  other modes     no speculative-decoding metric (the rollout is plain)

Losses are not required to fall: GRPO on a random model's own samples moves them by noise.
Where flash-attn or apex is absent, trainer_check.py's stand-ins are added for the actor; SGLang
gets settings that keep the run free of just-in-time kernel builds (named in the report: the image
carries no flashinfer AOT cache, so flashinfer's attention and sampling kernels would be compiled
with nvcc at first use).

Exit codes: 0 every check passed, 1 a check failed, 2 usage error, 77 no CUDA device.
Only the standard library is imported at module level: the judging is testable without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import tinymimo
import trainer_check as tc

HERE = Path(__file__).resolve().parent
REWARD = HERE / "rl_reward.py"
DEFAULT_OVERRIDES = Path("/opt/mtp/verl/rl.overrides")
ACTOR_PREFIX = "actor_rollout_ref.actor.megatron.override_transformer_config."
RUN_TIMEOUT = float(os.environ.get("MTP_RL_TIMEOUT") or 900)
PASS, FAIL, SKIP, INFO = tc.PASS, tc.FAIL, tc.SKIP, tc.INFO
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = tc.EXIT_OK, tc.EXIT_FAIL, tc.EXIT_USAGE, tc.EXIT_SKIP
Finding = tc.Finding


@dataclasses.dataclass(frozen=True)
class Expect:
    """What the profile's version vector promises of an RL run."""

    trains_mtp: bool
    speculative: bool

    @classmethod
    def of(cls, vector: dict) -> Expect:
        mtp = vector.get("mtp_config") or {}
        return cls(
            trains_mtp=bool(vector.get("trains_mtp")),
            speculative=vector.get("mode") == "rollout" or str(mtp.get("enable_rollout")) == "True",
        )


@dataclasses.dataclass(frozen=True)
class RlResult:
    name: str
    rc: int
    seconds: float
    metrics: tuple[dict, ...]  # verl's file logger: {"step": n, "data": {...}} per step
    gpu_peak_mib: float | None = None  # the device's memory.used, every process, sampled
    log_tail: str = ""


# ------------------------------------------------------------------------------ the run
def rollout_settings() -> tuple[list[str], list[str]]:
    """SGLang settings of a test-sized run, and why: none is an MTP setting."""
    kw = "actor_rollout_ref.rollout.engine_kwargs.sglang."
    return (
        [
            # verl picks flashinfer for sglang >= 0.5.12 (async_sglang_server.py:271-277), whose
            # kernels are JIT-compiled at first use without flashinfer's AOT cache; FA3 is
            # sgl_kernel's precompiled one (SGLang's own default on Hopper), CUDA graphs off
            # because verl names FA3 graph capture broken on 0.5.12 (#22800)
            f"+{kw}attention_backend=fa3",
            # SGLang samples with flashinfer when it imports (server_args.py:2573), JIT again
            f"+{kw}sampling_backend=pytorch",
            "actor_rollout_ref.rollout.enforce_eager=True",
        ],
        [
            "sglang attention_backend=fa3, sampling_backend=pytorch, enforce_eager: no JIT kernel "
            "builds (the image has no flashinfer AOT cache)"
        ],
    )


def test_size(work: Path, run: str, steps: int, gpus: int) -> list[str]:
    """Data, batch, lengths, parallel sizes, logging: nothing of what the mode decides."""
    data = work / "data" / "rl.parquet"
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=32",
        "data.dataloader_num_workers=0",
        "data.trust_remote_code=True",
        f"actor_rollout_ref.model.path={work / 'model'}",
        "actor_rollout_ref.model.trust_remote_code=True",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        "actor_rollout_ref.actor.megatron.context_parallel_size=1",
        "actor_rollout_ref.actor.megatron.param_offload=False",
        "actor_rollout_ref.actor.megatron.grad_offload=False",
        "actor_rollout_ref.actor.megatron.optimizer_offload=False",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={REWARD}",
        "reward.custom_reward_function.name=compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.logger=[console,file]",
        "trainer.project_name=mtp-rl-check",
        f"trainer.experiment_name={run}",
        f"trainer.default_local_dir={work / 'runs' / run / 'ckpt'}",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.resume_mode=disable",
        "trainer.critic_warmup=0",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={gpus}",
        # VERL_USE_UV=0: the workers run this interpreter, not `uv run` (verl's examples' RAY=)
        "ray_kwargs.ray_init.runtime_env.py_executable=null",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"+ray_kwargs.ray_init._temp_dir={work / 'ray'}",
    ]


def command(lines: list[str], extra: list[str], work: Path, run: str, steps: int, gpus: int) -> list[str]:
    """The whole command line: the image's overrides first, exactly as they are; a test-size
    setting of a key they set is left out (theirs wins; a CP size above the node's GPU count was
    lowered by fit_to_node, and said so)."""
    theirs = {tc.setting_key(ln) for ln in lines}
    ours = [ln for ln in extra + test_size(work, run, steps, gpus) if tc.setting_key(ln) not in theirs]
    return [sys.executable, "-m", "verl.trainer.main_ppo", *lines, *ours]


class GpuPeak:
    """The device's memory.used (all processes: the actor and SGLang's KV pool), once a second."""

    def __init__(self) -> None:
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        smi = shutil.which("nvidia-smi")
        while smi and not self._stop.wait(1.0):
            try:
                out = subprocess.run(
                    [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
                used = max(float(x) for x in out.split())
            except (OSError, ValueError, subprocess.SubprocessError):
                continue
            self.peak = used if self.peak is None else max(self.peak, used)

    def __enter__(self) -> GpuPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def launch(name: str, argv: list[str], work: Path) -> RlResult:
    rundir = work / "runs" / name
    rundir.mkdir(parents=True, exist_ok=True)
    metrics, log = rundir / "metrics.jsonl", rundir / "main_ppo.log"
    metrics.unlink(missing_ok=True)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics), "PYTHONUNBUFFERED": "1"}
    (rundir / "command.json").write_text(json.dumps(argv, indent=1))
    started = time.monotonic()
    with GpuPeak() as peak, open(log, "wb") as out:
        try:
            rc = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=rundir, env=env, timeout=RUN_TIMEOUT
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    seconds = time.monotonic() - started
    return RlResult(name, rc, seconds, tc._jsonl(metrics), peak.peak, log.read_text(errors="replace")[-4000:])


# ------------------------------------------------------------------------------ judging
def values(metrics: tuple[dict, ...], suffix: str) -> list[list[float]]:
    """Per step, every value whose key is `suffix` or ends with `/suffix` (verl's prefixes vary)."""
    out = []
    for row in sorted(metrics, key=lambda r: r.get("step", 0)):
        data = row.get("data") or {}
        out.append([float(v) for k, v in data.items() if (k == suffix or k.endswith("/" + suffix))])
    return out


def per_step(metrics: tuple[dict, ...], key: str) -> list[float | None]:
    """One exact key per step (None where a step lacks it)."""
    rows = sorted(metrics, key=lambda r: r.get("step", 0))
    return [None if (r.get("data") or {}).get(key) is None else float(r["data"][key]) for r in rows]


def _fmt(xs) -> str:
    return " ".join("-" if x is None else f"{x:.4g}" for x in xs) or "none"


def _finite(xs) -> bool:
    return bool(xs) and all(x is not None and math.isfinite(x) for x in xs)


def error_line(log_tail: str) -> str:
    """The last line that names an exception, else the last line."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln or "error:" in ln:
            return ln[-400:]
    return lines[-1][-400:] if lines else ""


def judge(expect: Expect, result: RlResult, steps: int) -> list[Finding]:
    """The mode's promises on a recorded run. Pure: tests feed it recorded logs."""
    r = result
    if r.rc != 0:
        return [Finding("run", FAIL, f"exit {r.rc} after {r.seconds:.0f} s: {error_line(r.log_tail)}")]
    out: list[Finding] = []
    logged = len(r.metrics)
    out.append(
        Finding(
            "steps-logged", PASS if logged == steps else FAIL, f"{logged} of {steps} steps in verl's file log"
        )
    )
    pg = per_step(r.metrics, "actor/pg_loss")
    out.append(Finding("policy-loss-finite", PASS if _finite(pg) else FAIL, f"actor/pg_loss: {_fmt(pg)}"))
    gn = per_step(r.metrics, "actor/grad_norm")
    ok = _finite(gn) and all(g > 0 for g in gn)
    out.append(Finding("actor-updated", PASS if ok else FAIL, f"actor/grad_norm: {_fmt(gn)}"))
    mtp = per_step(r.metrics, "actor/mtp_losses/mtp_1_loss")
    if expect.trains_mtp:
        out.append(
            Finding(
                "mtp-loss-logged", PASS if _finite(mtp) else FAIL, f"actor/mtp_losses/mtp_1_loss: {_fmt(mtp)}"
            )
        )
    else:
        none = all(x is None or x == 0 for x in mtp)
        out.append(
            Finding("no-mtp-loss", PASS if none else FAIL, f"mtp_1_loss: {_fmt(mtp)} (MTP not trained)")
        )
    acc_len = per_step(r.metrics, "rollout/spec_accept_length")
    acc_rate = per_step(r.metrics, "rollout/spec_accept_rate")
    spec = f"spec_accept_length {_fmt(acc_len)}; spec_accept_rate {_fmt(acc_rate)}"
    if expect.speculative:
        ok = _finite(acc_len) and all(x >= 1.0 for x in acc_len)
        out.append(Finding("speculative-rollout", PASS if ok else FAIL, spec + " (EAGLE with the MTP draft)"))
    else:
        plain = all(x is None for x in acc_len)
        out.append(Finding("plain-rollout", PASS if plain else FAIL, spec))
    return out


def summary(r: RlResult) -> dict:
    mem = [max(v, default=None) for v in values(r.metrics, "max_memory_allocated_gb")]
    return {
        "name": r.name,
        "rc": r.rc,
        "seconds": round(r.seconds, 1),
        "steps": len(r.metrics),
        "pg_loss": per_step(r.metrics, "actor/pg_loss"),
        "grad_norm": per_step(r.metrics, "actor/grad_norm"),
        "mtp_1_loss": per_step(r.metrics, "actor/mtp_losses/mtp_1_loss"),
        "score_mean": per_step(r.metrics, "critic/score/mean"),
        "response_length_mean": per_step(r.metrics, "response_length/mean"),
        "spec_accept_length": per_step(r.metrics, "rollout/spec_accept_length"),
        "spec_accept_rate": per_step(r.metrics, "rollout/spec_accept_rate"),
        "step_seconds": per_step(r.metrics, "timing_s/step"),
        "gen_seconds": per_step(r.metrics, "timing_s/gen"),
        "update_actor_seconds": per_step(r.metrics, "timing_s/update_actor"),
        "actor_peak_gib": max((m for m in mem if m is not None), default=None),
        "gpu_peak_mib": r.gpu_peak_mib,
        "error": None if r.rc == 0 else error_line(r.log_tail),
    }


# ------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--work", type=Path, help="where the model, data and runs go (default: a temp dir)")
    ap.add_argument("--version-vector", type=Path, default=tc.DEFAULT_VECTOR)
    ap.add_argument("--overrides", type=Path, default=DEFAULT_OVERRIDES)
    args = ap.parse_args(argv)
    try:
        vector = json.loads(args.version_vector.read_text())
        lines = [ln for ln in args.overrides.read_text().splitlines() if ln.strip()]
    except (OSError, ValueError) as exc:
        print(f"rl_check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if "rl" not in vector.get("targets", ["rl"]):
        print(f"rl_check: profile {vector.get('profile')} has no rl target", file=sys.stderr)
        return EXIT_USAGE
    import importlib.util

    import torch

    gpus = min(torch.cuda.device_count(), 1)
    if gpus == 0:
        print("rl_check: no CUDA device", file=sys.stderr)
        return EXIT_SKIP
    lines, notes = tc.fit_to_node(lines, gpus)
    extra, more = tc.stand_ins(
        importlib.util.find_spec("flash_attn") is not None,
        importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None,
        ACTOR_PREFIX,
    )
    notes += more
    sg, more = rollout_settings()
    extra += sg
    notes += more
    work = args.work or Path(tempfile.mkdtemp(prefix="mtp-rl-check-"))
    tinymimo.make(work)
    expect = Expect.of(vector)
    result = launch("grpo", command(lines, extra, work, "grpo", args.steps, gpus), work)
    findings = judge(expect, result, args.steps)
    failed = any(f.status == FAIL for f in findings)
    report = {
        "ok": not failed,
        "profile": vector.get("profile"),
        "expect": dataclasses.asdict(expect),
        "overrides": lines,
        "stand_ins": extra,
        "notes": notes,
        "gpus": gpus,
        "runs": [summary(result)],
        "results": [dataclasses.asdict(f) for f in findings],
        "work": str(work),
    }
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        for note in notes:
            print(f"note: {note}")
        print(tc.table(findings))
    return EXIT_FAIL if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
