#!/usr/bin/env python3
"""GPT-2 124M on the prepared Austen tokens, on one GPU (the H200 figures of docs/gpu-runs.md):
configs/jobs/gpt2-124m-austen-1gpu.toml through `topolaunch run` (B=8, T=1024, 2000 steps,
validation every 100), then a sample from the last checkpoint on the GPU (KV cache), the
checkpoint exported to safetensors, and a plain PyTorch GPT-2 (and transformers' GPT2LMHeadModel
where installed) loading the export, its logits on a batch against our decoders' (the GPU's bf16
one and the CPU's fp32 one).

usage: gpt2_austen.py --build BUILD --data DIR --out OUT [--steps N] [--config JOB --device cpu]
  DIR: `data prepare`'s folder (train.bin, val.bin, tokenizer.model; gpu-host.sh --prepare
  carries it as .carry-gpu/data/austen-bpe8k). Writes OUT/curves.json (training and validation
  loss by step), OUT/sample-ids.txt (one line of token ids per line of text: on a host with
  SentencePiece, `spm_decode --model DIR/tokenizer.model --input_format=id < sample-ids.txt`
  gives the text), OUT/sample.txt (the text itself where this build has SentencePiece) and
  OUT/logits.json (the comparison). Exit 1 when a step fails or the logits differ too much.
  --config/--device cpu: another job file (its data paths under data/austen-bpe8k/ replaced by
  DIR) sampled on the CPU: the same steps on a host without a GPU, to try the script.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(argv, **kw):
    print("$", " ".join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    sys.stdout.write(proc.stdout[-4000:])
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        sys.exit("exit %d: %s" % (proc.returncode, " ".join(argv)))
    return proc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "jobs",
                                                    "gpt2-124m-austen-1gpu.toml"))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    build, data = os.path.abspath(args.build), os.path.abspath(args.data)
    worker = os.path.join(build, "kernels", "topolaunch-worker")
    topolaunch = os.path.join(build, "launcher", "topolaunch")
    env = dict(os.environ, PATH=os.path.dirname(worker) + os.pathsep + os.environ["PATH"],
               NCCL_NVLS_ENABLE="0")

    with open(args.config) as f:
        text = f.read().replace("data/austen-bpe8k", data)
    if args.steps:
        text = re.sub(r"(?m)^steps = \d+", "steps = %d" % args.steps, text)
    metrics = os.path.join(args.out, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    text += 'metrics_file = "%s"\n' % metrics
    job = os.path.join(args.out, "gpt2-124m-austen.toml")
    with open(job, "w") as f:
        f.write(text)
    job_dir = os.path.join(args.out, "job")
    subprocess.run(["rm", "-rf", job_dir])
    proc = run([topolaunch, "run", job, "--job-dir", job_dir], env=env)
    log = proc.stdout + proc.stderr

    train, val = [], []
    with open(metrics) as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                val.append([r["step"], r["val_loss"]])
            elif "loss" in r:
                train.append([r["step"], r["loss"], r.get("ms"), r.get("tokens")])
    tps = re.findall(r"throughput: (\d+) tok/s", log)
    curves = {"job": job, "train": train[::50] + train[-1:], "val": val,
              "throughput_tok_s": int(tps[-1]) if tps else None,
              "banner": [l for l in log.splitlines() if "model gpt2" in l]}
    with open(os.path.join(args.out, "curves.json"), "w") as f:
        json.dump(curves, f, indent=1)
    print("validation:", " ".join("%d:%.3f" % (s, l) for s, l in val))

    ckpt = os.path.join(job_dir, "checkpoints")
    with open(os.path.join(ckpt, "model.json")) as f:
        model = json.load(f)
    newline = model.get("newline_token", -1)
    # A sample on the GPU: text where this build has SentencePiece, else ids (said on stderr).
    sampled = subprocess.run([worker, "sample", ckpt, "--device", args.device, "--tokens", "300",
                                "--seed", "1", "--prompt-ids", str(max(newline, 0))],
                               capture_output=True, text=True)
    sys.stderr.write(sampled.stderr)
    if sampled.returncode != 0:
        sys.exit("sample failed")
    if "token ids, not text" in sampled.stderr:
        ids = [int(x) for x in sampled.stdout.split()]
        lines, cur = [], []
        for t in ids:
            if t == newline:
                lines.append(cur)
                cur = []
            else:
                cur.append(t)
        lines.append(cur)
        with open(os.path.join(args.out, "sample-ids.txt"), "w") as f:
            f.write("\n".join(" ".join(map(str, l)) for l in lines) + "\n")
        print("sample: %d token ids in sample-ids.txt (decode with spm_decode on a host with "
              "SentencePiece)" % len(ids))
    else:
        with open(os.path.join(args.out, "sample.txt"), "w") as f:
            f.write(sampled.stdout)
        print("sample:\n" + sampled.stdout[:1500])

    export = os.path.join(args.out, "exported")
    run([worker, "export", ckpt, "--out", export], env=env)
    # A batch of validation tokens: the first 256 of val.bin (at most the model's context).
    import struct
    n = min(256, model["block_size"])
    with open(os.path.join(data, "val.bin"), "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        ids = list(struct.unpack("<%dH" % n, f.read(2 * n)))
    sys.path.insert(0, HERE)
    import torch
    import torch_gpt2
    ids_arg = ",".join(map(str, ids))
    result = {"tokens": len(ids), "vocab": header[3]}
    for device in (["cuda"] if args.device == "cuda" else []) + ["cpu"]:
        logits = os.path.join(args.out, "logits-%s.f32" % device)
        run([worker, "sample", ckpt, "--device", device, "--prompt-ids", ids_arg, "--tokens", "1",
             "--logits", logits], env=env)
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
        r = torch_gpt2.compare(export, ids, logits, torch_device)
        result["ours_" + device] = r
    with open(os.path.join(args.out, "logits.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("logits:", json.dumps(result))
    # fp32 against fp32: the CPU decoder's logits must be PyTorch's to rounding.
    if result["ours_cpu"]["max_abs_diff_plain_torch"] > 1e-2:
        sys.exit("the CPU decoder's logits differ from PyTorch's by %g" %
                 result["ours_cpu"]["max_abs_diff_plain_torch"])


if __name__ == "__main__":
    main()
