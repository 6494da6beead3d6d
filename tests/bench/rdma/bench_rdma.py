#!/usr/bin/env python3
"""rdma benchmarks, one JSON object per measurement, peer figure from the same run:

1. Preflight bandwidth and latency vs `ucx_perftest` (ucx-utils) on the same transport (tcp,
   shm loopback), 2 processes, alternating reps. Bandwidth: RDMA put of 1 MiB messages into the
   same 1 MiB buffer (perftest's ucp_put_bw pattern; ours is flushed = remote-complete), and ours
   over fresh 64 MiB as the headline. Latency: 8 B put ping-pong, median of one-way (RTT / 2).
   perftest runs with -e (peer error handling), as our endpoints do.
2. Host all-reduce (fp32, ring) bus bandwidth for 2 and 4 ranks on shared memory:
   busbw = 2 (n-1)/n * bytes / time (nccl-tests' definition).

usage: bench_rdma.py PREFLIGHT_WORKER COLLECTIVES_WORKER [REPS]
No pass/fail on timing: exit 0 unless a program fails to run."""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n")
PORT = [13500 + os.getpid() % 400]


def run_ranks(cmds, timeout=300):
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=ENV) for c in cmds]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return outs


def ours(worker, tls, buffer_bytes, total_bytes, iters):
    store = tempfile.mkdtemp(prefix="rdma-bench-")
    try:
        cmds = [[worker, "--dir", store, "--rank", str(r), "--world", "2", "--tls", tls,
                 "--buffer", str(buffer_bytes), "--message", str(1 << 20),
                 "--total", str(total_bytes), "--iters", str(iters)] for r in range(2)]
        outs = run_ranks(cmds)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    rc, out = outs[0]
    if rc != 0:
        raise RuntimeError(f"preflight worker failed ({rc}):\n{out}")
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    bw = [l for l in lines if l["stage"] == "bandwidth"][0]["gbytes_per_s"]
    lat = [l for l in lines if l["stage"] == "latency"][0]["median_us"]
    return bw, lat


def perftest(tls, test, size, iters):
    PORT[0] += 1
    # -e = peer error handling, like our endpoints; shm then needs posix error handling (1.13).
    env = dict(ENV, UCX_TLS=tls, UCX_POSIX_ERROR_HANDLING="y")
    server = subprocess.Popen(["ucx_perftest", "-p", str(PORT[0]), "-e"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
    time.sleep(0.5)
    try:
        client = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(PORT[0]), "-e", "-t", test,
                                 "-s", str(size), "-n", str(iters), "-f"], capture_output=True,
                                text=True, env=env, timeout=300)
    finally:
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    # final row: iterations, lat p50, lat avg, lat overall, bw avg, bw overall, rate avg, overall
    rows = [l.split() for l in client.stdout.splitlines() if re.match(r"^\s+\d+\s+[0-9.]", l)]
    if client.returncode != 0 or not rows:
        raise RuntimeError(f"ucx_perftest {test} failed:\n{client.stdout}{client.stderr}")
    row = [float(x) for x in rows[-1]]
    return {"lat_p50_us": row[1], "bw_mib_s_overall": row[5]}


def emit(obj):
    print(json.dumps(obj), flush=True)


def main():
    pf_worker, coll_worker = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    if not shutil.which("ucx_perftest"):
        print("ucx_perftest not found: apt-get install ucx-utils", file=sys.stderr)
        return 1
    for tls in ("tcp", "shm"):
        our_bw, our_lat, their_bw, their_lat, fresh_bw = [], [], [], [], []
        for _ in range(reps):
            bw, lat = ours(pf_worker, tls, 1 << 20, 256 << 20, 2000)
            our_bw.append(bw)
            our_lat.append(lat)
            p = perftest(tls, "ucp_put_bw", 1 << 20, 256)
            their_bw.append(p["bw_mib_s_overall"] * 1024 * 1024 / 1e9)
            p = perftest(tls, "ucp_put_lat", 8, 2000)
            their_lat.append(p["lat_p50_us"])
            bw, _ = ours(pf_worker, tls, 64 << 20, 256 << 20, 10)
            fresh_bw.append(bw)
        ob, tb = statistics.median(our_bw), statistics.median(their_bw)
        ol, tl = statistics.median(our_lat), statistics.median(their_lat)
        emit({"bench": "preflight_bandwidth", "transport": tls, "message_bytes": 1 << 20,
              "pattern": "same 1 MiB buffer (perftest's)", "ours_gbytes_per_s": ob,
              "ucx_perftest_gbytes_per_s": tb, "ratio": ob / tb if tb else None,
              "goal_ratio_min": 0.9, "reps": reps,
              "ours_fresh_64MiB_gbytes_per_s": statistics.median(fresh_bw)})
        emit({"bench": "preflight_latency", "transport": tls, "message_bytes": 8,
              "ours_median_us": ol, "ucx_perftest_p50_us": tl,
              "ratio": ol / tl if tl else None, "goal_ratio_max": 1.1, "reps": reps})
    for world in (2, 4):
        count = 16 << 20  # 64 MiB of fp32
        store = tempfile.mkdtemp(prefix="rdma-bench-")
        try:
            cmds = [[coll_worker, "--dir", store, "--rank", str(r), "--world", str(world),
                     "--tls", "shm", "--mode", "allreduce", "--sizes", f"{count},{count},{count}"]
                    for r in range(world)]
            outs = run_ranks(cmds)
        finally:
            shutil.rmtree(store, ignore_errors=True)
        rc, out = outs[0]
        if rc != 0:
            raise RuntimeError(f"collectives worker failed:\n{out}")
        secs = [float(m) for m in re.findall(r"fp32_seconds=([0-9.]+)", out)]
        best = min(secs)
        nbytes = count * 4
        emit({"bench": "host_allreduce_busbw", "transport": "shm", "ranks": world,
              "bytes": nbytes, "best_seconds": best, "runs": len(secs),
              "algbw_gbytes_per_s": nbytes / best / 1e9,
              "busbw_gbytes_per_s": 2 * (world - 1) / world * nbytes / best / 1e9})
    return 0


if __name__ == "__main__":
    sys.exit(main())
