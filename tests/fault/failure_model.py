#!/usr/bin/env python3
"""The failure model (docs/architecture.md, ../shared/ARCHITECTURE.md) under `topolaunch run`, on
the CPU example job (configs/jobs/tiny-gpt-cpu.toml: 2 ranks of the built-in worker, standalone)
shortened to 120 steps with a checkpoint every 20. Each case asserts what is left when it is over
(the job's processes, the checkpoint directory, report.json) and measures how long the teardown
took; it prints one `RESULT {json}` line (tests/fault/repeat_faults.py runs the cases many
times and tabulates those).

worker_killed      rank 1 SIGKILLed mid-job: every worker gone, the job restarted once, resumed
                   from a checkpoint, every loss bit-identical to an uninterrupted run's.
worker_stopped     rank 1 SIGSTOPped: the heartbeat watch names rank 1 (stopped), not rank 0,
                   which waits for it in the all-reduce; teardown, restart, resume, bit-identical.
worker_failing     rank 1 exits 1 mid-job (gdb makes it call _exit(1)): the root cause names rank
                   1 and its status, not rank 0's "a peer died"; nothing left, exit 1.
topolaunch_killed  `topolaunch run` SIGKILLed: its workers die with it (no report: the agent is
                   gone); `run --resume` of the same job dir resumes, bit-identical.
enospc             the checkpoint directory a tmpfs with room for two generations: the third
                   fails with one line naming the file and "No space left on device", its
                   temporary file removed, the two older generations good (a resume from them is
                   bit-identical). Needs root (mount).

usage: failure_model.py CASE --topolaunch T --worker W --source-root R [--reference FILE]
--reference: the uninterrupted run's losses, read if the file exists, else run and written
there (repeat_faults.py shares one among its runs).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from faultlib import (CaseFailed, check, check_bit_identical, checkpoint_files, describe, emit,
                      example_config, generation_name, job_env, job_processes, kill_all,
                      logs_of, loss_lines, losses, new_marker, read_report, resumed_at,
                      temporaries, wait_for, wait_gone, worker_pids, state)

STEPS, EVERY = 120, 20
# What the failure model promises, per case (the table's second column).
PROMISES = {
    "worker_killed": "a dead worker takes the job down within seconds, nothing left; the restart "
                     "resumes from the last complete checkpoint",
    "worker_stopped": "a worker that stops making progress (heartbeat) is named, not the ranks "
                      "waiting for it; job down within seconds, restart resumes",
    "worker_failing": "a worker exiting non-zero takes the job down within seconds; the root "
                      "cause names that rank",
    "topolaunch_killed": "no orphans: the workers die with topolaunch; the next run resumes from "
                         "the last complete checkpoint",
    "enospc": "checkpoints are written to a temporary name and renamed: a failed write is one "
              "clear line, no torn file, the older checkpoints load",
}


class Case:
    def __init__(self, args, tmp, name):
        self.args, self.tmp, self.name = args, tmp, name
        self.marker = new_marker()
        self.result = {"case": name, "promise": PROMISES[name], "teardown_s": None,
                       "restarts": None, "left_processes": [], "left_files": []}

    def config(self, name, restarts=1, job=None, checkpoint_dir=None):
        return example_config(self.args.source_root, self.tmp, name, STEPS, EVERY, restarts,
                              job, checkpoint_dir)

    def metrics(self, name):
        return os.path.join(self.tmp, name + ".jsonl")

    def start(self, config, job_dir, *extra):
        return subprocess.Popen([self.args.topolaunch, "run", config, "--job-dir", job_dir,
                                 *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=job_env(self.args.worker, self.marker))

    def run(self, config, job_dir, *extra, timeout=300):
        proc = self.start(config, job_dir, *extra)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err

    def wait_steps(self, proc, metrics, steps):
        """Until rank 0 logged `steps` losses; the job must still be running then."""
        wait_for(lambda: len(loss_lines(metrics)) >= steps or proc.poll() is not None, 240,
                 what="%d steps" % steps)
        if proc.poll() is not None:
            raise CaseFailed("the job ended before the fault (exit %d):\n%s"
                             % (proc.returncode, proc.communicate()[1][-3000:]))

    def workers(self, attempt, count=2):
        return wait_for(lambda: (lambda p: p if len(p) == count else None)(
            worker_pids(self.marker, attempt)), 60, what="the workers of attempt %d" % attempt)

    def nothing_left(self):
        """The job's processes still alive (none may be) and the checkpoint dir's temporaries."""
        left = job_processes(self.marker)
        self.result["left_processes"] = [describe([p]) for p in left]
        check(not left, "processes of the job left behind: %s" % describe(left))

    def checkpoints_left(self, directory, want_steps):
        files = checkpoint_files(directory)
        want = [generation_name(s) for s in want_steps]
        self.result["left_files"] = [f for f in files if f not in want]
        check(files == want, "left in the checkpoint dir: %s (want %s)" % (files, want))


def reference(args, tmp):
    """The uninterrupted run's losses (step -> text); cached in --reference when given."""
    if args.reference and os.path.exists(args.reference):
        with open(args.reference) as f:
            return {int(k): v for k, v in json.load(f).items()}
    directory = os.path.join(tmp, "reference")
    os.makedirs(directory)
    config = example_config(args.source_root, directory, "reference", STEPS, EVERY)
    start = time.monotonic()
    proc = subprocess.run([args.topolaunch, "run", config, "--job-dir",
                           os.path.join(directory, "job")], capture_output=True, text=True,
                          timeout=600, env=job_env(args.worker, new_marker()))
    check(proc.returncode == 0, "the uninterrupted run failed (%d):\n%s"
          % (proc.returncode, proc.stderr[-3000:]))
    ref = losses(os.path.join(directory, "reference.jsonl"))
    check(sorted(ref) == list(range(1, STEPS + 1)), "the reference logged %d steps" % len(ref))
    print("ok  uninterrupted: %d steps in %.1f s" % (STEPS, time.monotonic() - start))
    if args.reference:
        with open(args.reference, "w") as f:
            json.dump(ref, f)
    return ref


