#!/usr/bin/env python3
"""The failure model on the private Slurm cluster (tests/slurm/cluster-start, one per case), with
the CPU example job (configs/jobs/tiny-gpt-cpu.toml, one rank per node, [wireup] backend "tcp")
started by `topolaunch run` inside sbatch. Each case asserts what is left (the job's processes
on every node, report.json) and measures how long it took; it prints one `RESULT {json}` line
(tests/fault/repeat_faults.py).

node_lost        node n2 goes down mid-job: its slurmd, its slurmstepd and every process of the
                 job there are frozen, then killed, at once (what a power cut leaves). The job
                 ends, report.json's root cause names n2, nothing of the job is left on n1, n3.
agent_killed     the `topolaunch agent` of n2 is SIGKILLed: its worker dies with it, the other
                 nodes' workers stop, the root cause names n2 (its agent left no report).
store_host_dies  `topolaunch run`, which hosts the agents' TCP store, is SIGKILLed while the
                 agents wait in their exchange (n3's slurmd is frozen so that its agent never
                 comes): every agent that started exits with one line naming the store, well
                 within wireup.timeout, and nothing is left.
sbatch_requeue   configs/jobs/tiny-gpt-cpu-requeue.sbatch, as shipped, on one node (2 ranks)
                 with --time=1 --signal=B:USR1@20: Slurm's notice reaches the ranks through the
                 script and topolaunch, they checkpoint, the job exits 75, Slurm requeues it
                 (this cluster's slurm.conf has RequeueExit=75), the requeued run resumes, and
                 every loss is bit-identical to the same job run without a time limit. Slurm
                 looks at time limits every 30 s, so the notice comes 10-40 s into each run and
                 the job may be requeued more than once.

The cluster's slurm.conf gains RequeueExit=75, AuthInfo cred_expire=10 (a requeued job may
start again cred_expire + 1 s after it ended; Slurm's default is 120 s) and a backfill pass
every 5 s (SchedulerParameters=bf_interval=5; default 30), which starts it then.

usage: slurm_faults.py CASE --topolaunch T --worker W --source-root R
Run it under `flock /tmp/topolaunch-slurm.lock` where others start clusters on this host.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from faultlib import (CaseFailed, Cluster, check, check_bit_identical, program, describe,
                      emit, example_config, job_env, job_processes, kill_all, loss_lines,
                      new_marker, read_report, resumed_at, logs_of, wait_for, wait_gone,
                      worker_pids, alive, is_watchdog, cmdline)

NODES = ["n1", "n2", "n3"]
PROMISES = {
    "node_lost": "a node lost takes the job down: the root cause names it, no process of the job "
                 "is left on the other nodes",
    "agent_killed": "an agent killed takes the job down within seconds: its workers die with "
                    "it, the root cause names its node",
    "store_host_dies": "the TCP store's host dying mid-fence: every agent exits with a clear line "
                       "within wireup.timeout",
    "sbatch_requeue": "preemption is notify, checkpoint at the step boundary, exit, requeue: the "
                      "requeued job resumes bit-identically",
}
# A job that exits 75 is requeued; the backfill scheduler looks every 5 s (default 30), so a
# requeued job starts soon after it may (AuthInfo cred_expire, below).
EXTRA_CONF = "# fault suite\nRequeueExit=75\nSchedulerParameters=bf_interval=5\n"


class SlurmCase:
    def __init__(self, args, tmp, name):
        self.args, self.tmp, self.name = args, tmp, name
        self.marker = new_marker()
        self.result = {"case": name, "promise": PROMISES[name], "teardown_s": None,
                       "restarts": None, "left_processes": [], "left_files": []}
        os.chmod(tmp, 0o755)
        self.cluster = Cluster(args.source_root, os.path.join(tmp, "cluster"), nodes=len(NODES),
                               extra_conf=EXTRA_CONF)
        conf = os.path.join(self.cluster.configs, "slurm.conf.in")
        with open(conf) as f:
            text = f.read()
        text, n = re.subn(r"(?m)^AuthInfo=(.*)$", r"AuthInfo=\1,cred_expire=10", text)
        check(n == 1, "the cluster's slurm.conf.in has no AuthInfo line")
        with open(conf, "w") as f:
            f.write(text)
        self.out = os.path.join(tmp, "out.txt")
        self.job_dir = os.path.join(tmp, "job")

    def env(self):
        """The job's: topolaunch and topolaunch-worker on PATH, the marker, and one OpenMP thread
        per rank (the emulated nodes' ranks would have a hundred on this host's cores)."""
        env = job_env(self.args.worker, self.marker)
        env["PATH"] = os.path.dirname(self.args.topolaunch) + os.pathsep + env["PATH"]
        env["OMP_NUM_THREADS"] = "1"
        return self.cluster.env(**env)

    def config(self, name, steps, every, restarts=0, job=None, checkpoint_dir=None):
        job = dict({"ranks_per_node": "1"}, **(job or {}))
        return example_config(self.args.source_root, self.tmp, name, steps, every, restarts, job,
                              checkpoint_dir)

    def sbatch_script(self, config, before=""):
        script = os.path.join(self.tmp, "job.sbatch")
        topology = os.path.join(self.cluster.dir, "topo", "%n.xml")
        with open(script, "w") as f:
            f.write("#!/bin/bash\n#SBATCH -N %d\n#SBATCH -o %s\n%s"
                    "%s run %s --job-dir %s --topology %s\necho \"topolaunch exit $?\"\n"
                    % (len(NODES), self.out, before, self.args.topolaunch, config, self.job_dir,
                       topology))
        return script

    def sbatch(self, script, options=(), script_args=()):
        proc = subprocess.run(["sbatch", "--parsable", *options, script, *script_args],
                              env=self.env(),
                              capture_output=True, text=True, timeout=60)
        check(proc.returncode == 0, "sbatch: " + proc.stderr.strip())
        return proc.stdout.strip().split(";")[0]

    def output(self):
        try:
            with open(self.out, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_exit(self, timeout):
        found = wait_for(lambda: re.search(r"topolaunch exit (\d+)", self.output()), timeout,
                         0.05, "the batch script's topolaunch exit line")
        return int(found.group(1))

    def wait_workers(self, count, timeout=120):
        return wait_for(lambda: (lambda p: p if len(p) == count else None)(
            worker_pids(self.marker, 0)), timeout, 0.05, "%d workers" % count)

    def node_of(self, pid):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                for item in f.read().split(b"\0"):
                    if item.startswith(b"SLURMD_NODENAME="):
                        return item.split(b"=", 1)[1].decode()
        except OSError:
            pass
        return None

    def agents(self):
        """{node: pid} of the job's `topolaunch agent` processes."""
        out = {}
        for pid in job_processes(self.marker):
            args = (cmdline(pid) or b"").split(b"\0")
            if (program(pid) == "topolaunch" and len(args) > 1 and args[1] == b"agent"
                    and not is_watchdog(pid)):
                out[self.node_of(pid)] = pid
        return out

    def nothing_left(self):
        left = job_processes(self.marker)
        self.result["left_processes"] = ["%s on %s" % (describe([p]), self.node_of(p))
                                         for p in left]
        check(not left, "processes of the job left: %s" % ", ".join(
            self.result["left_processes"]))


