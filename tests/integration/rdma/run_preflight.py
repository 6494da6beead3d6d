#!/usr/bin/env python3
"""Preflight on loopback with real processes.

  run_preflight.py WORKER pass --world N --tls T [--level full|quick]
      every rank exits 0 and reports every stage ok, with bandwidth and latency figures
  run_preflight.py WORKER unreachable --tls T
      world of 2 where rank 1 never starts: rank 0 fails connectivity naming rank 1, exit 4
  run_preflight.py WORKER corrupt --tls T
      rank 1's connection blob in the store is corrupted: rank 0 fails naming rank 1, exit 4
  run_preflight.py WORKER missing-nic
      verbs transport on a NIC that does not exist: the local stage names it, exit 4
  run_preflight.py WORKER no-common-transport
      rank 0 on shm, rank 1 on tcp (no path between them): both fail connectivity naming the
      other rank, exit 4, within seconds
  run_preflight.py WORKER peer-dies --tls T
      rank 1 is killed after the connectivity stage: rank 0 fails naming rank 1 within 5 s of
      the kill (the endpoint's error, not a stage timeout), exit 4
  run_preflight.py WORKER corrupt-nic --tls T
      a real rank 1 publishes a damaged NIC blob: both ranks fail naming the key and rank 1, exit 4
  run_preflight.py WORKER concurrent --world 4 --tls T
      4 ranks on 4 (pretend) nodes: the bandwidth and latency edges run in 2 rounds of 2
All ranks run under a deadline and are killed and reaped on the way out. Every mode also checks
that no process of the run is left once the ranks under test have exited."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def start(worker, store, rank, world, extra):
    cmd = [worker, "--dir", store, "--rank", str(rank), "--world", str(world)] + extra
    env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def lines_of(out):
    res = []
    for line in out.splitlines():
        if line.startswith("{"):
            res.append(json.loads(line))
    return res


def leftovers(store):
    """Processes (ours or their children) still running with the store directory in argv."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and store.encode() in argv:
            found.append(int(pid))
    return found


def finish(procs, timeout):
    outs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed: deadline)"
        outs.append(out)
    return outs


