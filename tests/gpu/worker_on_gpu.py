#!/usr/bin/env python3
"""The GPU worker end to end (suite gpu): topolaunch-worker with train.precision = "bf16".

  worker_on_gpu.py single   --worker EXE --topolaunch EXE --work DIR   one GPU, a small GPT:
      (a) STEPS steps uninterrupted, every loss in a metrics file, loss falls;
      (b) the same job sent SIGUSR1 once step SIGNAL_AT is logged: exit 75, the "stopped by
          SIGUSR1 after step S; checkpoint ..." line, the checkpoint file;
      (c) resumed from (b)'s checkpoint: resumes at S, runs to STEPS, losses within 1e-2 of (a)'s
          (the GEMM autotune may pick other algorithms in another process: bits are reported);
      (e) checkpoints across backends: (b)'s GPU checkpoint resumed by the CPU worker (fp32), a
          CPU checkpoint resumed by the GPU worker: the next step's loss within 1e-2 of the other
          backend's.
  worker_on_gpu.py launcher ... --source DIR
      `topolaunch map` and `topolaunch run` of configs/jobs/gpt2-124m-1gpu.toml on GPU 0: loss
      falls, and the binding the worker reports (GPU PCI bus id, CUDA_VISIBLE_DEVICES, CPU
      affinity, NUMA policy: read back by the worker itself) equals the rank map.
  worker_on_gpu.py ddp      ...                       two GPUs (suite gpu-multi): GPT-2 124M
      through `topolaunch run` (one rank per GPU, NCCL): per-step communication lines against
      the plan and a deliberately tight [budget] whose warnings name the keys; SIGUSR1 to the
      launcher: both ranks stop after the same step, topolaunch exits 3, a checkpoint.

The Jane Austen data: Debian's r-cran-janeaustenr, or $TOPOLAUNCH_JANEAUSTENR (tests/gpu/gpu-host.sh
carries the file to hosts without it). Prints one line per check and a JSON summary (also
written to WORK/result.json); exit status 1 when a check fails.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
DEBIAN_AUSTEN = "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
checks = {}
facts = {}


def check(name, ok, detail=""):
    checks[name] = bool(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def austen():
    path = os.environ.get("TOPOLAUNCH_JANEAUSTENR", DEBIAN_AUSTEN)
    if not os.path.isfile(path):
        sys.exit(f"the Jane Austen data is not at {path}: install r-cran-janeaustenr or set "
                 "TOPOLAUNCH_JANEAUSTENR (tests/gpu/gpu-host.sh carries it)")
    return path


def env_for_gpu(devices="0"):
    env = dict(os.environ, **NO_MULTICAST)
    env["CUDA_VISIBLE_DEVICES"] = devices
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(k, None)
    return env


def losses(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            if "loss" in r:
                out[r["step"]] = r["loss"]
    return out


def rel(x, y):
    return abs(x - y) / abs(y) if x is not None and y is not None and y != 0 else None


SMALL = """[model]
kind = "gpt2"
n_layer = 4
n_embd = 256
n_head = 4
block_size = 128

[data]
kind = "janeaustenr"
path = "{data}"