def lose_node(case, node):
    """Freezes, then kills, node's slurmd, slurmstepd and the job's processes there."""
    victims = set(case.cluster.node_daemons(node))
    victims |= {p for p in job_processes(case.marker) if case.node_of(p) == node}
    check(case.cluster.slurmd(node) in victims, "%s's slurmd not found" % node)
    kill_all(victims, signal.SIGSTOP)
    kill_all(victims, signal.SIGKILL)
    return victims


def node_fault(case, kind):
    steps = 3000  # runs until the fault; never reached
    config = case.config(kind, steps, 50)
    case.sbatch(case.sbatch_script(config))
    workers = case.wait_workers(len(NODES))
    wait_for(lambda: len(loss_lines(os.path.join(case.tmp, kind + ".jsonl"))) >= 5, 120, 0.05,
             "5 steps")
    # The first attempt's workers still there after 5 steps, each named by the node its
    # environment says (re-read now: a worker that ended since it was first seen is no worker of
    # the fault, and its /proc entry is gone).
    by_node = {}
    for node in NODES:
        by_node.update({node: pid for pid in worker_pids(case.marker, 0, node).values()})
    check(sorted(by_node) == NODES and sorted(by_node.values()) == sorted(workers.values()),
          "the first attempt's workers %s changed before the fault: now %s\n%s"
          % (sorted(workers.values()), by_node, case.output()[-3000:]))
    if kind == "node_lost":
        victims = lose_node(case, "n2")
        what = "n2's slurmd, slurmstepd and job processes (%d) frozen and killed" % len(victims)
    else:
        agent = case.agents().get("n2")
        check(agent, "no topolaunch agent on n2")
        os.kill(agent, signal.SIGKILL)
        what = "n2's topolaunch agent (pid %d) SIGKILLed" % agent
    start = time.monotonic()
    teardown = wait_gone(list(workers.values()), 60)
    case.result["teardown_s"] = round(teardown, 3)
    status = case.wait_exit(float(os.environ.get("FAULT_EXIT_WAIT", "120")))
    case.result["job_end_s"] = round(time.monotonic() - start, 3)
    check(status == 1, "topolaunch exit %d (want 1: the job failed):\n%s"
          % (status, case.output()[-3000:]))
    report = read_report(case.job_dir)
    case.result["restarts"] = report["restarts_used"]
    cause = report["root_cause"]
    phase, said = ("node-lost", "node n2 lost: ") if kind == "node_lost" else \
        ("agent-lost", "node n2: its agent ended without a report")
    check(cause and cause["node"] == "n2" and cause["phase"] == phase and said in cause["what"],
          "root cause %s (want phase %s, %r)" % (cause, phase, said))
    check("root cause:" in case.output() and said in case.output(),
          "the summary does not name n2:\n" + case.output()[-2000:])
    # The other nodes' processes: gone (the job's, by marker; n2's were killed by the case).
    case.nothing_left()
    print("ok  %s: the other workers gone in %.2f s, the job ended after %.2f s; root cause: %s"
          % (what, teardown, case.result["job_end_s"], cause["what"]))
    return teardown < 30


