#!/usr/bin/env python3
"""Checkpoint generations under `topolaunch run`, on the CPU example job (configs/jobs/
tiny-gpt-cpu.toml: 2 ranks, the built-in worker), shortened to 120 steps with a checkpoint every
20 (train.keep_checkpoints left at its default, 2).

corrupt_newest: the job is stopped with SIGUSR1 part way (every rank checkpoints at the same step,
  exit 75, topolaunch exits 3); one byte of that newest checkpoint is flipped. The next run skips
  it, says which and why, resumes from the generation before, and every loss it logs is
  bit-identical to an uninterrupted run's; at the end the two newest generations are left and no
  temporary file.
no_good_checkpoint: every generation is damaged (one truncated, one a FIFO): the resume refuses
  within seconds (no hang on the FIFO), exit 2, and report.json's root cause is the worker's line
  naming each file and why, not just "exited 2".

usage: checkpoint_generations.py CASE --topolaunch T --worker W --source-root R
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from example_job import character_level  # noqa: E402  (tests/example_job.py)

STEPS, EVERY = 120, 20


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def job_config(args, tmp, name, metrics, restarts=1):
    """The example job with its [train] shortened and its files in tmp."""
    with open(os.path.join(args.source_root, "configs", "jobs", "tiny-gpt-cpu.toml")) as f:
        text = f.read()
    replaced = {
        r"(?m)^restarts = \d+": "restarts = %d" % restarts,
        r"(?m)^steps = \d+": "steps = %d" % STEPS,
        r"(?m)^checkpoint_every = \d+": "checkpoint_every = %d" % EVERY,
        r"(?m)^log_every = \d+": "log_every = 1",
    }
    for pattern, value in replaced.items():
        text, n = re.subn(pattern, value, text)
        check(n == 1, "the example job has no line matching %s" % pattern)
    # Character-level Jane Austen instead of the prepared BPE tokens: what is tested here is the
    # checkpoints, and the novels need no preparing.
    try:
        text = character_level(text)
    except ValueError as e:
        check(False, str(e))
    # [job] is the first table: its checkpoint_dir goes right under the header.
    text = text.replace("[job]\n", '[job]\ncheckpoint_dir = "%s"\n' % os.path.join(tmp, "ckpt"), 1)
    text += 'metrics_file = "%s"\n' % metrics
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def worker_env(args):
    """[worker].command is left out: topolaunch runs topolaunch-worker from PATH, the build's."""
    return dict(os.environ, PATH=os.path.dirname(os.path.abspath(args.worker)) + os.pathsep +
                os.environ.get("PATH", ""))


def run(args, config, job_dir, timeout=300):
    start = time.monotonic()
    proc = subprocess.run([args.topolaunch, "run", config, "--job-dir", job_dir],
                          capture_output=True, text=True, timeout=timeout, env=worker_env(args))
    return proc, time.monotonic() - start