def checkpoint_size(args, tmp):
    """Bytes of one generation of this model (the reference run's)."""
    directory = os.path.join(tmp, "reference", "ckpt")
    if args.reference:
        cached = args.reference + ".checkpoint-size"
        if os.path.exists(cached):
            with open(cached) as f:
                return int(f.read())
    files = [f for f in checkpoint_files(directory) if f.startswith("checkpoint-")]
    if not files:  # the reference came from the cache: one short run writes a checkpoint
        os.makedirs(os.path.join(tmp, "size"), exist_ok=True)
        config = example_config(args.source_root, os.path.join(tmp, "size"), "size", EVERY,
                                EVERY)
        subprocess.run([args.topolaunch, "run", config, "--job-dir",
                        os.path.join(tmp, "size", "job")], capture_output=True, timeout=300,
                       env=job_env(args.worker, new_marker()))
        directory = os.path.join(tmp, "size", "ckpt")
        files = [f for f in checkpoint_files(directory) if f.startswith("checkpoint-")]
    check(files, "no checkpoint written to measure")
    size = os.path.getsize(os.path.join(directory, files[0]))
    if args.reference:
        with open(args.reference + ".checkpoint-size", "w") as f:
            f.write(str(size))
    return size


def check_restarted_run(case, rc, err, job_dir, metrics, ref, root_rank, cause_has):
    """A job that failed once and finished after one restart, bit-identical."""
    check(rc == 0, "exit %d after the restart (want 0):\n%s" % (rc, err[-3000:]))
    report = read_report(job_dir)
    case.result["restarts"] = report["restarts_used"]
    check(report["status"] == "succeeded" and report["restarts_used"] == 1,
          "status %s after %d restarts (want succeeded after 1)"
          % (report["status"], report["restarts_used"]))
    cause = report["root_cause"]
    check(cause and cause["attempt"] == 0 and cause["rank"] == root_rank,
          "root cause %s (want rank %d of attempt 0)" % (cause, root_rank))
    for part in cause_has:
        check(part in cause["what"], "the root cause does not say %r: %r" % (part, cause["what"]))
    check(report["attempts"][0]["outcome"] == "failed", report["attempts"][0])
    path, step = resumed_at(logs_of(job_dir, attempt=1))
    check(path, "attempt 1 did not resume from a checkpoint:\n" + logs_of(job_dir, 1)[-2000:])
    check_bit_identical(loss_lines(metrics), ref, STEPS, "the restarted run")
    return report, cause, step


