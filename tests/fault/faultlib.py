"""What the fault suite's drivers share: the CPU example job (configs/jobs/tiny-gpt-cpu.toml)
shortened into a temporary config, its losses, the processes of a job (found by a marker in
their environment, which every process of the job inherits), the checkpoint directory, and the
one-line JSON result each case prints for tests/fault/repeat_faults.py.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from example_job import character_level  # noqa: E402  (tests/example_job.py)

MARKER = "TOPOLAUNCH_FAULT_MARKER"
RESULT_PREFIX = "RESULT "


class CaseFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CaseFailed(message)


def example_config(source_root, directory, name, steps, every, restarts=1, job=None,
                   checkpoint_dir=None, metrics=None):
    """The example job with [train] shortened to `steps` steps, a checkpoint every `every`, a loss
    logged every step, its checkpoints under `directory` (or `checkpoint_dir`); `job` replaces
    or adds [job] keys (values as TOML text)."""
    with open(os.path.join(source_root, "configs", "jobs", "tiny-gpt-cpu.toml")) as f:
        text = f.read()
    replaced = {
        r"(?m)^steps = \d+": "steps = %d" % steps,
        r"(?m)^checkpoint_every = \d+": "checkpoint_every = %d" % every,
        r"(?m)^log_every = \d+": "log_every = 1",
        r"(?m)^restarts = \d+": "restarts = %d" % restarts,
    }
    for pattern, value in replaced.items():
        text, n = re.subn(pattern, value, text)
        check(n == 1, "the example job has no line matching %s" % pattern)
    # Character-level Jane Austen instead of the prepared BPE tokens: the failure model is what is
    # tested here, and the novels need no preparing.
    try:
        text = character_level(text)
    except ValueError as e:
        check(False, str(e))
    job = dict(job or {})
    for key in list(job):
        text, n = re.subn(r"(?m)^%s = .*$" % re.escape(key), "%s = %s" % (key, job[key]), text)
        if n:
            del job[key]
    checkpoint_dir = checkpoint_dir or os.path.join(directory, "ckpt")
    added = 'checkpoint_dir = "%s"\n' % checkpoint_dir
    added += "".join("%s = %s\n" % item for item in job.items())
    # [job] is the first table: what it gains goes right under the header.
    text = text.replace("[job]\n", "[job]\n" + added, 1)
    text += 'metrics_file = "%s"\n' % (metrics or os.path.join(directory, name + ".jsonl"))
    path = os.path.join(directory, name + ".toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def job_env(worker, marker):
    """topolaunch runs topolaunch-worker from PATH (the build's); every process of the job
    carries the marker."""
    return dict(os.environ, PATH=os.path.dirname(os.path.abspath(worker)) + os.pathsep +
                os.environ.get("PATH", ""), **{MARKER: marker})


def new_marker():
    return uuid.uuid4().hex


def loss_lines(path):
    """(step, loss text) in the order written (%.17g: equal text means equal doubles); a
    restart that resumes writes the steps after its checkpoint again."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line, parse_float=str)
                out.append((record["step"], record["loss"]))
    return out


def losses(path):
    return dict(loss_lines(path))


def check_bit_identical(lines, reference, steps, what):
    """Every loss logged equals the uninterrupted run's at that step, and the last is the end."""
    check(lines, "%s logged no loss" % what)
    for step, loss in lines:
        check(reference.get(step) == loss, "%s: step %d loss %s, uninterrupted %s"
              % (what, step, loss, reference.get(step)))
    check(lines[-1][0] == steps, "%s ended at step %d, not %d" % (what, lines[-1][0], steps))
    check(sorted({s for s, _ in lines}) == list(range(1, steps + 1)),
          "%s did not log every step once at least" % what)


def _environ(pid):
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def alive(pid):
    """The process exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def command_name(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def job_processes(marker, exclude=()):
    """{pid: environment} of the live processes that carry the marker."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude or int(entry) == os.getpid():
            continue
        env = _environ(entry)
        if env is not None and env.get(MARKER) == marker and alive(int(entry)):
            found[int(entry)] = env
    return found


def program(pid):
    """The file name of the program the process runs (a worker that re-executed itself through
    /proc/self/exe is named "exe" in /proc/PID/comm)."""
    try:
        return os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        return "?"


def cmdline(pid):
    """The raw NUL-separated command line (None when the process is gone)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return None


def parent(pid):
    """The parent's pid (0 when the process is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def is_watchdog(pid):
    """A topolaunch process's watchdog: forked without exec, so the same program and command line
    as its parent (launcher/src/containment.cpp)."""
    mine = cmdline(pid)
    return (program(pid) == "topolaunch" and mine is not None
            and mine == cmdline(parent(pid)) and program(parent(pid)) == "topolaunch")


def describe(pids):
    return ", ".join("%d (%s)" % (p, program(p)) for p in sorted(pids)) or "none"


def worker_pids(marker, attempt=None, node=None):
    """{rank: pid} of the job's worker processes (those with TOPOLAUNCH_RANK), of one attempt
    and one Slurm node when given."""
    out = {}
    for pid, env in job_processes(marker).items():
        if "TOPOLAUNCH_RANK" not in env or program(pid) != "topolaunch-worker":
            continue
        # A worker's own short-lived fork (an isolated parse, common/src/isolated.cpp) has the
        # same program and environment: it is not a worker, and taking it made a worker's pid
        # seem to change.
        if program(parent(pid)) == "topolaunch-worker":
            continue
        if attempt is not None and env.get("TOPOLAUNCH_ATTEMPT") != str(attempt):
            continue
        if node is not None and env.get("SLURMD_NODENAME") != node:
            continue
        out[int(env["TOPOLAUNCH_RANK"])] = pid
    return out


def wait_for(predicate, timeout, interval=0.01, what="a condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise CaseFailed("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def wait_gone(pids, timeout):
    """Seconds until none of `pids` is alive (raises after `timeout`)."""
    start = time.monotonic()
    wait_for(lambda: not any(alive(p) for p in pids), timeout, 0.005,
             "processes %s to end" % describe([p for p in pids if alive(p)]))
    return time.monotonic() - start


def generation_name(step):
    return "checkpoint-%012d.bin" % step


def checkpoint_files(directory):
    """The generations and temporaries (not model.json and tokenizer.model, which describe the
    model beside them)."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(n for n in names if n not in ("model.json", "tokenizer.model"))


def temporaries(directory):
    return [n for n in checkpoint_files(directory) if n.startswith(".")]


def read_report(job_dir):
    path = os.path.join(job_dir, "report.json")
    check(os.path.exists(path), "no report.json in " + job_dir)
    with open(path) as f:
        return json.load(f)


def logs_of(job_dir, attempt=None):
    text = ""
    for root, _, files in sorted(os.walk(job_dir)):
        if attempt is not None and os.path.basename(root) != "attempt-%d" % attempt:
            continue
        for name in sorted(files):
            if name.endswith(".log"):
                with open(os.path.join(root, name), errors="replace") as f:
                    text += f.read()
    return text


def resumed_at(log):
    found = re.search(r"resumed from (\S+) at step (\d+)", log)
    return (found.group(1), int(found.group(2))) if found else (None, None)


def emit(result):
    """One JSON line for repeat_faults.py."""
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True))
    sys.stdout.flush()


def kill_all(pids, sig=signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Cluster:
    """A private Slurm test cluster (tests/slurm/cluster-start) in `directory`, from the slurm.conf
    template of configs/slurm with `extra_conf` lines added (the fault cases' own settings)."""

    def __init__(self, source_root, directory, nodes=4, extra_conf=""):
        self.source_root, self.dir, self.nodes = source_root, directory, nodes
        self.configs = directory + "-configs"
        shutil.copytree(os.path.join(source_root, "configs", "slurm"), self.configs)
        if extra_conf:
            with open(os.path.join(self.configs, "slurm.conf.in"), "a") as f:
                f.write(extra_conf)

    def start(self):
        env = dict(os.environ, TOPOLAUNCH_SLURM_CONFIGS=self.configs,
                   TOPOLAUNCH_SLURM_NODES=str(self.nodes))
        proc = subprocess.run([os.path.join(self.source_root, "tests", "slurm", "cluster-start"),
                               self.dir], capture_output=True, text=True, timeout=300, env=env)
        check(proc.returncode == 0, "cluster-start: " + proc.stderr.strip()[-1000:])

    def stop(self):
        return subprocess.run([os.path.join(self.source_root, "tests", "slurm", "cluster-stop"),
                               self.dir], capture_output=True, text=True, timeout=300)

    def env(self, **extra):
        env = dict(os.environ)
        with open(os.path.join(self.dir, "env")) as f:
            for line in f:
                if line.startswith("export "):
                    key, value = line[len("export "):].strip().split("=", 1)
                    env[key] = value.strip("'\"")
        env.update(extra)
        return env

    def node_daemons(self, node):
        """pids of node's slurmd and slurmstepd (each holds the node's log file open)."""
        log = os.path.join(self.dir, "log", "slurmd.%s.log" % node)
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or command_name(int(entry)) not in ("slurmd", "slurmstepd"):
                continue
            try:
                fds = os.listdir("/proc/%s/fd" % entry)
                if any(os.readlink("/proc/%s/fd/%s" % (entry, fd)) == log for fd in fds):
                    found.append(int(entry))
            except OSError:
                pass
        return found

    def slurmd(self, node):
        """pid of this cluster's `slurmd -f DIR/etc/slurm.conf -N node`."""
        conf = os.path.join(self.dir, "etc", "slurm.conf").encode()
        for entry in os.listdir("/proc"):
            if entry.isdigit() and command_name(int(entry)) == "slurmd" and alive(int(entry)):
                raw = cmdline(int(entry))
                if raw is None:
                    continue
                args = raw.split(b"\0")
                if conf in args and b"-N" in args and \
                        args[args.index(b"-N") + 1:][:1] == [node.encode()]:
                    return int(entry)
        raise CaseFailed("no slurmd -N %s" % node)
