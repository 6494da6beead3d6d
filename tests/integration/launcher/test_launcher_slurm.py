#!/usr/bin/env python3
"""`topolaunch run` inside sbatch on the local 4-node Slurm test cluster (tests/slurm/).

usage: test_launcher_slurm.py TOPOLAUNCH TEST_WORKER SOURCE_ROOT CASE [SPANK_PLUGIN]
Starts a private cluster (tests/slurm/cluster-start), runs the case, stops the cluster.
Cases: env_4x2 (4 nodes x 2 ranks: env per rank, store exchange, report), kill9 (kill -9 one
worker: every worker gone within 5 s, root cause named), usr1 (scancel --signal=USR1 JOBID, i.e. the job step:
workers checkpoint, exit status 3 for requeue), wireup_pmi2 / wireup_pmix / wireup_tcp ([wireup] backend: the
agents exchange through srun --mpi=pmi2 / pmix / the TCP store; env per rank as env_4x2, the report and every
agent's log line name the backend, workers see no PMI variables), preflight_quick ([rdma]
preflight on nodes without RDMA NICs: one line per agent, the job runs), preflight_missing_nic (a
NIC named that does not exist: exit 2 before any worker, root cause named, no restart), mpi4py
(an MPI program: the right allreduce on 2 nodes under srun --mpi=pmix --topolaunch=auto, refused
with one line under topolaunch run), early_start ([job] start = "early": env and binding per rank
as the map says, workers started before the agents' exchange), early_start_mismatch (a 4-GPU node
among 8-GPU ones: the whole map differs from what each node started, the job stops with one line,
exit 2, no worker left running; the same job with start = "checked" runs),
early_start_exchange_fails (the agents' store unreachable after the workers started: every
agent stops them, the attempt fails naming job.start and the exchange, no worker left).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TOPOLAUNCH, WORKER, ROOT, CASE = [os.path.abspath(a) for a in sys.argv[1:4]] + [sys.argv[4]]
# The SPANK plugin, for the cases that run srun --topolaunch=auto ("" = a cluster without it).
PLUGIN = os.path.abspath(sys.argv[5]) if len(sys.argv) > 5 else ""
TMP = tempfile.mkdtemp(prefix="topolaunch-slurm-")
os.chmod(TMP, 0o755)
CLUSTER = os.path.join(TMP, "cluster")
JOB_DIR = os.path.join(TMP, "job")


def fail(message):
    print("FAIL:", message)
    stop_cluster()
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def stop_cluster():
    subprocess.run([os.path.join(ROOT, "tests", "slurm", "cluster-stop"), CLUSTER],
                   capture_output=True)


def slurm_env():
    env = dict(os.environ)
    with open(os.path.join(CLUSTER, "env")) as f:
        for line in f:
            if line.startswith("export "):
                key, value = line[len("export "):].strip().split("=", 1)
                env[key] = value.strip("'\"")
    return env


def sbatch(worker_args, wait=True, extra_config="", rdma='preflight = "off"', job_extra="",
           script_extra=""):
    config = os.path.join(TMP, "job.toml")
    with open(config, "w") as f:
        f.write(f'[job]\nname = "sb"\nranks_per_node = 2\nstop_grace = "5s"\n{job_extra}\n'
                f'[mapping]\noversubscribe = true\n[rdma]\n{rdma}\n' + extra_config)
    script = os.path.join(TMP, "job.sbatch")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N 4
#SBATCH -o {TMP}/out.txt
{script_extra}
{TOPOLAUNCH} run {config} --job-dir {JOB_DIR} --topology {CLUSTER}/topo/%n.xml -- {WORKER} {worker_args}
echo "topolaunch exit $?"
""")
    args = ["sbatch", "--parsable"] + (["--wait"] if wait else []) + [script]
    proc = subprocess.run(args, env=slurm_env(), capture_output=True, text=True, timeout=120)
    return proc.stdout.strip().split(";")[0]


def output():
    with open(os.path.join(TMP, "out.txt")) as f:
        return f.read()


def log_of(rank, attempt=0):
    try:
        with open(os.path.join(JOB_DIR, f"attempt-{attempt}", f"rank-{rank}.log")) as f:
            return f.read()
    except OSError:
        return ""


