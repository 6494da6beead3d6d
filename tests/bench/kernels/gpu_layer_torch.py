#!/usr/bin/env python3
"""PyTorch twin of gpu_layer_bench.cu: the same partial GPT-2 124M layer (no attention core) and
the same classifier, forward + backward, bf16 autocast with fp32 parameters, eager and
torch.compile, timed with CUDA events (median of reps). Reads our JSON (gpu_layer_bench's stdout)
from the file given as argv[1] and prints one JSON object with both and the ratios
(PyTorch time / ours; > 1 means ours is faster). Never a pass/fail on timing.

Usage: gpu_layer_torch.py OURS.json [B] [T]
"""
import json
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, reps):
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


def main():
    ours = json.load(open(sys.argv[1]))
    B = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    T = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    C, V, Vp = 768, 50257, 50304
    N = B * T
    dev = "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    def p(*shape, std=0.02):
        return (torch.randn(*shape, device=dev) * std).requires_grad_()

    ln1 = torch.nn.LayerNorm(C, device=dev)
    ln2 = torch.nn.LayerNorm(C, device=dev)
    wqkv, bqkv = p(3 * C, C), p(3 * C)
    wproj, bproj = p(C, C), p(C)
    wfc, bfc = p(4 * C, C), p(4 * C)
    wfcp, bfcp = p(C, 4 * C), p(C)
    wte = p(Vp, C)
    x = torch.randn(N, C, device=dev, requires_grad=True)
    yatt = torch.randn(N, C, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(N, C, device=dev, dtype=torch.bfloat16) * 1e-3
    dqkv = torch.randn(N, 3 * C, device=dev, dtype=torch.bfloat16) * 1e-3
    targets = torch.randint(0, V, (N,), device=dev)

    def layer_fwd(x, yatt):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h1 = ln1(x)
            qkv = F.linear(h1, wqkv, bqkv)
            s = x + F.linear(yatt, wproj, bproj)
            h = F.gelu(F.linear(ln2(s), wfc, bfc), approximate="tanh")
            out = s + F.linear(h, wfcp, bfcp)
        return out, qkv

    def classifier_fwd(h):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = F.linear(h, wte)
        # the padded columns are excluded like ours (first V of Vp)
        return F.cross_entropy(logits[:, :V].float(), targets)

    lnf_in = torch.randn(N, C, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def make_steps(lf, cf):
        def layer_step():
            out, qkv = lf(x, yatt)
            torch.autograd.backward([out, qkv], [dout.to(out.dtype), dqkv.to(qkv.dtype)])

        def classifier_step():
            cf(lnf_in).backward()

        return layer_step, classifier_step

    result = {"ours": ours, "B": B, "T": T, "torch_version": torch.__version__,
              "note": "layer_no_attention excludes the attention core on both sides; ratio = "
                      "torch ms / ours graph-replay ms (> 1: ours faster)"}
    for mode in ("eager", "compile"):
        lf, cf = layer_fwd, classifier_fwd
        if mode == "compile":
            lf, cf = torch.compile(layer_fwd), torch.compile(classifier_fwd)
        layer_step, classifier_step = make_steps(lf, cf)
        entry = {}
        for name, fn, reps in (("layer_no_attention", layer_step, 30),
                               ("classifier", classifier_step, 20)):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            med, mn = median_ms(fn, reps)
            ours_ms = ours[name]["graph_median_ms"]
            entry[name] = {"median_ms": round(med, 4), "min_ms": round(mn, 4),
                           "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                           "ratio_torch_over_ours": round(med / ours_ms, 3)}
        result["torch_" + mode] = entry
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
