#!/usr/bin/env python3
"""Launch overhead: `topolaunch run` vs `mpirun -np 8` (Debian Open MPI), same worker, same run.

usage: bench_launch.py TOPOLAUNCH BENCH_WORKER CONFIG [REPEATS]
Measures, from the moment the launcher is started: the time until all 8 workers have started
(the latest start timestamp any worker recorded) and the time until the launcher exited (all
workers exited and were collected). Prints one JSON object per measurement with the peer's median
from the same run and the ratio (topolaunch / peer). No pass/fail on timing.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

topolaunch, worker, config = sys.argv[1:4]
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 7
RANKS = 8


def measure(cmd, extra_env=None):
    starts_dir = tempfile.mkdtemp(prefix="bench-launch-")
    env = dict(os.environ, BENCH_STARTS_DIR=starts_dir, **(extra_env or {}))
    t0 = time.time_ns()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t_end = time.time_ns()
    if proc.returncode != 0:
        sys.exit(f"bench: {cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    starts = []
    for name in os.listdir(starts_dir):
        with open(os.path.join(starts_dir, name)) as f:
            starts.append(int(f.read()))
    shutil.rmtree(starts_dir, ignore_errors=True)
    if len(starts) != RANKS:
        sys.exit(f"bench: {cmd[0]} started {len(starts)} workers, expected {RANKS}")
    return (max(starts) - t0) / 1e6, (t_end - t0) / 1e6


job_root = tempfile.mkdtemp(prefix="bench-launch-jobs-")
launchers = {
    "topolaunch": lambda i: [topolaunch, "run", config, "-q", "--job-dir",
                             os.path.join(job_root, str(i)), "--", worker],
    "mpirun": lambda i: ["mpirun", "-np", str(RANKS), "--oversubscribe", "--allow-run-as-root",
                         "--bind-to", "none", worker],
}
# With SLURM_CONF pointing at a running cluster (tests/slurm/cluster-start), srun -n8 on one node
# is a second peer.
if os.environ.get("SLURM_CONF") and shutil.which("srun"):
    launchers["srun"] = lambda i: ["srun", "-N1", "-n", str(RANKS), "--overcommit",
                                   "--kill-on-bad-exit=1", worker]
if shutil.which("mpirun") is None:
    sys.exit("bench: mpirun not found (apt-get install openmpi-bin)")
results = {name: {"all_started_ms": [], "all_exited_ms": []} for name in launchers}
measure(launchers["topolaunch"](-1))  # warm the page cache for both
measure(launchers["mpirun"](-1))
for i in range(repeats):
    for name, make_cmd in launchers.items():  # interleaved, so drifts hit both alike
        started, exited = measure(make_cmd(i))
        results[name]["all_started_ms"].append(started)
        results[name]["all_exited_ms"].append(exited)
shutil.rmtree(job_root, ignore_errors=True)
peer_names = {"mpirun": "mpirun -np 8 (Open MPI)", "srun": "srun -N1 -n8 (local test cluster)"}
for peer_key in [k for k in launchers if k != "topolaunch"]:
    for metric in ["all_started_ms", "all_exited_ms"]:
        ours = statistics.median(results["topolaunch"][metric])
        peer = statistics.median(results[peer_key][metric])
        print(json.dumps({
            "benchmark": "launcher_local_8_ranks", "metric": metric, "repeats": repeats,
            "topolaunch_median": round(ours, 2), "peer": peer_names[peer_key],
            "peer_median": round(peer, 2), "ratio": round(ours / peer, 3),
            "topolaunch_all": [round(x, 2) for x in results["topolaunch"][metric]],
            "peer_all": [round(x, 2) for x in results[peer_key][metric]],
        }))
