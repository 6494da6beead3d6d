#!/usr/bin/env python3
"""train.precision = "fp8" against "bf16" from the same start on real text, on one GPU:
configs/jobs/gpt2-124m-austen-1gpu.toml (GPT-2 124M on the prepared Austen tokens, B=8, T=1024,
2000 steps, validation every 100 steps on the held-out split) through `topolaunch run`, once per
precision, the same seed and data order. Writes OUT/fp8_vs_bf16.json: both loss curves (training
every 50 steps, all validation points), the throughput each job reported, the mean training loss
of the last 100 steps and the last validation loss of each, and their relative differences
(fp8 - bf16) / bf16. With --noise-floor a third job, bf16 from another seed (--seed + 1), gives
the same differences between two bf16 runs: how far apart two runs of one precision land on this
data, against which fp8's difference is read. A figure, not a pass/fail: exit 1 only when a job
fails. With --resume a job whose summary (OUT/<job>/run.json) was written from the same job
config is read back, not run again: a long comparison can span several calls.

usage: fp8_vs_bf16.py --build BUILD --data DIR --out OUT [--steps N] [--batch B]
                      [--val-batches N] [--seed S] [--noise-floor] [--resume]
  DIR: `data prepare`'s folder (gpu-host.sh --prepare carries it as .carry-gpu/data/austen-bpe8k;
  B=64 needs a validation split of at least 64 x 1024 + 1 tokens: --prepare's austen-bpe8k-v25).
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def train(args, precision, seed, label):
    build, data = os.path.abspath(args.build), os.path.abspath(args.data)
    out = os.path.join(os.path.abspath(args.out), label)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(ROOT, "configs", "jobs", "gpt2-124m-austen-1gpu.toml")) as f:
        text = f.read().replace("data/austen-bpe8k", data)
    text = re.sub(r'(?m)^precision = "bf16"', 'precision = "%s"' % precision, text)
    text = re.sub(r"(?m)^checkpoint_every = \d+", "checkpoint_every = 0", text)
    if args.steps:
        text = re.sub(r"(?m)^steps = \d+", "steps = %d" % args.steps, text)
    if args.batch:
        text = re.sub(r"(?m)^batch = \d+", "batch = %d" % args.batch, text)
    if args.val_batches:
        text = re.sub(r"(?m)^val_batches = \d+", "val_batches = %d" % args.val_batches, text)
    text += "seed = %d\n" % seed
    metrics = os.path.join(out, "metrics.jsonl")
    # The config compared on --resume is the one the job ran, metrics file included.
    text += 'metrics_file = "%s"\n' % metrics
    summary_path = os.path.join(out, "run.json")
    if args.resume and os.path.exists(summary_path):
        with open(summary_path) as f:
            earlier = json.load(f)
        if earlier.get("config") == text:
            print("%s: read from %s" % (label, summary_path), flush=True)
            return earlier["run"]
    if os.path.exists(metrics):
        os.remove(metrics)
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
    run = {"precision": precision, "seed": seed, "train": train_pts[::50] + train_pts[-1:],
           "val": val, "train_loss_last100_mean": sum(last) / len(last),
           "val_loss_last": val[-1][1], "throughput_tok_s": int(tps[-1]) if tps else None,
           "banner": [l for l in log.splitlines() if "model gpt2" in l][:1],
           "done": [l for l in log.splitlines() if "done:" in l][-1:]}
    with open(summary_path, "w") as f:
        json.dump({"config": text, "run": run}, f)
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--batch", type=int, default=0, help="[train] batch (the config's: 8)")
    p.add_argument("--val-batches", type=int, default=0, help="[train] val_batches")
    p.add_argument("--seed", type=int, default=1337, help="[train] seed of both jobs")
    p.add_argument("--noise-floor", action="store_true",
                   help="also bf16 from seed + 1: the difference between two bf16 runs")
    p.add_argument("--resume", action="store_true",
                   help="read back a job already run from the same config (OUT/<job>/run.json)")
    args = p.parse_args()
    runs = {prec: train(args, prec, args.seed, prec) for prec in ("bf16", "fp8")}
    if args.noise_floor:
        other = args.seed + 1
        runs["bf16_other_seed"] = train(args, "bf16", other, "bf16-seed%d" % other)
    b, f = runs["bf16"], runs["fp8"]
    data_name = os.path.basename(os.path.normpath(args.data))
    result = {"bench": "fp8_vs_bf16", "model": "gpt2-124m", "data": data_name,
              "batch": args.batch or 8,
              "steps": b["train"][-1][0], "runs": runs}
    for key in ("train_loss_last100_mean", "val_loss_last"):
        result[key + "_rel_diff"] = round((f[key] - b[key]) / b[key], 5)
        if args.noise_floor:
            o = runs["bf16_other_seed"]
            result[key + "_rel_diff_bf16_seeds"] = round((o[key] - b[key]) / b[key], 5)
    if b["throughput_tok_s"] and f["throughput_tok_s"]:
        result["throughput_ratio_fp8_vs_bf16"] = round(f["throughput_tok_s"] / b["throughput_tok_s"], 4)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_vs_bf16.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    summary = {k: v for k, v in result.items() if k != "runs"}
    for prec in runs:
        summary[prec] = {k: runs[prec][k] for k in ("train_loss_last100_mean", "val_loss_last",
                                                   "throughput_tok_s", "done")}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
