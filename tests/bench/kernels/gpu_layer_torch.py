#!/usr/bin/env python3
"""PyTorch twin of gpu_layer_bench.cu: the same partial GPT-2 124M layer (no attention core) and
the same classifier, forward + backward, bf16 autocast with fp32 parameters, eager and
torch.compile, timed with CUDA events (median of reps). Reads our JSON (gpu_layer_bench's stdout)
from the file given as argv[1] and prints one JSON object with both and the ratios
(PyTorch time / ours; > 1 means ours is faster). Never a pass/fail on timing.

The "kernels" section times PyTorch's equivalent of each memory-bound kernel of ours on the same
shapes, the same way (10 back-to-back calls per timed rep, median of 20 reps), and gives
ours_after (and ours_before, when a second JSON from a build of the previous kernels is given)
with GB/s and ratios.

Usage: gpu_layer_torch.py OURS.json [B] [T] [OURS_BEFORE.json]
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
    if len(sys.argv) > 4:
        result["ours_before"] = json.load(open(sys.argv[4]))
    # the per-kernel twins first, and on stderr as soon as they exist (a run cut short by its
    # time limit still reports them)
    result["kernels"] = kernel_twins(ours, result.get("ours_before"), B, T)
    print(json.dumps({"kernels": result["kernels"]}, indent=1), file=sys.stderr, flush=True)
    torch.cuda.empty_cache()
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


def kernel_twins(ours, before, B, T):
    """PyTorch's equivalent of each of our memory-bound kernels, same shapes and timing method."""
    C, V, Vp = 768, 50257, 50304
    N = B * T
    P = 124475904
    dev = "cuda"
    bf = torch.bfloat16
    launches = ours.get("kernel_launches_per_rep", 10)
    g = torch.Generator(device=dev).manual_seed(1)

    def rnd(*shape, dtype=bf, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dtype)

    x, a, dy, dxa = rnd(N, C), rnd(N, C), rnd(N, C, scale=1e-3), rnd(N, C, scale=1e-3)
    w, b = rnd(C) + 1, rnd(C, scale=0.1)
    h, dh, dg = rnd(N, 4 * C), rnd(N, 4 * C, scale=1e-3), rnd(N, 4 * C, scale=1e-3)
    wte, wpe = rnd(Vp, C, scale=0.02), rnd(T, C, scale=0.02)
    tokens = torch.randint(0, V, (B, T), device=dev)
    targets = tokens.view(-1)
    pos = torch.arange(T, device=dev)
    y, mean, rstd = torch.ops.aten.native_layer_norm(x, [C], w, b, 1e-5)
    logits = rnd(N, Vp, scale=2.0).requires_grad_()
    param = torch.zeros(P, device=dev, requires_grad=True)
    param.grad = torch.zeros(P, device=dev)
    param_bf16 = torch.empty(P, device=dev, dtype=bf)
    opt = torch.optim.AdamW([param], lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)

    def residual_ln(a, x):
        s = a + x
        return s, torch.ops.aten.native_layer_norm(s, [C], w, b, 1e-5)

    def ce(logits):
        logits.grad = None  # a fresh gradient each call, as ours overwrites dlogits
        loss = F.cross_entropy(logits[:, :V], targets)
        loss.backward()
        return loss

    def adamw_step():
        opt.step()
        param_bf16.copy_(param.detach())

    twins = {
        "encoder_forward": ("F.embedding(tokens, wte) + wpe[pos]",
                            lambda: F.embedding(tokens, wte) + F.embedding(pos, wpe)),
        "encoder_backward": ("aten.embedding_dense_backward (bf16) + dout.sum over B (wpe)",
                             lambda: (torch.ops.aten.embedding_dense_backward(
                                 dy.view(B, T, C), tokens, Vp, -1, False),
                                 dy.view(B, T, C).sum(0, dtype=torch.float32))),
        "layernorm_forward": ("aten.native_layer_norm (bf16 x, w, b)",
                              lambda: torch.ops.aten.native_layer_norm(x, [C], w, b, 1e-5)),
        "residual_layernorm_forward": ("a + x, then aten.native_layer_norm (2 kernels)",
                                       lambda: residual_ln(a, x)),
        "layernorm_backward": ("aten.native_layer_norm_backward (dx, dw, db; no += into dx)",
                               lambda: torch.ops.aten.native_layer_norm_backward(
                                   dy, x, [C], mean, rstd, w, b, [True, True, True])),
        "gelu_forward": ("F.gelu(tanh)", lambda: F.gelu(h, approximate="tanh")),
        "gelu_backward": ("aten.gelu_backward(tanh) (no += into dx)",
                          lambda: torch.ops.aten.gelu_backward(dg, h, approximate="tanh")),
        "residual_forward": ("a + b", lambda: torch.add(a, x)),
        "residual_backward": ("da += dy; db += dy", lambda: (dxa.add_(dy), a.add_(dy))),
        "crossentropy_forward_backward": ("F.cross_entropy(logits[:, :V]).backward() (bf16)",
                                          lambda: ce(logits)),
        "bias_backward_768": ("dy.sum(0, dtype=fp32)", lambda: dy.sum(0, dtype=torch.float32)),
        "bias_backward_3072": ("dh.sum(0, dtype=fp32)", lambda: dh.sum(0, dtype=torch.float32)),
        "sum_of_squares_124M": ("torch.linalg.vector_norm (fp32)",
                                lambda: torch.linalg.vector_norm(param.grad)),
        "adamw_124M": ("torch.optim.AdamW(fused=True).step() + bf16 copy", adamw_step),
        "to_bf16_124M": ("bf16.copy_(fp32)", lambda: param_bf16.copy_(param.detach())),
    }
    compiled = {
        "residual_layernorm_forward": lambda: torch.compile(residual_ln),
        "crossentropy_forward_backward": lambda: torch.compile(ce),
    }
    out = {"method": "%d back-to-back calls per rep, median of 20 reps, per call; ratio = torch "
                     "ms / ours ms (> 1: ours faster); speedup = before ms / after ms" % launches}
    for name, (what, fn) in twins.items():
        ours_k = ours.get("kernels", {}).get(name)
        if ours_k is None:
            continue
        entry = {"torch_op": what, "bytes": ours_k["bytes"],
                 "ours_after_ms": ours_k["median_ms"], "ours_after_GB_per_s": ours_k["GB_per_s"]}
        if before is not None and name in before.get("kernels", {}):
            bk = before["kernels"][name]
            entry["ours_before_ms"] = bk["median_ms"]
            entry["ours_before_GB_per_s"] = bk["GB_per_s"]
            entry["speedup_after_over_before"] = round(bk["median_ms"] / ours_k["median_ms"], 2)
        variants = [("torch_eager", fn)]
        if name in compiled:
            cf = compiled[name]()
            variants.append(("torch_compile", (lambda cf=cf, name=name:
                                               cf(logits) if name.startswith("cross")
                                               else cf(a, x))))
        for label, f in variants:
            try:
                def rep(f=f):
                    for _ in range(launches):
                        f()
                rep()
                torch.cuda.synchronize()
                med, _ = median_ms(rep, 20)
                med /= launches
                entry[label + "_ms"] = round(med, 5)
                entry[label + "_GB_per_s"] = round(ours_k["bytes"] / (med * 1e-3) / 1e9, 1)
                entry["ratio_" + label + "_over_ours"] = round(med / ours_k["median_ms"], 2)
            except Exception as e:  # a twin that fails is reported, not fatal
                entry[label + "_error"] = str(e)[:300]
        out[name] = entry
    return out


if __name__ == "__main__":
    main()
