#!/usr/bin/env python3
"""A user's own PyTorch DDP script (tests/integration/foreign/ddp_train.py: gloo, env://, 2 local
ranks) under `topolaunch run` and under torch.distributed.run (tests/integration/foreign/
torchrun.py, the wrapper Debian's torch 1.13 needs on Python 3.11), in the same run, interleaved.

usage: bench_torchrun.py TOPOLAUNCH SOURCE_ROOT [REPEATS]
Per launcher and measurement, the median of REPEATS (default 5) runs, and the ratio
topolaunch / torchrun; one JSON object per measurement on stdout:
  all_started_s    launch -> the slowest rank's script started (its first line, before torch)
  first_step_s     launch -> the slowest rank's first optimizer step
  failure_teardown_s  rank 1 raises at step 20 -> the launcher has exited (every rank gone)
  ctrl_c_exit_s    SIGINT to the launcher's process group (a terminal's Ctrl-C) after the first
                   step -> the launcher has exited; its exit statuses are in "exit_codes"
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TOPOLAUNCH, ROOT = sys.argv[1:3]
REPEATS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
HERE = os.path.join(ROOT, "tests", "integration", "foreign")
SCRIPT = os.path.join(HERE, "ddp_train.py")
TMP = tempfile.mkdtemp(prefix="bench-torchrun-")


def torch_python():
    for candidate in (sys.executable, "/usr/bin/python3"):
        if subprocess.run([candidate, "-c", "import torch"], capture_output=True).returncode == 0:
            return candidate
    sys.exit("bench: no python3 here can import torch (apt-get install python3-torch)")


PYTHON = torch_python()
CONFIG = os.path.join(TMP, "job.toml")
with open(CONFIG, "w") as f:
    f.write('[job]\nname = "bench"\nranks_per_node = 2\nstop_grace = "30s"\n'
            '[mapping]\noversubscribe = true\n[rdma]\npreflight = "off"\n')
runs = 0


def command(launcher, marks, *script_args):
    global runs
    runs += 1
    if launcher == "topolaunch":
        return [TOPOLAUNCH, "run", CONFIG, "-q", "--job-dir", os.path.join(TMP, f"job-{runs}"),
                "--", PYTHON, SCRIPT, "--marks", marks, *script_args]
    return [PYTHON, os.path.join(HERE, "torchrun.py"), "--standalone", "--nproc_per_node=2",
            SCRIPT, "--marks", marks, *script_args]


def marks_of(marks, suffix):
    out = []
    for name in os.listdir(marks):
        if name.endswith(suffix):
            with open(os.path.join(marks, name)) as f:
                text = f.read()
            if text:
                out.append(float(text))
    return out


def fresh_marks():
    path = tempfile.mkdtemp(dir=TMP)
    return path


def launch(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def wait_marks(marks, suffix, count, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = marks_of(marks, suffix)
        if len(found) >= count:
            return found
        if proc.poll() is not None:
            sys.exit(f"bench: launcher exited {proc.returncode} before {count} {suffix} marks")
        time.sleep(0.01)
    sys.exit(f"bench: no {count} {suffix} marks within {timeout}s")


def start_and_first_step(launcher):
    marks = fresh_marks()
    t0 = time.time()
    proc = launch(command(launcher, marks, "--steps", "40"))
    proc.wait(timeout=600)
    if proc.returncode != 0:
        sys.exit(f"bench: {launcher} exited {proc.returncode}")
    started = marks_of(marks, ".started")
    first = marks_of(marks, ".first-step")
    if len(started) != 2 or len(first) != 2:
        sys.exit(f"bench: {launcher}: {len(started)} started, {len(first)} first steps")
    return max(started) - t0, max(first) - t0


def failure_teardown(launcher):
    marks = fresh_marks()
    proc = launch(command(launcher, marks, "--fail-rank", "1", "--fail-step", "20"))
    proc.wait(timeout=600)
    exited = time.time()
    failing = marks_of(marks, ".failing")
    if proc.returncode == 0 or len(failing) != 1:
        sys.exit(f"bench: {launcher}: exit {proc.returncode}, {len(failing)} failing marks")
    return exited - failing[0]


def ctrl_c(launcher):
    marks = fresh_marks()
    proc = launch(command(launcher, marks, "--steps", "1000000", "--step-sleep", "0.01"))
    wait_marks(marks, ".first-step", 2, proc)
    time.sleep(0.5)
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=600)
    return time.time() - t0, proc.returncode


results = {m: {"topolaunch": [], "torchrun": []}
           for m in ("all_started_s", "first_step_s", "failure_teardown_s", "ctrl_c_exit_s")}
exit_codes = {"topolaunch": [], "torchrun": []}
start_and_first_step("topolaunch")  # warm the page cache (torch's libraries) for both
start_and_first_step("torchrun")
for _ in range(REPEATS):
    for launcher in ("topolaunch", "torchrun"):  # interleaved: drifts hit both alike
        started, first = start_and_first_step(launcher)
        results["all_started_s"][launcher].append(started)
        results["first_step_s"][launcher].append(first)
        results["failure_teardown_s"][launcher].append(failure_teardown(launcher))
        took, code = ctrl_c(launcher)
        results["ctrl_c_exit_s"][launcher].append(took)
        exit_codes[launcher].append(code)

for measurement, by_launcher in results.items():
    ours = statistics.median(by_launcher["topolaunch"])
    theirs = statistics.median(by_launcher["torchrun"])
    line = {"benchmark": "launcher_vs_torchrun", "measurement": measurement, "ranks": 2,
            "repeats": REPEATS, "topolaunch_median_s": round(ours, 3),
            "torchrun_median_s": round(theirs, 3), "ratio": round(ours / theirs, 3),
            "topolaunch_s": [round(v, 3) for v in by_launcher["topolaunch"]],
            "torchrun_s": [round(v, 3) for v in by_launcher["torchrun"]]}
    if measurement == "ctrl_c_exit_s":
        line["exit_codes"] = exit_codes
    print(json.dumps(line), flush=True)
shutil.rmtree(TMP, ignore_errors=True)
