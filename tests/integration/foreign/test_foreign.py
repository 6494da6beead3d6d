#!/usr/bin/env python3
"""A user's own programs under `topolaunch run`: a real PyTorch DDP script (Debian's
python3-torch, gloo, env://, DistributedSampler, @record) on 2 local ranks, and an mpi4py program.

usage: test_foreign.py TOPOLAUNCH SOURCE_ROOT CASE
Cases:
  same_params      200 steps under topolaunch run and under torch.distributed.run (torchrun.py,
                   the wrapper Debian's torch 1.13 needs on Python 3.11): the same final
                   parameters, bit for bit
  failure          rank 1 raises at step 20: every process gone within 5 s, exit 1, the root
                   cause is rank 1 with the exception, and its @record traceback is in
                   report.json and the summary
  hang_beats       the script beats; rank 1 SIGSTOPs itself: rank 1 (not rank 0, which waits in
                   the all-reduce) named hung within heartbeat_timeout + 4 s
  hang_no_beats    the script never beats; progress_timeout: rank 1 named the same way
  healthy          heartbeat_timeout 1s and progress_timeout 2s on a 3 s+ job that never beats:
                   not killed, exit 0
  ctrl_c           SIGINT to topolaunch: exit 130 within 5 s, nothing left running
  restart          rank 1 raises in attempt 0 only, restarts = 1: exit 0, attempt 1 resumed
  json_stdout      `run --json` without -q: stdout is the JSON report alone
  job_dir_kept     a second run into the same job_dir is refused; --resume keeps the earlier
                   run under earlier/1
  node_name        `topolaunch map` names this machine as `run` does
  mpi_singleton    an mpi4py program under topolaunch run: refused before its MPI_Init
                   completes, exit 2, one clear line; never computes
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

TOPOLAUNCH, ROOT, CASE = sys.argv[1:4]
HERE = os.path.join(ROOT, "tests", "integration", "foreign")
SCRIPT = os.path.join(HERE, "ddp_train.py")
TMP = tempfile.mkdtemp(prefix="topolaunch-foreign-")
MARKER = "TOPOLAUNCH_FOREIGN_TEST"
marker_value = uuid.uuid4().hex


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def python_with(module):
    """An interpreter that can import `module` (Debian's python3, not a pyenv shim's)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if subprocess.run([candidate, "-c", f"import {module}"], capture_output=True).returncode == 0:
            return candidate
    fail(f"no python3 here can import {module} (apt-get install python3-torch python3-mpi4py)")


def write_config(extra_job="", ranks=2):
    path = os.path.join(TMP, f"job-{uuid.uuid4().hex[:6]}.toml")
    with open(path, "w") as f:
        f.write(f'[job]\nname = "foreign"\nranks_per_node = {ranks}\nstop_grace = "3s"\n'
                f'{extra_job}\n[mapping]\noversubscribe = true\n[rdma]\npreflight = "off"\n')
    return path


def job_processes():
    needle = f"{MARKER}={marker_value}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def start(config, *script_args, job_dir=None, run_args=(), program=None):
    job_dir = job_dir or os.path.join(TMP, "job")
    env = dict(os.environ, **{MARKER: marker_value})
    cmd = [TOPOLAUNCH, "run", config, "--job-dir", job_dir, *run_args, "--",
           *(program or [python_with("torch"), SCRIPT]), *script_args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=180):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        fail(f"topolaunch still running after {timeout}s\n{err[-3000:]}")
    return proc.returncode, out, err


def report(job_dir=None):
    with open(os.path.join(job_dir or os.path.join(TMP, "job"), "report.json")) as f:
        return json.load(f)


def marks_dir():
    path = os.path.join(TMP, "marks")
    os.makedirs(path, exist_ok=True)
    return path


