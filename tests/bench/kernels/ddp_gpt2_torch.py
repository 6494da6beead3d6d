#!/usr/bin/env python3
"""PyTorch peer of ddp_gpt2_bench.cu: GPT-2 124M (pre-LN, learned positions, tied lm head,
GELU-tanh, V padded to 50304, T=1024), bf16 autocast with fp32 parameters, fused AdamW, grad clip
1.0, DistributedDataParallel (NCCL, bucket 25 MB) + torch.compile, one process per GPU on GPUs
0..world-1 (world 2 unless given; 1 = the single-GPU point of a scaling series), random tokens.
Timed like ours: `steps` back-to-back steps between two synchronisations (wall clock),
after 5 warm-ups; also the same steps under no_sync() (no all-reduce) for the exposed
communication. Reads our JSON from argv[1] (or 'none') and prints one JSON with both and the
ratio ours/torch of tokens/s. Never a pass/fail on timing.

Usage: ddp_gpt2_torch.py OURS.json|none [B] [T] [steps] [world]
DDP_TORCH_RAW=FILE: rank 0's figures are (also) written there as soon as they are measured.
DDP_TORCH_NO_SYNC=0: skip the no_sync() pass (it recompiles; exposed_comm_ms is then null).
"""
import json
import math
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, C=768, H=12, V=50304, T=1024):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def run(rank, world, port, B, T, steps, out_path):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=dev)
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = GPT().to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=25)
    cmodel = torch.compile(ddp)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), fused=True)
    g = torch.Generator(device=dev).manual_seed(1000 + rank)
    tokens = torch.randint(0, 50257, (B, T + 1), device=dev, generator=g)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step(sync=True):
        ctx = torch.autocast("cuda", dtype=torch.bfloat16)
        if sync:
            with ctx:
                loss = cmodel(x, y)
            loss.backward()
        else:
            with ddp.no_sync(), ctx:
                loss = cmodel(x, y)
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    loss_first = step()
    for _ in range(4):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0

    def timed(sync):
        torch.cuda.synchronize()
        dist.barrier()
        t = time.time()
        for _ in range(steps):
            loss = step(sync)
        torch.cuda.synchronize()
        return (time.time() - t) * 1e3 / steps, loss

    step_ms, loss_last = timed(True)

    def write(step_ms_no_comm):
        res = {"system": f"PyTorch {torch.__version__} DDP (bucket 25 MB) + torch.compile",
               "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
               "world_size": world, "batch_per_gpu": B, "seq_len": T, "steps": steps,
               "warmup_s": round(warm_s, 1), "step_ms": round(step_ms, 3),
               "tokens_per_s_total": round(world * B * T / (step_ms * 1e-3)),
               "tokens_per_s_per_gpu": round(B * T / (step_ms * 1e-3)),
               "step_ms_no_comm": step_ms_no_comm and round(step_ms_no_comm, 3),
               "exposed_comm_ms": step_ms_no_comm and round(step_ms - step_ms_no_comm, 3),
               "loss_first": round(loss_first.item(), 4), "loss_last": round(loss_last.item(), 4),
               "max_memory_allocated_bytes": torch.cuda.max_memory_allocated()}
        with open(out_path, "w") as f:
            json.dump(res, f)

    if rank == 0:  # the main figure first: the no_sync pass below recompiles and may run out of time
        write(None)
    step_ms_no_comm = None
    if os.environ.get("DDP_TORCH_NO_SYNC", "1") != "0":
        try:  # no_sync under torch.compile recompiles; a failure here must not lose the main figure
            for _ in range(3):
                step(False)
            step_ms_no_comm, _ = timed(False)
        except Exception as e:  # noqa: BLE001
            print(f"rank {rank}: no_sync measurement failed: {e}", file=sys.stderr)
            step_ms_no_comm = None
    if rank == 0:
        write(step_ms_no_comm)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ours = None if sys.argv[1] == "none" else json.load(open(sys.argv[1]))
    B = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    T = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    world = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    if world < 1 or world > torch.cuda.device_count():
        sys.exit(f"ddp_gpt2_torch.py: world {world} needs that many GPUs; "
                 f"this process sees {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = os.environ.get("DDP_TORCH_RAW")  # rank 0's figures, written as soon as measured
    if not out_path:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out_path = f.name
    mp.spawn(run, args=(world, port, B, T, steps, out_path), nprocs=world, join=True)
    torch_res = json.load(open(out_path))
    out = {"benchmark": "ddp_gpt2_124m", "ours": ours, "torch": torch_res}
    if ours and ours.get("world_size", world) != world:
        out["note"] = f"ours ran on {ours.get('world_size')} GPUs, torch on {world}: no ratio"
    elif ours:
        out["ratio_tokens_per_s_ours_over_torch"] = round(
            ours["tokens_per_s_total"] / torch_res["tokens_per_s_total"], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
