"""A plain PyTorch GPT-2 that loads a directory `topolaunch-worker export` wrote (model.safetensors
with Hugging Face GPT-2 names + config.json), with the `safetensors` package when it is installed
and a small reader of the format otherwise (8-byte little-endian header length, JSON header, raw
data). Used to check that the exported weights give our forward's logits: in CI on the CPU
(tests/integration/kernels/example_text.py) and on the H200 (tests/gpu/gpt2_austen.py).

usage as a program: torch_gpt2.py DIR IDS_FILE LOGITS_FILE [--device cuda]
  IDS_FILE: token ids, one line, comma separated; LOGITS_FILE: ours (float32, tokens x vocab).
  Prints one JSON line: the max abs difference of the logits and the tokens compared.
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    try:
        from safetensors.torch import load_file
        return load_file(path), "safetensors package"
    except ImportError:
        pass
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dtypes[e["dtype"]])
        out[name] = t.reshape(e["shape"]) if e["shape"] else t
    return out, "the reader in torch_gpt2.py"


class GPT2(torch.nn.Module):
    """GPT-2 as Hugging Face defines it (pre-LN, learned positions, tied head, GELU tanh),
    holding the tensors under their names (Conv1D weights [in, out])."""

    def __init__(self, config, tensors):
        super().__init__()
        self.c = config
        self.t = {k[len("transformer."):] if k.startswith("transformer.") else k: v.float()
                  for k, v in tensors.items()}

    def forward(self, idx):
        c, t = self.c, self.t
        B, T = idx.shape
        C, nh = c["n_embd"], c["n_head"]
        eps = c.get("layer_norm_epsilon", 1e-5)
        x = t["wte.weight"][idx] + t["wpe.weight"][:T]
        mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
        for i in range(c["n_layer"]):
            p = "h.%d." % i
            h = F.layer_norm(x, (C,), t[p + "ln_1.weight"], t[p + "ln_1.bias"], eps)
            qkv = h @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]
            q, k, v = qkv.split(C, dim=2)
            q, k, v = (z.view(B, T, nh, C // nh).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // nh)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
            h = F.layer_norm(x, (C,), t[p + "ln_2.weight"], t[p + "ln_2.bias"], eps)
            h = F.gelu(h @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (C,), t["ln_f.weight"], t["ln_f.bias"], eps)
        return x @ t["wte.weight"].T


def load(directory, device="cpu"):
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    tensors, how = read_safetensors(os.path.join(directory, "model.safetensors"))
    model = GPT2(config, {k: v.to(device) for k, v in tensors.items()})
    return model, config, how


def transformers_logits(directory, ids, device):
    """transformers.GPT2LMHeadModel.from_pretrained(directory)'s logits, or None without it."""
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        return None
    m = GPT2LMHeadModel.from_pretrained(directory).to(device).eval()
    with torch.no_grad():
        return m(torch.tensor([ids], device=device)).logits[0].float().cpu()


def compare(directory, ids, ours_path, device="cpu"):
    model, config, how = load(directory, device)
    with torch.no_grad():
        theirs = model(torch.tensor([ids], device=device))[0].float().cpu()
    V = config["vocab_size"]
    ours = torch.frombuffer(bytearray(open(ours_path, "rb").read()), dtype=torch.float32)
    ours = ours.reshape(len(ids), V)
    result = {"tokens": len(ids), "vocab": V, "loaded_with": how,
              "max_abs_diff_plain_torch": float((ours - theirs).abs().max()),
              "max_abs_logit": float(theirs.abs().max())}
    hf = transformers_logits(directory, ids, device)
    if hf is not None:
        result["max_abs_diff_transformers"] = float((ours - hf).abs().max())
    return result


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    device = "cuda" if "--device" in sys.argv and "cuda" in sys.argv else "cpu"
    with open(args[1]) as f:
        ids = [int(x) for x in f.read().strip().split(",")]
    print(json.dumps(compare(args[0], ids, args[2], device)))
