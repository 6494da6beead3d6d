#!/usr/bin/env python3
"""The test cluster's own scripts under failure: a start that fails leaves no daemon, and
cluster-stop kills and names a daemon that does not answer SIGTERM (tests/slurm/cluster-start,
cluster-stop).

  test_cluster_scripts.py --scripts tests/slurm [-k NAME]

Each case starts (or fails to start) a private cluster in its own directory, then looks at /proc
for any process that belongs to it: a daemon whose arguments name the directory, or a pid from
its pid files. Prints PASS/FAIL per case with the seconds it took; exit 1 when any failed.
"""
import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def port_free(port):
    """Nothing binds `port` and no TCP socket, in any state, uses it (cluster-start's port_taken
    reads /proc/net/tcp{,6} the same way: a TIME_WAIT that bind() would allow counts)."""
    needle = ":%04X" % port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                if any(line.split()[1].endswith(needle) for line in f.readlines()[1:]):
                    return False
        except OSError:
            pass
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def hold_port_with_free_neighbours(attempts=50):
    """A listening socket on a port P whose neighbours P-2..P+2 are free: the cluster's range
    (base P-2, five ports) then fails on P alone, whatever else the machine listens on. P is
    outside the ephemeral range (ip_local_port_range), as cluster-start's own ranges are: there
    no outgoing connection of a test running beside this one takes a neighbour between this
    check and cluster-start's."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(v) for v in f.read().split())
    lo, hi = (10002, low - 3) if low - 3 > 10102 else (high + 3, 65530)
    rng = random.Random()
    for _ in range(attempts):
        taken = rng.randrange(lo, hi)
        if not all(port_free(taken + d) for d in (-2, -1, 0, 1, 2)):
            continue
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("0.0.0.0", taken))
        except OSError:
            holder.close()
            continue
        holder.listen()
        return holder, taken
    raise Failure("no port with four free neighbours in %d tries" % attempts)


def state_of(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def cluster_processes(directory):
    """Live (non-zombie) munged/slurmctld/slurmd/slurmstepd whose arguments name directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open("/proc/%d/comm" % pid) as f:
                comm = f.read().strip()
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if comm not in ("munged", "slurmctld", "slurmd", "slurmstepd"):
            continue
        if any(a.startswith(directory + "/") or ("=" + directory + "/") in a for a in args):
            if state_of(pid) not in (None, "Z"):
                found.append((pid, " ".join(a for a in args if a)))
    return found


def listening(port):
    needle = ":%04X" % port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[1].endswith(needle) and fields[3] == "0A":
                        return True
        except OSError:
            pass
    return False


