#!/usr/bin/env python3
"""What the agent's memory and energy sampling costs the steps of a job: bench_sampling (one
round's cost, in-process) and, in one run of this script, the CPU example job's step time under
`topolaunch run` (the agent sampling every 200 ms: /proc, NVML where loaded, RAPL where
readable, and everything else an agent does) against the same two workers started without an
agent (same cores, same environment, no sampling), interleaved REPEATS times.

Prints the JSON of bench_sampling, then one JSON object: the median step time under the agent
against without it, and the ratio. No pass/fail on timing.

usage: bench_sampling.py BENCH_SAMPLING FAKE_NVML TOPOLAUNCH WORKER SOURCE_ROOT [REPEATS] [--out F]
"""
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
from example_job import character_level  # noqa: E402  (tests/example_job.py)

bench, fake_nvml, topolaunch, worker, root = sys.argv[1:6]
repeats = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6].isdigit() else 3
out_file = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
STEPS = 150
rows = [json.loads(subprocess.run([bench, fake_nvml], capture_output=True, text=True,
                                  check=True).stdout)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


tmp = tempfile.mkdtemp(prefix="bench-sampling-")
text = character_level(open(os.path.join(root, "configs", "jobs", "tiny-gpt-cpu.toml")).read())
text = re.sub(r"(?m)^steps = \d+", f"steps = {STEPS}", text)
text = re.sub(r"(?m)^log_every = \d+", "log_every = 10", text)
text = re.sub(r"(?m)^checkpoint_every = \d+", "checkpoint_every = 0", text)
text = text.replace("[train]\n", "[train]\nresume = false\n", 1)  # each run from step 1
config = os.path.join(tmp, "job.toml")
open(config, "w").write(text)
# The same gradient communicator either way (under an agent the workers would take UCX through
# its store, started by hand the TCP ring).
env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(worker)) + os.pathsep + os.environ["PATH"],
           TOPOLAUNCH_KERNELS_COMM="tcp")


def step_ms(files):
    ms = []
    for f in files:
        for line in open(f):
            r = json.loads(line)
            if r.get("steps", 0) > 0 and r["step"] > 20:
                ms.append(r["wall_ms"] / r["steps"])
    return ms


def under_agent(i):
    job_dir = os.path.join(tmp, f"agent-{i}")
    subprocess.run([topolaunch, "run", config, "-q", "--job-dir", job_dir], check=True, env=env,
                   capture_output=True, timeout=600)
    ms = step_ms([os.path.join(job_dir, "attempt-0", "metrics", f"rank-{r}.jsonl") for r in (0, 1)])
    shutil.rmtree(job_dir, ignore_errors=True)
    return ms


def without_agent(i, tries=3):
    """The two ranks as the agent starts them (its environment's names, a core each, passive
    OpenMP waiting), by this script instead. The TCP ring takes MASTER_PORT+1 and +2, which
    another program may hold: a run that fails is tried again on another port."""
    port, files, procs = free_port(), [], []
    for rank in (0, 1):
        files.append(os.path.join(tmp, f"direct-{i}-{rank}.jsonl"))
        e = dict(env, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                 TOPOLAUNCH_CHECKPOINT_DIR=os.path.join(tmp, f"ck-{i}"),
                 TOPOLAUNCH_STEP_METRICS_FILE=files[-1])
        procs.append(subprocess.Popen(["taskset", "-c", str(rank), worker, config], env=e,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    failed = [p.communicate(timeout=600)[1] for p in procs]
    if any(p.returncode != 0 for p in procs):
        if tries > 1:
            return without_agent(i, tries - 1)
        sys.exit("bench: a worker started without the agent failed: " + " | ".join(failed)[-1500:])
    ms = step_ms(files)
    shutil.rmtree(os.path.join(tmp, f"ck-{i}"), ignore_errors=True)
    return ms


agent, direct = [], []
for i in range(repeats):
    agent += under_agent(i)
    direct += without_agent(i)
shutil.rmtree(tmp, ignore_errors=True)
row = {"bench": "agent_sampling_step_time_ms", "value": statistics.median(agent),
       "peer": "the same workers without an agent", "peer_value": statistics.median(direct),
       "steps": STEPS, "repeats": repeats, "job": "configs/jobs/tiny-gpt-cpu.toml, 2 ranks"}
row["ratio"] = row["value"] / row["peer_value"]
rows.append(row)
for r in rows:
    print(json.dumps(r))
if out_file:
    with open(out_file, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
