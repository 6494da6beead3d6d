#!/usr/bin/env python3
"""PyTorch peer of gpt2_bench.cu: GPT-2 124M (L=12, C=768, NH=12, vocab 50304, T=1024; also 350M,
774M and 1558M, and the ~1B LLaMA "llama1b": L=18, C=2048, 32 heads sharing 8 key/value heads,
RMSNorm, rotary positions, SwiGLU 5632, untied head, no biases) training
steps with the settings of research/static_graph.md §8: nanoGPT-style model (pre-LN, learned
positions, tied lm-head, bias, GELU tanh), bf16 autocast over fp32 parameters, SDPA causal
attention (flash), logits cast to fp32 before the cross-entropy, fused AdamW (lr 6e-4,
betas 0.9/0.95, weight decay 0.1 on 2-D tensors), grad clip 1.0, TF32 on, random tokens.
Eager and torch.compile (default mode; compiled afresh per batch size, warm-up steps not timed).
Timing: CUDA events between consecutive step starts over 20 steps after 5 warm-up steps (the same
method as gpt2_bench), median and p90. Memory: torch.cuda.max_memory_allocated / reserved.

Reads our JSON lines (gpt2_bench's stdout) from argv[1] and prints JSON lines: the peer's runs,
then one "gpt2_compare" line per batch size with ours, eager and compile and the ratios
(ours tokens/s / peer tokens/s; > 1 means ours is faster). Never a pass/fail on timing.

usage: gpt2_torch.py OURS.jsonl [B[@MODEL] ...]     (default B: 16 64 8; MODEL 124m (default),
350m, 774m, 1558m or llama1b, as gpt2_bench's model field)
OURS.jsonl is read after the peer's runs (ours may run meanwhile on another GPU).
TORCH_SYSTEMS=compile: torch.compile only (default: eager and compile).
"""
import os
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, T = 50304, 1024
MODELS = {"124m": (12, 768, 12), "350m": (24, 1024, 16), "774m": (36, 1280, 20),
          "1558m": (48, 1600, 25)}  # layers, width, heads
WARMUP, TIMED = 5, 20
LLAMA = {"llama1b": dict(L=18, C=2048, NH=32, NKV=8, H=5632, theta=10000.0)}


def label(model_name):
    return "llama-1b" if model_name in LLAMA else "gpt2-" + model_name


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.C, self.NH = C, NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T_, _ = x.shape
        C, NH = self.C, self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T_, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


