#!/usr/bin/env python3
"""The `slurm` suite: scenarios for the topolaunch SPANK plugin on a real Slurm 22.05 cluster.

Starts one private cluster (tests/slurm/cluster-start: n1, n2 = DGX H100, n3 = 8x L40S PCIe,
n4 = DGX A100, emulated on this host from hwloc XMLs), runs every scenario against it as the
unprivileged user `nobody`, and always stops it. Each scenario prints PASS/FAIL with the reason;
the exit status is 1 when any failed. Timings are printed as one JSON line at the end.

  slurm_suite.py --plugin spank_topolaunch.so --oracle map_oracle --scripts tests/slurm [-k NAME]
"""

import argparse
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import traceback

JOB_USER = "nobody"
PREREQUISITES = [  # (program, Debian package)
    ("munged", "munge"),
    ("slurmctld", "slurmctld"),
    ("slurmd", "slurmd"),
    ("srun", "slurm-client"),
    ("sbatch", "slurm-client"),
    ("runuser", "util-linux"),
]
NODE_XML = {"n1": "dgx-h100", "n2": "dgx-h100", "n3": "pcie-l40s-8gpu", "n4": "dgx-a100"}
NODE_CPUS = {"n1": 224, "n2": 224, "n3": 128, "n4": 256}
CRASH_PATTERN = re.compile(
    r"segfault|Segmentation fault|SIGSEGV|signal 11|core dumped|Aborted|fatal:|terminate called",
    re.IGNORECASE)


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


