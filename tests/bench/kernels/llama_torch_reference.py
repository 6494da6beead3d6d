#!/usr/bin/env python3
"""PyTorch reference of the small LLaMA that tests/gpu/test_llama_backend.cu trains.

The test exports (into a folder) the CPU executor's init (llama_small_params.bin: fp32 parameters
in the graph's order), the batch (llama_small_batch.bin: int32 tokens then targets) and the losses
and gradient norms of our CPU (fp32) and CUDA (bf16) backends over 20 steps (llama_small.json).
This script builds the same model from those parameters: pre-RMSNorm (eps 1e-5), rotary
embeddings on q and k in LLaMA's interleaved-pair convention (pair i of a head rotated by
t * theta^(-2i/hs)), grouped-query attention (key/value head h // (n_head / n_kv_head) for query
head h, causal, scaled by 1/sqrt(hs)), SwiGLU (gate and up as the two halves of one projection),
an untied head, no biases, cross-entropy over the first vocab_size of the padded logits (mean over
tokens). It trains the same steps with torch.optim.AdamW (decay only on the tensors our graph marks
as decayed) and global-norm clipping, in fp32 (TF32 off) and in bf16 autocast, and compares the
per-step losses and gradient norms (before clipping):
  torch fp32 vs our CPU fp32: relative <= 1e-3 (same arithmetic up to summation order)
  torch fp32 vs our CUDA bf16: losses relative <= 1e-2, gradient norms <= 5e-2
Prints one JSON object; exit status 1 when a comparison fails.

usage: llama_torch_reference.py EXPORT_DIR
"""
import json
import math
import sys

import torch
import torch.nn.functional as F


def main():
    folder = sys.argv[1]
    meta = json.load(open(f"{folder}/llama_small.json"))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    L, C, NH, NKV = meta["n_layer"], meta["n_embd"], meta["n_head"], meta["n_kv_head"]
    H, theta = meta["ffn_hidden"], meta["rope_theta"]
    V, B, T = meta["vocab_size"], meta["batch"], meta["seq_len"]
    hs, KC = C // NH, C // NH * NKV
    raw = torch.frombuffer(bytearray(open(f"{folder}/llama_small_params.bin", "rb").read()),
                           dtype=torch.float32)
    batch = torch.frombuffer(bytearray(open(f"{folder}/llama_small_batch.bin", "rb").read()),
                             dtype=torch.int32).long()
    tokens = batch[:B * T].view(B, T).to(dev)
    targets = batch[B * T:].view(B, T).to(dev)

    # cos/sin of pair i at position t, computed in double as our kernels do
    i = torch.arange(hs // 2, dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / hs)[None, :]
    cos, sin = angle.cos().float().to(dev), angle.sin().float().to(dev)  # (T, hs/2)

    def load_params():
        params, off = {}, 0
        for p in meta["params"]:
            n = math.prod(p["shape"])
            params[p["name"]] = raw[off:off + n].view(*p["shape"]).clone().to(dev).requires_grad_(True)
            off += n
        assert off == raw.numel(), (off, raw.numel())
        return params

    def rmsnorm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w

    def rope(x):  # (B, T, heads, hs): pairs (2i, 2i+1) rotated
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)

    def causal_attention(q, k, v):
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # PyTorch before 2.0 (Debian 12's 1.13): the same product written out
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return s.float().softmax(-1).type_as(q) @ v

    def forward(P, idx, tgt):
        x = P["wte"][idx]
        for l in range(L):
            p = f"h{l}."
            h = rmsnorm(x, P[p + "norm1w"])
            qkv = h @ P[p + "qkvw"].t()
            q, k, v = qkv.split([C, KC, KC], dim=-1)
            q = rope(q.view(B, T, NH, hs)).transpose(1, 2)
            k = rope(k.view(B, T, NKV, hs)).transpose(1, 2)
            v = v.view(B, T, NKV, hs).transpose(1, 2)
            k = k.repeat_interleave(NH // NKV, dim=1)  # query head h reads kv head h // group
            v = v.repeat_interleave(NH // NKV, dim=1)
            y = causal_attention(q, k, v)
            y = y.transpose(1, 2).reshape(B, T, C)
            x = x + y @ P[p + "attprojw"].t()
            h = rmsnorm(x, P[p + "norm2w"])
            g, u = (h @ P[p + "fcw"].t()).split(H, dim=-1)
            x = x + (F.silu(g) * u) @ P[p + "fcprojw"].t()
        x = rmsnorm(x, P["normfw"])
        logits = x @ P["lm_headw"].t()
        return F.cross_entropy(logits[..., :V].float().reshape(-1, V), tgt.reshape(-1))

    def train(autocast):
        P = load_params()
        decayed = [P[p["name"]] for p in meta["params"] if p["decayed"]]
        plain = [P[p["name"]] for p in meta["params"] if not p["decayed"]]
        opt = torch.optim.AdamW(
            [{"params": decayed, "weight_decay": meta["weight_decay"]},
             {"params": plain, "weight_decay": 0.0}],
            lr=meta["learning_rate"], betas=(meta["beta1"], meta["beta2"]), eps=meta["epsilon"])
        losses, norms = [], []
        for _ in range(meta["steps"]):
            with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=autocast):
                loss = forward(P, tokens, targets)
            losses.append(loss.item())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clip = meta["grad_clip"] if meta["grad_clip"] > 0 else float("inf")
            norms.append(torch.nn.utils.clip_grad_norm_(list(P.values()), clip).item())
            opt.step()
        return losses, norms

    fp32, fp32_norms = train(False)
    bf16, bf16_norms = train(True)

    def worst(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a, b))

    cpu, cuda = meta["cpu_fp32_losses"], meta["cuda_bf16_losses"]
    cpu_n, cuda_n = meta["cpu_fp32_grad_norms"], meta["cuda_bf16_grad_norms"]
    result = {
        "bench": "llama_small_torch_reference", "device": dev, "torch": torch.__version__,
        "steps": meta["steps"],
        "torch_fp32_losses": fp32, "torch_bf16_autocast_losses": bf16,
        "torch_fp32_grad_norms": fp32_norms, "torch_bf16_autocast_grad_norms": bf16_norms,
        "ours_cpu_fp32_losses": cpu, "ours_cuda_bf16_losses": cuda,
        "ours_cpu_fp32_grad_norms": cpu_n, "ours_cuda_bf16_grad_norms": cuda_n,
        "worst_rel_loss_torch_fp32_vs_ours_cpu_fp32": worst(cpu, fp32),
        "worst_rel_norm_torch_fp32_vs_ours_cpu_fp32": worst(cpu_n, fp32_norms),
        "worst_rel_loss_torch_fp32_vs_ours_cuda_bf16": worst(cuda, fp32),
        "worst_rel_norm_torch_fp32_vs_ours_cuda_bf16": worst(cuda_n, fp32_norms),
        "worst_rel_loss_torch_bf16_vs_ours_cuda_bf16": worst(cuda, bf16),
        "worst_rel_norm_torch_bf16_vs_ours_cuda_bf16": worst(cuda_n, bf16_norms),
    }
    result["pass"] = (result["worst_rel_loss_torch_fp32_vs_ours_cpu_fp32"] <= 1e-3
                      and result["worst_rel_norm_torch_fp32_vs_ours_cpu_fp32"] <= 1e-3
                      and result["worst_rel_loss_torch_fp32_vs_ours_cuda_bf16"] <= 1e-2
                      and result["worst_rel_norm_torch_fp32_vs_ours_cuda_bf16"] <= 5e-2)
    print(json.dumps(result, indent=1))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