def node_lost(case):
    return node_fault(case, "node_lost")


def agent_killed(case):
    return node_fault(case, "agent_killed")


def store_host_dies(case):
    timeout = 20
    config = case.config("store", 3000, 50)
    with open(config) as f:
        text = f.read()
    text = text.replace('backend = "tcp"', 'backend = "tcp"\ntimeout = "%ds"' % timeout, 1)
    with open(config, "w") as f:
        f.write(text)
    go = os.path.join(case.tmp, "go")
    case.sbatch(case.sbatch_script(config, before="touch %s/started\nwhile [ ! -e %s ]; do sleep "
                                   "0.05; done\n" % (case.tmp, go)))
    wait_for(lambda: os.path.exists(os.path.join(case.tmp, "started")), 60, 0.05,
             "the batch script")
    frozen = case.cluster.slurmd("n3")
    os.kill(frozen, signal.SIGSTOP)
    try:
        with open(go, "w"):
            pass
        # n1's and n2's agents connect and wait in the exchange for n3's, which never comes.
        wait_for(lambda: sum("agents exchange through tcp" in l
                             for l in case.output().splitlines()) >= 2, 60, 0.05,
                 "n1's and n2's agents in the exchange")
        agents = case.agents()
        check(sorted(agents) == ["n1", "n2"], "agents running: %s" % agents)
        time.sleep(1)
        check(all(alive(p) for p in agents.values()), "an agent ended before the store did")
        run = [p for p in job_processes(case.marker) if program(p) == "topolaunch"
               and p not in agents.values() and not is_watchdog(p)]
        check(len(run) == 1, "one topolaunch run expected: %s" % describe(run))
        os.kill(run[0], signal.SIGKILL)
        teardown = wait_gone(list(agents.values()), timeout + 30)
        case.result["teardown_s"] = round(teardown, 3)
        case.wait_exit(60)
        # srun waits for n3's launch until Slurm's MessageTimeout (10 s), then gives up.
        wait_for(lambda: not [p for p in job_processes(case.marker) if program(p) == "srun"],
                 60, 0.1, "srun to give up on n3")
    finally:
        os.kill(frozen, signal.SIGCONT)
    # Whatever n3's slurmd does with the launch it was sent while frozen: an agent it starts
    # finds no store and says so within wireup.timeout.
    wait_for(lambda: not job_processes(case.marker), timeout + 30, 0.1,
             "the job's processes to end")
    out = case.output()
    lines = [l for l in out.splitlines() if re.match(r"topolaunch agent n\d:", l)
             and "agents exchange through" not in l]
    for node in ("n1", "n2"):
        said = [l for l in lines if l.startswith("topolaunch agent %s:" % node)]
        check(len(said) == 1, "agent %s said %d lines (want one):\n%s" % (node, len(said),
                                                                         out[-3000:]))
        check("upstream store" in said[0] and "is gone" in said[0],
              "agent %s's line does not say the store is gone: %s" % (node, said[0]))
    for line in lines:
        check(re.search(r"store", line), "an agent's line does not name the store: %s" % line)
    case.nothing_left()
    print("ok  the store's host SIGKILLed mid-exchange: both agents gone in %.2f s "
          "(wireup.timeout %d s):\n    %s" % (teardown, timeout, "\n    ".join(lines)))
    return teardown < timeout


