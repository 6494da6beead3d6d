#!/usr/bin/env python3
"""The agent's metrics endpoint ([observe] metrics_port) under 100 scrapes/s, in one run of this
script, on the CPU example job (2 ranks) while it trains: ROUNDS times PHASE seconds with no
scrapes then PHASE seconds of GET /metrics at 100/s from one client (a new connection each, as
Prometheus's scrapes of many targets look), then the same client against Debian's Prometheus
serving its own /metrics (the peer). The step time while scraped includes the client's own CPU
on this host's two cores; the agent's CPU is its own.

Prints one JSON object per measurement with the peer's figure from the same run and the ratio:
  metrics_scrape_latency_ms  p50 and p99 of ours    vs Prometheus's own /metrics
  metrics_agent_cpu          the agent's CPU (% of a core) while scraped vs not scraped
  metrics_step_time          the job's step time (median ms) while scraped vs not scraped
No pass/fail on timing.

usage: bench_metrics_endpoint.py TOPOLAUNCH WORKER SOURCE_ROOT [--out FILE]
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
from example_job import character_level  # noqa: E402  (tests/example_job.py)

topolaunch, worker, root = sys.argv[1:4]
out_file = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
PHASE, RATE, ROUNDS = 6.0, 100.0, 3
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def scrape_for(port, seconds):
    lat, t_end = [], time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        body = c.getresponse().read()
        c.close()
        lat.append((time.monotonic() - t0) * 1e3)
        if not body:
            sys.exit("bench: an empty scrape")
        nxt += 1 / RATE
        time.sleep(max(0.0, nxt - time.monotonic()))
    return lat


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


tmp = tempfile.mkdtemp(prefix="bench-metrics-")
port = free_port()
text = character_level(open(os.path.join(root, "configs", "jobs", "tiny-gpt-cpu.toml")).read())
text = re.sub(r"(?m)^steps = \d+", "steps = 2000", text)
text = re.sub(r"(?m)^log_every = \d+", "log_every = 5", text)
text = text.replace("[job]\n", f'[job]\ncheckpoint_dir = "{tmp}/ckpt"\n', 1)
text += f"\n[observe]\nmetrics_port = {port}\n"
config = os.path.join(tmp, "job.toml")
open(config, "w").write(text)
env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(worker)) + os.pathsep + os.environ["PATH"])
job_dir = os.path.join(tmp, "job")
agent = subprocess.Popen([topolaunch, "run", config, "-q", "--job-dir", job_dir],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
time.sleep(8)  # past the start and the first steps
phases = {"quiet": [], "scraped": []}
for _ in range(ROUNDS):
    for name, scraping in (("quiet", False), ("scraped", True)):
        t0, c0 = time.time(), cpu_s(agent.pid)
        lat = scrape_for(port, PHASE) if scraping else (time.sleep(PHASE) or [])
        phases[name].append({"t0": t0, "t1": time.time(), "cpu": (cpu_s(agent.pid) - c0) / PHASE,
                             "latency": lat})
agent.send_signal(signal.SIGTERM)
agent.wait(timeout=60)


def step_ms(phases):
    ms = []
    for rank in (0, 1):
        for line in open(os.path.join(job_dir, "attempt-0", "metrics", f"rank-{rank}.jsonl")):
            r = json.loads(line)
            if r.get("steps", 0) > 0 and any(p["t0"] + 1 < r["t_unix"] <= p["t1"] for p in phases):
                ms.append(r["wall_ms"] / r["steps"])
    return statistics.median(ms)


prom_port = free_port()
open(os.path.join(tmp, "p.yml"), "w").write("global:\n  scrape_interval: 15s\n")
prom = subprocess.Popen(["prometheus", f"--config.file={os.path.join(tmp, 'p.yml')}",
                         f"--storage.tsdb.path={tmp}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        scrape_for(prom_port, 0.01)
        break
    except OSError:
        time.sleep(0.2)
peer = scrape_for(prom_port, PHASE)
prom.send_signal(signal.SIGTERM)
prom.wait(timeout=30)
steps = {name: step_ms(phase) for name, phase in phases.items()}
shutil.rmtree(tmp, ignore_errors=True)

ours = [x for p in phases["scraped"] for x in p["latency"]]
cpu = {name: statistics.median(p["cpu"] for p in ps) for name, ps in phases.items()}
rows = [
    {"bench": "metrics_scrape_latency_ms_p50", "value": pct(ours, 0.5),
     "peer": "prometheus 2.42's own /metrics, same client", "peer_value": pct(peer, 0.5)},
    {"bench": "metrics_scrape_latency_ms_p99", "value": pct(ours, 0.99),
     "peer": "prometheus 2.42's own /metrics, same client", "peer_value": pct(peer, 0.99)},
    {"bench": "metrics_agent_cpu_percent_of_a_core", "value": 100 * cpu["scraped"],
     "peer": "the same agent, not scraped", "peer_value": 100 * cpu["quiet"]},
    {"bench": "metrics_step_time_ms", "value": steps["scraped"],
     "peer": "the same job, not scraped", "peer_value": steps["quiet"]},
]
for r in rows:
    r["ratio"] = r["value"] / r["peer_value"] if r["peer_value"] else None
    r.update({"scrapes_per_s": len(ours) / (PHASE * ROUNDS), "scrapes": len(ours),
              "phases_s": [PHASE] * ROUNDS,
              "job": "configs/jobs/tiny-gpt-cpu.toml, 2 ranks"})
    print(json.dumps(r))
if out_file:
    with open(out_file, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
