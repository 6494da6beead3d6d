#!/usr/bin/env python3
"""train.precision = "fp8" against "bf16" from the same start on real text, on one GPU:
configs/jobs/gpt2-124m-austen-1gpu.toml (GPT-2 124M on the prepared Austen tokens, B=8, T=1024,
2000 steps, validation every 100 steps on the held-out split) through `topolaunch run`, once per
precision, the same seed and data order. Writes OUT/fp8_vs_bf16.json: both loss curves (training
every 50 steps, all validation points), the throughput each job reported, the mean training loss
of the last 100 steps and the last validation loss of each, and their relative differences
(fp8 - bf16) / bf16. A figure, not a pass/fail: exit 1 only when a job fails.

usage: fp8_vs_bf16.py --build BUILD --data DIR --out OUT [--steps N]
  DIR: `data prepare`'s folder (gpu-host.sh --prepare carries it as .carry-gpu/data/austen-bpe8k).
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def train(args, precision):
    build, data = os.path.abspath(args.build), os.path.abspath(args.data)
    out = os.path.join(os.path.abspath(args.out), precision)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(ROOT, "configs", "jobs", "gpt2-124m-austen-1gpu.toml")) as f:
        text = f.read().replace("data/austen-bpe8k", data)
    text = re.sub(r'(?m)^precision = "bf16"', 'precision = "%s"' % precision, text)
    text = re.sub(r"(?m)^checkpoint_every = \d+", "checkpoint_every = 0", text)
    if args.steps:
        text = re.sub(r"(?m)^steps = \d+", "steps = %d" % args.steps, text)
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    text += 'metrics_file = "%s"\n' % metrics
    job = os.path.join(out, "job.toml")
    with open(job, "w") as f:
        f.write(text)
    job_dir = os.path.join(out, "job")
    subprocess.run(["rm", "-rf", job_dir])
    env = dict(os.environ, NCCL_NVLS_ENABLE="0",
               PATH=os.path.join(build, "kernels") + os.pathsep + os.environ["PATH"])
    argv = [os.path.join(build, "launcher", "topolaunch"), "run", job, "--job-dir", job_dir]
    print("$", " ".join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    log = proc.stdout + proc.stderr
    with open(os.path.join(out, "job.log"), "w") as f:
        f.write(log)
    if proc.returncode != 0:
        sys.stdout.write(log[-3000:])
        sys.exit("%s: exit %d" % (precision, proc.returncode))
    train_pts, val = [], []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                val.append([r["step"], r["val_loss"]])
            elif "loss" in r:
                train_pts.append([r["step"], r["loss"]])
    tps = re.findall(r"throughput: (\d+) tok/s", log)
    last = [l for s, l in train_pts[-100:]]
    return {"precision": precision, "train": train_pts[::50] + train_pts[-1:], "val": val,
            "train_loss_last100_mean": sum(last) / len(last), "val_loss_last": val[-1][1],
            "throughput_tok_s": int(tps[-1]) if tps else None,
            "banner": [l for l in log.splitlines() if "model gpt2" in l][:1],
            "done": [l for l in log.splitlines() if "done:" in l][-1:]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=0)
    args = p.parse_args()
    runs = {prec: train(args, prec) for prec in ("bf16", "fp8")}
    b, f = runs["bf16"], runs["fp8"]
    result = {"bench": "fp8_vs_bf16", "model": "gpt2-124m", "data": "austen-bpe8k",
              "steps": b["train"][-1][0], "runs": runs}
    for key in ("train_loss_last100_mean", "val_loss_last"):
        result[key + "_rel_diff"] = round((f[key] - b[key]) / b[key], 5)
    if b["throughput_tok_s"] and f["throughput_tok_s"]:
        result["throughput_ratio_fp8_vs_bf16"] = round(f["throughput_tok_s"] / b["throughput_tok_s"], 4)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_vs_bf16.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    summary = {k: v for k, v in result.items() if k != "runs"}
    for prec in ("bf16", "fp8"):
        summary[prec] = {k: runs[prec][k] for k in ("train_loss_last100_mean", "val_loss_last",
                                                   "throughput_tok_s", "done")}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