def sbatch_requeue(case):
    # Longer than the 40 s a notice may take on a quiet host (about 20 steps a second).
    steps, every = 800, 100
    script = os.path.join(case.args.source_root, "configs", "jobs",
                          "tiny-gpt-cpu-requeue.sbatch")
    topology = ["--topology", os.path.join(case.cluster.dir, "topo", "%n.xml")]
    # One node, two ranks (the example's ranks_per_node): `run` is the agent, in the batch step.
    # (On several nodes a rank that gets Slurm's notice first can finish its checkpoint and
    # exit 75 before another node's agent has had its own: that is the srun preemption race.)
    two_ranks = {"ranks_per_node": "2"}
    # The same job without a time limit, at the same time on another node: the reference.
    ref_config = case.config("reference", steps, every, job=dict(two_ranks, name='"reference"'),
                             checkpoint_dir=os.path.join(case.tmp, "ref-ckpt"))
    ref_out = os.path.join(case.tmp, "reference.out")
    ref_dir = os.path.join(case.tmp, "ref-job")
    req_config = case.config("requeue", steps, every, job=two_ranks)
    ref_id = case.sbatch(script, ["-N", "1", "-w", "n2", "--time=0", "-o", ref_out],
                         [ref_config, "--job-dir", ref_dir, *topology])
    job_id = case.sbatch(script, ["-N", "1", "-w", "n1", "--time=1", "--signal=B:USR1@20",
                                  "-o", case.out],
                         [req_config, "--job-dir", case.job_dir, *topology])
    start = time.monotonic()

    def finished(job):
        # Neither pending nor running; gone from squeue altogether MinJobAge after its end.
        proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=case.env(),
                              capture_output=True, text=True, timeout=30)
        return (proc.returncode == 0 and not proc.stdout.strip()) or \
            "Invalid job id" in proc.stderr

    wait_for(lambda: finished(job_id) and finished(ref_id), 900, 1, "the jobs to end")
    took = time.monotonic() - start
    out = case.output()
    runs = re.findall(r"run (\d+) of job %s" % job_id, out)
    exits = [int(x) for x in re.findall(r"topolaunch exit (\d+)", out)]
    check(runs and exits and exits[-1] == 0, "the job did not end well: runs %s, exits %s:\n%s"
          % (runs, exits, out[-3000:]))
    check(len(runs) >= 2 and exits[:-1] == [3] * (len(runs) - 1),
          "want at least one requeue (exit 3, then 75 to Slurm) before the last run's 0: runs %s, "
          "topolaunch exits %s:\n%s" % (runs, exits, out[-3000:]))
    check(runs == [str(i) for i in range(len(runs))], "SLURM_RESTART_COUNT of the runs: %s" % runs)
    acct = subprocess.run(["scontrol", "show", "job", job_id], env=case.env(),
                          capture_output=True, text=True, timeout=30).stdout
    restarts = re.search(r"Restarts=(\d+)", acct)
    case.result["restarts"] = int(restarts.group(1)) if restarts else len(runs) - 1
    ref_text = open(ref_out, errors="replace").read() if os.path.exists(ref_out) else ""
    check("topolaunch exit 0" in ref_text, "the reference job failed:\n" + ref_text[-3000:])
    ref = dict(loss_lines(os.path.join(case.tmp, "reference.jsonl")))
    check(sorted(ref) == list(range(1, steps + 1)), "the reference logged %d steps" % len(ref))
    lines = loss_lines(os.path.join(case.tmp, "requeue.jsonl"))
    check_bit_identical(lines, ref, steps, "the requeued job")
    # Each requeued run resumed from the checkpoint the one before wrote when it stopped.
    logs = logs_of(case.job_dir)  # earlier/<n>/ holds the runs before the last
    stops = [int(s) for s in re.findall(r"stopped by SIGUSR1 after step (\d+)", logs)]
    resumes = re.findall(r"resumed from \S+ at step (\d+)", logs)
    check(stops and resumes, "no stop or resume line in the ranks' logs")
    check(set(int(r) for r in resumes) <= set(stops),
          "resumed at %s, stopped at %s: a resume did not take the stop's checkpoint"
          % (resumes, stops))
    # Slurm's side: each run but the last exited 75 and was requeued for it (RequeueExit=75).
    with open(os.path.join(case.cluster.dir, "log", "slurmctld.log"), errors="replace") as f:
        ctld = f.read()
    statuses = re.findall(r"_job_complete: JobId=%s WEXITSTATUS (\d+)" % job_id, ctld)
    check(statuses == ["75"] * (len(runs) - 1) + ["0"],
          "slurmctld saw the job exit %s (want 75 for each requeue, then 0)" % statuses)
    check(ctld.count("Requeuing JobId=%s\n" % job_id) == len(runs) - 1,
          "slurmctld requeued the job %d times, not %d" % (
              ctld.count("Requeuing JobId=%s\n" % job_id), len(runs) - 1))
    report = read_report(case.job_dir)
    check(report["status"] == "succeeded", "the last run's report: %s" % report["status"])
    case.result["wall_s"] = round(took, 1)
    case.nothing_left()
    print("ok  job %s: %d runs (Slurm Restarts=%s), stopped by SIGUSR1 after steps %s, resumed "
          "at %s, %d losses bit-identical to job %s's; %.0f s" % (
              job_id, len(runs), case.result["restarts"], sorted(set(stops)),
              sorted(set(int(r) for r in resumes)), len(lines), ref_id, took))
    return True


