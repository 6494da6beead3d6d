#!/usr/bin/env python3
"""The TCP store under a burst of hostile peers does not flood the job's log.

A job of 2 test-worker ranks runs for a few seconds under `topolaunch run`; meanwhile 1,000
peers connect to its store (TOPOLAUNCH_STORE_ADDR, from a rank's log): half send junk, half
claim a rank with a wrong secret's proof. The job must succeed, and topolaunch's stderr must
hold a handful of "refused" lines and counts, not one line per peer (1,272 lines in 23 s before),
with every refusal counted.

usage: store_noise.py --topolaunch T --worker TEST_WORKER
"""
import argparse
import hashlib
import hmac
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

PEERS = 1000


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def hostile_peer(host, port, junk):
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.settimeout(5)
            if junk:
                s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
            else:
                # Read the challenge, answer with an auth frame whose proof is made up: the
                # framing is right, the secret is not.
                s.recv(4096)
                payload = struct.pack("<qq", 0, 2)
                for blob in (os.urandom(32), hmac.new(b"guess", b"x", hashlib.sha256).digest()):
                    payload += struct.pack("<I", len(blob)) + blob
                # header: u32 magic "TLKV", u16 version 2, u16 op 2 (auth), u32 payload bytes
                s.sendall(b"TLKV" + struct.pack("<HHI", 2, 2, len(payload)) + payload)
            while s.recv(4096):
                pass
    except OSError:
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--topolaunch", required=True)
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="topolaunch-noise-")
    config = os.path.join(tmp, "job.toml")
    with open(config, "w") as f:
        f.write('[job]\nname = "noise"\nranks_per_node = 2\n[mapping]\noversubscribe = true\n'
                '[rdma]\npreflight = "off"\n')
    job_dir = os.path.join(tmp, "job")
    # stderr to a file: a pipe nobody reads while the burst lasts would fill and stop the store
    errors = open(os.path.join(tmp, "stderr.txt"), "w+")
    proc = subprocess.Popen([args.topolaunch, "run", config, "--job-dir", job_dir, "--",
                             args.worker, "--sleep", "8"], stdout=subprocess.DEVNULL,
                            stderr=errors)
    address = None
    deadline = time.monotonic() + 20
    while address is None and time.monotonic() < deadline:
        try:
            with open(os.path.join(job_dir, "attempt-0", "rank-0.log")) as f:
                m = re.search(r"^env TOPOLAUNCH_STORE_ADDR=(\S+):(\d+)$", f.read(), re.M)
                if m:
                    address = (m.group(1), int(m.group(2)))
        except OSError:
            pass
        time.sleep(0.05)
    check(address, "rank 0 did not say its store's address")
    t0 = time.monotonic()
    for i in range(PEERS):
        hostile_peer(*address, junk=i % 2 == 0)
    burst_s = time.monotonic() - t0
    proc.wait(timeout=60)
    errors.seek(0)
    err = errors.read()
    check(proc.returncode == 0, f"the job failed under the burst (exit {proc.returncode}):\n"
          f"{err[-2000:]}")
    lines = [l for l in err.splitlines() if "topolaunch wireup:" in l]
    in_full = [l for l in lines if re.search(r"wireup: refused \S+:\d+", l)]
    counts = [int(m.group(1)) for l in lines
              for m in [re.search(r"refused (\d+) more peers? in", l)] if m]
    print(f"{PEERS} hostile peers in {burst_s:.1f} s: {len(lines)} store lines on stderr "
          f"({len(in_full)} in full, {len(counts)} counts)")
    for line in lines[:8]:
        print("  " + line)
    check(len(in_full) == 5, f"the first 5 refusals in full expected, got {len(in_full)}")
    check(len(in_full) + sum(counts) == PEERS,
          f"every refusal counted once: {len(in_full)} + {sum(counts)} != {PEERS}")
    check(len(lines) <= 6 + int(burst_s / 10) + 2, f"{len(lines)} lines for a {burst_s:.1f} s "
          "burst: more than the first few and one count per 10 s")
    check(any("wrong secret" in l for l in lines) and any("bad frame" in l for l in lines),
          "both kinds of refusal should be named")
    print("PASS store_noise")


if __name__ == "__main__":
    main()