def worker_killed(case, ref):
    config, job_dir, metrics = case.config("killed"), os.path.join(case.tmp, "job"), \
        case.metrics("killed")
    proc = case.start(config, job_dir)
    case.wait_steps(proc, metrics, 2 * EVERY + 5)
    pids = case.workers(0)
    os.kill(pids[1], signal.SIGKILL)
    teardown = wait_gone(pids.values(), 30)
    case.result["teardown_s"] = round(teardown, 3)
    _, err = proc.communicate(timeout=300)
    report, cause, step = check_restarted_run(case, proc.returncode, err, job_dir, metrics, ref,
                                              1, ["killed by SIGKILL"])
    check(step >= EVERY, "resumed at step %d: from before the last complete checkpoint" % step)
    case.nothing_left()
    case.checkpoints_left(os.path.join(case.tmp, "ckpt"), [STEPS - EVERY, STEPS])
    print("ok  rank 1 SIGKILLed: both workers gone in %.3f s; %s; restarted, resumed at step %d, "
          "%d losses bit-identical" % (teardown, cause["what"], step, len(loss_lines(metrics))))
    return teardown < 10  # "within seconds"


def worker_stopped(case, ref):
    timeout = 5
    config = case.config("stopped", job={"heartbeat_timeout": '"%ds"' % timeout})
    job_dir, metrics = os.path.join(case.tmp, "job"), case.metrics("stopped")
    proc = case.start(config, job_dir)
    case.wait_steps(proc, metrics, 2 * EVERY + 5)
    pids = case.workers(0)
    os.kill(pids[1], signal.SIGSTOP)
    check(wait_for(lambda: state(pids[1]) == "T", 5, what="rank 1 stopped"), "not stopped")
    teardown = wait_gone(pids.values(), timeout + 60)
    case.result["detect_and_teardown_s"] = round(teardown, 3)
    _, err = proc.communicate(timeout=300)
    report, cause, step = check_restarted_run(
        case, proc.returncode, err, job_dir, metrics, ref, 1,
        ["hung", "stopped (state T", "job.heartbeat_timeout %ds" % timeout])
    ranks = {r["rank"]: r for r in report["attempts"][0]["ranks"]}
    check(ranks[0]["cause"] == "waiting for rank 1", "rank 0's cause: %r (want 'waiting for rank "
          "1')" % ranks[0]["cause"])
    # The teardown after the watch fired: the time past the timeout.
    case.result["teardown_s"] = round(max(0.0, teardown - timeout), 3)
    case.nothing_left()
    case.checkpoints_left(os.path.join(case.tmp, "ckpt"), [STEPS - EVERY, STEPS])
    print("ok  rank 1 SIGSTOPped: named after %.2f s (heartbeat_timeout %d s): %s; rank 0: %s; "
          "restarted, resumed at %d, bit-identical" % (teardown, timeout, cause["what"],
                                                       ranks[0]["cause"], step))
    return teardown < timeout + 10