class RMSNorm(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, NKV, H):
        super().__init__()
        self.C, self.NH, self.NKV, self.H = C, NH, NKV, H
        self.norm1 = RMSNorm(C)
        self.qkv = nn.Linear(C, C + 2 * (C // NH) * NKV, bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.norm2 = RMSNorm(C)
        self.fc = nn.Linear(C, 2 * H, bias=False)  # gate | up
        self.fc_proj = nn.Linear(H, C, bias=False)

    def forward(self, x, cos, sin):
        B, T_, _ = x.shape
        C, NH, NKV, hs = self.C, self.NH, self.NKV, self.C // self.NH
        q, k, v = self.qkv(self.norm1(x)).split([C, hs * NKV, hs * NKV], dim=-1)

        def rope(t):  # LLaMA's interleaved pairs
            t0, t1 = t[..., 0::2], t[..., 1::2]
            c, s = cos.to(t.dtype), sin.to(t.dtype)
            return torch.stack((t0 * c - t1 * s, t0 * s + t1 * c), dim=-1).flatten(-2)

        q = rope(q.view(B, T_, NH, hs)).transpose(1, 2)
        k = rope(k.view(B, T_, NKV, hs)).transpose(1, 2)
        v = v.view(B, T_, NKV, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T_, C))
        g, u = self.fc(self.norm2(x)).split(self.H, dim=-1)
        return x + self.fc_proj(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, L, C, NH, NKV, H, theta):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.h = nn.ModuleList(LlamaBlock(C, NH, NKV, H) for _ in range(L))
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)  # untied
        hs = C // NH
        angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (
            -2.0 * torch.arange(hs // 2, dtype=torch.float64) / hs)[None, :]
        self.register_buffer("cos", angle.cos().float()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angle.sin().float()[None, :, None, :], persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "fc_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for b in self.h:
            x = b(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


def run(B, compiled, model_name="124m"):
    torch.manual_seed(1337)
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = (Llama(**LLAMA[model_name]) if model_name in LLAMA else GPT(*MODELS[model_name])).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator(device="cuda").manual_seed(7)
    data = torch.randint(0, 50257, (B, T + 1), device="cuda", generator=g)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(WARMUP):
        loss = step()
    torch.cuda.synchronize()
    warmup_s = time.time() - t0
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED + 1)]
    for i in range(TIMED):
        ev[i].record()
        loss = step()
    ev[TIMED].record()
    torch.cuda.synchronize()
    ms = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(TIMED))
    med = ms[len(ms) // 2] if len(ms) % 2 else 0.5 * (ms[len(ms) // 2 - 1] + ms[len(ms) // 2])
    p90 = ms[min(len(ms) - 1, int(round(0.9 * (len(ms) - 1))))]
    out = {"bench": "gpt2_train", "system": "torch_compile" if compiled else "torch_eager",
           "torch": torch.__version__, "model": label(model_name), "batch": B, "seq_len": T, "median_ms": round(med, 3),
           "p90_ms": round(p90, 3), "tokens_per_s": round(B * T / (med / 1e3)),
           "max_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 4),
           "max_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 4),
           "warmup_s": round(warmup_s, 2), "loss_last": round(loss.item(), 4)}
    del model, opt, fwd
    return out


def main():
    runs = []  # (batch, model)
    for arg in sys.argv[2:] or ["16", "64", "8"]:
        b, _, m = arg.partition("@")
        runs.append((int(b), m or "124m"))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch._dynamo.config.automatic_dynamic_shapes = False
    peers = {}
    for B, m in runs:
        modes = (True,) if os.environ.get("TORCH_SYSTEMS") == "compile" else (False, True)
        for compiled in modes:
            try:
                r = run(B, compiled, m)
            except Exception as e:  # report and go on (e.g. out of memory)
                r = {"bench": "gpt2_train", "system": "torch_compile" if compiled else "torch_eager",
                     "model": label(m), "batch": B, "error": str(e).splitlines()[0][:300]}
            peers[(B, m, r["system"])] = r
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()
    ours = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
    for B, m in runs:
        # ours without a budget, and under each memory budget (recomputation), against the
        # same peers (which run without one)
        mine = [o for o in ours if o.get("batch") == B and o.get("mode") == "graph"
                and o.get("model", "gpt2-124m") == label(m) and "tokens_per_s" in o]
        for o in mine:
            cmp = {"bench": "gpt2_compare", "model": label(m), "batch": B,
                   "ours_budget_gib": o.get("budget_gib", 0),
                   "ours_precision": o.get("precision", "bf16"),
                   "ours_classifier_chunk_rows": o.get("classifier_chunk_rows"),
                   "ours_recomputed_tensors": o.get("recomputed_tensors", 0),
                   "ours_extra_compute_pct": o.get("extra_compute_pct", 0),
                   "ours_tokens_per_s": o["tokens_per_s"],
                   "ours_median_ms": o["median_ms"], "ours_device_used_gib": o["device_used_gib"],
                   "ours_arena_gib": o["arena_gib"]}
            for sys_name in ("torch_eager", "torch_compile"):
                p = peers.get((B, m, sys_name), {})
                if "tokens_per_s" in p:
                    cmp[f"{sys_name}_tokens_per_s"] = p["tokens_per_s"]
                    cmp[f"{sys_name}_max_allocated_gib"] = p["max_allocated_gib"]
                    cmp[f"{sys_name}_max_reserved_gib"] = p["max_reserved_gib"]
                    cmp[f"ratio_ours_vs_{sys_name}"] = round(o["tokens_per_s"] / p["tokens_per_s"], 4)
            print(json.dumps(cmp), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
