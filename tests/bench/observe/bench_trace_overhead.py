#!/usr/bin/env python3
"""The cost of [observe] trace_steps on the CPU example job (configs/jobs/tiny-gpt-cpu.toml, 2
ranks, the built-in worker), in one run of this script: the job with every other step from
FIRST on traced (run A) against the same job untraced (run B), interleaved A, B, A, B...; every
step logged, so that the step figures give each step's wall time.

Prints one JSON object per measurement, with the peer's figure from the same run and the ratio:
  traced_steps    A's traced steps  vs A's untraced steps between them (the same runs, one step
                  apart: the cost on a traced step, free of the drift between runs)
  untraced_steps  A's untraced steps vs B's same steps (the cost elsewhere: none is done, so
                  what this shows is the drift between runs on a shared host)
  record_cost     what the workers measured of one span, times the spans of a traced step, against
                  that step's time.
No pass/fail on timing.

usage: bench_trace_overhead.py TOPOLAUNCH WORKER SOURCE_ROOT [REPEATS] [--out FILE]
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
from example_job import character_level  # noqa: E402  (tests/example_job.py)

topolaunch, worker, root = sys.argv[1:4]
repeats = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4].isdigit() else 3
out_file = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
STEPS, FIRST = 160, 40
TRACED = list(range(FIRST, STEPS, 2))


def config(tmp, name, traced):
    # (a checkpoint folder of its own per run: a second run would resume at the end of the first)
    text = character_level(open(os.path.join(root, "configs", "jobs", "tiny-gpt-cpu.toml")).read())
    text = re.sub(r"(?m)^steps = \d+", f"steps = {STEPS}", text)
    text = re.sub(r"(?m)^log_every = \d+", "log_every = 1", text)
    text = re.sub(r"(?m)^checkpoint_every = \d+", "checkpoint_every = 0", text)
    text = text.replace("[job]\n", f'[job]\ncheckpoint_dir = "{tmp}/ckpt-{name}"\n', 1)
    text = re.sub(r"(?m)^keep_checkpoints = \d+", "keep_checkpoints = 1", text)
    text = text.replace("[train]\n", "[train]\nresume = false\n", 1)
    if traced:
        text += f"\n[observe]\ntrace_steps = {traced}\n"
    path = os.path.join(tmp, name + ".toml")
    open(path, "w").write(text)
    return path


def run(tmp, name, traced, i):
    job_dir = os.path.join(tmp, f"{name}-{i}")
    env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(worker)) + os.pathsep + os.environ["PATH"])
    p = subprocess.run([topolaunch, "run", config(tmp, name, traced), "-q", "--job-dir", job_dir],
                       capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        sys.exit(f"bench: the job failed ({p.returncode}): {p.stderr[-2000:]}")
    walls, trace_parts = {}, []  # (rank, step) -> ms; the tracing part of each traced step
    for rank in (0, 1):
        for line in open(os.path.join(job_dir, "attempt-0", "metrics", f"rank-{rank}.jsonl")):
            r = json.loads(line)
            if r.get("steps") == 1:
                walls[(rank, r["step"])] = r["wall_ms"]
                if r["step"] in (traced or []) and r["step"] != traced[-1]:
                    trace_parts.append(r["trace_ms"])  # (the last one writes the file too)
    spans = []
    if traced:
        trace = json.load(open(os.path.join(job_dir, "trace.json")))
        for per_rank in trace["otherData"]["per_rank"]:
            spans.append(per_rank["overhead"]["record_ns_per_span"])
        x = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        spans_per_step = len(x) / (2 * len(traced))
    shutil.rmtree(job_dir, ignore_errors=True)
    return walls, (statistics.median(spans), spans_per_step, statistics.median(trace_parts)) \
        if traced else None


tmp = tempfile.mkdtemp(prefix="bench-trace-")
a_walls, b_walls, record = [], [], []
for i in range(repeats):
    w, rec = run(tmp, "traced", TRACED, i)
    a_walls.append(w)
    record.append(rec)
    w, _ = run(tmp, "untraced", None, i)
    b_walls.append(w)
shutil.rmtree(tmp, ignore_errors=True)


def median_over(walls, steps):
    return statistics.median(w[(r, s)] for w in walls for r in (0, 1) for s in steps
                             if (r, s) in w)


untraced = [s for s in range(FIRST + 1, STEPS, 2)]
rows = [
    {"bench": "trace_overhead_traced_steps", "unit": "ms per step (median, both ranks)",
     "value": median_over(a_walls, TRACED),
     "peer": "the untraced steps between them, same runs",
     "peer_value": median_over(a_walls, untraced)},
    {"bench": "trace_overhead_untraced_steps", "unit": "ms per step (median, both ranks)",
     "value": median_over(a_walls, untraced),
     "peer": "the same steps in a run without [observe]",
     "peer_value": median_over(b_walls, untraced)},
]
for r in rows:
    r["ratio"] = r["value"] / r["peer_value"]
    r.update({"steps": STEPS, "traced_steps": len(TRACED), "repeats": repeats,
              "job": "configs/jobs/tiny-gpt-cpu.toml, 2 ranks"})
ns = statistics.median(r[0] for r in record)
per_step = statistics.median(r[1] for r in record)
rows.append({"bench": "trace_part_of_a_traced_step", "unit": "ms (median, both ranks)",
             "value": statistics.median(r[2] for r in record),
             "what": "the loop's own tracing work: the executor's spans collected, the "
                     "clock-sync all-reduce(s) after the step",
             "peer": "the traced step's median wall time", "peer_value": rows[0]["value"]})
rows[-1]["ratio"] = rows[-1]["value"] / rows[-1]["peer_value"]
rows.append({"bench": "trace_record_cost", "unit": "ns per span (as the workers measured it)",
             "value": ns, "spans_per_traced_step_per_rank": per_step,
             "ms_per_traced_step": ns * per_step / 1e6,
             "peer": "the traced step's median wall time",
             "peer_value": rows[0]["value"], "ratio": ns * per_step / 1e6 / rows[0]["value"]})
for r in rows:
    print(json.dumps(r))
if out_file:
    with open(out_file, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