def wait_started(ranks=8, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        pids = {}
        for r in range(ranks):
            for line in log_of(r).splitlines():
                if line.startswith("pid "):
                    pids[r] = int(line.split()[1])
        if len(pids) == ranks:
            return pids
        time.sleep(0.1)
    fail("workers did not start")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def check_env_4x2(backend):
    out = output()
    check("topolaunch exit 0" in out, out[-2000:])
    rep = json.load(open(os.path.join(JOB_DIR, "report.json")))
    check(rep["status"] == "succeeded" and len(rep["attempts"][0]["ranks"]) == 8, rep)
    check(rep["wireup"] == {"agents": backend, "workers": "tcp"}, rep["wireup"])
    said = [l for l in out.splitlines() if f"agents exchange through {backend} (agent" in l]
    check(len(said) == 4, f"4 agents should log the {backend} backend:\n{out[-2000:]}")
    print("\n".join(said))
    nodes = {}
    for r in range(8):
        log = log_of(r)
        for expected in [f"env RANK={r}", f"env LOCAL_RANK={r % 2}", "env WORLD_SIZE=8",
                         "env LOCAL_WORLD_SIZE=2", f"env GROUP_RANK={r // 2}",
                         "env GROUP_WORLD_SIZE=4", "env PMI_RANK=<unset>",
                         "env PMIX_RANK=<unset>", "exchange 8/8"]:
            check(expected in log, f"rank {r}: {expected!r} missing:\n{log}")
        nodes[r] = rep["attempts"][0]["ranks"][r]["node_name"]
    check(sorted(set(nodes.values())) == ["n1", "n2", "n3", "n4"], nodes)


def case_env_4x2():
    # [wireup] backend "auto" (the default): PMIx when srun offers it (this build has PMIx and
    # PMI2), else PMI2, else the TCP store.
    offered = srun_mpi_plugins()
    expected = "pmix" if "pmix" in offered else "pmi2" if "pmi2" in offered else "tcp"
    sbatch("--exchange --sleep 0.5")
    check_env_4x2(expected)


def srun_mpi_plugins():
    proc = subprocess.run(["srun", "--mpi=list"], env=slurm_env(), capture_output=True, text=True,
                          timeout=30)
    text = proc.stdout + proc.stderr
    return [l.strip() for l in text.splitlines() if l.strip() and " " not in l.strip()
            and ":" not in l]


def case_wireup(backend):
    offered = srun_mpi_plugins()
    check(backend == "tcp" or backend in offered,
          f"the test cluster's srun offers no {backend} plugin: {offered}")
    t0 = time.time()
    sbatch("--exchange --sleep 0.5", extra_config=f'[wireup]\nbackend = "{backend}"\n')
    check_env_4x2(backend)
    print(f"{backend}: 4 agents x 2 ranks in {time.time() - t0:.1f}s (srun --mpi=list: {offered})")


def case_wireup_pmi2():
    case_wireup("pmi2")


def case_wireup_pmix():
    case_wireup("pmix")


def case_wireup_tcp():
    case_wireup("tcp")


def case_preflight_quick():
    # The test cluster's nodes have no RDMA NICs (this host has none): every agent says so in one
    # line and the job runs.
    sbatch("--sleep 0.2", rdma='preflight = "quick"')
    out = output()
    check("topolaunch exit 0" in out, out[-2000:])
    said = [l for l in out.splitlines() if "rdma preflight (quick)" in l]
    check(len(said) == 4 and all("no RDMA NICs here, nothing to check" in l for l in said),
          f"one line per agent expected:\n{out[-2000:]}")
    rep = json.load(open(os.path.join(JOB_DIR, "report.json")))
    check("nothing to check" in rep["preflight"], rep["preflight"])


def case_preflight_missing_nic():
    # A NIC named in the config that no node has: the agents stop before any worker starts,
    # exit 2, the report names the preflight as root cause; no restart.
    sbatch("--sleep 30", rdma='preflight = "quick"\nnics = "mlx5_nosuch"', job_extra="restarts = 2")
    out = output()
    check("topolaunch exit 2" in out, out[-2000:])
    check(not os.path.exists(os.path.join(JOB_DIR, "attempt-1")), "the job was restarted")
    check(not any(log_of(r) for r in range(8)), "a worker started")
    rep = json.load(open(os.path.join(JOB_DIR, "report.json")))
    cause = rep["root_cause"]
    check(rep["status"] == "failed" and cause and cause["phase"] == "preflight"
          and "mlx5_nosuch" in cause["what"], rep)
    print("root cause:", cause["what"])


def host_cpus():
    return sorted(os.sched_getaffinity(0))


def parse_cpus(text):
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    return out


def case_early_start():
    # [job] start = "early" with the agents on the TCP store: each agent starts its workers
    # before the exchange, and they meet the store at their node's relay. Every rank's
    # environment is the map's (rankmap.json, written after the exchange) and its binding too.
    sbatch("--exchange --sleep 0.5", extra_config='[wireup]\nbackend = "tcp"\n',
           job_extra='start = "early"')
    check_env_4x2("tcp")
    themap = json.load(open(os.path.join(JOB_DIR, "rankmap.json")))
    for entry in themap["ranks"]:
        r = entry["rank"]
        log = log_of(r)
        env = dict(l[4:].split("=", 1) for l in log.splitlines() if l.startswith("env "))
        for key, value in entry["env"].items():
            if key in env:
                check(env[key] == value, f"rank {r}: {key}={env[key]!r}, the map says {value!r}")
        check(env["TOPOLAUNCH_RANKMAP_FILE"] == os.path.join(JOB_DIR, "rankmap.json"),
              f"rank {r}: {env['TOPOLAUNCH_RANKMAP_FILE']}")
        # The emulated nodes claim more CPUs than this host has: the map's that exist here.
        want = sorted(set(parse_cpus(entry["cpus"])) & set(host_cpus())) or host_cpus()
        got = parse_cpus(next(l for l in log.splitlines() if l.startswith("affinity "))[9:])
        check(got == want, f"rank {r}: affinity {got}, the map's cpus here {want}")
    rep = json.load(open(os.path.join(JOB_DIR, "report.json")))
    for node in rep["attempts"][0]["nodes"]:
        marks = [name for name, _ in node["start_marks_unix_s"]]
        check(marks.index("workers_started") == marks.index("topology") + 1 and
              marks.index("workers_started") < marks.index("exchange"),
              f"{node['node']}: workers not started before the exchange: {marks}")
        print(node["node"], " ".join(marks))


def worker_pids_alive(marker):
    """Live processes whose command line holds `marker` (this case's workers)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and WORKER.encode() in args and marker.encode() in args:
            found.append(int(pid))
    return found


def case_early_start_mismatch():
    # A node unlike the others (n4: a 4-GPU GH200 board among 8-GPU nodes) with ranks from the
    # GPUs (gpus_per_rank = 4): each agent started its workers from a map of nodes like its own
    # (8 or 4 ranks in all), the agents' map has 7. Every agent stops its workers; the job fails
    # as bad input (exit 2, not restarted) with one line naming job.start and the difference. The
    # same job with start = "checked" runs.
    topo = os.path.join(TMP, "topo")
    shutil.copytree(os.path.join(CLUSTER, "topo"), topo)
    shutil.copy(os.path.join(ROOT, "tests", "fixtures", "topology", "gh200-quad.xml"),
                os.path.join(topo, "n4.xml"))
    configs = {}
    for start in ("early", "checked"):
        configs[start] = os.path.join(TMP, f"{start}.toml")
        with open(configs[start], "w") as f:
            f.write(f'[job]\nname = "mix"\nstart = "{start}"\nstop_grace = "3s"\nrestarts = 2\n'
                    '[mapping]\ngpus_per_rank = 4\n[rdma]\npreflight = "off"\n'
                    '[wireup]\nbackend = "tcp"\n')
    marker = "41.5"  # --sleep 41.5: this case's workers, to find any left behind
    script = os.path.join(TMP, "job.sbatch")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N 4
#SBATCH -o {TMP}/out.txt
{TOPOLAUNCH} run {configs["early"]} --job-dir {JOB_DIR} --topology {topo}/%n.xml -- {WORKER} --sleep {marker}
echo "early exit $?"
{TOPOLAUNCH} run {configs["checked"]} --job-dir {TMP}/checked --topology {topo}/%n.xml -- {WORKER} --sleep 0.2
echo "checked exit $?"
""")
    t0 = time.time()
    proc = subprocess.run(["sbatch", "--parsable", "--wait", script], env=slurm_env(),
                          capture_output=True, text=True, timeout=240)
    out = output()
    check("early exit 2" in out, f"sbatch {proc.returncode}: {out[-3000:]}")
    check("checked exit 0" in out, out[-3000:])
    check(not os.path.exists(os.path.join(JOB_DIR, "attempt-1")), "the job was restarted")
    left = worker_pids_alive(marker)
    check(not left, f"workers left running after the early start failed: {left}")
    rep = json.load(open(os.path.join(JOB_DIR, "report.json")))
    cause = rep["root_cause"]
    check(rep["status"] == "failed" and cause and cause["phase"] == "early-start", rep)
    what = cause["what"]
    check(what.startswith('job.start = "early": the agents\' map differs from the one node ') and
          "world size 7, not " in what and "its workers were stopped" in what, what)
    check("\n" not in what, what)
    said = [l for l in out.splitlines() if 'job.start = "early": the agents\' map differs' in l]
    check(said, out[-3000:])
    # Workers had started (their logs hold their pid), and none outlived the attempt.
    pids = [int(l.split()[1]) for r in range(8) for l in log_of(r).splitlines()
            if l.startswith("pid ")]
    check(pids, "no worker had started: the early start did not start them")
    check(not any(alive(p) for p in pids), f"a worker is still alive: {pids}")
    stopped = [r for r in rep["attempts"][0]["ranks"] if r.get("cause") == "stopped"]
    check(stopped, f"no rank stopped: {rep['attempts'][0]['ranks']}")
    checked = json.load(open(os.path.join(TMP, "checked", "report.json")))
    check(checked["status"] == "succeeded" and len(checked["attempts"][0]["ranks"]) == 7, checked)
    print(f"root cause: {what}")
    print(f"{len(pids)} workers started early, all stopped; {time.time() - t0:.1f}s")


