#!/usr/bin/env python3
"""GPU tests of the compiled extensions (issue 22), run on the device machine next to its
torch 2.11.0+cu130 with the wheels the image installs (scripts/device/ext-proof.sh).

Each test compares an extension's kernels with a plain PyTorch reference on the same inputs,
forward and backward, and prints one line; the last line is a JSON summary. A package that
was not carried is reported SKIP with why, never PASS.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import torch

RESULTS: list[dict] = []


def record(name: str, status: str, detail: str, seconds: float) -> None:
    RESULTS.append({"test": name, "status": status, "detail": detail, "seconds": round(seconds, 2)})
    print(f"{status:<5} {name:<32} {detail}", flush=True)


def run(name: str, fn) -> None:
    t0 = time.monotonic()
    try:
        detail = fn()
        record(name, "PASS", detail, time.monotonic() - t0)
    except ModuleNotFoundError as exc:
        record(name, "SKIP", f"not installed: {exc.name}", time.monotonic() - t0)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, the others still run
        tb = traceback.format_exc().strip().splitlines()
        record(name, "FAIL", f"{type(exc).__name__}: {exc} | {' | '.join(tb[-3:])}", time.monotonic() - t0)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def check(value: float, limit: float, what: str) -> str:
    if not value <= limit:
        raise AssertionError(f"{what}: relative difference {value:.3e} > {limit:.0e}")
    return f"{what} {value:.1e}"


def te_linear() -> str:
    import transformer_engine.pytorch as te

    torch.manual_seed(0)
    lin = te.Linear(256, 512, bias=True, params_dtype=torch.bfloat16).cuda()
    ref = torch.nn.Linear(256, 512, bias=True, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        ref.weight.copy_(lin.weight)
        ref.bias.copy_(lin.bias)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = lin(x), ref(x2)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    out = [check(rel(y, y2), 2e-2, "fwd"), check(rel(x.grad, x2.grad), 2e-2, "dgrad")]
    out.append(check(rel(lin.weight.grad, ref.weight.grad), 2e-2, "wgrad"))
    import transformer_engine

    return f"TE {transformer_engine.__version__} Linear bf16: " + ", ".join(out)


def te_attention() -> str:
    import os

    import transformer_engine.pytorch as te

    os.environ.setdefault("NVTE_DEBUG", "1")
    os.environ.setdefault("NVTE_DEBUG_LEVEL", "1")
    torch.manual_seed(0)
    b, s, h, d = 2, 256, 8, 64
    q, k, v = (
        torch.randn(s, b, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    attn = te.DotProductAttention(h, d, attn_mask_type="causal", qkv_format="sbhd").cuda()
    out = attn(q, k, v)
    g = torch.randn_like(out)
    out.backward(g)
    qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref = (
        torch.nn.functional.scaled_dot_product_attention(
            qr.permute(1, 2, 0, 3), kr.permute(1, 2, 0, 3), vr.permute(1, 2, 0, 3), is_causal=True
        )
        .permute(2, 0, 1, 3)
        .reshape(s, b, h * d)
    )
    ref.backward(g)
    parts = [check(rel(out, ref), 2e-2, "fwd")]
    parts += [
        check(rel(a.grad, r.grad), 5e-2, f"d{n}") for n, a, r in (("q", q, qr), ("k", k, kr), ("v", v, vr))
    ]
    return "TE DotProductAttention causal bf16 (fused backend as TE chose it): " + ", ".join(parts)


def flash_varlen() -> str:
    from flash_attn import flash_attn_varlen_func

    torch.manual_seed(0)
    h, d = 8, 128
    lens = [37, 128, 5, 200]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    total = sum(lens)
    q, k, v = (
        torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    g = torch.randn_like(out)
    out.backward(g)
    qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    refs = []
    for i in range(len(lens)):
        a, e = int(cu[i]), int(cu[i + 1])
        o = torch.nn.functional.scaled_dot_product_attention(
            qr[a:e].transpose(0, 1), kr[a:e].transpose(0, 1), vr[a:e].transpose(0, 1), is_causal=True
        ).transpose(0, 1)
        refs.append(o)
    ref = torch.cat(refs)
    ref.backward(g)
    parts = [check(rel(out, ref), 2e-2, "fwd")]
    parts += [
        check(rel(a.grad, r.grad), 5e-2, f"d{n}") for n, a, r in (("q", q, qr), ("k", k, kr), ("v", v, vr))
    ]
    import flash_attn

    return f"flash-attn {flash_attn.__version__} varlen causal bf16, 4 sequences: " + ", ".join(parts)


def apex_fused_adam() -> str:
    from apex.optimizers import FusedAdam

    torch.manual_seed(0)
    p1 = [
        torch.randn(1000, 100, device="cuda", requires_grad=True),
        torch.randn(77, device="cuda", requires_grad=True),
    ]
    p2 = [p.detach().clone().requires_grad_(True) for p in p1]
    o1 = FusedAdam(p1, lr=1e-3, weight_decay=0.01, adam_w_mode=True)
    o2 = torch.optim.AdamW(p2, lr=1e-3, weight_decay=0.01)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in p1]
        for p, q, gr in zip(p1, p2, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        o1.step()
        o2.step()
    worst = max(rel(a, b) for a, b in zip(p1, p2))
    return "apex FusedAdam (AdamW mode) vs torch.optim.AdamW, 5 steps: " + check(worst, 1e-5, "params")


def apex_layer_norm() -> str:
    from apex.normalization import FusedLayerNorm

    torch.manual_seed(0)
    ln = FusedLayerNorm(1024).cuda()
    ref = torch.nn.LayerNorm(1024).cuda()
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = ln(x), ref(x2)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    parts = [check(rel(y, y2), 1e-5, "fwd"), check(rel(x.grad, x2.grad), 1e-4, "dgrad")]
    parts.append(check(rel(ln.weight.grad, ref.weight.grad), 1e-4, "dweight"))
    return "apex FusedLayerNorm fp32 vs torch.nn.LayerNorm: " + ", ".join(parts)


def autobridge() -> str:
    import megatron.bridge
    from megatron.bridge import AutoBridge  # noqa: F401 - the import is the test

    return f"from megatron.bridge import AutoBridge: ok ({getattr(megatron.bridge, '__version__', '?')})"


def main() -> int:
    print(
        f"torch {torch.__version__} cuda {torch.version.cuda} on {torch.cuda.get_device_name(0)}", flush=True
    )
    for name, fn in (
        ("te-linear-bf16", te_linear),
        ("te-fused-attention-bf16", te_attention),
        ("flash-attn-varlen", flash_varlen),
        ("apex-fused-adam", apex_fused_adam),
        ("apex-fused-layer-norm", apex_layer_norm),
        ("megatron-bridge-autobridge", autobridge),
    ):
        run(name, fn)
    print(json.dumps({"results": RESULTS}))
    return 1 if any(r["status"] == "FAIL" for r in RESULTS) else 0


if __name__ == "__main__":
    sys.exit(main())
