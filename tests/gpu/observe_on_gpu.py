#!/usr/bin/env python3
"""[observe] on the GPU (suite gpu): `topolaunch run` of GPT-2 124M with traced steps, NVML
energy and the cost table.

  observe_on_gpu.py one_gpu  --topolaunch EXE --worker EXE --work DIR --source DIR
      configs/jobs/gpt2-124m-1gpu.toml shortened to STEPS steps, [observe] trace_steps = TRACED
      and [cost] gpu_hour = 2.5: the merged trace is trace-event JSON whose compute-stream spans
      (CUDA events of the traced graph) follow one another in the plan's order without overlap,
      every span an op of the plan; report.json has NVML energy in joules, tokens per joule, an
      MFU between 0 and 1 against the GPU's data-sheet peak, the price, and the device as
      nvidia-smi names it with its memory (arena <= used <= the card); the tracing overhead of
      the traced steps against the untraced ones before them is printed (not judged).
  observe_on_gpu.py two_gpus ...   (suite gpu-multi) configs/jobs/gpt2-124m-h200x2.toml the same
      way: each rank's trace has every gradient bucket's all-reduce on the communication stream
      of each traced step, and the first of them starts before that step's backward ends (the
      all-reduces run beside the backward).

Prints one line per check and a JSON summary (also WORK/result.json); exit status 1 when a check
fails. The Jane Austen data as worker_on_gpu.py finds it.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
DEBIAN_AUSTEN = "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
STEPS, TRACED = 60, [40, 41]
checks, facts = {}, {}


def check(name, ok, detail=""):
    checks[name] = bool(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def austen():
    path = os.environ.get("TOPOLAUNCH_JANEAUSTENR", DEBIAN_AUSTEN)
    if not os.path.isfile(path):
        sys.exit(f"the Jane Austen data is not at {path}: install r-cran-janeaustenr or set "
                 "TOPOLAUNCH_JANEAUSTENR (tests/gpu/gpu-host.sh carries it)")
    return path


def job_copy(args, name):
    text = open(os.path.join(args.source, "configs", "jobs", name)).read()
    text = re.sub(r'(?m)^kind = "janeaustenr".*$', f'kind = "janeaustenr"\npath = "{austen()}"', text)
    text = re.sub(r"(?m)^steps = .*$", f"steps = {STEPS}", text)
    text = re.sub(r"(?m)^log_every = .*$", "log_every = 10", text)
    text += f"\n[observe]\ntrace_steps = {TRACED}\n\n[cost]\ngpu_hour = 2.5\n"
    path = os.path.join(args.work, name)
    open(path, "w").write(text)
    return path


def run(args, name, devices):
    job = job_copy(args, name)
    job_dir = os.path.join(args.work, "job")
    shutil.rmtree(job_dir, ignore_errors=True)
    env = dict(os.environ, **NO_MULTICAST, CUDA_VISIBLE_DEVICES=devices)
    t0 = time.time()
    with open(os.path.join(args.work, "run.log"), "w") as log:
        rc = subprocess.run([args.topolaunch, "run", job, "--local", "--job-dir", job_dir],
                            stdout=log, stderr=subprocess.STDOUT, timeout=500, env=env).returncode
    facts["run_s"] = round(time.time() - t0, 1)
    check(f"topolaunch run of {name} with traced steps: exit 0", rc == 0, f"exit {rc}")
    return job_dir


def spans_by(trace, rank, tid, step):
    return sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == rank
                   and e["tid"] == tid and e["args"].get("step") == step), key=lambda e: e["ts"])


def check_trace(job_dir, world):
    trace = json.load(open(os.path.join(job_dir, "trace.json")))
    other = trace["otherData"]
    check("trace: one process per rank", sorted(other["ranks"]) == list(range(world)),
          str(other["ranks"]))
    check("trace: the traced steps", other["steps"] == TRACED, str(other["steps"]))
    for rank in range(world):
        plan_ops = other["per_rank"][rank]["plan_ops"]
        for step in TRACED:
            compute = spans_by(trace, rank, 1, step)
            ops = [e["args"]["op"] for e in compute]
            check(f"rank {rank} step {step}: compute spans are the plan's ops, in order",
                  compute and ops == sorted(ops) and len(set(ops)) == len(ops) and
                  0 <= ops[0] and ops[-1] < plan_ops, f"{len(ops)} spans of {plan_ops} ops")
            overlap = max((a["ts"] + a["dur"] - b["ts"] for a, b in zip(compute, compute[1:])),
                          default=0)
            check(f"rank {rank} step {step}: one stream, no two ops at once", overlap <= 1.0,
                  f"largest overlap {overlap:.2f} us")
    overhead = [o["overhead"] for o in other["per_rank"]]
    facts["trace_overhead"] = overhead
    facts["clock_alignment"] = other["clock_alignment"]
    return trace


def check_cost(job_dir):
    rep = json.load(open(os.path.join(job_dir, "report.json")))
    cost = rep.get("cost", {})
    energy = cost.get("energy", {})
    check("report: GPU energy from NVML, in joules", (energy.get("gpu_j") or 0) > 0,
          str(energy.get("gpu_j")))
    check("report: tokens per joule", (cost.get("tokens_per_j") or 0) > 0,
          str(cost.get("tokens_per_j")))
    mfu = cost.get("mfu")
    check("report: MFU against the data sheet's peak", mfu is not None and 0 < mfu < 1,
          f"{mfu} ({cost.get('peak_from')})")
    check("report: the job's price from [cost] gpu_hour",
          (cost.get("price", {}).get("total") or 0) > 0, str(cost.get("price")))
    parts = cost.get("step_time", {})
    facts["cost"] = {k: cost.get(k) for k in ("allocation", "energy", "tokens", "tokens_per_s",
                                             "tokens_per_j", "mfu", "peak_from", "price")}
    facts["step_time"] = parts
    ranks = rep["attempts"][-1]["ranks"]
    facts["memory_rank0"] = ranks[0].get("steps", {}).get("memory")
    # The device the job ran on, as nvidia-smi names it (an H200 or an H100 host alike), and
    # memory figures that hold together: the arena inside what the process used, inside the card.
    allocated = (facts["memory_rank0"] or {}).get("allocated", {})
    named = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True).stdout.strip()
    check("report: the device and its memory as allocated",
          bool(named) and allocated.get("device") == named
          and 0 < allocated.get("arena", 0) <= allocated.get("device_used", 0)
          <= allocated.get("device_total", 0),
          f"{allocated} (nvidia-smi: {named!r})")


def one_gpu(args):
    job_dir = run(args, "gpt2-124m-1gpu.toml", "0")
    check_trace(job_dir, 1)
    check_cost(job_dir)


def two_gpus(args):
    job_dir = run(args, "gpt2-124m-h200x2.toml", "0,1")
    trace = check_trace(job_dir, 2)
    for rank in range(2):
        buckets = trace["otherData"]["per_rank"][rank]["plan_buckets"]
        for step in TRACED:
            comm = spans_by(trace, rank, 2, step)
            backward = [e for e in spans_by(trace, rank, 1, step) if e["cat"] == "backward"]
            check(f"rank {rank} step {step}: every bucket's all-reduce on the communication "
                  "stream", sorted(e["args"]["bucket"] for e in comm) == list(range(buckets)),
                  f"{len(comm)} of {buckets}")
            if comm and backward:
                end = max(e["ts"] + e["dur"] for e in backward)
                check(f"rank {rank} step {step}: the first all-reduce runs beside the backward",
                      comm[0]["ts"] < end, f"starts {end - comm[0]['ts']:.0f} us before its end")
    check_cost(job_dir)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["one_gpu", "two_gpus"])
    ap.add_argument("--topolaunch", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--source", required=True)
    args = ap.parse_args()
    args.work = os.path.join(os.path.abspath(args.work), args.what)
    os.environ["PATH"] = os.path.dirname(os.path.abspath(args.worker)) + os.pathsep + os.environ["PATH"]
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    try:
        {"one_gpu": one_gpu, "two_gpus": two_gpus}[args.what](args)
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        check("the run and its files", False, repr(e))
    result = {"what": args.what, "checks": checks, "facts": facts, "pass": all(checks.values())}
    json.dump(result, open(os.path.join(args.work, "result.json"), "w"), indent=1)
    print(json.dumps(result))
    if not result["pass"]:
        log = os.path.join(args.work, "run.log")
        if os.path.exists(log):
            print("##### run.log\n" + open(log, errors="replace").read()[-6000:])
    sys.exit(0 if result["pass"] else 1)


if __name__ == "__main__":
    main()
