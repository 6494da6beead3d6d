#!/usr/bin/env python3
"""PyTorch reference of the small GPT that tests/gpu/test_cuda_backend.cu trains.

The test exports (into a folder) the CPU executor's init (gpt2_small_params.bin: fp32 parameters
in the graph's order), the batch (gpt2_small_batch.bin: int32 tokens then targets) and the losses
of our CPU (fp32) and CUDA (bf16) backends (gpt2_small.json). This script builds the same model
from those parameters (pre-LN GPT-2, learned positions, tied lm-head, bias, GELU tanh, LayerNorm
eps 1e-5, causal attention scaled by 1/sqrt(hs), cross-entropy over the first vocab_size of the
padded logits, mean over tokens), trains the same steps with torch.optim.AdamW (decay only on the
tensors our graph marks as decayed) and global-norm clipping, in fp32 (TF32 off) and in bf16
autocast, and compares the per-step losses:
  torch fp32 vs our CPU fp32: relative <= 1e-3 (same arithmetic up to summation order)
  torch fp32 vs our CUDA bf16: relative <= 1e-2
Prints one JSON object; exit status 1 when a comparison fails.

usage: gpt2_torch_reference.py EXPORT_DIR
"""
import json
import math
import sys

import torch
import torch.nn.functional as F


def main():
    folder = sys.argv[1]
    meta = json.load(open(f"{folder}/gpt2_small.json"))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    L, C, NH = meta["n_layer"], meta["n_embd"], meta["n_head"]
    V, B, T = meta["vocab_size"], meta["batch"], meta["seq_len"]
    raw = torch.frombuffer(bytearray(open(f"{folder}/gpt2_small_params.bin", "rb").read()),
                           dtype=torch.float32)
    batch = torch.frombuffer(bytearray(open(f"{folder}/gpt2_small_batch.bin", "rb").read()),
                             dtype=torch.int32).long()
    tokens = batch[:B * T].view(B, T).to(dev)
    targets = batch[B * T:].view(B, T).to(dev)

    def load_params():
        params, off = {}, 0
        for p in meta["params"]:
            n = math.prod(p["shape"])
            params[p["name"]] = raw[off:off + n].view(*p["shape"]).clone().to(dev).requires_grad_(True)
            off += n
        assert off == raw.numel(), (off, raw.numel())
        return params

    def forward(P, idx, tgt):
        x = P["wte"][idx] + P["wpe"][:T]
        for l in range(L):
            p = f"h{l}."
            h = F.layer_norm(x, (C,), P[p + "ln1w"], P[p + "ln1b"], 1e-5)
            qkv = h @ P[p + "qkvw"].t() + P[p + "qkvb"]
            q, k, v = qkv.split(C, dim=-1)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(B, T, C)
            x = x + (y @ P[p + "attprojw"].t() + P[p + "attprojb"])
            h = F.layer_norm(x, (C,), P[p + "ln2w"], P[p + "ln2b"], 1e-5)
            h = F.gelu(h @ P[p + "fcw"].t() + P[p + "fcb"], approximate="tanh")
            x = x + (h @ P[p + "fcprojw"].t() + P[p + "fcprojb"])
        x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
        logits = x @ P["wte"].t()
        return F.cross_entropy(logits[..., :V].float().reshape(-1, V), tgt.reshape(-1))

    def train(autocast):
        P = load_params()
        decayed = [P[p["name"]] for p in meta["params"] if p["decayed"]]
        plain = [P[p["name"]] for p in meta["params"] if not p["decayed"]]
        opt = torch.optim.AdamW(
            [{"params": decayed, "weight_decay": meta["weight_decay"]},
             {"params": plain, "weight_decay": 0.0}],
            lr=meta["learning_rate"], betas=(meta["beta1"], meta["beta2"]), eps=meta["epsilon"])
        losses = []
        for _ in range(meta["steps"]):
            with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=autocast):
                loss = forward(P, tokens, targets)
            losses.append(loss.item())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if meta["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(list(P.values()), meta["grad_clip"])
            opt.step()
        return losses

    fp32 = train(False)
    bf16 = train(True)

    def worst(a, b):
        return max(abs(x - y) / abs(y) for x, y in zip(a, b))

    cpu, cuda = meta["cpu_fp32_losses"], meta["cuda_bf16_losses"]
    result = {
        "bench": "gpt2_small_torch_reference", "device": dev, "torch": torch.__version__,
        "steps": meta["steps"],
        "torch_fp32_losses": fp32, "torch_bf16_autocast_losses": bf16,
        "ours_cpu_fp32_losses": cpu, "ours_cuda_bf16_losses": cuda,
        "worst_rel_torch_fp32_vs_ours_cpu_fp32": worst(cpu, fp32),
        "worst_rel_torch_fp32_vs_ours_cuda_bf16": worst(cuda, fp32),
        "worst_rel_torch_bf16_vs_ours_cuda_bf16": worst(cuda, bf16),
    }
    result["pass"] = (result["worst_rel_torch_fp32_vs_ours_cpu_fp32"] <= 1e-3
                      and result["worst_rel_torch_fp32_vs_ours_cuda_bf16"] <= 1e-2)
    print(json.dumps(result, indent=1))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
