#!/usr/bin/env python3
"""rdma benchmarks: one JSON document on stdout, peer figures from the same run.

1. Preflight vs `ucx_perftest` (ucx-utils) on the same transport (UCX_TLS=tcp, shm; loopback,
   2 processes), reps alternating ours / theirs, medians of the reps:
   - latency: 8 B put ping-pong, one way = round trip / 2, median over the iterations (ours:
     the preflight's latency stage; theirs: ucp_put_lat "50.0%ile"), warm-up excluded;
   - bandwidth: 1 MiB puts re-writing one 1 MiB buffer, 256 MiB in all (perftest's ucp_put_bw
     pattern; ours is flushed = remote-complete, both buffers ucp_mem_map ALLOCATE'd like
     perftest's), and beside it ours over a fresh 64 MiB buffer (the preflight's default).
   perftest runs with -e (peer-failure endpoints, as ours) and the UCX settings ours applies
   (UCX_POSIX_ERROR_HANDLING=y; on shm UCX_ALLOC_PRIO with posix first, so the allocated
   buffers are mapped by the posix lane): the same lanes. Its figures without -e and with
   UCX's default settings are reported as a reference (shm: the sysv RMA lane, which
   peer-failure endpoints cannot use in UCX 1.13).
2. Host all-reduce (fp32, ring, UCX shm) bus bandwidth for 2 and 4 ranks, 1 MiB .. 256 MiB:
   busbw = 2 (n-1)/n * bytes / time (nccl-tests' definition); median of the timed reps.

usage: bench_rdma.py PREFLIGHT_WORKER COLLECTIVES_WORKER [REPS] [--out FILE]
No pass/fail on timing: exit 0 unless a program fails to run."""
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n")
PORT = [13500 + os.getpid() % 400]
MIB = 1 << 20
POSIX_FIRST_ALLOC_PRIO = "md:posix,md:sysv,huge,thp,md:*,mmap,heap"  # = kPosixFirstAllocPrio


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
    """Bandwidth (GB/s) and latency (us) of rank 0 -> rank 1, and the transport description."""
    store = tempfile.mkdtemp(prefix="rdma-bench-")
    try:
        cmds = [[worker, "--dir", store, "--rank", str(r), "--world", "2", "--tls", tls,
                 "--buffer", str(buffer_bytes), "--message", str(MIB),
                 "--total", str(total_bytes), "--iters", str(iters)] for r in range(2)]
        outs = run_ranks(cmds)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    rc, out = outs[0]
    if rc != 0 or outs[1][0] != 0:
        raise RuntimeError("preflight worker failed:\n" + "\n".join(
            f"--- rank {r} exit {c}\n{o}" for r, (c, o) in enumerate(outs)))
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    stage = {l["stage"]: l for l in lines}
    return (stage["bandwidth"]["gbytes_per_s"], stage["latency"]["median_us"],
            stage["connectivity"]["message"])


FAILED_RUNS = []


def ours_retry(*args):
    """A failed run of ours is printed, counted in the JSON and run once more (this host is
    shared and overloaded; a failure still ends the benchmark the second time)."""
    try:
        return ours(*args)
    except RuntimeError as e:
        print(e, file=sys.stderr, flush=True)
        FAILED_RUNS.append(str(e).splitlines()[0:12])
        return ours(*args)


def perftest(tls, test, size, iters, err_handling=True):
    PORT[0] += 1
    # -e = peer error handling, like our endpoints; shm then needs posix error handling (1.13),
    # and the UCX settings ours applies (rdma/src/ucx_context.cpp): memory from posix first.
    env = dict(ENV, UCX_TLS=tls)
    if err_handling:
        env["UCX_POSIX_ERROR_HANDLING"] = "y"
        if tls == "shm":
            env["UCX_ALLOC_PRIO"] = POSIX_FIRST_ALLOC_PRIO
    e = ["-e"] if err_handling else []
    server = subprocess.Popen(["ucx_perftest", "-p", str(PORT[0])] + e, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
    time.sleep(0.5)
    try:
        client = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(PORT[0])] + e +
                                ["-t", test, "-s", str(size), "-n", str(iters), "-f"],
                                capture_output=True, text=True, env=env, timeout=300)
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
    return {"lat_p50_us": row[1], "gbytes_per_s": row[5] * MIB / 1e9}  # perftest "MB" = MiB