class Cluster:
    def __init__(self, scripts, plugin, root):
        self.scripts = scripts
        self.plugin = plugin
        self.dir = os.path.join(root, "cluster")
        self.jobs = os.path.join(self.dir, "jobs")
        self.conf = os.path.join(self.dir, "etc", "slurm.conf")
        self.started = False

    def start(self):
        t0 = time.monotonic()
        proc = subprocess.run([os.path.join(self.scripts, "cluster-start"), self.dir, self.plugin],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise Failure("cluster-start failed: " + proc.stderr.strip()[-2000:])
        self.started = True
        return time.monotonic() - t0

    def stop(self):
        t0 = time.monotonic()
        proc = subprocess.run([os.path.join(self.scripts, "cluster-stop"), self.dir],
                              capture_output=True, text=True, timeout=120)
        self.started = False
        if proc.returncode != 0:
            raise Failure("cluster-stop failed: " + proc.stderr.strip()[-2000:])
        return time.monotonic() - t0

    def env(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "MASTER_", "TOPOLAUNCH_"))}
        env["SLURM_CONF"] = self.conf
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        return env

    def run(self, argv, user=JOB_USER, timeout=60, stdin=None):
        """Runs a Slurm command as `user` from the job directory; returns CompletedProcess."""
        if user != "root":
            argv = ["runuser", "-u", user, "--"] + argv
        return subprocess.run(argv, cwd=self.jobs, env=self.env(), capture_output=True,
                              text=True, timeout=timeout, input=stdin)

    def node_states(self):
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], user="root")
        return dict(line.split() for line in proc.stdout.split("\n") if line.strip())

    def daemons_alive(self):
        alive = {}
        run = os.path.join(self.dir, "run")
        for name in sorted(os.listdir(run)):
            with open(os.path.join(run, name)) as f:
                pid = f.read().strip()
            alive[name] = os.path.isdir("/proc/" + pid)
        return alive

    def crash_lines(self):
        lines = []
        log = os.path.join(self.dir, "log")
        for name in sorted(os.listdir(log)):
            with open(os.path.join(log, name), errors="replace") as f:
                lines += [name + ": " + l.strip() for l in f if CRASH_PATTERN.search(l)]
        return lines

    def write_job_file(self, name, text, mode=0o644, owner_root=False):
        path = os.path.join(self.jobs, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        if not owner_root:
            user = pwd.getpwnam(JOB_USER)
            os.chown(path, user.pw_uid, user.pw_gid)
        return path


class Suite:
    def __init__(self, args):
        self.args = args
        self.cluster = None
        self.results = []

    # --- helpers ------------------------------------------------------------------------------
    def oracle(self, nodes, ranks_per_node, extra=()):
        fixtures = os.path.join(self.args.scripts, "..", "fixtures", "slurm")
        argv = [self.args.oracle, "--ranks-per-node", str(ranks_per_node)] + list(extra)
        argv += ["%s=%s" % (n, os.path.join(fixtures, NODE_XML[n] + ".pci.xml")) for n in nodes]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        check(proc.returncode == 0, "map_oracle failed: " + proc.stderr.strip())
        return json.loads(proc.stdout)

    def task_dumps(self, prefix, count):
        """Reads the per-task files written by `srun -o prefix.%t.out` running dump_command."""
        dumps = []
        for t in range(count):
            path = os.path.join(self.cluster.jobs, "%s.%d.out" % (prefix, t))
            check(os.path.exists(path), "task %d wrote no output (%s)" % (t, path))
            env, status = {}, {}
            with open(path) as f:
                for line in f:
                    line = line.rstrip("\n")
                    if line.startswith("STATUS "):
                        key, _, value = line[7:].partition(":")
                        status[key.strip()] = value.strip()
                    elif "=" in line:
                        key, _, value = line.partition("=")
                        env[key] = value
            dumps.append((env, status))
        return dumps

    DUMP = ("env; sed -n 's/^\\(Cpus_allowed_list\\|Uid\\):/STATUS &/p' /proc/self/status")

    def expected_binding(self, intended, local_task):
        """What the plugin must apply: choose_binding() restated (task_binding.hpp)."""
        allowed = sorted(os.sched_getaffinity(0))
        ids = parse_list(intended)
        if ids and set(ids) <= set(allowed):
            return ids
        both = sorted(set(ids) & set(allowed))
        return both if both else [allowed[local_task % len(allowed)]]

    def compare_with_map(self, dumps, themap, nodes):
        ranks = {r["rank"]: r for r in themap["ranks"]}
        seen = set()
        for env, status in dumps:
            check("RANK" in env, "a task has no RANK (plugin did not run?)")
            rank = int(env["RANK"])
            check(rank not in seen, "rank %d appears twice" % rank)
            seen.add(rank)
            expected = ranks[rank]
            for key, value in expected["env"].items():
                check(env.get(key) == value, "rank %d: %s=%r, the map says %r"
                      % (rank, key, env.get(key), value))
            check(env.get("TOPOLAUNCH_CPUS") == expected["cpus"],
                  "rank %d: TOPOLAUNCH_CPUS=%r, the map says %r"
                  % (rank, env.get("TOPOLAUNCH_CPUS"), expected["cpus"]))
            check(env.get("SLURMD_NODENAME") == expected["hostname"],
                  "rank %d ran on %s, the map puts it on %s"
                  % (rank, env.get("SLURMD_NODENAME"), expected["hostname"]))
            check(env.get("MASTER_ADDR") == themap["nodes"][0]["name"],
                  "rank %d: MASTER_ADDR=%r" % (rank, env.get("MASTER_ADDR")))
            check(env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", "rank %d: no CUDA_DEVICE_ORDER"
                  % rank)
            # Applied affinity, read by the task itself from /proc/self/status.
            want = self.expected_binding(expected["cpus"], int(env["SLURM_LOCALID"]))
            got = parse_list(status.get("Cpus_allowed_list", ""))
            check(got == want, "rank %d: Cpus_allowed_list %s, expected %s"
                  % (rank, format_list(got), format_list(want)))
            check(env.get("TOPOLAUNCH_BOUND_CPUS") == format_list(want),
                  "rank %d: TOPOLAUNCH_BOUND_CPUS=%r" % (rank, env.get("TOPOLAUNCH_BOUND_CPUS")))
            check(status.get("Uid", "").split()[:1] == [str(pwd.getpwnam(JOB_USER).pw_uid)],
                  "rank %d did not run as %s" % (rank, JOB_USER))
        check(seen == set(range(themap["world_size"])),
              "ranks seen %s, expected 0..%d" % (sorted(seen), themap["world_size"] - 1))
        ports = {env.get("MASTER_PORT") for env, _ in dumps}
        check(len(ports) == 1 and ports.pop().isdigit(), "MASTER_PORT differs between tasks")

    def assert_node_healthy(self):
        # A failed step's job may still be "completing" for a moment; a node that went down or
        # was drained never comes back by itself.
        deadline = time.monotonic() + 20
        while True:
            states = self.cluster.node_states()
            bad = {n: s for n, s in states.items() if re.search("down|drain|fail|unk", s)}
            check(not bad, "nodes not healthy afterwards: %s" % states)
            if len(states) == 4 and all(s == "idle" for s in states.values()):
                break
            check(time.monotonic() < deadline, "nodes not idle 20s afterwards: %s" % states)
            time.sleep(0.3)
        alive = self.cluster.daemons_alive()
        check(all(alive.values()), "a daemon died: %s" % alive)
        crashes = self.cluster.crash_lines()
        check(not crashes, "crash in the logs: %s" % crashes[:3])

    def expect_step_failure(self, argv, reason_pattern):
        proc = self.cluster.run(argv)
        check(proc.returncode != 0, "exit status 0; stderr: %s" % proc.stderr.strip())
        lines = [l for l in proc.stderr.split("\n") if re.search(reason_pattern, l)]
        check(lines, "no line matching %r in stderr: %s" % (reason_pattern, proc.stderr.strip()))
        check(all("\n" not in l and len(l) < 400 for l in lines), "reason is not one short line")
        self.assert_node_healthy()
        return lines[0]

    # --- scenarios ------------------------------------------------------------------------------
    def test_help(self):
        """srun/sbatch/salloc --help list the options with the [topolaunch] prefix."""
        for cmd in ("srun", "sbatch", "salloc"):
            out = self.cluster.run([cmd, "--help"]).stdout
            for opt in ("--topolaunch=auto|off|verbose", "--topolaunch-config=FILE",
                        "--topolaunch-map=auto|block|cyclic", "--topolaunch-nics=LIST"):
                check(opt in out, "%s --help lacks %s" % (cmd, opt))
            check("[topolaunch]" in out, "%s --help lacks the [topolaunch] prefix" % cmd)

    def test_map_two_dgx_h100(self):
        """srun -N2 --ntasks-per-node=8 on n1-n2: env and binding equal the library's map."""
        prefix = "h100"
        proc = self.cluster.run(["srun", "-N2", "-w", "n[1-2]", "--ntasks-per-node=8", "-c", "28",
                                 "--topolaunch=auto", "-o", prefix + ".%t.out",
                                 "/bin/sh", "-c", self.DUMP])
        check(proc.returncode == 0, "srun failed: " + proc.stderr.strip())
        dumps = self.task_dumps(prefix, 16)
        self.compare_with_map(dumps, self.oracle(["n1", "n2"], 8), ["n1", "n2"])
        gpus = {(e["SLURMD_NODENAME"], e["CUDA_VISIBLE_DEVICES"]) for e, _ in dumps}
        check(len(gpus) == 16, "two ranks of a node share a GPU: %s" % sorted(gpus))

    def test_verbose(self):
        """--topolaunch=verbose prints one line per task naming GPU, cores, NUMA and NIC."""
        proc = self.cluster.run(["srun", "-N1", "-w", "n3", "-n2", "-c", "64",
                                 "--topolaunch=verbose", "true"])
        check(proc.returncode == 0, "srun failed: " + proc.stderr.strip())
        lines = [l for l in proc.stderr.split("\n") if l.startswith("topolaunch: n3 task")]
        check(len(lines) == 2, "expected 2 verbose lines, got: %s" % proc.stderr.strip())
        for line in lines:
            for word in ("gpu ", "cores ", "numa ", "nic ", "bound to cpus", "emulated node"):
                check(word in line, "verbose line lacks %r: %s" % (word, line))

    def test_sbatch_propagation(self):
        """#SBATCH --topolaunch=auto reaches inner srun steps; the batch step is untouched."""
        script = self.cluster.write_job_file("prop.sbatch", "\n".join([
            "#!/bin/sh",
            "#SBATCH -N2 -w n[1-2] --ntasks-per-node=2 -c 112",
            "#SBATCH --topolaunch=auto",
            "#SBATCH -o prop.batch.out",
            "echo BATCH RANK=${RANK:-unset} TOPOLAUNCH_CPUS=${TOPOLAUNCH_CPUS:-unset}"
            " CPUS=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)",
            "srun -o prop.%t.out /bin/sh -c \"" + self.DUMP.replace('"', '\\"') + "\"",
            ""]))
        host_cpus = format_list(sorted(os.sched_getaffinity(0)))
        proc = self.cluster.run(["sbatch", "--wait", script], timeout=120)
        check(proc.returncode == 0, "sbatch --wait failed: %s %s" % (proc.stdout, proc.stderr))
        with open(os.path.join(self.cluster.jobs, "prop.batch.out")) as f:
            batch = f.read()
        check("BATCH RANK=unset TOPOLAUNCH_CPUS=unset CPUS=" + host_cpus in batch,
              "the batch step was touched: %s" % batch.strip())
        dumps = self.task_dumps("prop", 4)
        self.compare_with_map(dumps, self.oracle(["n1", "n2"], 2), ["n1", "n2"])

    def test_bogus_mode(self):
        """--topolaunch=bogus fails fast in srun with a clear line."""
        self.expect_step_failure(["srun", "-N1", "--topolaunch=bogus", "true"],
                                 r"topolaunch=bogus: use auto, off or verbose")

    def test_overlong_value(self):
        """An over-long option value is refused without reaching the nodes."""
        self.expect_step_failure(["srun", "-N1", "--topolaunch=auto",
                                  "--topolaunch-config=" + "a" * 5000, "true"],
                                 r"longer than the limit")
        self.expect_step_failure(["srun", "-N1", "--topolaunch-nics=" + "mlx5_0," * 100, "true"],
                                 r"longer than the limit")

    def test_secret_config(self):
        """A config only root can read is refused: the plugin reads it as the job's user."""
        secret = self.cluster.write_job_file("secret.toml", "[mapping]\npolicy = \"block\"\n",
                                             mode=0o600, owner_root=True)
        line = self.expect_step_failure(
            ["srun", "-N1", "-n1", "--topolaunch=auto", "--topolaunch-config=" + secret, "true"],
            r"topolaunch.*secret\.toml.*Permission denied")
        check("as the job's user" in line, "reason does not say whose identity: " + line)
        self.expect_step_failure(
            ["srun", "-N1", "-n1", "--topolaunch=auto", "--topolaunch-config=/root/secret.toml",
             "true"], r"topolaunch.*/root/secret\.toml: (Permission denied|No such file)")

    def test_toml_error(self):
        """A job config with a TOML syntax error fails the step naming file and line."""
        bad = self.cluster.write_job_file("bad.toml", "[mapping]\npolicy = \n")
        self.expect_step_failure(
            ["srun", "-N1", "-n1", "--topolaunch=auto", "--topolaunch-config=" + bad, "true"],
            r"topolaunch.*bad\.toml:2")

    def test_toml_crash_inputs(self):
        """Table headers that abort toml++ 3.3 fail the step with one line; slurmstepd lives."""
        for i, header in enumerate(["[+]", "[*]", "[.]", "[[["]):
            bad = self.cluster.write_job_file("crash%d.toml" % i, header + "\n")
            t0 = time.monotonic()
            line = self.expect_step_failure(
                ["srun", "-N1", "-n1", "--topolaunch=auto", "--topolaunch-config=" + bad, "true"],
                r"topolaunch.*crash%d\.toml:1:\d+: TOML syntax error" % i)
            check(time.monotonic() - t0 < 30, "srun took %.1f s for %s" % (
                time.monotonic() - t0, header))
            check("table name must start" in line, "unexpected reason: " + line)

    def test_nics_missing(self):
        """--topolaunch-nics naming a NIC a node lacks fails the step naming it and the NICs."""
        line = self.expect_step_failure(
            ["srun", "-N1", "-w", "n1", "-n1", "--topolaunch=auto", "--topolaunch-nics=nosuchnic9",
             "true"], r"--topolaunch-nics=nosuchnic9: node n1 has no NIC nosuchnic9")
        check("its NICs: mlx5_0, mlx5_1" in line, "the node's NICs are not named: " + line)
        for nics in ("mlx5_0", "^mlx5_nosuch"):  # a NIC it has; an exclusion of none
            proc = self.cluster.run(["srun", "-N1", "-w", "n1", "-n1", "--topolaunch=auto",
                                     "--topolaunch-nics=" + nics, "true"])
            check(proc.returncode == 0, "--topolaunch-nics=%s refused: %s" % (
                nics, proc.stderr.strip()))

    def test_mixed_nodes(self):
        """One job over n1..n4 (three node types): a valid map on every node."""
        prefix = "mixed"
        proc = self.cluster.run(["srun", "-N4", "--ntasks-per-node=4", "-c", "32",
                                 "--topolaunch=auto", "-o", prefix + ".%t.out",
                                 "/bin/sh", "-c", self.DUMP])
        check(proc.returncode == 0, "srun failed: " + proc.stderr.strip())
        dumps = self.task_dumps(prefix, 16)
        nodes = ["n1", "n2", "n3", "n4"]
        # Slurm hands each task 32 CPUs (16 cores): the plugin must stay inside them, so the
        # oracle cannot assume whole nodes here; check validity per node instead.
        per_node = {}
        for env, _ in dumps:
            node = env.get("SLURMD_NODENAME")
            per_node.setdefault(node, []).append(env)
            check("RANK" in env and env.get("CUDA_VISIBLE_DEVICES", "") != "",
                  "task on %s has no RANK/GPU" % node)
            cpus = parse_list(env.get("TOPOLAUNCH_CPUS", ""))
            check(cpus and max(cpus) < NODE_CPUS[node],
                  "%s: cpus %s outside the node" % (node, env.get("TOPOLAUNCH_CPUS")))
            check(env.get("WORLD_SIZE") == "16" and env.get("LOCAL_WORLD_SIZE") == "4",
                  "%s: WORLD_SIZE/LOCAL_WORLD_SIZE wrong" % node)
        check(sorted(per_node) == nodes, "tasks ran on %s" % sorted(per_node))
        ranks = sorted(int(e["RANK"]) for e, _ in dumps)
        check(ranks == list(range(16)), "ranks %s" % ranks)
        for node, envs in per_node.items():
            gpus = [e["CUDA_VISIBLE_DEVICES"] for e in envs]
            check(len(set(gpus)) == 4, "%s: GPUs shared between ranks: %s" % (node, gpus))
            cpu_sets = [set(parse_list(e["TOPOLAUNCH_CPUS"])) for e in envs]
            for i in range(len(cpu_sets)):
                for j in range(i + 1, len(cpu_sets)):
                    check(not (cpu_sets[i] & cpu_sets[j]), "%s: ranks share cpus" % node)

    def test_topology_cache(self):
        """Each node keeps its imported topology files (topology_cache): root's, mode 0700, one
        index entry per node file and one import per distinct file; a second step writes none."""
        cache = os.path.join(self.cluster.dir, "topology-cache")

        def step():
            proc = self.cluster.run(["srun", "-N4", "--ntasks-per-node=1", "--topolaunch=auto",
                                     "/bin/sh", "-c", "test -n \"$RANK\""])
            check(proc.returncode == 0, "srun failed: " + proc.stderr.strip())

        def entries():
            found = {}
            for sub in ("files", "topologies"):
                folder = os.path.join(cache, sub)
                check(os.path.isdir(folder), "no %s after a mapped step" % folder)
                for name in os.listdir(folder):
                    found[sub + "/" + name] = os.stat(os.path.join(folder, name)).st_mtime_ns
            return found

        step()
        st = os.stat(cache)
        check(st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700,
              "cache owner %d mode %o" % (st.st_uid, stat.S_IMODE(st.st_mode)))
        first = entries()
        files = [k for k in first if k.startswith("files/")]
        imports = [k for k in first if k.startswith("topologies/")]
        # four node files of three types (n1, n2 DGX H100; n3 L40S; n4 DGX A100)
        check(len(files) == 4, "index entries: %s" % sorted(files))
        check(len(imports) == 3, "imported topologies: %s" % sorted(imports))
        step()
        check(entries() == first, "a second step rewrote cache entries")
        for node in ("n1", "n2", "n3", "n4"):
            with open(os.path.join(self.cluster.dir, "log", "slurmd.%s.log" % node)) as f:
                unused = [line for line in f if "topology cache not" in line]
            check(not unused, "%s: %s" % (node, unused[:1]))

    def test_off_is_untouched(self):
        """Without --topolaunch (site default off) tasks get nothing from the plugin."""
        proc = self.cluster.run(["srun", "-N1", "-n1", "/bin/sh", "-c",
                                 "echo RANK=${RANK:-unset} T=${TOPOLAUNCH_CPUS:-unset}"])
        check(proc.returncode == 0 and "RANK=unset T=unset" in proc.stdout,
              "plugin acted with mode off: %s" % proc.stdout.strip())

    def test_pmi2_across_nodes(self):
        """PMI2 works across the emulated nodes (every rank gets a PMI2 fd and rank)."""
        proc = self.cluster.run(["srun", "--mpi=pmi2", "-N4", "-n4", "/bin/sh", "-c",
                                 "echo $SLURMD_NODENAME ${PMI_FD:-none} ${PMI_RANK:-none}"])
        check(proc.returncode == 0, "srun --mpi=pmi2 failed: " + proc.stderr.strip())
        rows = sorted(l.split() for l in proc.stdout.strip().split("\n"))
        check([r[0] for r in rows] == ["n1", "n2", "n3", "n4"] and
              sorted(r[2] for r in rows) == ["0", "1", "2", "3"] and
              all(r[1] != "none" for r in rows), "PMI2 env: %s" % rows)

    def test_pmix_one_node(self):
        """PMIx works within one node (the server gives every rank its namespace)."""
        proc = self.cluster.run(["srun", "--mpi=pmix", "-N1", "-n2", "/bin/sh", "-c",
                                 "echo ${PMIX_RANK:-none} ${PMIX_NAMESPACE:-none}"])
        check(proc.returncode == 0, "srun --mpi=pmix failed: " + proc.stderr.strip())
        rows = sorted(l.split() for l in proc.stdout.strip().split("\n"))
        check([r[0] for r in rows] == ["0", "1"] and all(r[1] != "none" for r in rows),
              "PMIx env: %s" % rows)

    # --- driver ---------------------------------------------------------------------------------
    def scenarios(self):
        names = [n for n in dir(self) if n.startswith("test_")]
        order = sorted(names, key=lambda n: getattr(Suite, n).__code__.co_firstlineno)
        if self.args.k:
            order = [n for n in order if self.args.k in n]
        return order

    def run(self):
        missing = [(prog, pkg) for prog, pkg in PREREQUISITES
                   if not shutil.which(prog, path="/usr/sbin:/usr/bin:/sbin:/bin")]
        if missing:
            for prog, pkg in missing:
                print("FAIL prerequisites: %s not found: apt-get install %s" % (prog, pkg))
            return 1
        if os.geteuid() != 0:
            print("FAIL prerequisites: the slurm suite runs as root (slurmd must switch users)")
            return 1
        t_suite = time.monotonic()
        root = tempfile.mkdtemp(prefix="topolaunch-slurm-")
        os.chmod(root, 0o755)
        self.cluster = Cluster(self.args.scripts, self.args.plugin, root)
        timings = {}
        failed = 0
        try:
            timings["cluster_start_s"] = round(self.cluster.start(), 2)
            print("cluster started in %.2fs (%s)" % (timings["cluster_start_s"], self.cluster.dir))
            for name in self.scenarios():
                t0 = time.monotonic()
                try:
                    getattr(self, name)()
                    status, why = "PASS", ""
                except Failure as e:
                    status, why = "FAIL", str(e)
                except Exception:
                    status, why = "FAIL", traceback.format_exc().strip().split("\n")[-1]
                failed += status == "FAIL"
                print("%s %s (%.1fs)%s" % (status, name[5:], time.monotonic() - t0,
                                           ": " + why if why else ""), flush=True)
        except Failure as e:
            print("FAIL cluster: %s" % e)
            failed += 1
        finally:
            if self.cluster.started:
                try:
                    timings["cluster_stop_s"] = round(self.cluster.stop(), 2)
                except Failure as e:
                    print("FAIL cluster-stop: %s" % e)
                    failed += 1
            if failed and not self.args.keep:
                print("logs kept in %s/log" % self.cluster.dir)
            elif not self.args.keep:
                shutil.rmtree(root, ignore_errors=True)
        timings["suite_s"] = round(time.monotonic() - t_suite, 2)
        timings["failed"] = failed
        print(json.dumps(timings))
        return 1 if failed else 0


def parse_list(text):
    ids = []
    for part in filter(None, text.replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        ids += range(int(lo), int(hi or lo) + 1)
    return sorted(set(ids))


def format_list(ids):
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else "%d-%d" % (ids[i], ids[j]))
        i = j + 1
    return ",".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plugin", required=True)
    parser.add_argument("--oracle", required=True)
    parser.add_argument("--scripts", required=True, help="the tests/slurm source folder")
    parser.add_argument("-k", help="run only scenarios whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory")
    return Suite(parser.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
