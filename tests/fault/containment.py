#!/usr/bin/env python3
"""No process outlives the job: a shell-script worker whose children try to stay behind.

Each rank of the worker (2 ranks, standalone `topolaunch run`) starts a child in its process
group, a child that calls setsid, a double-forked grandchild, a double-forked grandchild that
calls setsid, and a setsid'd shell with a child of its own. Then:
  *_normal_end: the worker exits 0 after 3 seconds; when `topolaunch run` has exited, no process
    of the job may remain (within 5 s; the seconds are printed).
  *_kill9: `topolaunch run` itself is killed with SIGKILL while the ranks run; within 5 s no
    process of the job may remain (PR_SET_PDEATHSIG reaches only the worker: the watchdog kills
    the rest).
cgroup_*: on this host, as root, the job gets a cgroup v2 subtree of its own (asserted: every
  worker's /proc/PID/cgroup names topolaunch's cgroup); a host without cgroup v2 fails here.
tracked_*: the same run in a mount namespace without any cgroup2 mount (unshare -m, as root):
  topolaunch says in one line what it cannot guarantee, and still leaves nothing, by pid.

A process "of the job" carries this test's marker in its environment (/proc/PID/environ).

usage: containment.py CASE --topolaunch T
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

MARKER = "TOPOLAUNCH_CONTAINMENT_MARKER"
RANKS = 2
LIMIT_S = 5.0

WORKER = """#!/bin/sh
# A shell-script worker whose children try to outlive the job.
sleep 600 &                                # a child in the worker's process group
setsid sleep 600 &                         # a child in a session of its own
( sleep 600 & )                            # a grandchild, orphaned (double fork)
( setsid sleep 600 & )                     # orphaned, and in a session of its own
setsid sh -c 'sleep 600 & exec sleep 600' &  # a session leader with a child of its own
echo "started $$"
echo 1 > "$TOPOLAUNCH_HEARTBEAT_FILE"
if [ "$1" = end ]; then sleep 3; exit 0; fi
exec sleep 600
"""
# Per rank, besides the worker: the 6 sleeps its children and grandchildren end up as.
STARTED_PER_RANK = 6


MARKER_VALUE = uuid.uuid4().hex


def fail(message):
    print("FAIL:", message)
    for pid, _ in job_processes(MARKER_VALUE):  # a failed case leaves nothing running either
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def job_processes(marker):
    """(pid, comm) of every live process whose environment carries the marker."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/comm") as f:
                found.append((int(pid), f.read().strip()))
        except OSError:
            pass
    return found


