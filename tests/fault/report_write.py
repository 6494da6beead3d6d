#!/usr/bin/env python3
"""report.json on a full disk: the error names errno, no partial report is left, and the summary
does not point to a report that is not there.

The job directory is a 4 MiB tmpfs mounted here (as root); the job's one rank fills it and exits
0. Before: "cannot write .../report.json" with no reason, a 0-byte report.json, and the summary's
"report: .../report.json". Now: "cannot write .../report.json: No space left on device", no
report.json and no temporary file beside it, and "report: not written (...)" in the summary.
The job itself succeeded: the exit status stays 0.

usage: report_write.py --topolaunch T
"""
import argparse
import os
import subprocess
import sys
import tempfile


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--topolaunch", required=True)
    args = parser.parse_args()
    check(os.geteuid() == 0, "runs as root (it mounts a small tmpfs)")
    tmp = tempfile.mkdtemp(prefix="topolaunch-enospc-")
    small = os.path.join(tmp, "small")
    os.mkdir(small)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", small],
                           capture_output=True, text=True)
    check(mount.returncode == 0, f"cannot mount a tmpfs: {mount.stderr.strip()}")
    try:
        job_dir = os.path.join(small, "job")
        config = os.path.join(tmp, "job.toml")
        with open(config, "w") as f:
            f.write('[job]\nname = "enospc"\nranks_per_node = 1\n[mapping]\noversubscribe = true\n'
                    '[rdma]\npreflight = "off"\n'
                    '[worker]\ncommand = ["/bin/sh", "-c", "dd if=/dev/zero '
                    'of=\\"$TOPOLAUNCH_JOB_DIR/fill\\" bs=64k 2>/dev/null; echo filled; exit 0"]\n')
        proc = subprocess.run([args.topolaunch, "run", config, "--job-dir", job_dir],
                              capture_output=True, text=True, timeout=60)
        err = proc.stderr
        check(proc.returncode == 0, f"the job itself succeeded, exit 0 expected: "
              f"{proc.returncode}\n{err[-2000:]}")
        report = os.path.join(job_dir, "report.json")
        said = [l for l in err.splitlines() if l.startswith("topolaunch: cannot write")]
        check(len(said) == 1 and said[0].endswith(
            f"cannot write {report}: No space left on device"),
            f"one line naming the file and errno expected: {said}\n{err[-2000:]}")
        print(said[0])
        if os.path.exists(report):
            fail(f"a partial report was left: {os.path.getsize(report)} bytes")
        temps = [n for n in os.listdir(job_dir) if n.startswith(".report.json.tmp")]
        check(not temps, f"temporary files left: {temps}")
        summary = [l for l in err.splitlines() if l.strip().startswith("report:")]
        check(len(summary) == 1 and "not written" in summary[0] and
              "No space left on device" in summary[0] and "report.json," not in summary[0],
              f"the summary should say the report was not written: {summary}")
        print(summary[0].strip())
        print("PASS report_write")
    finally:
        subprocess.run(["umount", "-l", small], capture_output=True)


if __name__ == "__main__":
    main()
