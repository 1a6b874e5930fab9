#!/usr/bin/env python3
"""Run verl's own trainer module with two observation hooks, for trainer_check.py.

    torchrun --standalone --nproc-per-node N trainer_probe.py HYDRA_OVERRIDES...

It runs `verl.trainer.sft_trainer` (MTP_PROBE_MODULE) exactly as `python -m` would, after:
  - wrapping megatron-core's finalize_model_grads, which verl registers as the model config's
    finalize_model_grads_func (verl/utils/megatron_utils.py:1680-1692) and megatron's schedule
    calls once per step after the backward pass: each call writes, on rank 0, one JSON line to
    MTP_PROBE_OUT with the gradient norm of every parameter group (mtp, output_layer,
    embedding, decoder, other) and the GPU's peak memory so far;
  - with MTP_PROBE_ZERO_MAIN_LOSS=1, scaling verl's SFT loss (verl.workers.utils.losses.sft_loss,
    which the trainer looks up when it builds its engine) by 0, so that every gradient left is
    the MTP loss's own: megatron adds that one in the backward pass (MTPLossAutoScaler), not
    through the returned loss.
Nothing of verl or megatron is changed on disk; without the variables it only observes.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import sys
import time

GROUPS = ("mtp", "output_layer", "embedding", "decoder")


def group_of(name: str) -> str:
    """A megatron GPTModel parameter's group, from its name inside the DDP/Float16 wrappers."""
    while name.startswith("module."):
        name = name[len("module.") :]
    head = name.split(".", 1)[0]
    return head if head in GROUPS else "other"


def summarize(named_norms: list[tuple[str, float | None]]) -> dict:
    """{group: {params, nonzero, norm}} of (name, gradient norm or None for no gradient)."""
    out: dict[str, dict] = {}
    for name, norm in named_norms:
        g = out.setdefault(group_of(name), {"params": 0, "nonzero": 0, "sq": 0.0})
        g["params"] += 1
        if norm is not None and norm > 0:
            g["nonzero"] += 1
            g["sq"] += norm * norm
    return {
        k: {"params": v["params"], "nonzero": v["nonzero"], "norm": math.sqrt(v["sq"])}
        for k, v in out.items()
    }


def _install(out_path: str, zero_main: bool) -> None:
    import megatron.core.distributed as mcd
    import torch
    import torch.distributed as dist

    original = mcd.finalize_model_grads
    state = {"calls": 0, "last": time.monotonic()}

    def finalize_model_grads(model, *args, **kwargs):
        result = original(model, *args, **kwargs)
        if dist.is_initialized() and dist.get_rank() != 0:
            return result
        named = []
        for chunk in model:
            for name, p in chunk.named_parameters():
                grad = getattr(p, "main_grad", None)
                if grad is None:
                    grad = p.grad
                named.append((name, None if grad is None else float(grad.detach().float().norm())))
        now = time.monotonic()
        state["calls"] += 1
        line = {
            "call": state["calls"],
            "seconds": round(now - state["last"], 3),
            "groups": summarize(named),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 4)
            if torch.cuda.is_available()
            else None,
        }
        state["last"] = now
        with open(out_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
        return result

    mcd.finalize_model_grads = finalize_model_grads
    if zero_main:
        import verl.workers.utils.losses as losses

        sft_loss = losses.sft_loss

        def zeroed(*args, **kwargs):
            loss, metrics = sft_loss(*args, **kwargs)
            return loss * 0.0, metrics

        losses.sft_loss = zeroed


def main() -> None:
    out = os.environ.get("MTP_PROBE_OUT")
    if out:
        _install(out, os.environ.get("MTP_PROBE_ZERO_MAIN_LOSS") == "1")
    module = os.environ.get("MTP_PROBE_MODULE", "verl.trainer.sft_trainer")
    sys.argv = [module] + sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