def worker_failing(case, ref):
    gdb = shutil.which("gdb")
    check(gdb, "gdb not found (apt-get install gdb): it makes the worker exit 1")
    config = case.config("failing", restarts=0)
    job_dir, metrics = os.path.join(case.tmp, "job"), case.metrics("failing")
    proc = case.start(config, job_dir)
    case.wait_steps(proc, metrics, EVERY + 5)
    pids = case.workers(0)
    # _exit(1) from inside the process: the status a worker's runtime failure has.
    gdb_run = subprocess.Popen([gdb, "-p", str(pids[1]), "-batch", "-nx", "-ex",
                                "call (void)_exit(1)"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    wait_gone([pids[1]], 120)  # attaching takes gdb a few seconds
    teardown = wait_gone(pids.values(), 30)
    said = gdb_run.communicate(timeout=60)[0]
    check("exited" in said, "gdb did not make rank 1 exit: %s" % said[-1000:])
    case.result["teardown_s"] = round(teardown, 3)
    _, err = proc.communicate(timeout=120)
    check(proc.returncode == 1, "exit %d (want 1: failed, no restarts):\n%s"
          % (proc.returncode, err[-3000:]))
    report = read_report(job_dir)
    case.result["restarts"] = report["restarts_used"]
    cause = report["root_cause"]
    check(report["status"] == "failed" and cause and cause["rank"] == 1,
          "root cause %s (want rank 1)" % cause)
    check(cause["what"].startswith("exited 1"), "root cause %r (want 'exited 1')" % cause["what"])
    check("root cause: rank 1" in err, "the summary does not name rank 1:\n" + err[-2000:])
    ranks = {r["rank"]: r for r in report["attempts"][0]["ranks"]}
    check(ranks[0]["cause"] != "root cause", "rank 0 is named as a root cause too: %s" % ranks[0])
    case.nothing_left()
    # What was written stays: the generations so far, no temporary file.
    check(not temporaries(os.path.join(case.tmp, "ckpt")), "temporary checkpoint files left: %s"
          % temporaries(os.path.join(case.tmp, "ckpt")))
    print("ok  rank 1 exited 1: both workers gone %.3f s after; root cause rank 1 %r; rank 0: %s "
          "(exit %s)" % (teardown, cause["what"], ranks[0]["cause"], ranks[0]["exit_code"]))
    return teardown < 10


def topolaunch_killed(case, ref):
    config, job_dir, metrics = case.config("orphans"), os.path.join(case.tmp, "job"), \
        case.metrics("orphans")
    proc = case.start(config, job_dir)
    case.wait_steps(proc, metrics, 2 * EVERY + 5)
    pids = case.workers(0)
    proc.kill()
    teardown = wait_gone(pids.values(), 30)
    proc.communicate(timeout=30)
    case.result["teardown_s"] = round(teardown, 3)
    left = job_processes(case.marker)
    case.result["left_processes"] = [describe([p]) for p in left]
    check(not left, "processes left after topolaunch was killed: %s" % describe(left))
    check(not os.path.exists(os.path.join(job_dir, "report.json")),
          "a report.json exists although topolaunch was killed")
    ckpt = os.path.join(case.tmp, "ckpt")
    torn = temporaries(ckpt)
    generations = [f for f in checkpoint_files(ckpt) if f not in torn]
    check(generations, "no checkpoint written before the kill")
    # The next run of the same job: --resume, from the newest complete generation.
    rc, _, err = case.run(config, job_dir, "--resume")
    check(rc == 0, "run --resume exited %d:\n%s" % (rc, err[-3000:]))
    path, step = resumed_at(logs_of(job_dir, attempt=0))
    check(path and os.path.basename(path) == generations[-1],
          "run --resume did not resume from %s (resumed from %s)" % (generations[-1], path))
    check_bit_identical(loss_lines(metrics), ref, STEPS, "killed, then resumed")
    check(os.path.isdir(os.path.join(job_dir, "earlier", "1", "attempt-0")),
          "the killed run's attempt-0 was not kept under earlier/1")
    case.result["restarts"] = read_report(job_dir)["restarts_used"]
    case.nothing_left()
    case.checkpoints_left(ckpt, [STEPS - EVERY, STEPS])
    print("ok  topolaunch SIGKILLed: its 2 workers gone in %.3f s, no report, %s%s; run --resume "
          "from step %d, bit-identical" % (teardown, " ".join(generations),
                                          " + torn " + " ".join(torn) if torn else "", step))
    return teardown < 10


def enospc(case, ref):
    check(os.geteuid() == 0, "enospc mounts a tmpfs: run as root")
    size = checkpoint_size(case.args, case.tmp)
    mount = os.path.join(case.tmp, "tmpfs")
    os.makedirs(mount)
    room = (size * 5 // 2 + 4095) // 4096 * 4096  # two generations and half of a third
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=0755" % room, "tmpfs", mount],
                   check=True, timeout=30)
    try:
        config = case.config("enospc", restarts=0, checkpoint_dir=mount)
        job_dir = os.path.join(case.tmp, "job")
        start = time.monotonic()
        rc, _, err = case.run(config, job_dir)
        case.result["teardown_s"] = None
        case.result["wall_s"] = round(time.monotonic() - start, 2)
        check(rc == 1, "exit %d (want 1: a checkpoint could not be written):\n%s"
              % (rc, err[-3000:]))
        report = read_report(job_dir)
        case.result["restarts"] = report["restarts_used"]
        cause = report["root_cause"]
        third = 3 * EVERY
        tmp_name = ".checkpoint-%012d.bin.tmp." % third
        check(cause and cause["rank"] == 0, "root cause %s (want rank 0, the writer)" % cause)
        for part in ("exited 1", "checkpoint: writing ", tmp_name, "No space left on device"):
            check(part in cause["what"], "the root cause does not say %r: %r"
                  % (part, cause["what"]))
        said = [l for l in err.splitlines() if "No space left on device" in l]
        check(said, "stderr has no line saying the disk is full:\n" + err[-2000:])
        files = checkpoint_files(mount)
        case.result["left_files"] = [f for f in files if f.startswith(".")]
        check(files == [generation_name(EVERY), generation_name(2 * EVERY)],
              "left on the full disk: %s (want the two older generations, no temporary)" % files)
        saved = os.path.join(case.tmp, "saved")
        shutil.copytree(mount, saved)
    finally:
        subprocess.run(["umount", mount], timeout=60)
    # The older generations are good: the next run resumes from the newest, bit-identical.
    metrics = case.metrics("after-enospc")
    config = example_config(case.args.source_root, case.tmp, "after-enospc", STEPS, EVERY,
                            checkpoint_dir=saved)
    rc, _, err = case.run(config, os.path.join(case.tmp, "job-after"))
    check(rc == 0, "the run after the full disk exited %d:\n%s" % (rc, err[-3000:]))
    path, step = resumed_at(logs_of(os.path.join(case.tmp, "job-after")))
    check(step == 2 * EVERY, "resumed from %s at %s (want step %d)" % (path, step, 2 * EVERY))
    lines = loss_lines(metrics)
    check(lines and lines[0][0] == 2 * EVERY + 1, "the resume started at step %s"
          % (lines[0][0] if lines else None))
    for s, loss in lines:
        check(ref[s] == loss, "after the full disk: step %d loss %s, uninterrupted %s"
              % (s, loss, ref[s]))
    case.nothing_left()
    print("ok  full disk (tmpfs of %d bytes, checkpoints of %d): %r; left %s; resumed at step %d, "
          "bit-identical" % (room, size, said[0].strip()[:200], " ".join(files), step))
    return True


CASES = {"worker_killed": worker_killed, "worker_stopped": worker_stopped,
         "worker_failing": worker_failing, "topolaunch_killed": topolaunch_killed,
         "enospc": enospc}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--topolaunch", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--source-root", required=True)
    p.add_argument("--reference", default="")
    args = p.parse_args()
    if not os.path.exists("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"):
        print("FAIL: r-cran-janeaustenr is not installed (the example job's data)")
        sys.exit(1)
    with tempfile.TemporaryDirectory(prefix="topolaunch-fault-") as tmp:
        case = Case(args, tmp, args.case)
        try:
            ref = reference(args, tmp)
            within_seconds = CASES[args.case](case, ref)
            check(within_seconds, "the teardown took %s s: not within seconds"
                  % case.result["teardown_s"])
            case.result["passed"] = True
        except CaseFailed as e:
            case.result["passed"] = False
            case.result["why"] = str(e)[:500]
            emit(case.result)
            print("FAIL:", e)
            kill_all(job_processes(case.marker))
            sys.exit(1)
        finally:
            kill_all(job_processes(case.marker))
    emit(case.result)
    print("PASS", args.case)


if __name__ == "__main__":
    main()
