#!/usr/bin/env python3
"""PyTorch twin of attention_bench.cu: causal scaled_dot_product_attention on the same shapes
(q, k, v as head-major views of one (B, T, 3C) bf16 tensor, as a GPT-2 block makes them), flash
backend (and cuDNN's, when it runs), forward and backward timed with CUDA events (median of reps).
Reads our JSON (attention_bench's stdout)
from argv[1] and prints one JSON object with ours, torch's and the ratios (torch ms / ours ms;
> 1 means ours is faster). Never a pass/fail on timing.

Usage: attention_torch.py OURS.json
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], times[0]


def time_backend(backend, B, T, NH, hs):
    C = NH * hs
    torch.manual_seed(0)
    qkv = ((torch.rand(B, T, 3 * C, device="cuda") - 0.5) * 4).to(torch.bfloat16)
    dy = ((torch.rand(B, NH, T, hs, device="cuda") - 0.5) * 2).to(torch.bfloat16)
    qkv.requires_grad_()

    def heads(x):
        q, k, v = x.split(C, dim=2)
        return [t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v)]

    with sdpa_kernel([backend]):
        q, k, v = heads(qkv.detach())
        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 30)
        # backward of the attention core alone: q, k, v leaves (no stacking into dqkv)
        ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
        bwd = median_ms(lambda: torch.autograd.grad(out, (ql, kl, vl), dy, retain_graph=True), 30)
        # backward into the (B, T, 3C) gradient as a GPT-2 block needs it (what ours writes)
        q2, k2, v2 = heads(qkv)
        out2 = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
        bwd_qkv = median_ms(lambda: torch.autograd.grad(out2, (qkv,), dy, retain_graph=True), 30)
    return {"fwd_median_ms": round(fwd[0], 4), "fwd_min_ms": round(fwd[1], 4),
            "bwd_median_ms": round(bwd[0], 4), "bwd_min_ms": round(bwd[1], 4),
            "bwd_into_qkv_median_ms": round(bwd_qkv[0], 4)}


def main():
    ours = json.load(open(sys.argv[1]))
    T, NH, hs = ours["T"], ours["NH"], ours["hs"]
    result = {"ours": ours, "torch_version": torch.__version__,
              "device": torch.cuda.get_device_name(),
              "note": "ratio = torch median ms / ours median ms (> 1: ours faster); torch bwd = "
                      "grad of q, k, v leaves (bwd_into_qkv: into the (B,T,3C) tensor, as ours)",
              "torch": {}, "ratios": []}
    batches = sorted({r["B"] for r in ours["runs"]})
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for B in batches:
        for name, backend in backends.items():
            try:
                result["torch"][f"{name}_B{B}"] = time_backend(backend, B, T, NH, hs)
            except Exception as e:  # a backend may be unavailable for the shape: say so
                result["torch"][f"{name}_B{B}"] = {"error": str(e).splitlines()[0][:200]}
            torch.cuda.empty_cache()
        flash = result["torch"][f"flash_B{B}"]
        for r in ours["runs"]:
            if r["B"] != B or "fwd_median_ms" not in flash or "fwd_median_ms" not in r:
                continue
            result["ratios"].append({
                "impl": r["impl"], "B": B,
                "fwd_torch_flash_over_ours": round(flash["fwd_median_ms"] / r["fwd_median_ms"], 3),
                "bwd_torch_flash_over_ours": round(flash["bwd_median_ms"] / r["bwd_median_ms"], 3),
                "bwd_into_qkv_torch_flash_over_ours":
                    round(flash["bwd_into_qkv_median_ms"] / r["bwd_median_ms"], 3)})
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
