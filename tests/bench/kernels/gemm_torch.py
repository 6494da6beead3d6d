#!/usr/bin/env python3
"""PyTorch twin of gemm_bench.cu: times the same GPT-2 124M GEMMs with torch (bf16 tensors,
F.linear for the forward with bias, dy @ w for dx, dy^T @ x for dW (torch writes bf16; ours
accumulates into fp32), dW + dy.sum(0) for the rows with a bias gradient), timed the same way
(CUDA events, calls back to back per rep, median of reps), in the same run. Reads our JSON
(gemm_bench's stdout) from argv[1] and prints one JSON object: every row with torch_ms,
torch TFLOP/s and torch_over_tuned (torch time / ours; > 1 means ours is faster), plus per N an
estimate of one training step's GEMM time (12 transformer layers + the lm head): heuristic-first
with the separate bias pass (before), tuned with the measured bias choice (after), and torch.
Never a pass/fail on timing.

Usage: gemm_torch.py OURS.json
"""
import json
import sys

import torch
import torch.nn.functional as F

REPS = 15
CALLS_PER_REP = 10


def time_ms(fn):
    fn()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    calls = 2 if a.elapsed_time(b) > 1.0 else CALLS_PER_REP
    times = []
    for _ in range(REPS):
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    times.sort()
    return times[len(times) // 2]


def main():
    ours = json.load(open(sys.argv[1]))
    dev = "cuda"
    torch.manual_seed(0)
    cache = {}
    for row in ours["rows"]:
        N, C, OC = row["N"], row["C"], row["OC"]
        key = (N, C, OC, row["layer"])
        if key not in cache:
            cache.clear()  # one shape's tensors at a time (lm head at N=65536: 6.6 GB each)
            torch.cuda.empty_cache()
            x = torch.randn(N, C, device=dev, dtype=torch.bfloat16)
            w = torch.randn(OC, C, device=dev, dtype=torch.bfloat16) * 0.05
            b = torch.randn(OC, device=dev, dtype=torch.bfloat16) * 0.1
            dy = torch.randn(N, OC, device=dev, dtype=torch.bfloat16) * 0.01
            cache[key] = (x, w, b, dy)
        x, w, b, dy = cache[key]
        with_bias = row["layer"] != "lm_head"
        op = row["op"]
        if op == "fwd":
            fn = (lambda: F.linear(x, w, b)) if with_bias else (lambda: torch.matmul(x, w.t()))
        elif op == "dx":
            fn = lambda: torch.matmul(dy, w)
        elif op == "dw":
            fn = lambda: torch.matmul(dy.t(), x)
        elif op == "dw_bias":
            fn = lambda: (torch.matmul(dy.t(), x), dy.sum(0, dtype=torch.float32))
        else:
            continue
        t = time_ms(fn)
        flop = 2.0 * N * C * OC
        row["torch_ms"] = round(t, 5)
        row["torch_tflops"] = round(flop / t / 1e9, 1)
        ours_ms = row.get("tuned_ms", row.get("measured_ms"))
        row["torch_over_tuned"] = round(t / ours_ms, 3)
    # per N: one training step's GEMMs (12 layers of qkv/attn_proj/fc/fc_proj + the lm head)
    step = {}
    for N in sorted({r["N"] for r in ours["rows"]}):
        rows = {(r["layer"], r["op"]): r for r in ours["rows"] if r["N"] == N}
        before = after = torch_ms = 0.0
        for layer in ("qkv", "attn_proj", "fc", "fc_proj", "lm_head"):
            count = 1 if layer == "lm_head" else 12
            fwd, dx, dw = rows[(layer, "fwd")], rows[(layer, "dx")], rows[(layer, "dw")]
            b_ = fwd["heuristic_ms"] + dx["heuristic_ms"] + dw["heuristic_ms"]
            a_ = fwd["tuned_ms"] + dx["tuned_ms"]
            t_ = fwd["torch_ms"] + dx["torch_ms"]
            if (layer, "dw_bias") in rows:
                db = rows[(layer, "dw_bias")]
                b_ += db["separate_ms"] - dw["tuned_ms"]  # the separate bias pass
                a_ += db["measured_ms"]
                t_ += db["torch_ms"]
            else:
                a_ += dw["tuned_ms"]
                t_ += dw["torch_ms"]
            before += count * b_
            after += count * a_
            torch_ms += count * t_
        step[str(N)] = {
            "heuristic_separate_bias_ms": round(before, 3),
            "tuned_measured_bias_ms": round(after, 3),
            "torch_ms": round(torch_ms, 3),
            "saving_ms": round(before - after, 3),
            "torch_over_tuned": round(torch_ms / after, 3),
        }
    ours["step_gemm_estimate"] = step
    ours["torch"] = torch.__version__
    json.dump(ours, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
