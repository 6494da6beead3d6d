#!/usr/bin/env python3
"""PyTorch twin of allreduce_bench.cpp: torch.distributed.all_reduce (NCCL backend, fp32 sum),
one process per GPU, the same sizes and method (5 warm-ups, `iters` back-to-back calls between two
CUDA events on the current stream, 3 trials, median trial; busbw = algbw * 2(n-1)/n, GB = 1e9 B).
Reads our JSON (allreduce_bench's output) from argv[1] and prints one JSON object with both and
the ratio ours/torch of the bus bandwidth (> 1: ours is faster). Never a pass/fail on timing.

Usage: allreduce_torch.py OURS.json
NVLink multicast must stay off: NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1.
"""
import json
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, world, port, sizes, out_path):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=dev)
    data = torch.zeros(max(sizes) // 4, dtype=torch.float32, device=dev)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    rows = []
    for nbytes, iters in sizes.items():
        t = data[: nbytes // 4]
        for _ in range(5):
            dist.all_reduce(t)
        trials = []
        for _ in range(3):
            start.record()
            for _ in range(iters):
                dist.all_reduce(t)
            stop.record()
            stop.synchronize()
            trials.append(start.elapsed_time(stop) / iters)
        trials.sort()
        ms = trials[1]
        algbw = nbytes / (ms * 1e-3) / 1e9
        rows.append({"bytes": nbytes, "iters": iters, "ms": round(ms, 5),
                     "algbw_GBps": round(algbw, 2),
                     "busbw_GBps": round(algbw * 2 * (world - 1) / world, 2)})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ours = json.load(open(sys.argv[1]))
    world = ours["world_size"]
    sizes = {r["bytes"]: r["iters"] for r in ours["results"]}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out_path = f.name
    mp.spawn(run, args=(world, free_port(), sizes, out_path), nprocs=world, join=True)
    theirs = {r["bytes"]: r for r in json.load(open(out_path))}
    rows = []
    for r in ours["results"]:
        t = theirs[r["bytes"]]
        rows.append({
            "bytes": r["bytes"], "mib": r["bytes"] / 2**20, "iters": r["iters"],
            "ours_ms": r["ms"], "ours_algbw_GBps": r["algbw_GBps"],
            "ours_busbw_GBps": r["busbw_GBps"],
            "ours_per_call_event_ms_median": r.get("per_call_event_ms_median"),
            "torch_ms": t["ms"], "torch_algbw_GBps": t["algbw_GBps"],
            "torch_busbw_GBps": t["busbw_GBps"],
            "ratio_busbw_ours_over_torch": round(r["busbw_GBps"] / t["busbw_GBps"], 3),
        })
    print(json.dumps({
        "benchmark": "allreduce_busbw", "world_size": world, "dtype": "float32", "op": "sum",
        "device": ours.get("device"),
        "ours": {"system": ours.get("system"), "nccl_version": ours.get("nccl_version")},
        "torch": {"version": torch.__version__,
                  "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))},
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",
                                               "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
        "rows": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