[train]
batch = 8
seq_len = 128
steps = {steps}
precision = "bf16"
learning_rate = 1e-3
warmup_steps = 20
min_lr_fraction = 0.1
weight_decay = 0.1
grad_clip = 1.0
grad_accum = 1
log_every = 50
"""


def run_single(args):
    steps, signal_at = 300, 100
    work = args.work
    worker = args.worker
    job = os.path.join(work, "small.toml")
    open(job, "w").write(SMALL.format(data=austen(), steps=steps))

    def small(label, *sets, timeout=120):
        cmd = [worker, job, "--set", f'train.metrics_file="{work}/{label}.jsonl"']
        for s in sets:
            cmd += ["--set", s]
        with open(os.path.join(work, label + ".log"), "w") as log:
            return subprocess.run(cmd, env=env_for_gpu(), stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode

    rc_a = small("a", f'train.checkpoint_dir="{work}/ckpt-a"', "train.resume=false")
    a = losses(f"{work}/a.jsonl")
    check("a: exit 0 and every step logged", rc_a == 0 and len(a) == steps,
          f"exit {rc_a}, {len(a)} of {steps} steps")
    check("a: loss falls", len(a) == steps and a[steps] < 0.8 * a[1],
          f"{a.get(1)} -> {a.get(steps)}")

    # (b): the worker is our child; SIGUSR1 once its metrics file passes signal_at
    with open(f"{work}/b.log", "w") as log:
        p = subprocess.Popen([worker, job, "--set", f'train.metrics_file="{work}/b.jsonl"', "--set",
                              f'train.checkpoint_dir="{work}/ckpt-b"', "--set", "train.resume=false"],
                             env=env_for_gpu(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None and len(losses(f"{work}/b.jsonl")) < signal_at:
            time.sleep(0.01)
        p.send_signal(signal.SIGUSR1)
        try:
            rc_b = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc_b = p.wait()
    blog = open(f"{work}/b.log", errors="replace").read()
    m = re.search(r"stopped by SIGUSR1 after step (\d+); checkpoint (\S+) \(exit 75", blog)
    stop = int(m.group(1)) if m else None
    check("b: SIGUSR1 -> exit 75 and the stop line", rc_b == 75 and stop is not None and stop < steps,
          f"exit {rc_b}, stopped after {stop}")
    check("b: checkpoint file", m is not None and os.path.isfile(m.group(2)))
    b = losses(f"{work}/b.jsonl")
    b_rel = [rel(v, a.get(s)) for s, v in b.items()]
    check("b: losses equal a's before the stop (1e-2)",
          b and None not in b_rel and max(b_rel) <= 1e-2, f"max rel {max(b_rel) if b_rel else None}")
    shutil.copytree(f"{work}/ckpt-b", f"{work}/ckpt-e")  # (c) writes ckpt-b again at its end

    rc_c = small("c", f'train.checkpoint_dir="{work}/ckpt-b"', "train.resume=true")
    c = losses(f"{work}/c.jsonl")
    clog = open(f"{work}/c.log", errors="replace").read()
    check("c: resumed at the stop step, exit 0",
          rc_c == 0 and stop is not None and f"at step {stop}" in clog, f"exit {rc_c}")
    tail = list(range(stop + 1, steps + 1)) if stop else []
    c_rel = [rel(c.get(s), a.get(s)) for s in tail]
    check("c: resumed losses equal a's (1e-2)", tail and None not in c_rel and max(c_rel) <= 1e-2,
          f"{len([s for s in tail if s in c])} steps, max rel {max(c_rel) if tail and None not in c_rel else None}")
    facts["c_bit_identical_steps"] = sum(1 for s in tail if c.get(s) == a.get(s))
    facts["c_steps"] = len(tail)

    # (e): across backends
    if stop:
        small("e_gpu_to_cpu", 'train.precision="fp32"', f"train.steps={stop + 1}",
              f'train.checkpoint_dir="{work}/ckpt-e"')
    e = losses(f"{work}/e_gpu_to_cpu.jsonl")
    e_rel = rel(e.get(stop + 1), a.get(stop + 1)) if stop else None
    check("e: a GPU checkpoint resumes on the CPU (next loss within 1e-2)",
          e_rel is not None and e_rel <= 1e-2, f"rel {e_rel}")
    small("f_cpu3", 'train.precision="fp32"', "train.steps=3", "train.resume=false",
          f'train.checkpoint_dir="{work}/ckpt-f"')
    shutil.copytree(f"{work}/ckpt-f", f"{work}/ckpt-g")
    small("f_cpu4", 'train.precision="fp32"', "train.steps=4", f'train.checkpoint_dir="{work}/ckpt-f"')
    small("g_cpu_to_gpu", "train.steps=4", f'train.checkpoint_dir="{work}/ckpt-g"')
    g_rel = rel(losses(f"{work}/g_cpu_to_gpu.jsonl").get(4), losses(f"{work}/f_cpu4.jsonl").get(4))
    check("e: a CPU checkpoint resumes on the GPU (step 4 within 1e-2)",
          g_rel is not None and g_rel <= 1e-2, f"rel {g_rel}")
    facts.update(loss_first_last=[a.get(1), a.get(steps)], stopped_after=stop)


# --- the launcher on one GPU, and the binding check ---------------------------------------------

def cpu_ids(text):  # "0-3,8" -> {0,1,2,3,8}
    out = set()
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def bus(text):  # "00000000:1B:00.0" / "0000:1b:00.0" -> (0, 0x1b, 0, 0)
    m = re.match(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", text.strip())
    return tuple(int(g or "0", 16) for g in m.groups()) if m else None


BINDING = re.compile(r"rank (\d+) binding: cuda device (\d+) \((.*), pci (\S+), "
                     r"CUDA_VISIBLE_DEVICES=(\S*)\) \| cpus (\S+) \| numa (\S+) \(memory policy (\S+)\)")


def check_binding(map_json, job_dir):
    ranks = {}
    if os.path.exists(map_json):
        d = json.load(open(map_json))
        ranks = {r["rank"]: r for r in d.get("map", d).get("ranks", [])}
    reported = {}
    for log in glob.glob(os.path.join(job_dir, "attempt-*", "rank-*.log")):
        for line in open(log, errors="replace"):
            m = BINDING.search(line)
            if m:
                reported[int(m.group(1))] = m
    check("binding: every rank of the map reported its binding",
          ranks and sorted(ranks) == sorted(reported), f"map {sorted(ranks)}, reported {sorted(reported)}")
    for r, want in sorted(ranks.items()):
        got = reported.get(r)
        if got is None:
            continue
        env = want.get("env", {})
        want_bus = [bus(b) for b in env.get("TOPOLAUNCH_GPU_BUSIDS", "").split(",") if b]
        check(f"binding: rank {r} GPU", [bus(got.group(4))] == want_bus,
              f"worker {got.group(4)}, map {env.get('TOPOLAUNCH_GPU_BUSIDS')}")
        check(f"binding: rank {r} CUDA_VISIBLE_DEVICES", got.group(5) == env.get("CUDA_VISIBLE_DEVICES"),
              f"worker {got.group(5)}, map {env.get('CUDA_VISIBLE_DEVICES')}")
        check(f"binding: rank {r} cpus", cpu_ids(got.group(6)) == cpu_ids(want["cpus"]),
              f"worker {got.group(6)}, map {want['cpus']}")
        if "TOPOLAUNCH_NUMA" in env:
            check(f"binding: rank {r} numa memory", got.group(8) == "bind" and
                  cpu_ids(got.group(7)) == {int(env["TOPOLAUNCH_NUMA"])},
                  f"worker {got.group(7)} ({got.group(8)}), map {env['TOPOLAUNCH_NUMA']}")


def job_copy(source, work, name, steps=None):
    """The job file with the data path of this host (and a step count), as a user would edit it."""
    text = open(os.path.join(source, "configs", "jobs", name)).read()
    text = re.sub(r'(?m)^kind = "janeaustenr".*$', f'kind = "janeaustenr"\npath = "{austen()}"', text)
    if steps is not None:
        text = re.sub(r"(?m)^steps = .*$", f"steps = {steps}", text)
    path = os.path.join(work, name)
    open(path, "w").write(text)
    return path


def step_losses(job_dir, rank=0):
    out = {}
    for log in sorted(glob.glob(os.path.join(job_dir, "attempt-*", f"rank-{rank}.log"))):
        for m in re.finditer(r"(?m)^step +(\d+)/\d+ \| loss ([0-9.]+)", open(log, errors="replace").read()):
            out[int(m.group(1))] = float(m.group(2))
    return out


def run_launcher(args):
    work = args.work
    topolaunch = args.topolaunch
    job = job_copy(args.source, work, "gpt2-124m-1gpu.toml")
    map_json = os.path.join(work, "map.json")
    with open(map_json, "w") as out:
        rc_map = subprocess.run([topolaunch, "map", job, "--json"], stdout=out, timeout=60,
                                env=env_for_gpu()).returncode
    check("topolaunch map --json: exit 0", rc_map == 0, f"exit {rc_map}")
    job_dir = os.path.join(work, "job")
    shutil.rmtree(job_dir, ignore_errors=True)
    t0 = time.time()
    with open(os.path.join(work, "run.log"), "w") as log:
        rc = subprocess.run([topolaunch, "run", job, "--job-dir", job_dir], stdout=log,
                            stderr=subprocess.STDOUT, timeout=400, env=env_for_gpu()).returncode
    facts["launcher_run_s"] = round(time.time() - t0, 1)
    check("topolaunch run of the single-GPU example: exit 0", rc == 0, f"exit {rc}")
    lo = step_losses(job_dir)
    last = max(lo) if lo else None
    check("the example's loss falls", lo and lo[last] < 0.7 * lo[min(lo)],
          f"step {min(lo) if lo else None}: {lo.get(min(lo)) if lo else None} -> step {last}: "
          f"{lo.get(last) if lo else None}")
    facts["example_loss_first_last"] = [lo.get(min(lo)), lo.get(last)] if lo else None
    tps = re.findall(r"(?m)^step +\d+/\d+ \|.*\| ([0-9.]+) tok/s", "".join(
        open(f, errors="replace").read() for f in glob.glob(os.path.join(job_dir, "attempt-*", "rank-0.log"))))
    facts["example_tokens_per_s_last"] = float(tps[-1]) if tps else None
    check_binding(map_json, job_dir)
    check_binding(os.path.join(job_dir, "rankmap.json"), job_dir)


DDP_BUDGET = """
[budget]
memory = "32GiB"
gpu_memory = "60GiB"
comm_per_step = "64MiB"            # deliberately below the ~249 MB a rank sends: must warn
comm_exposed_per_step = "10us"     # deliberately tight: must warn
"""


def run_ddp(args):
    work = args.work
    topolaunch = args.topolaunch
    job = job_copy(args.source, work, "gpt2-124m-h200x2.toml", steps=400)
    text = open(job).read()
    text = re.sub(r"(?ms)^\[budget\].*?(?=^\[)", DDP_BUDGET.lstrip() + "\n", text)
    text = re.sub(r"(?m)^batch = .*$", "batch = 4", text)
    text = re.sub(r"(?m)^log_every = .*$", "log_every = 10", text)
    open(job, "w").write(text)
    job_dir = os.path.join(work, "ddp-job")
    shutil.rmtree(job_dir, ignore_errors=True)
    with open(os.path.join(work, "ddp.log"), "w") as log:
        p = subprocess.Popen([topolaunch, "run", job, "--local", "--job-dir", job_dir], stdout=log,
                             stderr=subprocess.STDOUT, env=env_for_gpu("0,1"))
        deadline = time.time() + 150
        while time.time() < deadline and p.poll() is None and max(step_losses(job_dir) or [0]) < 30:
            time.sleep(0.05)
        p.send_signal(signal.SIGUSR1)
        try:
            rc = p.wait(timeout=90)
        except subprocess.TimeoutExpired:
            p.terminate()
            rc = p.wait()
    check("ddp: SIGUSR1 to topolaunch -> exit 3 (stopped for requeue)", rc == 3, f"exit {rc}")
    stops, rank0 = {}, ""
    for log in glob.glob(os.path.join(job_dir, "attempt-*", "rank-*.log")):
        text = open(log, errors="replace").read()
        r = int(re.search(r"rank-(\d+)\.log", log).group(1))
        rank0 = text if r == 0 else rank0
        m = re.search(r"stopped by SIGUSR1 after step (\d+)", text) or \
            re.search(r"rank \d+ stopped after step (\d+)", text)
        stops[r] = int(m.group(1)) if m else None
    check("ddp: both ranks stop after the same step", len(stops) == 2 and None not in stops.values()
          and len(set(stops.values())) == 1, str(stops))
    comm = re.findall(r"(?m)^comm +\d+/\d+ \| all-reduce .*$", rank0)
    check("ddp: per-step communication lines", len(comm) >= 2, f"{len(comm)} lines")
    warnings = re.findall(r"(?m)^warning: .*$", rank0)
    check("ddp: the budget warnings name the keys",
          any("budget.comm_per_step" in w for w in warnings) and
          any("budget.comm_exposed_per_step" in w for w in warnings), f"{len(warnings)} warnings")
    check("ddp: a checkpoint written",
          bool(glob.glob(os.path.join(job_dir, "**", "checkpoint*"), recursive=True)))
    facts["ddp_comm_first"] = comm[:2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["single", "launcher", "ddp"])
    ap.add_argument("--worker", required=True, help="topolaunch-worker")
    ap.add_argument("--topolaunch", required=True, help="topolaunch")
    ap.add_argument("--work", required=True)
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = ap.parse_args()
    args.work = os.path.join(os.path.abspath(args.work), args.what)
    # `topolaunch run` finds topolaunch-worker in PATH (the job's [worker] command)
    os.environ["PATH"] = os.path.dirname(os.path.abspath(args.worker)) + os.pathsep + os.environ["PATH"]
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    try:
        {"single": run_single, "launcher": run_launcher, "ddp": run_ddp}[args.what](args)
    except subprocess.TimeoutExpired as e:
        check("no stage ran past its time limit", False, str(e))
    result = {"what": args.what, "checks": checks, "facts": facts, "pass": all(checks.values())}
    json.dump(result, open(os.path.join(args.work, "result.json"), "w"), indent=1)
    print(json.dumps(result))
    logs = sorted(glob.glob(os.path.join(args.work, "**", "*.log"), recursive=True))
    if not result["pass"]:
        for log in logs:  # what failed, in the meson testlog
            print(f"##### {log}\n" + open(log, errors="replace").read()[-4000:])
    return 0 if result["pass"] and checks else 1


if __name__ == "__main__":
    sys.exit(main())