def med(xs):
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def transport_bench(pf_worker, tls, reps):
    r = {k: [] for k in ("ours_lat", "their_lat", "ours_bw", "their_bw", "their_bw_no_e",
                         "ours_fresh")}
    lanes = ""
    for _ in range(reps):
        bw, lat, lanes = ours_retry(pf_worker, tls, MIB, 256 * MIB, 2000)
        r["ours_bw"].append(bw)
        r["ours_lat"].append(lat)
        r["their_bw"].append(perftest(tls, "ucp_put_bw", MIB, 256)["gbytes_per_s"])
        r["their_lat"].append(perftest(tls, "ucp_put_lat", 8, 2000)["lat_p50_us"])
        bw, _, _ = ours_retry(pf_worker, tls, 64 * MIB, 256 * MIB, 100)
        r["ours_fresh"].append(bw)
        r["their_bw_no_e"].append(
            perftest(tls, "ucp_put_bw", MIB, 256, err_handling=False)["gbytes_per_s"])
    m = {k: med(v) for k, v in r.items()}
    return {
        "transport": tls,
        "ours_endpoint": lanes,
        "latency": {
            "message_bytes": 8, "what": "put ping-pong, one way = RTT/2, median",
            "ours_median_us": m["ours_lat"], "ucx_perftest_p50_us": m["their_lat"],
            "ratio": ratio(m["ours_lat"], m["their_lat"]), "goal_ratio_max": 1.1,
            "ours_reps_us": r["ours_lat"], "ucx_perftest_reps_us": r["their_lat"]},
        "bandwidth": {
            "message_bytes": MIB, "total_bytes": 256 * MIB,
            "pattern": "1 MiB puts re-writing one 1 MiB buffer (perftest's ucp_put_bw)",
            "ours_gbytes_per_s": m["ours_bw"], "ucx_perftest_gbytes_per_s": m["their_bw"],
            "ratio": ratio(m["ours_bw"], m["their_bw"]), "goal_ratio_min": 0.9,
            "ours_fresh_64MiB_flushed_gbytes_per_s": m["ours_fresh"],
            "ucx_perftest_without_e_default_env_gbytes_per_s": m["their_bw_no_e"],
            "ratio_vs_perftest_without_e": ratio(m["ours_bw"], m["their_bw_no_e"]),
            "ours_reps": r["ours_bw"], "ucx_perftest_reps": r["their_bw"],
            "ours_fresh_reps": r["ours_fresh"], "ucx_perftest_without_e_reps": r["their_bw_no_e"]},
    }


def allreduce_bench(coll_worker, world, sizes_bytes, reps):
    counts = [b // 4 for b in sizes_bytes]
    store = tempfile.mkdtemp(prefix="rdma-bench-")
    try:
        cmds = [[coll_worker, "--dir", store, "--rank", str(r), "--world", str(world),
                 "--tls", "shm", "--mode", "busbw", "--reps", str(reps),
                 "--sizes", ",".join(map(str, counts))] for r in range(world)]
        outs = run_ranks(cmds, timeout=600)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    rc, out = outs[0]
    if rc != 0:
        raise RuntimeError(f"collectives worker failed ({rc}):\n{out}")
    transports = re.search(r"^transports (.*)$", out, re.M)
    rows = []
    for m in re.finditer(r"busbw count=(\d+) bytes=(\d+) seconds=([0-9.,]+)", out):
        nbytes = int(m.group(2))
        secs = [float(x) for x in m.group(3).split(",")]
        t = statistics.median(secs)
        rows.append({"bytes": nbytes, "median_seconds": t, "reps_seconds": secs,
                     "algbw_gbytes_per_s": nbytes / t / 1e9,
                     "busbw_gbytes_per_s": 2 * (world - 1) / world * nbytes / t / 1e9})
    return {"ranks": world, "transport": "shm",
            "endpoint": transports.group(1) if transports else "", "dtype": "fp32",
            "algorithm": "ring (reduce-scatter + all-gather), 4 MiB pieces", "sizes": rows}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--out")]
    out_file = None
    if "--out" in sys.argv:
        out_file = sys.argv[sys.argv.index("--out") + 1]
        args.remove(out_file)
    pf_worker, coll_worker = args[0], args[1]
    reps = int(args[2]) if len(args) > 2 else 3
    if not shutil.which("ucx_perftest"):
        print("ucx_perftest not found: apt-get install ucx-utils", file=sys.stderr)
        return 1
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    doc = {"bench": "rdma_preflight_vs_ucx_perftest", "host": platform.node(),
           "cpus": os.cpu_count(), "loadavg_before": load_before, "reps": reps,
           "ucx": subprocess.run(["ucx_info", "-v"], capture_output=True,
                                 text=True).stdout.splitlines()[0].strip("# "),
           "transports": [], "host_allreduce_busbw": []}
    for tls in ("tcp", "shm"):
        doc["transports"].append(transport_bench(pf_worker, tls, reps))
        print(json.dumps(doc["transports"][-1]), file=sys.stderr, flush=True)
    sizes = [MIB, 16 * MIB, 64 * MIB, 256 * MIB]
    for world in (2, 4):
        doc["host_allreduce_busbw"].append(allreduce_bench(coll_worker, world, sizes, reps))
        print(json.dumps(doc["host_allreduce_busbw"][-1]), file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        doc["loadavg_after"] = f.read().split()[:3]
    doc["our_failed_runs_retried"] = FAILED_RUNS
    text = json.dumps(doc, indent=1)
    print(text)
    if out_file:
        with open(out_file, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
