#!/usr/bin/env python3
"""Starts N ranks of an rdma integration worker on this host, exchanging addresses through a
directory store in a fresh temporary directory, and checks what they report.

  run_ranks.py WORKER --world N --tls T --mode exchange|allreduce [--sizes a,b] [--expect-lane L]
  run_ranks.py WORKER --world N --tls T --mode survive --kill RANK [--detect-within S]

Every rank runs under a deadline; on any failure all ranks are killed and reaped (a zombie counts
as alive to UCX's keepalive, so killed ranks are waited for at once). Exit 0 = pass."""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("worker")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--tls", required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--sizes", default="1")
    ap.add_argument("--chunk", default="0")
    ap.add_argument("--expect-lane", default="", help="regex one lane of every rank must match")
    ap.add_argument("--kill", type=int, default=-1)
    ap.add_argument("--detect-within", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()

    store = tempfile.mkdtemp(prefix="rdma-it-")
    env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n")
    procs = []
    try:
        for r in range(a.world):
            cmd = [a.worker, "--dir", store, "--rank", str(r), "--world", str(a.world),
                   "--tls", a.tls, "--mode", a.mode, "--sizes", a.sizes, "--chunk", a.chunk]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          env=env, text=True))
        deadline = time.monotonic() + a.timeout
        if a.mode == "survive":
            return survive(a, procs, deadline)
        outputs = []
        ok = True
        for r, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"FAIL: rank {r} did not finish within {a.timeout} s")
                return 1
            outputs.append(out)
            print(f"--- rank {r} (exit {p.returncode})\n{out.strip()}")
            if p.returncode != 0 or "\nok" not in "\n" + out:
                ok = False
            if a.expect_lane:
                m = re.search(r"^transports (.*)$", out, re.M)
                if not m or not re.search(a.expect_lane, m.group(1)):
                    print(f"FAIL: rank {r} lanes {m.group(1) if m else '?'} do not match "
                          f"{a.expect_lane}")
                    ok = False
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(store, ignore_errors=True)


def survive(a, procs, deadline):
    # Wait until every rank is up (prints "ready"), then kill one and time the others.
    for r, p in enumerate(procs):
        while True:
            line = p.stdout.readline()
            if not line:
                print(f"FAIL: rank {r} exited before it was ready (exit {p.wait()})")
                return 1
            if line.startswith("ready"):
                break
    time.sleep(0.3)  # let them run a few hundred barriers
    victim = procs[a.kill]
    killed_at = time.time()
    victim.send_signal(signal.SIGKILL)
    victim.wait()  # reap now: a zombie still counts as alive
    ok = True
    detections = []
    for r, p in enumerate(procs):
        if r == a.kill:
            continue
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"FAIL: rank {r} still running {a.timeout} s after rank {a.kill} was killed (hang)")
            return 1
        m = re.search(r"detected at ([0-9.]+): (.*)", out)
        if p.returncode != 3 or not m:
            print(f"FAIL: rank {r} exit {p.returncode}, no detection line:\n{out}")
            ok = False
            continue
        delay = float(m.group(1)) - killed_at
        detections.append(delay)
        print(f"rank {r}: detected after {delay * 1000:.1f} ms: {m.group(2)}")
        if not re.search(rf"rank {a.kill}\b|rank \d+ failed", m.group(2)):
            print(f"FAIL: rank {r}'s error does not name a failed rank")
            ok = False
    first = min(detections) if detections else float("inf")
    print(f'{{"world": {a.world}, "tls": "{a.tls}", "first_detection_ms": {first * 1000:.1f}}}')
    if first > a.detect_within:
        print(f"FAIL: first detection after {first:.3f} s (bound {a.detect_within} s)")
        ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
