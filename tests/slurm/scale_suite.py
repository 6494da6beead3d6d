#!/usr/bin/env python3
"""The `scale` suite: 32 emulated Slurm nodes (three node types) on this host, for real.

Starts a private cluster of --nodes nodes (tests/slurm/cluster-start, TOPOLAUNCH_SLURM_NODES) and:
  run_tcp, run_pmix, run_pmi2  one sbatch -N<nodes> each: `topolaunch run` with 2 ranks per node
        and [wireup] backend = tcp / pmix / pmi2; every rank's environment, binding and store
        exchange checked against the map agent 0 wrote and the library's map (map_oracle);
        then <repeats> launches timed against `srun -N<nodes> -n<ranks>` of the same program in
        the same allocation: time from the command to the last worker started. The program exits
        as soon as it has recorded its start (as /bin/true would); with --linger-ms it stays that
        long first, as a training worker would, so that the early nodes' teardown does not run
        beside the late nodes' start (both launchers alike).
  srun_auto   `srun --topolaunch=auto` over the same nodes and ranks as the job user: every task's
        environment and binding checked; its launch time against plain srun in the same run.
--start early sets [job] start = "early" in the runs' config: each agent starts its workers before
the agents' exchange (the checks above then also see its start marks in that order).
Prints PASS/FAIL per scenario and one JSON object per timing (peer figure, ratio, host load);
--results FILE also gets the JSON lines. Exit 1 when any scenario failed. No pass/fail on timing.

  scale_suite.py --plugin SO --oracle map_oracle --scripts tests/slurm --topolaunch BIN
                 --worker test_worker --starter bench_launch_worker [--nodes 32] [--repeats 3]
                 [--results FILE] [-k NAME] [--keep] [--linger-ms MS] [--start early]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slurm_suite  # noqa: E402  (the cluster, the checks of the task dumps)
from slurm_suite import Failure, check, parse_list, format_list  # noqa: E402

RANKS_PER_NODE = 2
NODE_TYPES = ["dgx-a100", "dgx-h100", "dgx-h100", "pcie-l40s-8gpu"]  # node i: NODE_TYPES[i % 4]
NODE_CPUS = {"dgx-h100": 224, "pcie-l40s-8gpu": 128, "dgx-a100": 256}


def node_type(name):
    return NODE_TYPES[int(name[1:]) % 4]


def load_1m():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class ScaleSuite(slurm_suite.Suite):
    def __init__(self, args):
        super().__init__(args)
        self.nodes = ["n%d" % i for i in range(1, args.nodes + 1)]
        self.ranks = args.nodes * RANKS_PER_NODE
        self.timings = []

    # --- helpers ------------------------------------------------------------------------------
    def record(self, line):
        line.update({"suite": "scale", "nodes": self.args.nodes, "ranks": self.ranks,
                     "host_cpus": os.cpu_count(), "host_load_1m": load_1m()})
        self.timings.append(line)
        print(json.dumps(line, sort_keys=True), flush=True)

    def oracle_for(self, config=None):
        fixtures = os.path.join(self.args.scripts, "..", "fixtures", "slurm")
        argv = [self.args.oracle, "--ranks-per-node", str(RANKS_PER_NODE)]
        if config:
            argv += ["--config", config]
        argv += ["%s=%s" % (n, os.path.join(fixtures, node_type(n) + ".pci.xml"))
                 for n in self.nodes]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        check(proc.returncode == 0, "map_oracle failed: " + proc.stderr.strip())
        return json.loads(proc.stdout)

    def assert_node_healthy(self):
        deadline = time.monotonic() + 30
        while True:
            states = self.cluster.node_states()
            bad = {n: s for n, s in states.items() if s not in ("idle", "completing", "mixed",
                                                                 "allocated")}
            check(not bad, "nodes not healthy afterwards: %s" % bad)
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                break
            check(time.monotonic() < deadline, "nodes not idle 30s afterwards: %s" % states)
            time.sleep(0.3)
        alive = self.cluster.daemons_alive()
        check(all(alive.values()), "a daemon died: %s" % {k: v for k, v in alive.items() if not v})
        crashes = self.cluster.crash_lines()
        check(not crashes, "crash in the logs: %s" % crashes[:3])

    @staticmethod
    def starts_ms(directory, t0_ns):
        starts = []
        for name in os.listdir(directory):
            with open(os.path.join(directory, name)) as f:
                starts.append(int(f.read()))
        return len(starts), (max(starts) - t0_ns) / 1e6 if starts else -1

    # --- topolaunch run -----------------------------------------------------------------------
    def run_backend(self, backend):
        base = os.path.join(self.cluster.jobs, "run-" + backend)
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        os.chmod(base, 0o777)
        config = os.path.join(base, "job.toml")
        with open(config, "w") as f:
            f.write('[job]\nname = "scale-%s"\nranks_per_node = %d\nstop_grace = "5s"\n'
                    'start = "%s"\n'
                    '[mapping]\noversubscribe = true\n[rdma]\npreflight = "off"\n'
                    '[wireup]\nbackend = "%s"\n' % (backend, RANKS_PER_NODE, self.args.start,
                                                     backend))
        topo = os.path.join(self.cluster.dir, "topo", "%n.xml")
        lines = ["#!/bin/bash", "#SBATCH -N %d" % len(self.nodes),
                 "#SBATCH -o %s/out.txt" % base, "now() { date +%s%N; }",
                 # The whole host's CPU (every emulated node is on it), in USER_HZ ticks:
                 # user + nice + system + irq + softirq of /proc/stat's first line.
                 "busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }",
                 # The job user (nobody) has no home: its topology import cache (the agents'
                 # --topology files, launcher/src/job.hpp) goes where a user's ~/.cache would.
                 "export XDG_CACHE_HOME=%s/xdg-cache" % base]
        if self.args.linger_ms > 0:  # bench_worker's BENCH_LINGER_MS, for both launchers
            lines.append("export BENCH_LINGER_MS=%d" % self.args.linger_ms)
        # Peers in the same allocation: plain srun of the workers, and (pmix, pmi2) srun with the
        # same --mpi plugin, whose own start-up cost the agents' step pays too.
        peers = [("peer", "srun")]
        if backend != "tcp":
            peers.append(("peermpi", "srun --mpi=" + backend))
        # The floor of any launcher that starts a program per node first: the agents' binary
        # started once on every node (it reads the config and exits).
        lines += ["t=$(now); srun -N%d -n%d %s check %s >/dev/null; echo \"floor 0 $t $? $(now)\""
                  % (len(self.nodes), len(self.nodes), self.args.topolaunch, config)]
        for i in range(self.args.repeats):
            for kind, srun in peers:
                lines += ["mkdir -p %s/%s-%d" % (base, kind, i),
                          "c=$(busy); t=$(now); BENCH_STARTS_DIR=%s/%s-%d %s -N%d -n%d %s; "
                          "echo \"%s %d $t $? $(now) $c $(busy)\""
                          % (base, kind, i, srun, len(self.nodes), self.ranks, self.args.starter,
                             kind, i)]
            lines += [
                "mkdir -p %s/topolaunch-%d" % (base, i),
                "c=$(busy); t=$(now); BENCH_STARTS_DIR=%s/topolaunch-%d %s run %s -q --job-dir "
                "%s/job-t%d --topology %s -- %s; echo \"topolaunch %d $t $? $(now) $c $(busy)\""
                % (base, i, self.args.topolaunch, config, base, i, topo, self.args.starter, i)]
        lines += ["%s run %s -q --job-dir %s/job --topology %s -- %s --exchange --sleep 0.5; "
                  "echo \"checked run exit $?\"" % (self.args.topolaunch, config, base, topo,
                                                     self.args.worker)]
        script = os.path.join(base, "job.sbatch")
        with open(script, "w") as f:
            f.write("\n".join(lines) + "\n")
        proc = subprocess.run(["sbatch", "--wait", "--parsable", script], env=self.cluster.env(),
                              capture_output=True, text=True, timeout=900)
        with open(os.path.join(base, "out.txt")) as f:
            out = f.read()
        check(proc.returncode == 0 and "checked run exit 0" in out,
              "sbatch failed (%d): %s %s" % (proc.returncode, proc.stderr.strip(), out[-3000:]))
        self.check_run(backend, os.path.join(base, "job"), out)
        times = {"topolaunch": [], "peer": [], "peermpi": []}
        host_cpu = {"topolaunch": [], "peer": [], "peermpi": []}  # ms, command to its end
        tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
        starts_at = {}  # timed topolaunch launch -> its command's start (ns since the epoch)
        floor_ms = None
        for line in out.splitlines():
            words = line.split()
            if len(words) == 5 and words[0] == "floor":
                check(words[3] == "0", "srun ... topolaunch check exited %s" % words[3])
                floor_ms = round((int(words[4]) - int(words[2])) / 1e6, 1)
            if len(words) == 7 and words[0] in times:
                kind, i, t0, status = words[0], int(words[1]), int(words[2]), words[3]
                host_cpu[kind].append(round((int(words[6]) - int(words[5])) * tick_ms))
                check(status == "0", "%s launch %d exited %s" % (kind, i, status))
                started, ms = self.starts_ms(os.path.join(base, "%s-%d" % (kind, i)), t0)
                check(started == self.ranks, "%s launch %d started %d of %d workers"
                      % (kind, i, started, self.ranks))
                times[kind].append(round(ms, 1))
                if kind == "topolaunch":
                    starts_at[i] = t0
        ours, peer = times["topolaunch"], times["peer"]
        check(len(ours) == len(peer) == self.args.repeats, "launch timings missing: " + out[-2000:])
        phases = self.agent_phases(base, starts_at)
        line = {"measurement": "all_workers_started_ms", "launcher": "topolaunch run",
                "wireup": backend, "start": self.args.start,
                "peer": "srun -N%d -n%d" % (len(self.nodes), self.ranks),
                "worker_linger_ms": self.args.linger_ms,
                "ms": ours, "ms_median": statistics.median(ours), "peer_ms": peer,
                "peer_ms_median": statistics.median(peer),
                "ratio": round(statistics.median(ours) / statistics.median(peer), 3),
                "agents_step_floor": "srun -N%d -n%d topolaunch check (wall)" % (len(self.nodes),
                                                                                len(self.nodes)),
                "agents_step_floor_ms": floor_ms,
                # CPU of the whole host from each command to its end (teardown included): on 2
                # cores a launch is CPU-bound, and this is the budget the wall time follows.
                "host_cpu_ms": host_cpu["topolaunch"], "peer_host_cpu_ms": host_cpu["peer"],
                "host_cpu_ratio": round(statistics.median(host_cpu["topolaunch"]) /
                                        max(1, statistics.median(host_cpu["peer"])), 3)}
        if times["peermpi"]:
            line.update({"peer_same_mpi": "srun --mpi=%s -N%d -n%d" % (backend, len(self.nodes),
                                                                         self.ranks),
                         "peer_same_mpi_ms": times["peermpi"],
                         "peer_same_mpi_ms_median": statistics.median(times["peermpi"]),
                         "ratio_same_mpi": round(statistics.median(ours) /
                                                 statistics.median(times["peermpi"]), 3)})
        self.record(line)
        if phases:
            self.record({"measurement": "agent_start_phases_ms", "launcher": "topolaunch run",
                         "wireup": backend, "start": self.args.start, "phases": phases,
                         "note": "ms from the command to the last agent past each step "
                                 "(first: the first agent), medians over the timed launches; "
                                 "agent_cpu_ms: the CPU an agent had used by then (user + "
                                 "system, with its reaped children; mean over the agents)"})

    @staticmethod
    def agent_phases(base, starts_at):
        """The agents' start marks (report.json, nodes[].start_marks_unix_s) of the timed
        launches: per step, the median over launches of the ms from the command to the first
        and to the last agent past it."""
        per_phase, cpu_per_phase = {}, {}
        for i, t0_ns in sorted(starts_at.items()):
            try:
                with open(os.path.join(base, "job-t%d" % i, "report.json")) as f:
                    nodes = json.load(f)["attempts"][0]["nodes"]
            except (OSError, ValueError, KeyError, IndexError):
                continue
            marks, cpu = {}, {}
            for node in nodes:
                for name, at in node.get("start_marks_unix_s", []):
                    marks.setdefault(name, []).append(at * 1e3 - t0_ns / 1e6)
                for name, at in node.get("start_marks_cpu_s", []):
                    cpu.setdefault(name, []).append(at * 1e3)
            for name, ms in marks.items():
                per_phase.setdefault(name, []).append((min(ms), max(ms)))
            for name, ms in cpu.items():
                cpu_per_phase.setdefault(name, []).append(statistics.mean(ms))
        order = ["main", "config", "contained", "topology", "agents_connected", "exchange", "map",
                 "relay", "ready", "workers_started"]
        # In the order the last agent passed them ("workers_started" comes before the exchange
        # with job.start = "early"); the usual order among equals.
        names = sorted(per_phase, key=lambda n: (statistics.median(b for _, b in per_phase[n]),
                                                 order.index(n) if n in order else len(order)))
        return [dict({"step": n,
                      "first_ms": round(statistics.median(a for a, _ in per_phase[n]), 1),
                      "last_ms": round(statistics.median(b for _, b in per_phase[n]), 1)},
                     **({"agent_cpu_ms": round(statistics.median(cpu_per_phase[n]), 2)}
                        if n in cpu_per_phase else {}))
                for n in names]

    def check_run(self, backend, job_dir, out):
        with open(os.path.join(job_dir, "report.json")) as f:
            report = json.load(f)
        check(report["status"] == "succeeded", "report: %s" % report["status"])
        check(report["wireup"]["agents"] == backend, "report wireup: %s" % report["wireup"])
        said = [l for l in out.splitlines() if "agents exchange through %s (agent" % backend in l]
        check(len(said) >= len(self.nodes), "%d agents said they use %s" % (len(said), backend))
        ranks = report["attempts"][0]["ranks"]
        check(len(ranks) == self.ranks, "report has %d ranks" % len(ranks))
        # Every agent's steps in the order it took them: its workers started after its map
        # ("checked") or right after its topology, before the agents' exchange ("early").
        for node in report["attempts"][0]["nodes"]:
            marks = [name for name, _ in node.get("start_marks_unix_s", [])]
            check("workers_started" in marks and "exchange" in marks,
                  "%s: start marks %s" % (node["node"], marks))
            started, exchanged = marks.index("workers_started"), marks.index("exchange")
            if self.args.start == "early":
                check(marks[started - 1] == "topology" and started < exchanged,
                      "%s: early start, yet start marks %s" % (node["node"], marks))
            else:
                check(started == len(marks) - 1, "%s: start marks %s" % (node["node"], marks))
            at = [t for _, t in node["start_marks_unix_s"]]
            check(at == sorted(at), "%s: start marks out of time order %s"
                  % (node["node"], node["start_marks_unix_s"]))
        with open(os.path.join(job_dir, "rankmap.json")) as f:
            themap = json.load(f)
        oracle = {r["rank"]: r for r in self.oracle_for(os.path.join(job_dir, "..",
                                                                     "job.toml"))["ranks"]}
        host_cpus = sorted(os.sched_getaffinity(0))
        stores = {}
        for entry in themap["ranks"]:
            r = entry["rank"]
            with open(os.path.join(job_dir, "attempt-0", "rank-%d.log" % r)) as f:
                log = f.read()
            env = dict(l[4:].split("=", 1) for l in log.splitlines() if l.startswith("env "))
            for key, value in entry["env"].items():
                if key in env:
                    check(env[key] == value, "rank %d: %s=%r, the map says %r"
                          % (r, key, env[key], value))
            for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "TOPOLAUNCH_CPUS"):
                check(key in env, "rank %d: no %s" % (r, key))
            check(env["WORLD_SIZE"] == str(self.ranks), "rank %d: WORLD_SIZE" % r)
            check(env["PMI_RANK"] == "<unset>" and env["PMIX_RANK"] == "<unset>",
                  "rank %d sees the agent's PMI variables" % r)
            # The library's map for the same inputs: same node, GPU and cores.
            o = oracle[r]
            check((entry["hostname"], entry["gpus"], entry["cpus"]) ==
                  (o["hostname"], o["gpus"], o["cpus"]),
                  "rank %d: map %s, library %s" % (r, (entry["hostname"], entry["cpus"]),
                                                   (o["hostname"], o["cpus"])))
            check(ranks[r]["node_name"] == entry["hostname"],
                  "rank %d ran on %s, the map says %s" % (r, ranks[r]["node_name"],
                                                          entry["hostname"]))
            # Binding: the map's cores that exist on this host, else the host's (emulated
            # nodes claim more CPUs than the host has).
            want = sorted(set(parse_list(entry["cpus"])) & set(host_cpus)) or host_cpus
            got = [int(c) for c in next(l for l in log.splitlines()
                                        if l.startswith("affinity "))[9:].split(",")]
            check(got == want, "rank %d: affinity %s, expected %s" % (r, format_list(got),
                                                                      format_list(want)))
            check("exchange %d/%d" % (self.ranks, self.ranks) in log,
                  "rank %d: store exchange incomplete: %s" % (r, [l for l in log.splitlines()
                                                                  if "exchange" in l]))
            stores.setdefault(entry["hostname"], set()).add(env["TOPOLAUNCH_STORE_ADDR"])
        # Workers reach the store through their node's relay: one address per node.
        check(all(len(s) == 1 for s in stores.values()) and
              len({next(iter(s)) for s in stores.values()}) == len(self.nodes),
              "store addresses per node: %s" % stores)

    def test_run_tcp(self):
        """topolaunch run, 32 nodes x 2 ranks, agents through the TCP store tree."""
        self.run_backend("tcp")

    def test_run_pmix(self):
        """topolaunch run, 32 nodes x 2 ranks, agents through srun --mpi=pmix."""
        self.run_backend("pmix")

    def test_run_pmi2(self):
        """topolaunch run, 32 nodes x 2 ranks, agents through srun --mpi=pmi2."""
        self.run_backend("pmi2")

    # --- srun --topolaunch=auto ---------------------------------------------------------------
    def test_srun_auto(self):
        """srun --topolaunch=auto -N32 --ntasks-per-node=2: every task's env and binding."""
        prefix = "auto"
        n = len(self.nodes)
        # -c 64: two tasks fit on every node type (the L40S nodes have 128 CPUs).
        proc = self.cluster.run(["srun", "-N%d" % n, "--ntasks-per-node=%d" % RANKS_PER_NODE,
                                 "-c", "64", "--topolaunch=auto", "-o", prefix + ".%t.out",
                                 "/bin/sh", "-c", self.DUMP], timeout=300)
        check(proc.returncode == 0, "srun failed: " + proc.stderr.strip()[-2000:])
        dumps = self.task_dumps(prefix, self.ranks)
        oracle = {r["rank"]: r for r in self.oracle_for()["ranks"]}
        per_node = {}
        for env, status in dumps:
            check("RANK" in env, "a task has no RANK (plugin did not run?)")
            rank = int(env["RANK"])
            node = env.get("SLURMD_NODENAME")
            per_node.setdefault(node, []).append((env, status))
            check(node == oracle[rank]["hostname"], "rank %d ran on %s, the library's map puts "
                  "it on %s" % (rank, node, oracle[rank]["hostname"]))
            for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
                        "CUDA_DEVICE_ORDER"):
                check(env.get(key) == oracle[rank]["env"][key], "rank %d: %s=%r, the map says %r"
                      % (rank, key, env.get(key), oracle[rank]["env"][key]))
            cpus = parse_list(env.get("TOPOLAUNCH_CPUS", ""))
            check(cpus and max(cpus) < NODE_CPUS[node_type(node)],
                  "rank %d: cpus %s outside %s" % (rank, env.get("TOPOLAUNCH_CPUS"), node))
            want = self.expected_binding(env["TOPOLAUNCH_CPUS"], int(env["SLURM_LOCALID"]))
            got = parse_list(status.get("Cpus_allowed_list", ""))
            check(got == want, "rank %d: Cpus_allowed_list %s, expected %s"
                  % (rank, format_list(got), format_list(want)))
            check(env.get("TOPOLAUNCH_BOUND_CPUS") == format_list(want),
                  "rank %d: TOPOLAUNCH_BOUND_CPUS=%r" % (rank, env.get("TOPOLAUNCH_BOUND_CPUS")))
        check(sorted(per_node) == sorted(self.nodes), "tasks ran on %s" % sorted(per_node))
        check(sorted(int(e["RANK"]) for e, _ in dumps) == list(range(self.ranks)), "ranks")
        for node, tasks in per_node.items():
            gpus = [e["CUDA_VISIBLE_DEVICES"] for e, _ in tasks]
            check(len(set(gpus)) == len(gpus), "%s: GPUs shared: %s" % (node, gpus))
            sets = [set(parse_list(e["TOPOLAUNCH_CPUS"])) for e, _ in tasks]
            check(not (sets[0] & sets[1]), "%s: tasks share cpus" % node)
        # Launch time with the plugin against plain srun, interleaved.
        ours, peer = [], []
        for _ in range(self.args.repeats):
            for argv, into in ((["srun", "-N%d" % n, "-n%d" % self.ranks, "/bin/true"], peer),
                               (["srun", "-N%d" % n, "-n%d" % self.ranks, "--topolaunch=auto",
                                 "/bin/true"], ours)):
                t0 = time.monotonic()
                proc = self.cluster.run(argv, timeout=300)
                check(proc.returncode == 0, "%s failed: %s" % (argv, proc.stderr.strip()))
                into.append(round((time.monotonic() - t0) * 1e3, 1))
        self.record({"measurement": "srun_wall_ms", "launcher": "srun --topolaunch=auto",
                     "peer": "srun -N%d -n%d /bin/true" % (n, self.ranks), "ms": ours,
                     "ms_median": statistics.median(ours), "peer_ms": peer,
                     "peer_ms_median": statistics.median(peer),
                     "ratio": round(statistics.median(ours) / statistics.median(peer), 3)})

    # --- driver -------------------------------------------------------------------------------
    def scenarios(self):
        names = [n for n in ScaleSuite.__dict__ if n.startswith("test_")]
        order = sorted(names, key=lambda n: getattr(ScaleSuite, n).__code__.co_firstlineno)
        return [n for n in order if not self.args.k or self.args.k in n]

    def run(self):
        os.environ["TOPOLAUNCH_SLURM_NODES"] = str(self.args.nodes)
        status = super().run()
        if self.args.results:
            with open(self.args.results, "w") as f:
                for line in self.timings:
                    f.write(json.dumps(line, sort_keys=True) + "\n")
        return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plugin", required=True)
    parser.add_argument("--oracle", required=True)
    parser.add_argument("--scripts", required=True, help="the tests/slurm source folder")
    parser.add_argument("--topolaunch", required=True)
    parser.add_argument("--worker", required=True, help="tests/integration/launcher/test_worker")
    parser.add_argument("--starter", required=True, help="tests/bench/launcher/bench_worker")
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", help="also write the timing JSON lines here")
    parser.add_argument("-k", help="run only scenarios whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory")
    parser.add_argument("--start", choices=("checked", "early"), default="checked",
                        help="[job] start of the topolaunch runs (docs/architecture.md)")
    parser.add_argument("--linger-ms", type=int, default=0,
                        help="the timed workers stay this long after recording their start")
    args = parser.parse_args()
    for name in ("topolaunch", "worker", "starter", "oracle", "plugin"):
        setattr(args, name, os.path.abspath(getattr(args, name)))
    return ScaleSuite(args).run()


if __name__ == "__main__":
    sys.exit(main())