def case_early_start_exchange_fails():
    # The agents' store cannot be reached (TOPOLAUNCH_STORE_HOST names an address no node can
    # reach, wireup.timeout 2 s): each agent's workers are already running when its exchange
    # fails. Every agent stops them and reports the failure (phase "wireup", a failed attempt:
    # exit 1 with no restarts left), and no worker is left.
    marker = "43.5"
    sbatch(f"--sleep {marker}", extra_config='[wireup]\nbackend = "tcp"\ntimeout = "2s"\n',
           job_extra='start = "early"', script_extra="export TOPOLAUNCH_STORE_HOST=192.0.2.1")
    out = output()
    check("topolaunch exit 1" in out, out[-3000:])
    left = worker_pids_alive(marker)
    check(not left, f"workers left running after the exchange failed: {left}")
    pids = [int(l.split()[1]) for r in range(8) for l in log_of(r).splitlines()
            if l.startswith("pid ")]
    check(len(pids) == 8, f"{len(pids)} of 8 workers had started before the exchange")
    check(not any(alive(p) for p in pids), f"a worker is still alive: {pids}")
    rep = json.load(open(os.path.join(JOB_DIR, "report.json")))
    cause = rep["root_cause"]
    check(rep["status"] == "failed" and cause and cause["phase"] == "wireup", rep)
    check(cause["what"].startswith('job.start = "early": the agents\' exchange failed after this '
                                   "node's workers started: "), cause["what"])
    ranks = rep["attempts"][0]["ranks"]
    check(len(ranks) == 8 and all(r["cause"] == "stopped" for r in ranks), ranks)
    print("root cause:", cause["what"])