def main():
    worker, mode = sys.argv[1], sys.argv[2]
    args = dict(zip(sys.argv[3::2], sys.argv[4::2]))
    world = int(args.get("--world", "2"))
    tls = args.get("--tls", "tcp")
    level = args.get("--level", "full")
    store = tempfile.mkdtemp(prefix="rdma-pf-")
    procs = []
    try:
        common = ["--tls", tls, "--level", level, "--total", str(32 << 20),
                  "--buffer", str(16 << 20), "--iters", "300"]
        if mode == "pass":
            procs = [start(worker, store, r, world, common) for r in range(world)]
            outs = finish(procs, 240)
            ok = True
            for r, (p, out) in enumerate(zip(procs, outs)):
                print(f"--- rank {r} exit {p.returncode}\n{out.strip()}")
                stages = {l["stage"]: l for l in lines_of(out)}
                want = ["local", "connectivity"] + (["bandwidth", "latency"] if level == "full" else [])
                if p.returncode != 0 or any(not stages.get(s, {}).get("ok") for s in want):
                    ok = False
                if level == "full" and ok:
                    if not stages["bandwidth"]["gbytes_per_s"] > 0 or not stages["latency"]["median_us"] > 0:
                        ok = False
            if leftovers(store):
                print(f"FAIL: processes still running after the ranks exited: {leftovers(store)}")
                ok = False
            print("PASS" if ok else "FAIL")
            return 0 if ok else 1
        short = common + ["--timeout-ms", "3000"]
        if mode == "unreachable":
            p = start(worker, store, 0, 2, short)
            procs = [p]
            t0 = time.monotonic()
            out = finish(procs, 60)[0]
            took = time.monotonic() - t0
            print(out.strip())
            conn = [l for l in lines_of(out) if l["stage"] == "connectivity"]
            ok = (p.returncode == 4 and conn and not conn[0]["ok"]
                  and "ranks not arrived: 1" in conn[0]["message"] and took < 20)
            print(f"exit {p.returncode} after {took:.1f} s")
        elif mode == "corrupt":
            # Pretend to be rank 1: a blob with a flipped byte, and arrive at the fence.
            def put(key, data):
                name = "v." + key.replace("/", "%2f")
                with open(os.path.join(store, name), "wb") as f:
                    f.write(data)
            put("preflight/ep/1/0", b"TLRB\x01\x00\x02\x00\x01\x00\x00\x00\x04\x00\x00\x00abcd\x00\x00\x00\x00")
            put("preflight/hello/1", b"garbage")
            open(os.path.join(store, "fence.0.1"), "w").close()
            p = start(worker, store, 0, 2, short)
            procs = [p]
            out = finish(procs, 60)[0]
            print(out.strip())
            conn = [l for l in lines_of(out) if l["stage"] == "connectivity"]
            ok = (p.returncode == 4 and conn and "corrupted blob from rank 1" in conn[0]["message"]
                  and "preflight/ep/1/0" in conn[0]["message"])
        elif mode == "missing-nic":
            p = start(worker, store, 0, 1, ["--transport", "verbs", "--device", "mlx5_9",
                                            "--level", "quick", "--timeout-ms", "3000"])
            procs = [p]
            out = finish(procs, 60)[0]
            print(out.strip())
            local = [l for l in lines_of(out) if l["stage"] == "local"]
            ok = (p.returncode == 4 and local and not local[0]["ok"]
                  and "NIC mlx5_9 does not exist" in local[0]["message"])
        elif mode == "no-common-transport":
            procs = [start(worker, store, 0, 2, ["--tls", "shm", "--timeout-ms", "3000"]),
                     start(worker, store, 1, 2, ["--tls", "tcp", "--timeout-ms", "3000"])]
            t0 = time.monotonic()
            outs = finish(procs, 60)
            took = time.monotonic() - t0
            ok = took < 20
            for r, (p, out) in enumerate(zip(procs, outs)):
                print(f"--- rank {r} exit {p.returncode}\n{out.strip()}")
                conn = [l for l in lines_of(out) if l["stage"] == "connectivity"]
                other = 1 - r
                if not (p.returncode == 4 and conn and not conn[0]["ok"]
                        and f"cannot reach rank {other}" in conn[0]["message"]):
                    ok = False
            print(f"both exited after {took:.1f} s")
        elif mode == "peer-dies":
            # Long latency stage so the kill lands while rank 0 waits on rank 1.
            long = common[:-2] + ["--iters", "100000000", "--timeout-ms", "60000"]
            procs = [start(worker, store, r, 2, long) for r in range(2)]
            seen = ""
            while True:  # rank 0 reports connectivity, then rank 1 is killed
                line = procs[0].stdout.readline()
                if not line:
                    break
                seen += line
                if '"stage":"connectivity"' in line:
                    break
            procs[1].kill()
            procs[1].wait()  # reaped at once: a zombie still counts as alive to UCX
            killed = time.monotonic()
            out = seen + finish([procs[0]], 60)[0]
            took = time.monotonic() - killed
            print(out.strip())
            failed = [l for l in lines_of(out) if not l["ok"] and "skipped" not in l["message"]]
            ok = (procs[0].returncode == 4 and failed and "rank 1" in failed[0]["message"]
                  and took < 5)
            print(f"rank 0 exit {procs[0].returncode} {took:.2f} s after rank 1 was killed")
        elif mode == "corrupt-nic":
            procs = [start(worker, store, 0, 2, short),
                     start(worker, store, 1, 2, short + ["--corrupt-put", "preflight/nic/"])]
            outs = finish(procs, 60)
            ok = True
            for r, (p, out) in enumerate(zip(procs, outs)):
                print(f"--- rank {r} exit {p.returncode}\n{out.strip()}")
                bw = [l for l in lines_of(out) if l["stage"] == "bandwidth"]
                if not (p.returncode == 4 and bw and not bw[0]["ok"]
                        and "corrupted blob from rank 1" in bw[0]["message"]
                        and "preflight/nic/1" in bw[0]["message"]):
                    ok = False
        elif mode == "concurrent":
            world = int(args.get("--world", "4"))
            procs = [start(worker, store, r, world, common + ["--node", f"node{r}"])
                     for r in range(world)]
            outs = finish(procs, 240)
            ok = True
            for r, (p, out) in enumerate(zip(procs, outs)):
                print(f"--- rank {r} exit {p.returncode}\n{out.strip()}")
                stages = {l["stage"]: l for l in lines_of(out)}
                # even world: edges 0,2,.. in round 1 and 1,3,.. in round 2, two at a time
                want_round = f"(round {r % 2 + 1} of 2, at the same time as "
                if p.returncode != 0 or any(
                        want_round not in stages.get(s, {}).get("message", "")
                        for s in ("bandwidth", "latency")):
                    ok = False
        else:
            print(f"unknown mode {mode}")
            return 2
        left = leftovers(store)
        if left:
            print(f"FAIL: processes still running after the ranks exited: {left}")
            ok = False
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
