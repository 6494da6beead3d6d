#!/usr/bin/env python3
"""[observe] on the CPU example job (configs/jobs/tiny-gpt-cpu.toml: 2 ranks, the built-in
worker) on the novels character by character (nothing to prepare), shortened to STEPS steps,
with tracing on two steps, the agent's metrics port and a core-hour price.

example: a real Prometheus server (Debian's prometheus) scrapes the agent while the job runs, and
  the job's series come back through its HTTP API with job, node and rank labels; then
  - trace.json is trace-event JSON with one process per rank, and in each traced step every op
    of the plan (as `topolaunch-worker --plan-only` counts them) and every gradient bucket;
  - report.json has the cost fields, and each rank's step-time parts sum to its measured step
    time within 5%;
  - `topolaunch report` writes one page with no reference outside itself, headless Chromium
    renders it, and the screenshot shows every plot's own colour (each plot drew data).
  The tracing overhead of the traced steps (against the untraced steps before them) is printed,
  not judged.
bad_input: a metrics port another program holds (`run`), a traced step beyond the run and a
  negative price (`check` and `run`): exit 2, one line naming file:line:col and the key.

usage: observe_example.py CASE --topolaunch T --worker W --source-root R [--screenshot PNG]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
from example_job import character_level  # noqa: E402  (tests/example_job.py)

# STEPS: the job must outlive several of Prometheus's 1 s scrapes on an idle host too (80 steps
# took 2 s there: no scrape saw the agent)
STEPS, TRACED = 400, [30, 31]
# launcher/src/report_page.hpp: kSeriesColours, one per plot
PLOT_COLOURS = {"loss": "d6272a", "tokens_per_s": "1f77b5", "memory": "2ca02d",
                "communication": "9467be", "step_time": "ff7f0f", "timeline": "8c564c"}


def fail(message):
    print("FAIL:", message, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)
    print("ok  ", message.split("\n")[0], flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_config(args, tmp, extra):
    with open(os.path.join(args.source_root, "configs", "jobs", "tiny-gpt-cpu.toml")) as f:
        text = character_level(f.read())
    for pattern, value in {r"(?m)^steps = \d+": f"steps = {STEPS}",
                           r"(?m)^log_every = \d+": "log_every = 10",
                           r"(?m)^checkpoint_every = \d+": "checkpoint_every = 40"}.items():
        text, n = re.subn(pattern, value, text)
        check(n == 1, f"the example job has a line matching {pattern}")
    text = text.replace("[job]\n", f'[job]\ncheckpoint_dir = "{tmp}/ckpt"\n', 1)
    path = os.path.join(tmp, "job.toml")
    with open(path, "w") as f:
        f.write(text + "\n" + extra)
    return path


def worker_env(args):
    return dict(os.environ, PATH=os.path.dirname(os.path.abspath(args.worker)) + os.pathsep +
                os.environ.get("PATH", ""))


def plan_counts(args, config):
    """Ops and buckets of the plan of 2 ranks, as topolaunch-worker --plan-only says."""
    env = dict(os.environ, WORLD_SIZE="2", RANK="0")
    out = subprocess.run([args.worker, "--plan-only", config], capture_output=True, text=True,
                         env=env, timeout=60).stdout
    ops = re.search(r"(?m)^plan: (\d+) ops", out)
    buckets = re.search(r"(?m)^communication: (\d+) buckets", out)
    check(ops and buckets, "topolaunch-worker --plan-only names the ops and buckets:\n" + out)
    return int(ops.group(1)), int(buckets.group(1))


class Prometheus:
    """Debian's prometheus scraping the agent's port every second, storing in tmp."""

    def __init__(self, tmp, target_port):
        exe = shutil.which("prometheus")
        check(exe is not None, "prometheus is installed (Debian's prometheus package)")
        self.port = free_port()
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                    "scrape_configs:\n  - job_name: topolaunch\n    honor_labels: true\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n")
        self.log = open(os.path.join(tmp, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log,
            stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready",
                                          timeout=1).status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        fail("prometheus did not get ready within 30 s:\n" + open(self.log.name).read()[-2000:])

    def query(self, expr):
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        return body["data"]["result"] if body.get("status") == "success" else []

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def png_pixels(path):
    """(width, height, RGB bytes per row) of an 8-bit RGB or RGBA PNG, no interlacing."""
    data = open(path, "rb").read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            check(depth == 8 and colour in (2, 6) and interlace == 0,
                  f"the screenshot is 8-bit RGB(A) (depth {depth}, colour type {colour})")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def colour_counts(path, colours):
    width, height, channels, rows = png_pixels(path)
    wanted = {bytes.fromhex(c): name for name, c in colours.items()}
    counts = {name: 0 for name in colours}
    for row in rows:
        for x in range(0, width * channels, channels):
            name = wanted.get(row[x:x + 3])
            if name:
                counts[name] += 1
    return counts


def chromium_screenshot(page, png, tmp):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    check(exe is not None, "chromium is installed (Debian's chromium package)")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp}/chromium", "--hide-scrollbars", "--window-size=1240,2000",
           f"--screenshot={png}", "file://" + os.path.abspath(page)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    check(proc.returncode == 0 and os.path.exists(png),
          f"headless chromium rendered the page (exit {proc.returncode}):\n{proc.stderr[-2000:]}")


def case_example(args):
    tmp = tempfile.mkdtemp(prefix="topolaunch-observe-")
    port = free_port()
    config = job_config(args, tmp, f"[observe]\ntrace_steps = {TRACED}\nmetrics_port = {port}\n\n"
                                   "[cost]\ncore_hour = 0.05\n")
    n_ops, n_buckets = plan_counts(args, config)
    job_dir = os.path.join(tmp, "job")
    prom = Prometheus(tmp, port)
    try:
        proc = subprocess.Popen([args.topolaunch, "run", config, "--job-dir", job_dir],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=worker_env(args))
        series = {}
        while proc.poll() is None and len(series) < 2:
            try:
                for r in prom.query("topolaunch_step"):
                    series[r["metric"].get("rank")] = r
            except OSError:
                pass
            time.sleep(0.5)
        out, err = proc.communicate(timeout=300)
        check(proc.returncode == 0, f"the example job ran (exit {proc.returncode}):\n{err[-3000:]}")
        time.sleep(1.5)  # the last scrape
        rep = json.load(open(os.path.join(job_dir, "report.json")))
        run_id = rep["run_id"]
        # (a series whose target is gone is stale now: ask for its last value in the window)
        steps = {r["metric"]["rank"]: r
                 for r in prom.query(f'last_over_time(topolaunch_step{{job="{run_id}"}}[5m])')}
        check(sorted(steps) == ["0", "1"] and all(r["metric"].get("node") for r in steps.values()),
              f"prometheus has topolaunch_step of ranks 0 and 1 with job {run_id} and node "
              f"labels: {steps}")
        for name in ("topolaunch_tokens_per_second", "topolaunch_loss",
                     'topolaunch_memory_bytes{kind="host"}', "topolaunch_heartbeat_age_seconds",
                     "topolaunch_comm_bytes_total", 'topolaunch_step_part_seconds{part="compute"}'):
            selector = name.replace("}", f',job="{run_id}"}}') if "{" in name else \
                f'{name}{{job="{run_id}"}}'
            got = prom.query(f"max_over_time({selector}[5m])")
            check(len(got) == 2 and all(float(r["value"][1]) > 0 for r in got),
                  f"prometheus has {name} > 0 for both ranks: {[r['value'][1] for r in got]}")
        restarts = prom.query(f'last_over_time(topolaunch_restarts_total{{job="{run_id}"}}[5m])')
        check(len(restarts) == 1, f"prometheus has the node's topolaunch_restarts_total: {restarts}")
    finally:
        prom.stop()

    trace = json.load(open(os.path.join(job_dir, "trace.json")))
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    check(sorted(names) == [0, 1], f"trace.json: one process per rank: {names}")
    for rank in (0, 1):
        for step in TRACED:
            spans = [e for e in events if e.get("ph") == "X" and e["pid"] == rank
                     and e["args"].get("step") == step]
            ops = {e["args"]["op"] for e in spans if "op" in e["args"]}
            buckets = {e["args"]["bucket"] for e in spans if e["tid"] == 2}
            check(ops == set(range(n_ops)),
                  f"rank {rank} step {step}: every op of the plan ({len(ops)} of {n_ops})")
            check(buckets == set(range(n_buckets)),
                  f"rank {rank} step {step}: every bucket on the communication track "
                  f"({len(buckets)} of {n_buckets})")
            check(all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans),
                  f"rank {rank} step {step}: spans from time zero, none negative")
    align = trace["otherData"]["clock_alignment"]
    print("trace:", rep.get("trace"))
    for o in (p["overhead"] for p in trace["otherData"]["per_rank"]):
        print("tracing overhead: traced steps %s ms, untraced before them %s ms, %.0f ns per span"
              % (o["traced_step_ms"], o["untraced_reference_ms"], o["record_ns_per_span"]))

    cost = rep.get("cost")
    check(cost is not None, "report.json has the cost")
    for key in ("allocation", "energy", "step_time", "tokens", "tokens_per_s", "tokens_per_j",
                "mfu", "price"):
        check(key in cost, f"report.json: cost.{key}")
    check(cost["allocation"]["core_hours"] > 0 and cost["price"]["total"] > 0,
          f"core-hours {cost['allocation']['core_hours']}, cost {cost['price']['total']}")
    check(cost["tokens"] == 2 * STEPS * 4 * 64, f"tokens {cost['tokens']} = 2 ranks x {STEPS} "
          "steps x 4 x 64")
    for r in rep["attempts"][0]["ranks"]:
        s = r["steps"]
        check(s["steps"] == STEPS, f"rank {r['rank']}: step figures of {s['steps']} steps")
        ratio = s["parts_sum_ms"] / s["wall_ms"]
        check(abs(ratio - 1) <= 0.05, "rank %d: step-time parts %.1f ms of %.1f ms measured (%.2f%%)"
              % (r["rank"], s["parts_sum_ms"], s["wall_ms"], 100 * ratio))
        check(s["parts_ms"]["trace"] > 0 and s["parts_ms"]["compute"] > 0,
              f"rank {r['rank']}: compute {s['parts_ms']['compute']:.0f} ms, tracing "
              f"{s['parts_ms']['trace']:.1f} ms")
    st = cost["step_time"]
    check(abs(st["parts_sum_ms"] / st["wall_ms"] - 1) <= 0.05,
          "the job's step-time parts sum to its step time: %.1f of %.1f ms"
          % (st["parts_sum_ms"], st["wall_ms"]))

    page = subprocess.run([args.topolaunch, "report", job_dir], capture_output=True, text=True,
                          timeout=60)
    html_path = os.path.join(job_dir, "report.html")
    check(page.returncode == 0 and page.stdout.strip() == html_path,
          f"topolaunch report wrote {html_path}: {page.stdout}{page.stderr}")
    html = open(html_path).read()
    outside = re.findall(r'(?:src|href)\s*=\s*"|url\(|<script|<link', html)
    check(not outside, f"the page refers to nothing outside itself: {outside[:5]}")
    png = args.screenshot or os.path.join(tmp, "report.png")
    chromium_screenshot(html_path, png, tmp)
    counts = colour_counts(png, PLOT_COLOURS)
    check(all(n >= 30 for n in counts.values()),
          f"every plot drew its data in the screenshot (pixels of each plot's colour): {counts}")
    shutil.rmtree(tmp, ignore_errors=True)


def case_bad_input(args):
    tmp = tempfile.mkdtemp(prefix="topolaunch-observe-bad-")
    env = worker_env(args)

    def refused(extra, key, command="check", hold_port=None):
        config = job_config(args, tmp, extra)
        cmd = [args.topolaunch, command, config] + (
            ["--job-dir", os.path.join(tmp, "job-" + key)] if command == "run" else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        check(proc.returncode == 2, f"{command} with a bad {key}: exit 2 (got {proc.returncode})"
              f"\n{proc.stderr[-1500:]}")
        check(len(lines) == 1 and re.search(r"job\.toml:\d+:\d+: " + re.escape(key) + ": ",
                                            lines[0]),
              f"{command}: one line naming file:line:col and {key}: {lines}")

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    refused(f"[observe]\nmetrics_port = {port}\n", "observe.metrics_port", "run")
    holder.close()
    check(not os.path.exists(os.path.join(tmp, "job-observe.metrics_port", "attempt-0")),
          "the port refused before any worker started")
    for command in ("check", "run"):
        refused(f"[observe]\ntrace_steps = [5, {STEPS + 1}]\n", "observe.trace_steps", command)
        refused("[cost]\ngpu_hour = -2.5\n", "cost.gpu_hour", command)
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["example", "bad_input"])
    ap.add_argument("--topolaunch", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--source-root", required=True)
    ap.add_argument("--screenshot", help="keep the page's screenshot here")
    args = ap.parse_args()
    {"example": case_example, "bad_input": case_bad_input}[args.case](args)


if __name__ == "__main__":
    main()