def case_kill9():
    job_id = sbatch("--sleep 120", wait=False)
    pids = wait_started()
    time.sleep(0.5)
    os.kill(pids[5], signal.SIGKILL)
    t0 = time.time()
    while time.time() - t0 < 5 and any(alive(p) for p in pids.values()):
        time.sleep(0.05)
    elapsed = time.time() - t0
    left = [p for p in pids.values() if alive(p)]
    check(not left, f"workers still alive {elapsed:.1f}s after kill -9: {left}")
    deadline = time.time() + 60
    while time.time() < deadline and "topolaunch exit" not in output():
        time.sleep(0.2)
    out = output()
    check("topolaunch exit 1" in out, out[-2000:])
    cause = json.load(open(os.path.join(JOB_DIR, "report.json")))["root_cause"]
    check(cause and cause["rank"] == 5 and "SIGKILL" in cause["what"], cause)
    print(f"job {job_id}: all 8 workers on 4 nodes gone {elapsed:.2f}s after kill -9")


def case_usr1():
    job_id = sbatch("--sleep 120", wait=False)
    wait_started()
    subprocess.run(["scancel", "--signal=USR1", job_id], env=slurm_env(), check=True)
    deadline = time.time() + 60
    while time.time() < deadline and "topolaunch exit" not in output():
        time.sleep(0.2)
    out = output()
    check("topolaunch exit 3" in out, out[-2000:])
    # Agents on other nodes may still be flushing their rank logs when the batch script prints
    # its exit status: give each log a few seconds to show the checkpoint line.
    for r in range(8):
        deadline = time.time() + 10
        while time.time() < deadline and "checkpointed" not in log_of(r):
            time.sleep(0.1)
        check("checkpointed" in log_of(r), f"rank {r} did not checkpoint:\n{log_of(r)}")