CASES = {"node_lost": node_lost, "agent_killed": agent_killed,
         "store_host_dies": store_host_dies, "sbatch_requeue": sbatch_requeue}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--topolaunch", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--source-root", required=True)
    args = p.parse_args()
    args.topolaunch = os.path.abspath(args.topolaunch)
    args.worker = os.path.abspath(args.worker)
    args.source_root = os.path.abspath(args.source_root)
    tmp = tempfile.mkdtemp(prefix="topolaunch-slurm-fault-")
    case = None
    try:
        case = SlurmCase(args, tmp, args.case)
        case.cluster.start()
        within = CASES[args.case](case)
        check(within, "took %s s: not within seconds" % case.result["teardown_s"])
        case.result["passed"] = True
    except CaseFailed as e:
        if case:
            case.result["passed"] = False
            case.result["why"] = str(e)[:500]
            emit(case.result)
        print("FAIL:", e)
        sys.exit(1)
    finally:
        if case:
            kill_all(job_processes(case.marker))
            stopped = case.cluster.stop()
            if stopped.returncode not in (0, 3):
                print("cluster-stop:", stopped.stderr.strip()[-1000:])
        if os.environ.get("FAULT_KEEP"):
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    emit(case.result)
    print("PASS", args.case)


if __name__ == "__main__":
    main()