def cgroup_of(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def cgroup2_mounted():
    with open("/proc/self/mountinfo") as f:
        return any(" - cgroup2 " in line for line in f)


def wait_until_gone(marker, since, limit=LIMIT_S * 3):
    """Seconds from `since` until no process of the job is left (or the limit, with what is)."""
    while True:
        left = job_processes(marker)
        elapsed = time.monotonic() - since
        if not left or elapsed > limit:
            return elapsed, left
        time.sleep(0.02)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["cgroup_normal_end", "cgroup_kill9", "tracked_normal_end",
                                         "tracked_kill9"])
    parser.add_argument("--topolaunch", required=True)
    args = parser.parse_args()
    mode, ending = args.case.split("_", 1)
    check(os.geteuid() == 0, "runs as root (a cgroup of the job, unshare -m)")
    tmp = tempfile.mkdtemp(prefix="topolaunch-contain-")
    worker = os.path.join(tmp, "worker.sh")
    with open(worker, "w") as f:
        f.write(WORKER)
    os.chmod(worker, 0o755)
    config = os.path.join(tmp, "job.toml")
    with open(config, "w") as f:
        f.write(f'[job]\nname = "contain"\nranks_per_node = {RANKS}\nstop_grace = "2s"\n'
                f'[mapping]\noversubscribe = true\n[rdma]\npreflight = "off"\n'
                f'[worker]\ncommand = ["{worker}", "{"end" if ending == "normal_end" else "run"}"]\n')
    marker = MARKER_VALUE
    env = dict(os.environ, **{MARKER: marker})
    cmd = [os.path.abspath(args.topolaunch), "run", config, "--job-dir", os.path.join(tmp, "job")]
    if mode == "tracked":
        check(subprocess.run(["which", "unshare"], capture_output=True).returncode == 0,
              "unshare (util-linux) is needed for the case without cgroups")
        # A private mount namespace with every cgroup2 mount taken away; exec keeps the pid, so
        # the kill below hits topolaunch itself.
        script = ("set -e; for m in $(awk '$0 ~ / - cgroup2 / {print $5}' /proc/self/mountinfo "
                  "| sort -r); do umount -l \"$m\"; done; exec \"$@\"")
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"] + cmd
    else:
        check(cgroup2_mounted(), "no cgroup v2 hierarchy is mounted on this host: the job's "
              "cgroup cannot be tested (run the tracked_* cases, or mount cgroup2)")
    errors = open(os.path.join(tmp, "stderr.txt"), "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=errors)

    # Every rank's worker and children are there (the watchdog looks once a second). The count
    # leaves out topolaunch and its watchdog: counting them let the wait end one sleep early.
    def worker_side(found):
        return [(p, c) for p, c in found if p != proc.pid and c != "topolaunch-wd"]

    deadline = time.monotonic() + 30
    while len(worker_side(job_processes(marker))) < RANKS * (1 + STARTED_PER_RANK):
        check(time.monotonic() < deadline and proc.poll() is None,
              f"the ranks did not start their children: {job_processes(marker)}")
        time.sleep(0.05)
    seen = job_processes(marker)
    if ending == "kill9":
        time.sleep(1.5)
    top = proc.pid
    if mode == "cgroup":
        own = cgroup_of(top)
        cgroups = {cgroup_of(p) for p, _ in seen if p != top}
        cgroups.discard(None)
        check(any(c.rsplit("/", 1)[-1].startswith(f"topolaunch.{top}.") for c in cgroups),
              f"no process is in a cgroup of topolaunch {top} (it is in {own}): {cgroups}")
        job_cgroup = [c for c in cgroups if c.rsplit("/", 1)[-1].startswith(f"topolaunch.{top}.")]
        # A short-lived subshell may be gone by now (no cgroup): every live one must be inside.
        workers = {p: cgroup_of(p) for p, _ in worker_side(seen)}
        in_job = [p for p, c in workers.items() if c in job_cgroup]
        outside = {p: c for p, c in workers.items() if c is not None and c not in job_cgroup}
        check(not outside and len(in_job) >= RANKS * (1 + STARTED_PER_RANK),
              f"{len(in_job)} processes in {job_cgroup}, outside it {outside}; expected every "
              f"worker's: {seen}")
        print(f"cgroup {job_cgroup[0]}: {len(in_job)} processes of {RANKS} ranks")

    if ending == "kill9":
        t0 = time.monotonic()
        os.kill(top, signal.SIGKILL)
        proc.wait(timeout=10)
        elapsed, left = wait_until_gone(marker, t0)
        check(not left, f"{len(left)} processes of the job left {elapsed:.1f} s after kill -9 of "
              f"topolaunch: {left}")
        print(f"kill -9 of topolaunch: the {len(seen) - 1} other processes of the job "
              f"({RANKS} shell workers and their children, the watchdog) gone in {elapsed:.2f} s")
        errors.seek(0)
        said = [l for l in errors.read().splitlines() if "watchdog" in l]
        check(said and "ended without stopping its job" in said[-1],
              f"the watchdog did not say what it killed: {said}")
        print(said[-1])
    else:
        rc = proc.wait(timeout=60)
        t0 = time.monotonic()
        elapsed, left = wait_until_gone(marker, t0)
        errors.seek(0)
        text = errors.read()
        check(rc == 0, f"topolaunch exited {rc}:\n{text[-2000:]}")
        check(not left, f"{len(left)} processes of the job left {elapsed:.1f} s after topolaunch "
              f"exited: {left}")
        print(f"normal end: nothing of the job left {elapsed:.2f} s after topolaunch exited "
              f"({len(seen) - 1} processes had run beside it)")
    check(elapsed <= LIMIT_S, f"took {elapsed:.1f} s (limit {LIMIT_S} s)")

    errors.seek(0)
    text = errors.read()
    said = [l for l in text.splitlines() if "containment:" in l]
    if mode == "tracked":
        check(len(said) == 1 and "no cgroup of the job" in said[0] and
              "no cgroup2 mount" in said[0],
              f"one line should say what cannot be guaranteed: {said}")
        print(said[0])
    else:
        check(not said, f"with a cgroup of the job nothing needs saying: {said}")
        leftover = [c for c in os.listdir(cgroup_mount_dir()) if c.startswith(f"topolaunch.{top}.")]
        check(not leftover, f"the job's cgroup was not removed: {leftover}")
    print("PASS", args.case)


def cgroup_mount_dir():
    """The directory of topolaunch's parent cgroup: where the job's cgroup was made."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if " - cgroup2 " in line:
                fields = line.split()
                own = cgroup_of(os.getpid()) or "/"
                root = fields[3]
                rest = own[len(root):] if root != "/" and own.startswith(root) else own
                return fields[4] + rest.rstrip("/")
    fail("no cgroup2 mount")


if __name__ == "__main__":
    main()