def case_mpi4py():
    # An MPI program on 2 nodes: under srun --mpi=pmix --topolaunch=auto (the plugin binds each
    # task) the allreduce is right; the same program under topolaunch run in the same allocation
    # is refused before it computes (each rank would be a one-process MPI job).
    offered = srun_mpi_plugins()
    check("pmix" in offered, f"the test cluster's srun offers no pmix plugin: {offered}")
    python = next((p for p in (sys.executable, "/usr/bin/python3")
                   if subprocess.run([p, "-c", "import mpi4py"],
                                     capture_output=True).returncode == 0), None)
    check(python, "no python3 here can import mpi4py (apt-get install python3-mpi4py)")
    program = os.path.join(ROOT, "tests", "integration", "foreign", "mpi_allreduce.py")
    config = os.path.join(TMP, "mpi.toml")
    with open(config, "w") as f:
        f.write('[job]\nname = "mpi"\nranks_per_node = 1\n[mapping]\noversubscribe = true\n'
                '[rdma]\npreflight = "off"\n')
    script = os.path.join(TMP, "mpi.sbatch")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N 2
#SBATCH -o {TMP}/out.txt
srun --mpi=pmix --topolaunch=auto -N2 --ntasks-per-node=1 {python} {program} > {TMP}/srun.txt 2>&1
echo "srun exit $?"
{TOPOLAUNCH} run {config} --job-dir {JOB_DIR} --topology {CLUSTER}/topo/%n.xml -- {python} {program}
echo "topolaunch exit $?"
""")
    subprocess.run(["sbatch", "--parsable", "--wait", script], env=slurm_env(),
                   capture_output=True, text=True, timeout=240)
    out = output()
    with open(os.path.join(TMP, "srun.txt")) as f:
        srun_out = f.read()
    check("srun exit 0" in out, f"{out[-2000:]}\n{srun_out[-2000:]}")
    results = sorted(l for l in srun_out.splitlines() if ": allreduce " in l)
    check(len(results) == 2 and all("of 2 on " in l and "allreduce 3 (expected 3)" in l
                                     for l in results), srun_out[-2000:])
    check(len({l.split(" on ")[1].split(":")[0] for l in results}) == 2,
          f"the two ranks ran on one node: {results}")
    print("\n".join(results))
    check("topolaunch exit 2" in out, out[-3000:])
    check(not any(": allreduce " in log_of(r) for r in range(2)), "a rank computed as a singleton")
    said = [l for l in out.splitlines() if "root cause:" in l]
    check(len(said) == 1 and "topolaunch run is not an MPI launcher" in said[0] and
          "srun --mpi=pmix --topolaunch=auto" in said[0], out[-3000:])
    print(said[0].strip())


try:
    proc = subprocess.run([os.path.join(ROOT, "tests", "slurm", "cluster-start"), CLUSTER]
                          + ([PLUGIN] if PLUGIN else []), capture_output=True, text=True,
                          timeout=180)
    if proc.returncode != 0:
        print("FAIL: cluster-start:", proc.stderr.strip()[-1000:])
        sys.exit(1)
    {"env_4x2": case_env_4x2, "kill9": case_kill9, "usr1": case_usr1,
     "wireup_pmi2": case_wireup_pmi2, "wireup_pmix": case_wireup_pmix,
     "wireup_tcp": case_wireup_tcp, "preflight_quick": case_preflight_quick,
     "preflight_missing_nic": case_preflight_missing_nic, "mpi4py": case_mpi4py,
     "early_start": case_early_start, "early_start_mismatch": case_early_start_mismatch,
     "early_start_exchange_fails": case_early_start_exchange_fails}[CASE]()
    print("PASS", CASE)
finally:
    stop_cluster()
    shutil.rmtree(TMP, ignore_errors=True)