def losses(path):
    """step -> the loss text as written (%.17g: equal text means equal doubles)."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line, parse_float=str)
                out[record["step"]] = record["loss"]
    return out


def generations(tmp):
    directory = os.path.join(tmp, "ckpt")
    # (model.json and tokenizer.model beside them describe the model, and are not generations)
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(n for n in names if n not in ("model.json", "tokenizer.model"))


def generation(tmp, step):
    return os.path.join(tmp, "ckpt", "checkpoint-%012d.bin" % step)


def logs_of(job_dir):
    """Everything the ranks wrote, every attempt (the per-rank log files of the job dir)."""
    text = ""
    for root, _, files in os.walk(job_dir):
        for name in sorted(files):
            if name.endswith(".log"):
                with open(os.path.join(root, name), errors="replace") as f:
                    text += f.read()
    return text


def reference(args, tmp):
    metrics = os.path.join(tmp, "reference.jsonl")
    config = job_config(args, os.path.join(tmp, "ref"), "reference", metrics)
    proc, took = run(args, config, os.path.join(tmp, "ref", "job"))
    check(proc.returncode == 0, "the uninterrupted run failed (%d):\n%s" % (proc.returncode,
                                                                            proc.stderr[-3000:]))
    ref = losses(metrics)
    check(sorted(ref) == list(range(1, STEPS + 1)), "the reference logged %d steps" % len(ref))
    print("ok  uninterrupted: %d steps in %.1f s" % (STEPS, took))
    return ref


def stop_part_way(args, tmp, config, metrics, at_least):
    """Starts the job, sends topolaunch SIGUSR1 once `at_least` steps are logged; the step all
    ranks checkpointed at."""
    job_dir = os.path.join(tmp, "job1")
    proc = subprocess.Popen([args.topolaunch, "run", config, "--job-dir", job_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=worker_env(args))
    deadline = time.monotonic() + 120
    while len(losses(metrics)) < at_least and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:
        fail("the job ended before the stop:\n%s" % proc.communicate()[1][-3000:])
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    check(proc.returncode == 3, "topolaunch exited %d after SIGUSR1 (want 3, requeue):\n%s"
          % (proc.returncode, err[-3000:]))
    found = re.search(r"stopped by SIGUSR1 after step (\d+)", logs_of(job_dir))
    check(found, "no rank said where it stopped:\n" + logs_of(job_dir)[-3000:])
    step = int(found.group(1))
    check(step < STEPS, "stopped at %d, the end" % step)
    return step


def flip_byte(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))


def corrupt_newest(args, tmp):
    ref = reference(args, tmp)
    metrics1 = os.path.join(tmp, "part1.jsonl")
    config1 = job_config(args, tmp, "part1", metrics1)
    stopped = stop_part_way(args, tmp, config1, metrics1, at_least=3 * EVERY + 5)
    older = (stopped // EVERY) * EVERY if stopped % EVERY else stopped - EVERY
    check(generations(tmp) == [os.path.basename(generation(tmp, s)) for s in (older, stopped)],
          "after the stop at %d: %s (want %d and %d)" % (stopped, generations(tmp), older, stopped))
    newest = generation(tmp, stopped)
    flip_byte(newest, os.path.getsize(newest) // 2)
    print("ok  stopped at step %d by SIGUSR1; flipped one byte of %s" % (stopped,
                                                                        os.path.basename(newest)))

    metrics2 = os.path.join(tmp, "part2.jsonl")
    config2 = job_config(args, tmp, "part2", metrics2)
    job_dir = os.path.join(tmp, "job2")
    proc, took = run(args, config2, job_dir)
    check(proc.returncode == 0, "the resumed run exited %d:\n%s" % (proc.returncode,
                                                                    proc.stderr[-3000:]))
    log = logs_of(job_dir)
    said = "checkpoint: skipped %s: fails its checksum (corrupt)" % newest
    check(said in log, "the resume did not say what it skipped (%r):\n%s" % (said, log[-3000:]))
    check("resumed from %s at step %d" % (generation(tmp, older), older) in log,
          "not resumed from the older generation:\n" + log[-3000:])
    part1, part2 = losses(metrics1), losses(metrics2)
    check(sorted(part2) == list(range(older + 1, STEPS + 1)),
          "the resumed run logged steps %s..%s" % (min(part2, default=None),
                                                  max(part2, default=None)))
    for step in list(range(1, stopped + 1)):
        check(part1[step] == ref[step], "step %d before the stop: %s, uninterrupted %s"
              % (step, part1[step], ref[step]))
    for step in part2:
        check(part2[step] == ref[step], "step %d after the resume: %s, uninterrupted %s"
              % (step, part2[step], ref[step]))
    # What is left: the two newest generations of the resumed line, no temporary file.
    want = [os.path.basename(generation(tmp, s)) for s in (STEPS - EVERY, STEPS)]
    check(generations(tmp) == want, "left in the checkpoint dir: %s (want %s)"
          % (generations(tmp), want))
    with open(os.path.join(job_dir, "report.json")) as f:
        report = json.load(f)
    check(report["status"] == "succeeded" and report["root_cause"] is None, report)
    print("ok  skipped %s, resumed at %d, %d losses bit-identical to the uninterrupted run "
          "(%.1f s); left %s" % (os.path.basename(newest), older, len(part2), took,
                                 " ".join(generations(tmp))))


def no_good_checkpoint(args, tmp):
    metrics1 = os.path.join(tmp, "part1.jsonl")
    config1 = job_config(args, tmp, "part1", metrics1)
    stopped = stop_part_way(args, tmp, config1, metrics1, at_least=EVERY + 5)
    older = (stopped // EVERY) * EVERY if stopped % EVERY else stopped - EVERY
    with open(generation(tmp, stopped), "r+b") as f:
        f.truncate(os.path.getsize(generation(tmp, stopped)) - 1000)
    os.remove(generation(tmp, older))
    os.mkfifo(generation(tmp, older))
    config2 = job_config(args, tmp, "part2", os.path.join(tmp, "part2.jsonl"), restarts=0)
    job_dir = os.path.join(tmp, "job2")
    proc, took = run(args, config2, job_dir, timeout=120)
    check(proc.returncode == 1 or proc.returncode == 2,
          "exit %d (want the job to fail):\n%s" % (proc.returncode, proc.stderr[-3000:]))
    check(took < 30, "the refusal took %.1f s (a FIFO read would hang until the heartbeat)" % took)
    with open(os.path.join(job_dir, "report.json")) as f:
        report = json.load(f)
    cause = report["root_cause"]
    check(report["status"] == "failed" and cause, report)
    what = cause["what"]
    for part in ("exited 2", "no good checkpoint in " + os.path.join(tmp, "ckpt"),
                 os.path.basename(generation(tmp, stopped)) + " is truncated",
                 os.path.basename(generation(tmp, older)) + " is not a regular file (a FIFO)"):
        check(part in what, "the root cause does not say %r: %r" % (part, what))
    check(os.path.exists(generation(tmp, stopped)), "the refused checkpoint was removed")
    print("ok  refused in %.1f s, exit %d; root cause: %s" % (took, proc.returncode, what))


CASES = {"corrupt_newest": corrupt_newest, "no_good_checkpoint": no_good_checkpoint}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--topolaunch", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--source-root", required=True)
    args = p.parse_args()
    if not os.path.exists("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"):
        fail("r-cran-janeaustenr is not installed (the example job's data)")
    with tempfile.TemporaryDirectory(prefix="topolaunch-fault-") as tmp:
        os.makedirs(os.path.join(tmp, "ref"))
        CASES[args.case](args, tmp)
    print("PASS", args.case)


if __name__ == "__main__":
    main()
