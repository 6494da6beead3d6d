#!/usr/bin/env python3
"""Runs each kill and hang case of the fault suite N times (default 10) and tabulates them: the
case, what the failure model promises, teardown seconds (min/median/max), restarts, what
remained (processes, files) and how many runs passed. Not part of CI (about an hour with the
Slurm cases on 2 cores); the figures of a run are kept in tests/fault/results/.

  tests/fault/repeat_faults.py --build build [-n 10] [--no-slurm] [--cases a,b] [--out DIR]

Writes DIR/repeat-<UTC date>.md (the table) and .jsonl (one line per run, then one per case), and
prints the table. The Slurm cases take /tmp/topolaunch-slurm.lock for each run, so that they never
start a cluster beside another one on this host.
"""
import argparse
import datetime
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOCAL = ["worker_killed", "worker_stopped", "worker_failing", "topolaunch_killed"]
SLURM = ["node_lost", "agent_killed", "store_host_dies"]
LOCK = "/tmp/topolaunch-slurm.lock"
ALSO = {"detect_and_teardown_s": "detected and torn down", "job_end_s": "job ended"}


def run_once(args, case, reference):
    slurm = case in SLURM
    driver = os.path.join(HERE, "slurm_faults.py" if slurm else "failure_model.py")
    argv = [sys.executable, driver, case, "--topolaunch", args.topolaunch, "--worker",
            args.worker, "--source-root", args.source_root]
    if not slurm:
        argv += ["--reference", reference]
    lock = open(LOCK, "a") if slurm else None
    try:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        took = time.monotonic() - start
    finally:
        if lock:
            lock.close()
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    if result is None:
        result = {"case": case, "passed": False, "why": (proc.stdout + proc.stderr)[-500:]}
    result["passed"] = bool(result.get("passed")) and proc.returncode == 0
    result["run_s"] = round(took, 1)
    if not result["passed"]:
        result.setdefault("why", "")
        result["output_tail"] = (proc.stdout + proc.stderr)[-2000:]
    return result


def summary(case, runs):
    teardowns = [r["teardown_s"] for r in runs if r.get("teardown_s") is not None]
    restarts = sorted({r.get("restarts") for r in runs if r.get("restarts") is not None})
    procs = sorted({p for r in runs for p in r.get("left_processes", [])})
    files = sorted({f for r in runs for f in r.get("left_files", [])})
    return {
        "case": case,
        "promise": next((r["promise"] for r in runs if r.get("promise")), ""),
        "runs": len(runs),
        "passed": sum(r["passed"] for r in runs),
        "teardown_s": {"min": min(teardowns), "median": statistics.median(teardowns),
                       "max": max(teardowns)} if teardowns else None,
        "restarts": restarts,
        "left_processes": procs,
        "left_files": files,
        # What some cases measure besides: the hang's detection and teardown together, the job's
        # end after a node was lost.
        "also": {key: statistics.median(r[key] for r in runs if r.get(key) is not None)
                 for key in ALSO if any(r.get(key) is not None for r in runs)},
    }


def table(summaries, when, n):
    lines = ["Fault cases, %d runs each (%s, tests/fault/repeat_faults.py)." % (n, when), "",
             "| case | the failure model promises | teardown s (min / median / max) | restarts |"
             " remained (processes; files) | also measured (median) | passed |",
             "|---|---|---|---|---|---|---|"]
    for s in summaries:
        t = s["teardown_s"]
        teardown = "%.2f / %.2f / %.2f" % (t["min"], t["median"], t["max"]) if t else "-"
        left = "%s; %s" % (", ".join(s["left_processes"]) or "none",
                           ", ".join(s["left_files"]) or "none")
        also = ", ".join("%s %.2f s" % (ALSO[k], v) for k, v in s["also"].items()) or "-"
        lines.append("| %s | %s | %s | %s | %s | %s | %d/%d |" % (
            s["case"], s["promise"], teardown, ", ".join(str(r) for r in s["restarts"]) or "-",
            left, also, s["passed"], s["runs"]))
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build", help="the meson build directory")
    p.add_argument("-n", type=int, default=10, help="runs per case")
    p.add_argument("--cases", default="", help="comma-separated (default: every kill and hang "
                   "case: %s)" % ", ".join(LOCAL + SLURM))
    p.add_argument("--no-slurm", action="store_true", help="leave out the Slurm cases")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    args.source_root = os.path.dirname(os.path.dirname(HERE))
    args.topolaunch = os.path.abspath(os.path.join(args.build, "launcher", "topolaunch"))
    args.worker = os.path.abspath(os.path.join(args.build, "kernels", "topolaunch-worker"))
    for program in (args.topolaunch, args.worker):
        if not os.access(program, os.X_OK):
            sys.exit("%s is not built (ninja -C %s)" % (program, args.build))
    cases = args.cases.split(",") if args.cases else LOCAL + ([] if args.no_slurm else SLURM)
    unknown = [c for c in cases if c not in LOCAL + SLURM]
    if unknown:
        sys.exit("unknown cases: %s (known: %s)" % (", ".join(unknown), ", ".join(LOCAL + SLURM)))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "repeat-" + when[:10])
    summaries = []
    with tempfile.TemporaryDirectory(prefix="topolaunch-repeat-") as tmp, \
            open(stem + ".jsonl", "w") as jsonl:
        reference = os.path.join(tmp, "reference.json")
        for case in cases:
            runs = []
            for i in range(args.n):
                r = run_once(args, case, reference)
                r["run"] = i + 1
                runs.append(r)
                jsonl.write(json.dumps(r, sort_keys=True) + "\n")
                jsonl.flush()
                print("%-18s %2d/%d %s teardown %s s (%.0f s)%s" % (
                    case, i + 1, args.n, "pass" if r["passed"] else "FAIL", r.get("teardown_s"),
                    r["run_s"], "" if r["passed"] else ": " + r.get("why", "")[:300]),
                    flush=True)
            s = summary(case, runs)
            summaries.append(s)
            jsonl.write(json.dumps(dict(s, summary=True), sort_keys=True) + "\n")
    text = table(summaries, when, args.n)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    sys.exit(0 if all(s["passed"] == s["runs"] for s in summaries) else 1)


if __name__ == "__main__":
    main()