class Cases:
    def __init__(self, scripts):
        self.scripts = scripts
        self.root = tempfile.mkdtemp(prefix="topolaunch-cluster-scripts-")
        os.chmod(self.root, 0o755)

    def start(self, directory, env_extra=None, timeout=120):
        env = dict(os.environ)
        env.update(env_extra or {})
        t0 = time.monotonic()
        proc = subprocess.run([os.path.join(self.scripts, "cluster-start"), directory],
                              capture_output=True, text=True, env=env, timeout=timeout)
        return proc, time.monotonic() - t0

    def stop(self, directory, env_extra=None):
        env = dict(os.environ)
        env.update(env_extra or {})
        t0 = time.monotonic()
        proc = subprocess.run([os.path.join(self.scripts, "cluster-stop"), directory],
                              capture_output=True, text=True, env=env, timeout=120)
        return proc, time.monotonic() - t0

    def fresh(self, name):
        path = os.path.join(self.root, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def assert_nothing_left(self, directory, when):
        left = cluster_processes(directory)
        if left:
            for pid, _ in left:  # do not leave them to the next case
                os.kill(pid, signal.SIGKILL)
        check(not left, "%s: still running: %s" % (when, left))

    def assert_failed_cleanly(self, proc, directory, reason):
        check(proc.returncode == 1, "cluster-start exited %d, not 1: %s"
              % (proc.returncode, proc.stderr.strip()))
        check(reason in proc.stderr, "stderr does not say %r: %s" % (reason, proc.stderr.strip()))
        self.assert_nothing_left(directory, "after the failed start")
        check("could not stop everything" not in proc.stderr, proc.stderr.strip())

    # --- cases --------------------------------------------------------------------------------
    def test_port_in_use(self):
        """A port of the fixed range already taken: exit 1 naming it, munged stopped again."""
        directory = self.fresh("port")
        holder, taken = hold_port_with_free_neighbours()
        try:
            # The taken port is node n2's: munged and the configuration come first.
            proc, _ = self.start(directory, {"TOPOLAUNCH_SLURM_PORT_BASE": str(taken - 2)})
            self.assert_failed_cleanly(proc, directory, "port %d is in use" % taken)
            check("stopped everything it had started" in proc.stderr, proc.stderr.strip())
        finally:
            holder.close()

    def test_unwritable_directory(self):
        """An empty directory nothing may be written to: exit 1 before any daemon starts."""
        directory = self.fresh("readonly")
        os.mkdir(directory)
        subprocess.run(["chattr", "+i", directory], check=True)
        try:
            proc, _ = self.start(directory)
            self.assert_failed_cleanly(proc, directory, "is not writable")
        finally:
            subprocess.run(["chattr", "-i", directory], check=True)

    def test_nodes_never_ready(self):
        """Nodes not idle by the deadline (n3's slurmd waits for a GPU device file that never
        appears) while slurmctld, the other slurmd and munged run: all of them are stopped."""
        directory = self.fresh("gres")
        configs = os.path.join(self.root, "configs-missing-gpu")
        shutil.rmtree(configs, ignore_errors=True)
        shutil.copytree(os.path.join(self.scripts, "..", "..", "configs", "slurm"), configs)
        with open(os.path.join(configs, "gres.conf.in"), "a") as f:
            f.write("NodeName=n3 Name=gpu File=@DIR@/dev/no-such-device\n")
        proc, seconds = self.start(directory, {"TOPOLAUNCH_SLURM_CONFIGS": configs,
                                               "TOPOLAUNCH_SLURM_START_TIMEOUT": "4",
                                               "TOPOLAUNCH_SLURM_STOP_GRACE": "2"})
        self.assert_failed_cleanly(proc, directory, "nodes not idle after 4s")
        check("stopped everything it had started" in proc.stderr, proc.stderr.strip())
        with open(os.path.join(directory, "log", "slurmd.n1.log")) as f:
            check("slurmd started" in f.read(), "n1's slurmd never ran: the case tests nothing")
        print("  failed start and its cleanup took %.1fs" % seconds)

    def test_stop_kills_stopped_slurmd(self):
        """A slurmd that does not answer SIGTERM (SIGSTOP) is killed, named, and cluster-stop
        exits 3; nothing of the cluster is left and its ports are free."""
        directory = self.fresh("sigstop")
        proc, _ = self.start(directory)
        check(proc.returncode == 0, "cluster-start failed: " + proc.stderr.strip())
        with open(os.path.join(directory, "run", "slurmd.n2.pid")) as f:
            stuck = int(f.read())
        with open(os.path.join(directory, "etc", "slurm.conf")) as f:
            ports = [int(word.split("=")[1]) for line in f for word in line.split()
                     if word.startswith(("Port=", "SlurmctldPort="))]
        os.kill(stuck, signal.SIGSTOP)
        stopped, seconds = self.stop(directory, {"TOPOLAUNCH_SLURM_STOP_GRACE": "2"})
        self.assert_nothing_left(directory, "after cluster-stop")
        check(stopped.returncode == 3, "cluster-stop exited %d, not 3: %s"
              % (stopped.returncode, stopped.stderr.strip()))
        named = [l for l in stopped.stderr.splitlines() if "(pid %d)" % stuck in l]
        check(named and "-N n2" in named[0] and "killed" in named[0],
              "the stuck slurmd is not named: %s" % stopped.stderr.strip())
        check(len(stopped.stderr.strip().splitlines()) == 1,
              "only the stuck slurmd should need SIGKILL: %s" % stopped.stderr.strip())
        busy = [p for p in ports if listening(p)]
        check(len(ports) == 5 and not busy, "ports %s still listening: %s" % (ports, busy))
        print("  cluster-stop took %.1fs with a stopped slurmd (grace 2s)" % seconds)

    def test_stop_without_slurmctld(self):
        """slurmctld gone (killed) and no slurmd pid file left (slurmd removes its own when it
        is told to stop, then may wait for good): cluster-stop still finds and stops every slurmd
        (it once returned 0 with four slurmd running)."""
        directory = self.fresh("noctld")
        proc, _ = self.start(directory)
        check(proc.returncode == 0, "cluster-start failed: " + proc.stderr.strip())
        run = os.path.join(directory, "run")
        with open(os.path.join(run, "slurmctld.pid")) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        for name in os.listdir(run):
            if name.startswith("slurmd."):
                os.unlink(os.path.join(run, name))
        check(len([p for p, args in cluster_processes(directory) if " -N n" in args]) == 4,
              "four slurmd should run before the stop")
        stopped, _ = self.stop(directory, {"TOPOLAUNCH_SLURM_STOP_GRACE": "2"})
        self.assert_nothing_left(directory, "after cluster-stop")
        check(stopped.returncode in (0, 3), "cluster-stop exited %d: %s"
              % (stopped.returncode, stopped.stderr.strip()))

    def test_healthy_stop_is_clean(self):
        """A healthy cluster stops the Slurm way: exit 0, no SIGKILL, nothing left."""
        directory = self.fresh("healthy")
        proc, _ = self.start(directory)
        check(proc.returncode == 0, "cluster-start failed: " + proc.stderr.strip())
        stopped, seconds = self.stop(directory)
        self.assert_nothing_left(directory, "after cluster-stop")
        check(stopped.returncode == 0 and not stopped.stderr.strip(),
              "cluster-stop exited %d: %s" % (stopped.returncode, stopped.stderr.strip()))
        print("  cluster-stop took %.1fs" % seconds)

    def run(self, only):
        names = [n for n in dir(self) if n.startswith("test_") and (not only or only in n)]
        names.sort(key=lambda n: getattr(Cases, n).__code__.co_firstlineno)
        failed = 0
        for name in names:
            t0 = time.monotonic()
            try:
                getattr(self, name)()
                status, why = "PASS", ""
            except Failure as e:
                status, why = "FAIL", str(e)
            failed += status == "FAIL"
            print("%s %s (%.1fs)%s" % (status, name[5:], time.monotonic() - t0,
                                       ": " + why if why else ""), flush=True)
        if not failed:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            print("directories kept in %s" % self.root)
        return 1 if failed or not names else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scripts", required=True, help="the tests/slurm source folder")
    parser.add_argument("-k", help="run only cases whose name contains this")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("FAIL prerequisites: the cluster scripts run as root")
        return 1
    return Cases(os.path.abspath(args.scripts)).run(args.k)


if __name__ == "__main__":
    sys.exit(main())
