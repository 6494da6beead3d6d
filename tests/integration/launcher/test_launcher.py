#!/usr/bin/env python3
"""Integration tests of `topolaunch run`: real processes on this machine.

usage: test_launcher.py TOPOLAUNCH TEST_WORKER SOURCE_ROOT CASE
Each case starts the launcher with 4 local ranks of the test worker and checks what the issue
asks: the environment per rank, the store exchange, teardown (nothing of the job left in /proc),
restarts, heartbeat, SIGUSR1/SIGTERM, memory budget and bad input (exit 2, one line).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

TOPOLAUNCH, WORKER, ROOT, CASE = sys.argv[1:5]
FAKE_NVML = sys.argv[5] if len(sys.argv) > 5 else ""  # tests/integration/launcher/fake_nvml.cpp
TMP = tempfile.mkdtemp(prefix="topolaunch-test-")
MARKER = "TOPOLAUNCH_TEST_MARKER"
marker_value = uuid.uuid4().hex


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def write_config(extra_job="", extra="", ranks=4, rdma='preflight = "off"'):
    path = os.path.join(TMP, "job.toml")
    with open(path, "w") as f:
        f.write(f"""[job]
name = "itest"
ranks_per_node = {ranks}
stop_grace = "3s"
{extra_job}
[mapping]
oversubscribe = true
[rdma]
{rdma}
{extra}
""")
    return path


def job_processes():
    """pids whose environment carries this test's marker (the job's agent and workers)."""
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


def start(config, *worker_args, job_dir=None, extra_args=(), extra_env=None):
    job_dir = job_dir or os.path.join(TMP, "job")
    env = dict(os.environ, **{MARKER: marker_value})
    env.update(extra_env or {})
    cmd = [TOPOLAUNCH, "run", config, "--job-dir", job_dir, *extra_args, "--", WORKER, *worker_args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def report(job_dir=None):
    with open(os.path.join(job_dir or os.path.join(TMP, "job"), "report.json")) as f:
        return json.load(f)


def log_of(rank, attempt=0):
    path = os.path.join(TMP, "job", f"attempt-{attempt}", f"rank-{rank}.log")
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def wait_started(ranks=4, attempt=0, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        pids = {}
        for r in range(ranks):
            for line in log_of(r, attempt).splitlines():
                if line.startswith("pid "):
                    pids[r] = int(line.split()[1])
        if len(pids) == ranks:
            return pids
        time.sleep(0.05)
    fail(f"workers did not start within {timeout}s")


def assert_nothing_left(agent_pid):
    left = [p for p in job_processes() if p != agent_pid]
    check(not left, f"processes of the job left behind: {left}")


def case_env_and_exchange():
    config = os.path.join(ROOT, "configs", "jobs", "test-worker.toml")
    rc, out, err = finish(start(config, "--exchange", "--sleep", "0.3"))
    check(rc == 0, f"exit {rc}\n{err}")
    rep = report()
    check(rep["status"] == "succeeded", rep["status"])
    check(len(rep["attempts"][0]["ranks"]) == 4, "4 ranks in the report")
    store_addrs = set()
    for r in range(4):
        log = log_of(r)
        for expected in [f"env RANK={r}", f"env LOCAL_RANK={r}", "env WORLD_SIZE=4",
                         "env LOCAL_WORLD_SIZE=4", "env GROUP_RANK=0", "env GROUP_WORLD_SIZE=1",
                         "env MASTER_ADDR=127.0.0.1", "env TORCHELASTIC_RESTART_COUNT=0",
                         "env TORCHELASTIC_MAX_RESTARTS=0", f"env TOPOLAUNCH_RANK={r}",
                         "env TOPOLAUNCH_STORE_SECRET=<set>", "env TOPOLAUNCH_ATTEMPT=0",
                         "env TEST_WORKER_GREETING=hello",
                         # [budget] memory is set, but budgets travel in the job file only
                         "env TOPOLAUNCH_MEMORY_BUDGET_BYTES=<unset>",
                         "exchange 4/4"]:
            check(expected in log, f"rank {r}: '{expected}' missing from its log:\n{log}")
        check(f"[rank {r}] exchange 4/4" in out, f"merged stream lacks rank {r}'s exchange")
        line = [l for l in log.splitlines() if l.startswith("env TOPOLAUNCH_STORE_ADDR=")][0]
        store_addrs.add(line.split("=", 1)[1])
        hb = [l for l in log.splitlines() if l.startswith("env TOPOLAUNCH_HEARTBEAT_FILE=")][0]
        check(hb.endswith(f"rank-{r}"), hb)
    check(len(store_addrs) == 1 and next(iter(store_addrs)).startswith("127.0.0.1:"),
          f"one store address on loopback: {store_addrs}")
    rankmap = json.load(open(os.path.join(TMP, "job", "rankmap.json")))
    check(len(rankmap["ranks"]) == 4, "rankmap.json has 4 ranks")
    # whole lines only: every merged line starts with a rank prefix
    for line in out.splitlines():
        check(line.startswith("[rank "), f"merged line without prefix: {line!r}")


def case_kill9_stops_all():
    config = write_config()
    proc = start(config, "--sleep", "60", "--fork-child")
    pids = wait_started()
    time.sleep(0.3)
    os.kill(pids[2], signal.SIGKILL)
    killed_at = time.time()
    rc, out, err = finish(proc, timeout=20)
    elapsed = time.time() - killed_at
    check(elapsed < 5, f"agent took {elapsed:.1f}s to stop the job")
    assert_nothing_left(proc.pid)
    check(rc == 1, f"exit {rc}")
    rep = report()
    cause = rep["root_cause"]
    check(cause and cause["rank"] == 2 and "SIGKILL" in cause["what"], f"root cause {cause}")
    check("root cause: rank 2" in err, f"summary names the root cause:\n{err}")
    print(f"all workers gone {elapsed:.2f}s after kill -9")


def case_restart_after_failure():
    config = write_config(extra_job="restarts = 2")
    rc, out, err = finish(start(config, "--sleep", "1", "--fail-rank", "1", "--fail-after", "0.2",
                                "--fail-attempt", "0"))
    check(rc == 0, f"exit {rc}\n{err}")
    rep = report()
    check(rep["restarts_used"] == 1, f"restarts_used {rep['restarts_used']}")
    check(rep["attempts"][0]["outcome"] == "failed", rep["attempts"][0]["outcome"])
    check(rep["root_cause"]["rank"] == 1 and "exited 3" in rep["root_cause"]["what"],
          rep["root_cause"])
    check("env TORCHELASTIC_RESTART_COUNT=1" in log_of(0, attempt=1), "restart count 1")
    check("env TORCHELASTIC_MAX_RESTARTS=2" in log_of(0, attempt=1), "max restarts 2")


def case_restarts_used_up():
    config = write_config(extra_job="restarts = 1")
    rc, out, err = finish(start(config, "--sleep", "5", "--fail-rank", "3", "--fail-after", "0.1"))
    check(rc == 1, f"exit {rc}")
    rep = report()
    check(len(rep["attempts"]) == 2 and rep["status"] == "failed", rep)
    check(rep["root_cause"]["attempt"] == 0 and rep["root_cause"]["rank"] == 3, rep["root_cause"])


def case_heartbeat_timeout():
    config = write_config(extra_job='heartbeat_timeout = "1s"')
    t0 = time.time()
    proc = start(config, "--sleep", "60", "--hang-rank", "2")
    rc, out, err = finish(proc, timeout=30)
    elapsed = time.time() - t0
    check(rc == 1, f"exit {rc}\n{err}")
    cause = report()["root_cause"]
    check(cause["rank"] == 2 and "no heartbeat" in cause["what"], cause)
    check(elapsed < 1 + 3 + 3, f"hang detected late: {elapsed:.1f}s")
    assert_nothing_left(proc.pid)
    print(f"hung rank stopped {elapsed:.2f}s after start (timeout 1s)")


def case_heartbeat_unarmed():
    # A program never told to beat (here a shell) outlives heartbeat_timeout four times over and
    # is not killed: its watch is armed only by a first beat.
    config = write_config(extra_job='heartbeat_timeout = "500ms"')
    env = dict(os.environ, **{MARKER: marker_value})
    proc = subprocess.run([TOPOLAUNCH, "run", config, "--job-dir", os.path.join(TMP, "job"), "--",
                           "/bin/sh", "-c", "sleep 2; echo rank $RANK done"],
                          env=env, capture_output=True, text=True, timeout=60)
    check(proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr}")
    check(proc.stdout.count(" done") == 4, proc.stdout)
    watch = [l for l in proc.stderr.splitlines() if l.startswith("topolaunch: hang watch:")]
    check(len(watch) == 1 and "armed at each rank's first beat" in watch[0] and
          "a rank of sh that never beats is not watched" in watch[0], proc.stderr)
    print(watch[0])


def case_sigusr1_requeue():
    config = write_config()
    proc = start(config, "--sleep", "60")
    wait_started()
    time.sleep(0.3)
    proc.send_signal(signal.SIGUSR1)
    rc, out, err = finish(proc, timeout=20)
    check(rc == 3, f"exit {rc}\n{err}")
    check(report()["status"] == "requeue", report()["status"])
    for r in range(4):
        check("checkpointed" in log_of(r), f"rank {r} did not checkpoint")
        check(os.path.exists(os.path.join(TMP, "job", "checkpoints", f"rank-{r}.ckpt")),
              f"rank {r} checkpoint file")
    assert_nothing_left(proc.pid)


def case_sigterm_clean_stop():
    config = write_config()
    proc = start(config, "--sleep", "60", "--fork-child")
    wait_started()
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    rc, out, err = finish(proc, timeout=20)
    check(rc == 128 + signal.SIGTERM, f"exit {rc}\n{err}")
    check(time.time() - t0 < 5, "stop took too long")
    check(report()["status"] == "stopped", report()["status"])
    assert_nothing_left(proc.pid)


def case_memory_budget():
    config = write_config(extra='[budget]\nmemory = "64MiB"\n')
    rc, out, err = finish(start(config, "--sleep", "30", "--alloc-rank", "0", "--alloc-mib",
                                "200"), timeout=30)
    check(rc == 1, f"exit {rc}\n{err}")
    cause = report()["root_cause"]
    check(cause["rank"] == 0 and "memory budget" in cause["what"], cause)


def children_of(parent):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                found.append(int(pid))
        except (OSError, IndexError, ValueError):
            pass
    return found


def case_memory_budget_tree():
    # Rank 2's worker stays small; the child it forks (which leaves the worker's process group)
    # allocates 200 MiB: only counting the rank's whole tree catches it.
    config = write_config(extra='[budget]\nmemory = "64MiB"\n')
    proc = start(config, "--sleep", "30", "--alloc-rank", "2", "--child-alloc-mib", "200")
    rc, out, err = finish(proc, timeout=30)
    check(rc == 1, f"exit {rc}\n{err}")
    cause = report()["root_cause"]
    check(cause["rank"] == 2 and "memory budget" in cause["what"] and "2 processes" in cause["what"],
          cause)
    check("child " in log_of(2), f"rank 2 did not fork its child:\n{log_of(2)}")
    assert_nothing_left(proc.pid)
    print("stopped:", cause["what"])


def nvml_env(usage_file):
    check(FAKE_NVML and os.path.exists(FAKE_NVML), f"fake NVML library missing: {FAKE_NVML!r}")
    return {"TOPOLAUNCH_NVML_LIBRARY": FAKE_NVML, "FAKE_NVML_USAGE": usage_file,
            "FAKE_NVML_DEVICES": "2"}


def case_gpu_memory_budget():
    usage = os.path.join(TMP, "gpu-usage")
    open(usage, "w").close()
    config = write_config(extra='[budget]\ngpu_memory = "256MiB"\n')
    proc = start(config, "--sleep", "30", "--fork-child", extra_env=nvml_env(usage))
    pids = wait_started()
    deadline = time.time() + 10
    while time.time() < deadline and not children_of(pids[1]):
        time.sleep(0.05)
    child = children_of(pids[1])
    check(child, "rank 1 did not fork its child")
    time.sleep(0.5)  # a few watch rounds with nothing on the GPUs
    check(proc.poll() is None, "the job ended before any GPU memory was used")
    # rank 0: 100 MiB on GPU 0 (under budget); rank 1: 100 MiB (worker) + 200 MiB (its child)
    # on GPU 1 = 300 MiB, over the 256 MiB budget only when the child is counted.
    with open(usage + ".tmp", "w") as f:
        f.write(f"0 {pids[0]} {100 << 20}\n1 {pids[1]} {100 << 20}\n1 {child[0]} {200 << 20}\n")
    os.rename(usage + ".tmp", usage)
    rc, out, err = finish(proc, timeout=20)
    check(rc == 1, f"exit {rc}\n{err}")
    rep = report()
    cause = rep["root_cause"]
    check(cause["rank"] == 1 and "GPU memory budget" in cause["what"], cause)
    check("GPU 1 holds 300" in cause["what"] and "budget.gpu_memory 256" in cause["what"], cause)
    check(f"on node {cause['node']}" in cause["what"], cause)
    ranks = {r["rank"]: r for r in rep["attempts"][0]["ranks"]}
    check(ranks[0]["peak_gpu_bytes"] == 100 << 20, f"rank 0 peak GPU {ranks[0]['peak_gpu_bytes']}")
    check(ranks[1]["peak_gpu_bytes"] == 300 << 20, f"rank 1 peak GPU {ranks[1]['peak_gpu_bytes']}")
    check("not watched" not in err, err)
    assert_nothing_left(proc.pid)
    print("stopped:", cause["what"])


def case_gpu_energy():
    """The energy NVML counts on the GPUs the ranks use (the fake's 100 W from its clock): in the
    node's usage and the job's cost, per GPU."""
    usage = os.path.join(TMP, "gpu-usage")
    open(usage, "w").close()
    config = write_config(extra='[cost]\ngpu_hour = 2.5\n')
    proc = start(config, "--sleep", "2", extra_env=nvml_env(usage))
    pids = wait_started()
    with open(usage + ".tmp", "w") as f:
        f.write(f"0 {pids[0]} {1 << 20}\n1 {pids[1]} {1 << 20}\n")
    os.rename(usage + ".tmp", usage)
    rc, out, err = finish(proc, timeout=30)
    check(rc == 0, f"exit {rc}\n{err}")
    rep = report()
    node = rep["attempts"][0]["nodes"][0]
    wall = rep["attempts"][0]["wall_s"]
    check(len(node["gpu_energy_j"]) == 2, f"energy of the 2 GPUs the ranks used: {node}")
    for j in node["gpu_energy_j"]:
        check(0.8 * 100 * wall < j < 1.2 * 100 * wall + 20, f"{j} J at 100 W over {wall:.2f} s")
    energy = rep["cost"]["energy"]
    check(energy["gpu_j"] == sum(node["gpu_energy_j"]) and len(energy["per_gpu"]) == 2, energy)
    check("energy: GPUs" in err and "J (NVML)" in err, err[-1500:])
    print("ok:", node["gpu_energy_j"], "J over", wall, "s")


def case_gpu_memory_unwatched():
    config = write_config(extra_job="restarts = 1", extra='[budget]\ngpu_memory = "256MiB"\n')
    env = {"TOPOLAUNCH_NVML_LIBRARY": os.path.join(TMP, "no-such-libnvidia-ml.so.1")}
    rc, out, err = finish(start(config, "--sleep", "0.3", "--fail-rank", "0", "--fail-after", "0.1",
                                "--fail-attempt", "0", extra_env=env))
    check(rc == 0, f"exit {rc}\n{err}")
    said = [l for l in err.splitlines() if "GPU memory is not watched" in l]
    check(len(said) == 1, f"expected the log to say it once over 2 attempts:\n{err}")
    check("no-such-libnvidia-ml.so.1" in said[0], said[0])
    print("ok:", said[0])


def has_rdma_devices():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def case_preflight_stage():
    config = write_config(rdma='preflight = "quick"')
    rc, out, err = finish(start(config, "--sleep", "0.3"))
    check(rc == 0, f"exit {rc}\n{err}")
    lines = [l for l in err.splitlines() if "rdma preflight" in l]
    check(len(lines) == 1, f"one preflight line expected:\n{err}")
    if has_rdma_devices():
        check(lines[0].endswith(" ok"), lines[0])
    else:
        check("no RDMA NICs here, nothing to check" in lines[0], lines[0])
    rep = report()
    check(rep["preflight"] and rep["preflight"] in lines[0], rep["preflight"])
    check(rep["status"] == "succeeded", rep["status"])
    print("ok:", lines[0])


def case_preflight_missing_nic():
    config = write_config(ranks=2, rdma='preflight = "quick"\nnics = "mlx5_nosuch"')
    job_dir = os.path.join(TMP, "job")
    env = dict(os.environ, **{MARKER: marker_value})
    proc = subprocess.run([TOPOLAUNCH, "run", config, "--job-dir", job_dir, "--", WORKER,
                           "--sleep", "30"], env=env, capture_output=True, text=True, timeout=60)
    check(proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}")
    lines = proc.stderr.strip().splitlines()
    check(len(lines) == 1 and "mlx5_nosuch" in lines[0] and "rdma preflight" in lines[0],
          f"one line naming the NIC expected: {proc.stderr!r}")
    check(not os.path.exists(os.path.join(job_dir, "attempt-0")), "a worker attempt was started")
    rep = report()
    check(rep["status"] == "failed" and rep["exit_code"] == 2, rep)
    check(rep["root_cause"]["phase"] == "preflight" and "mlx5_nosuch" in rep["root_cause"]["what"],
          rep["root_cause"])
    check(not job_processes(), "something was left running")
    print("ok:", lines[0])


def case_wireup_backend_standalone():
    # One node: no agent exchange ("none" in the report); an explicit PMI2 that is not there is
    # an error naming wireup.backend.
    config = write_config()
    rc, out, err = finish(start(config, "--sleep", "0.2"))
    check(rc == 0, f"exit {rc}\n{err}")
    check(report()["wireup"] == {"agents": "none", "workers": "tcp"}, report()["wireup"])
    base = '[mapping]\noversubscribe = true\n[job]\nranks_per_node = 2\n[rdma]\npreflight = "off"\n'
    expect_bad_input(base + '[wireup]\nbackend = "pmi2"\n', "wireup.backend")
    expect_bad_input(base + '[wireup]\nbackend = "pmix"\n', "wireup.backend")


def case_wireup_backend_srun_missing():
    # Inside a 2-node allocation whose srun offers no pmix plugin (a stand-in srun on PATH that
    # answers --mpi=list like Slurm 22.05 built without PMIx), wireup.backend = "pmix" is refused
    # before any agent starts: exit 2, one line naming wireup.backend and what srun offers.
    bindir = os.path.join(TMP, "fake-slurm-bin")
    os.makedirs(bindir, exist_ok=True)
    started = os.path.join(TMP, "srun-started-agents")
    with open(os.path.join(bindir, "srun"), "w") as f:
        f.write("#!/bin/sh\n"
                "if [ \"$1\" = --mpi=list ]; then\n"
                "  printf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n'; exit 0\n"
                "fi\n"
                f"touch {started}; exit 1\n")
    os.chmod(os.path.join(bindir, "srun"), 0o755)
    path = os.path.join(TMP, "srun-missing.toml")
    with open(path, "w") as f:
        f.write('[mapping]\noversubscribe = true\n[job]\nranks_per_node = 2\n'
                '[rdma]\npreflight = "off"\n[wireup]\nbackend = "pmix"\n')
    env = dict(os.environ, **{MARKER: marker_value, "SLURM_JOB_ID": "4242",
                              "SLURM_JOB_NUM_NODES": "2",
                              "PATH": bindir + os.pathsep + os.environ.get("PATH", "")})
    proc = subprocess.run([TOPOLAUNCH, "run", path, "--job-dir", os.path.join(TMP, "srun-job"),
                           "--", WORKER, "--sleep", "1"], env=env, capture_output=True, text=True,
                          timeout=30)
    check(proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}")
    lines = proc.stderr.strip().splitlines()
    check(len(lines) == 1 and "wireup.backend" in lines[0] and "no pmix plugin" in lines[0]
          and "none, pmi2" in lines[0], f"one line expected: {proc.stderr!r}")
    check(not os.path.exists(started), "srun was asked to start agents")
    print("ok:", lines[0])


def case_exec_failure():
    """A program whose exec fails (a script with a missing interpreter, which the PATH check
    cannot see) fails the job with the exec's errno as the root cause; no rank has a pid and no
    forked child is left behind."""
    program = os.path.join(TMP, "no-interpreter.sh")
    with open(program, "w") as f:
        f.write("#!/nonexistent/interpreter\n")
    os.chmod(program, 0o755)
    config = write_config(ranks=2)
    env = dict(os.environ, **{MARKER: marker_value})
    proc = subprocess.run([TOPOLAUNCH, "run", config, "--job-dir", os.path.join(TMP, "job"), "--",
                           program], env=env, capture_output=True, text=True, timeout=30)
    check(proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr}")
    r = report()
    check(r["status"] == "failed", f"status {r['status']}")
    what = r["root_cause"]["what"]
    check(f'cannot start "{program}": exec failed: No such file or directory' in what, what)
    ranks = r["attempts"][0]["ranks"]
    check(len(ranks) == 2 and all(x["pid"] == -1 for x in ranks),
          f"ranks that never ran must have no pid: {ranks}")
    check(not job_processes(), "something was left running")
    print("ok:", what)


def expect_bad_input(config_text, needle, worker=None, job_dir=None):
    path = os.path.join(TMP, f"bad-{uuid.uuid4().hex[:6]}.toml")
    with open(path, "w") as f:
        f.write(config_text)
    env = dict(os.environ, **{MARKER: marker_value})
    cmd = [TOPOLAUNCH, "run", path, "--job-dir", job_dir or os.path.join(TMP, "bad-job"), "--",
           worker or WORKER, "--sleep", "30"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    check(proc.returncode == 2, f"exit {proc.returncode} for {needle!r}: {proc.stderr}")
    lines = proc.stderr.strip().splitlines()
    check(len(lines) == 1, f"one line expected, got: {proc.stderr!r}")
    check(needle in lines[0], f"{needle!r} not in {lines[0]!r}")
    check(not job_processes(), "something was left running")
    print("ok:", lines[0])


def case_bad_input():
    base = '[mapping]\noversubscribe = true\n[job]\nranks_per_node = 2\n'
    expect_bad_input(base + 'name = "x\n', "TOML syntax error")
    expect_bad_input(base + 'restart = 1\n', 'did you mean "restarts"')
    expect_bad_input(base + 'restarts = "2"\n', "expected an integer")
    expect_bad_input(base + 'restarts = -1\n', "out of range")
    expect_bad_input(base + '[budget]\nmemory = "16GB"\n', '"16GB" is not a size')
    expect_bad_input(base + '[budget]\nmemory = "900PiB"\n', "absurdly large")
    expect_bad_input(base, "not found in PATH", worker="no-such-worker-program")
    expect_bad_input(base, "job.job_dir", job_dir="/dev/null/job")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    # preflight off: the [rdma] preflight stage (default "quick") runs before the store starts
    # and prints its own line.
    expect_bad_input(base + f'[wireup]\nport = {port}\n[rdma]\npreflight = "off"\n', str(port))
    taken.close()
    # job.start = "early" refused with a preflight (the default "quick") or a switch tree.
    expect_bad_input(base + 'start = "early"\n', 'job.start: "early" starts the workers before')
    expect_bad_input('[job]\nranks_per_node = 2\nstart = "early"\n[mapping]\noversubscribe = true\n'
                     'topology_conf = "/etc/slurm/topology.conf"\n[rdma]\npreflight = "off"\n',
                     "mapping.topology_conf (line 6) orders them by the switch tree")


def case_early_start_standalone():
    """job.start = "early" outside Slurm: no exchange, so the same as "checked": every rank's
    environment, the store exchange, and the start marks of the standalone run."""
    config = write_config(extra_job='start = "early"')
    rc, out, err = finish(start(config, "--exchange", "--sleep", "0.2"))
    check(rc == 0, f"exit {rc}\n{err}")
    check(report()["status"] == "succeeded", report()["status"])
    for r in range(4):
        log = log_of(r)
        for expected in [f"env RANK={r}", f"env LOCAL_RANK={r}", "env WORLD_SIZE=4",
                         "env LOCAL_WORLD_SIZE=4", "exchange 4/4"]:
            check(expected in log, f"rank {r}: '{expected}' missing from its log:\n{log}")
    check(not job_processes(), "something was left running")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}
if CASE not in CASES:
    fail(f"unknown case {CASE}; known: {', '.join(CASES)}")
CASES[CASE]()
print("PASS", CASE)