def wait_for_mark(suffix, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for name in os.listdir(marks_dir()):
            if name.endswith(suffix):
                with open(os.path.join(marks_dir(), name)) as f:
                    text = f.read()
                if text:
                    return float(text)
        time.sleep(0.05)
    fail(f"no {suffix} mark within {timeout}s")


def assert_nothing_left(agent_pid):
    left = [p for p in job_processes() if p != agent_pid]
    check(not left, f"processes of the job left behind: {left}")


def case_same_params():
    ours = os.path.join(TMP, "params-topolaunch")
    theirs = os.path.join(TMP, "params-torchrun")
    rc, out, err = finish(start(write_config(), "--params", ours))
    check(rc == 0, f"topolaunch exit {rc}\n{err[-3000:]}")
    torch_python = python_with("torch")
    peer = subprocess.run([torch_python, os.path.join(HERE, "torchrun.py"), "--standalone",
                           "--nproc_per_node=2", SCRIPT, "--params", theirs],
                          capture_output=True, text=True, timeout=300)
    check(peer.returncode == 0, f"torchrun exit {peer.returncode}\n{peer.stderr[-3000:]}")
    a, b = open(ours).read().split(), open(theirs).read().split()
    check(len(a) == 577 and a == b, f"final parameters differ: {len(a)} vs {len(b)} values, first "
          f"difference at {next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)}")
    check("[rank 0] step 200 loss" in out, out[-2000:])
    print(f"same {len(a)} parameters after 200 steps under topolaunch run and torchrun")


def case_failure():
    proc = start(write_config(), "--fail-rank", "1", "--fail-step", "20", "--marks", marks_dir())
    rc, out, err = finish(proc)
    exited = time.time()
    failing = wait_for_mark(".failing", timeout=1)
    check(rc == 1, f"exit {rc}\n{err[-3000:]}")
    teardown = exited - failing
    check(teardown < 5, f"every process gone {teardown:.1f}s after rank 1 raised")
    assert_nothing_left(proc.pid)
    rep = report()
    cause = rep["root_cause"]
    check(cause["rank"] == 1, f"root cause {cause}")
    check(cause["what"] == "exited 1: RuntimeError: rank 1 failed on purpose at step 20",
          cause["what"])
    check(cause["error"] == "RuntimeError: rank 1 failed on purpose at step 20", cause)
    check("ddp_train.py" in cause["traceback"] and "raise RuntimeError" in cause["traceback"],
          cause["traceback"])
    rank1 = [r for r in rep["attempts"][0]["ranks"] if r["rank"] == 1][0]
    check(rank1["traceback"] == cause["traceback"], rank1)
    check("root cause: rank 1" in err and "raise RuntimeError(" in err,
          f"summary without the traceback:\n{err[-3000:]}")
    error_file = os.path.join(TMP, "job", "attempt-0", "error", "rank-1.json")
    check(os.path.exists(error_file), "TORCHELASTIC_ERROR_FILE of rank 1 not written")
    print(f"teardown {teardown:.2f}s; root cause: {cause['what']}")


def hang_case(extra_job, *script_args, timeout_s):
    proc = start(write_config(extra_job), "--stop-rank", "1", "--stop-step", "30",
                 "--steps", "100000", "--marks", marks_dir(), *script_args)
    stopping = wait_for_mark(".stopping")
    rc, out, err = finish(proc)
    detected = time.time() - stopping
    check(rc == 1, f"exit {rc}\n{err[-3000:]}")
    cause = report()["root_cause"]
    check(cause["rank"] == 1 and cause["what"].startswith("hung: stopped"), cause)
    check("rank 0 waited for it" in cause["what"], cause)
    check(detected < timeout_s + 4, f"hang stopped {detected:.1f}s after rank 1 stopped")
    assert_nothing_left(proc.pid)
    hang_lines = [l for l in err.splitlines() if l.startswith("topolaunch: hang watch:")]
    check(len(hang_lines) == 1, f"the job's first lines state the hang watch:\n{err[:2000]}")
    print(f"{detected:.2f}s after rank 1 stopped: {cause['what']}")
    print(hang_lines[0])
    return hang_lines[0]


def case_hang_beats():
    line = hang_case('heartbeat_timeout = "3s"', "--beat", timeout_s=3)
    check("armed at each rank's first beat" in line, line)


def case_hang_no_beats():
    line = hang_case('progress_timeout = "3s"', timeout_s=3)
    check("job.progress_timeout 3s: no CPU time, output or heartbeat" in line, line)


def case_healthy():
    # 3 s or more of healthy training that never beats: neither watch may fire.
    config = write_config('heartbeat_timeout = "1s"\nprogress_timeout = "2s"')
    t0 = time.time()
    rc, out, err = finish(start(config, "--steps", "150", "--step-sleep", "0.02"))
    wall = time.time() - t0
    check(rc == 0, f"a healthy job was stopped: exit {rc}\n{err[-3000:]}")
    check(report()["status"] == "succeeded", report()["status"])
    check("[rank 0] rank 0 done after 150 steps" in out, out[-2000:])
    print(f"healthy foreign job ran {wall:.1f}s with heartbeat_timeout 1s: not killed")


def case_ctrl_c():
    proc = start(write_config(), "--steps", "100000", "--step-sleep", "0.01",
                 "--marks", marks_dir())
    wait_for_mark(".first-step")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    rc, out, err = finish(proc, timeout=30)
    took = time.time() - t0
    check(rc == 130, f"exit {rc}\n{err[-3000:]}")
    check(took < 5, f"Ctrl-C took {took:.1f}s")
    check(report()["status"] == "stopped", report()["status"])
    assert_nothing_left(proc.pid)
    print(f"Ctrl-C: exit {rc} after {took:.2f}s")


def case_restart():
    config = write_config("restarts = 1")
    rc, out, err = finish(start(config, "--fail-rank", "1", "--fail-step", "10",
                                "--fail-attempt", "0"))
    check(rc == 0, f"exit {rc}\n{err[-3000:]}")
    rep = report()
    check(rep["restarts_used"] == 1 and rep["attempts"][0]["outcome"] == "failed", rep)
    check(rep["root_cause"]["rank"] == 1 and rep["root_cause"]["attempt"] == 0, rep["root_cause"])
    log = open(os.path.join(TMP, "job", "attempt-1", "rank-1.log")).read()
    check("rank 1 of 2 (local 1) attempt 1" in log and "done after 200 steps" in log, log)


def case_json_stdout():
    rc, out, err = finish(start(write_config(), "--steps", "40", run_args=["--json"]))
    check(rc == 0, f"exit {rc}\n{err[-3000:]}")
    try:
        parsed = json.loads(out)
    except json.JSONDecodeError as e:
        fail(f"stdout is not the JSON report alone ({e}):\n{out[:2000]}")
    check(parsed["status"] == "succeeded" and len(parsed["attempts"][0]["ranks"]) == 2, parsed)
    check("[rank 0] step 40 loss" in err, f"the ranks' lines belong on stderr:\n{err[-2000:]}")


def case_job_dir_kept():
    job_dir = os.path.join(TMP, "kept")
    program = ["/bin/sh", "-c", "echo rank $RANK"]
    rc, out, err = finish(start(write_config(), job_dir=job_dir, program=program))
    check(rc == 0, f"first run: exit {rc}\n{err}")
    first = report(job_dir)
    rc, out, err = finish(start(write_config(), job_dir=job_dir, program=program))
    lines = err.strip().splitlines()
    check(rc == 2 and len(lines) == 1, f"second run: exit {rc}, expected one line:\n{err}")
    check(lines[0].startswith("topolaunch: job.job_dir:") and first["run_id"] in lines[0] and
          "--resume" in lines[0], lines[0])
    check(report(job_dir)["run_id"] == first["run_id"], "the earlier report was overwritten")
    rc, out, err = finish(start(write_config(), job_dir=job_dir, program=program,
                                run_args=["--resume"]))
    check(rc == 0, f"--resume: exit {rc}\n{err}")
    check(report(os.path.join(job_dir, "earlier", "1"))["run_id"] == first["run_id"],
          "the earlier run is not under earlier/1")
    check(report(job_dir)["run_id"] != first["run_id"], "the resumed run wrote no report")
    print("refused:", lines[0])


def case_node_name():
    config = write_config()
    rc, out, err = finish(start(config, job_dir=os.path.join(TMP, "named"),
                                program=["/bin/true"], run_args=["-q"]))
    check(rc == 0, f"run: exit {rc}\n{err}")
    run_name = report(os.path.join(TMP, "named"))["attempts"][0]["ranks"][0]["node_name"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    mapped = subprocess.run([TOPOLAUNCH, "map", config, "--json"], capture_output=True,
                            text=True, env=env, timeout=60)
    check(mapped.returncode == 0, mapped.stderr)
    names = {n["name"] for n in json.loads(mapped.stdout)["map"]["nodes"]}
    check(names == {run_name}, f"map names {names}, run names {run_name!r}")
    print(f"map and run both name this machine {run_name!r}")


def case_mpi_singleton():
    python = python_with("mpi4py")
    program = [python, os.path.join(HERE, "mpi_allreduce.py")]
    proc = start(write_config(), program=program)
    rc, out, err = finish(proc)
    check(rc == 2, f"exit {rc}\n{err[-3000:]}")
    check("allreduce" not in out, f"a rank computed as a singleton:\n{out}")
    rep = report()
    cause = rep["root_cause"]
    check(cause["phase"] == "mpi-without-launcher" and rep["restarts_used"] == 0, rep)
    check("topolaunch run is not an MPI launcher" in cause["what"] and
          "srun --mpi=pmix --topolaunch=auto" in cause["what"], cause["what"])
    said = [l for l in err.splitlines() if "root cause:" in l]
    check(len(said) == 1 and "not an MPI launcher" in said[0], f"one clear line:\n{err[-3000:]}")
    assert_nothing_left(proc.pid)
    print(said[0].strip())


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}
if CASE not in CASES:
    fail(f"unknown case {CASE}; known: {', '.join(CASES)}")
CASES[CASE]()
print("PASS", CASE)
