#!/usr/bin/env python3
"""A NIC named in the job that a node lacks is refused, not ignored.

`[rdma] nics = "nosuchnic9"` with the preflight off used to run the job without the NIC (on a
node with NICs with a warning at most, on this host silently). Now
`topolaunch run` exits 2 before any worker, with one line naming the file, the key, the node
and the NICs it has: on this host (no RDMA NICs) and mapped onto the DGX H100 fixture (12 mlx5
NICs). A name the node has still runs, and so does an exclusion ("^nosuchnic9"). With the
preflight on, the preflight stage names it (tests/integration/launcher: preflight_missing_nic).

usage: named_nics.py --topolaunch T --source-root R
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
    parser.add_argument("--source-root", required=True)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="topolaunch-nics-")
    dgx = os.path.join(args.source_root, "tests", "fixtures", "slurm", "dgx-h100.pci.xml")

    def run(nics, topology=None, name="job"):
        config = os.path.join(tmp, name + ".toml")
        with open(config, "w") as f:
            f.write(f'[job]\nname = "nics"\nranks_per_node = 1\n[mapping]\noversubscribe = true\n'
                    f'[rdma]\npreflight = "off"\nnics = "{nics}"\n')
        job_dir = os.path.join(tmp, name)
        cmd = [args.topolaunch, "run", config, "--job-dir", job_dir]
        if topology:
            cmd += ["--topology", topology]
        proc = subprocess.run(cmd + ["--", "/bin/true"], capture_output=True, text=True,
                              timeout=60)
        return proc, config, job_dir

    for label, topology, missing, has in (
            ("this host", None, "has no NICs mlx5_0, nosuchnic9", "it has no RDMA NICs"),
            ("the DGX H100 fixture", dgx, "has no NIC nosuchnic9", "its NICs: mlx5_0, mlx5_1, ")):
        proc, config, job_dir = run("mlx5_0,nosuchnic9", topology, "bad-" + str(len(label)))
        lines = proc.stderr.strip().splitlines()
        check(proc.returncode == 2, f"{label}: exit {proc.returncode}, 2 expected:\n{proc.stderr}")
        check(len(lines) == 1 and f'{config}: rdma.nics = "mlx5_0,nosuchnic9": node ' in lines[0]
              and missing in lines[0] and has in lines[0],
              f"{label}: one line naming the file, key, NIC and the node's NICs: {lines}")
        check(not os.path.exists(os.path.join(job_dir, "attempt-0")), f"{label}: a worker started")
        print(f"{label}: {lines[0]}")
        if label == "this host":
            continue
        for nics in ("mlx5_0", "^nosuchnic9", "mlx5"):
            proc, _, _ = run(nics, topology, "good-" + str(len(nics)))
            check(proc.returncode == 0, f'{label}: nics = "{nics}" refused:\n{proc.stderr}')
        print(f'{label}: "mlx5_0", "^nosuchnic9" and "mlx5" run')
    print("PASS named_nics")


if __name__ == "__main__":
    main()
