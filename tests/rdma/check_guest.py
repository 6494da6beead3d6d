#!/usr/bin/env python3
"""One behaviour of the rdma suite, judged from the records of the Soft-RoCE guest boot.

  check_guest.py CHECK -- QEMU_GUEST_ARGS...

QEMU_GUEST_ARGS are qemu_guest.py's (--cache, --out, --script, --env ...). The suite boots the
guest once (test rdma_guest_boot); each check then reads OUT. When OUT holds no finished boot,
or one older than any program or script it ran (a rebuild since), the check boots the guest
itself first (under a lock, so concurrent checks share one boot); a boot that failed is
reported by every check, not retried. Exit 0 = the behaviour held,
1 = it did not (printing what was seen), never a skip.
"""
import fcntl
import ipaddress
import json
import math
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def option_values(args, name):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]


def ensure_results(guest_args):
    out = option_values(guest_args, "--out")[0]
    cache = option_values(guest_args, "--cache")[0]
    inputs = [os.path.join(HERE, "qemu_guest.py")] + option_values(guest_args, "--script")
    inputs += [kv.partition("=")[2] for kv in option_values(guest_args, "--env")]
    done = os.path.join(out, "attempt.json")  # the last boot attempt is over (maybe failed)

    def fresh():
        if not os.path.exists(done):
            return False
        t = os.path.getmtime(done)
        return all(os.path.getmtime(p) < t for p in inputs if os.path.exists(p))

    if not fresh():
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, ".boot.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not fresh():
                print("check_guest: no current guest results: booting the guest", flush=True)
                subprocess.run([sys.executable, os.path.join(HERE, "qemu_guest.py")] + guest_args)
    expect(os.path.exists(os.path.join(out, "guest-rc")),
           f"the guest boot failed or did not finish: see rdma_guest_boot's log and "
           f"{os.path.join(out, 'console.log')}")
    return out


class Records:
    def __init__(self, out):
        self.out = out

    def text(self, name, ext):
        path = os.path.join(self.out, f"{name}.{ext}")
        expect(os.path.exists(path), f"the guest recorded no {name}.{ext} (guest.log says why)")
        with open(path, errors="replace") as f:
            return f.read()

    def rc(self, name):
        return int(self.text(name, "rc").strip())

    def show(self, name):
        print(f"--- {name}: exit {self.rc(name)}, {self.text(name, 'ms').strip()} ms")
        for ext in ("out", "err"):
            t = self.text(name, ext).strip()
            if t:
                print(f"[{ext}]\n{t[-6000:]}")

    def json_lines(self, name):
        res = []
        for line in self.text(name, "out").splitlines():
            line = line.strip()
            if line.startswith("{"):
                res.append(json.loads(line))
        return res


def gid_value(text):
    return ipaddress.IPv6Address(text.strip())


def devinfo_ports(text):
    """{(device, port): {"state": int, "phys": int, "link_layer": str, "gids": {idx: (ip, type)}}}
    from `ibv_devinfo -v`."""
    ports, dev, port = {}, None, None
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"hca_id:\s*(\S+)", s)
        if m:
            dev, port = m.group(1), None
            continue
        m = re.match(r"port:\s*(\d+)", s)
        if m and dev:
            port = (dev, int(m.group(1)))
            ports[port] = {"gids": {}}
            continue
        if not port:
            continue
        m = re.match(r"state:\s*\S+\s*\((\d+)\)", s)
        if m:
            ports[port]["state"] = int(m.group(1))
        m = re.match(r"phys_state:\s*\S+\s*\((\d+)\)", s)
        if m:
            ports[port]["phys"] = int(m.group(1))
        m = re.match(r"link_layer:\s*(\S+)", s)
        if m:
            ports[port]["link_layer"] = m.group(1)
        m = re.match(r"GID\[\s*(\d+)\]:\s*([0-9a-fA-F:.]+)(?:,\s*(.*))?", s)
        if m:
            ports[port]["gids"][int(m.group(1))] = (gid_value(m.group(2)), (m.group(3) or "").strip())
    return ports


STATE_NAMES = {4: "ACTIVE", 1: "DOWN"}
PHYS_NAMES = {5: "LinkUp", 3: "Disabled"}


def probe_devices(rec):
    expect(rec.rc("probe") == 0, f"topolaunch-rdma-probe exited {rec.rc('probe')}")
    inv = json.loads(rec.text("probe", "out"))
    return {d["name"]: d for d in inv["devices"]}


def port_of(devices, name, number=1):
    expect(name in devices, f"the probe does not report {name} (it reports {sorted(devices)})")
    ports = [p for p in devices[name]["ports"] if p["port"] == number]
    expect(ports, f"the probe reports no port {number} on {name}")
    return ports[0]


def check_probe_rxe(rec):
    rec.show("setup_links")
    rec.show("probe")
    devices = probe_devices(rec)
    truth = devinfo_ports(rec.text("ibv_devinfo", "out"))
    wanted = {"rxe0": ("lo", "::ffff:127.0.0.1"), "rxe1": ("tldummy0", "::ffff:192.0.2.1")}
    for name, (netdev, ipv4_gid) in wanted.items():
        p = port_of(devices, name)
        t = truth.get((name, 1))
        expect(t is not None, f"ibv_devinfo does not list {name} port 1")
        expect(t["state"] == 4 and t["phys"] == 5, f"ibv_devinfo: {name}:1 is not ACTIVE/LINK_UP: {t}")
        expect(p["state"] == "ACTIVE", f"{name}:1 state {p['state']!r}, expected ACTIVE")
        expect(p["phys_state"] == "LinkUp", f"{name}:1 phys_state {p['phys_state']!r}, expected LinkUp")
        expect(p["healthy"] is True, f"{name}:1 not reported healthy")
        expect(p["link_layer"] == "Ethernet" == t["link_layer"],
               f"{name}:1 link layer {p['link_layer']!r} (ibv_devinfo {t['link_layer']!r})")
        expect(p["rate_gbps"] > 0, f"{name}:1 rate {p['rate_gbps']}")
        expect(netdev in devices[name]["netdevs"],
               f"{name} netdevs {devices[name]['netdevs']}, expected {netdev}")
        ours = {g["index"]: (gid_value(g["gid"]), g["type"], g["netdev"]) for g in p["gids"]}
        theirs = {i: v for i, v in t["gids"].items() if v[0] != ipaddress.IPv6Address("::")}
        expect(set(ours) == set(theirs),
               f"{name}:1 GID indexes {sorted(ours)} differ from ibv_devinfo's {sorted(theirs)}")
        for i, (value, typ) in theirs.items():
            expect(ours[i][0] == value, f"{name}:1 GID[{i}] {ours[i][0]} != ibv_devinfo {value}")
            expect(ours[i][1] == typ, f"{name}:1 GID[{i}] type {ours[i][1]!r} != {typ!r}")
            expect(ours[i][2] == netdev, f"{name}:1 GID[{i}] netdev {ours[i][2]!r} != {netdev}")
        expect(any(v[0] == ipaddress.IPv6Address(ipv4_gid) and v[1] == "RoCE v2"
                   for v in ours.values()), f"{name}:1 has no RoCE v2 GID {ipv4_gid}")
        print(f"ok: {name}:1 ACTIVE/LinkUp Ethernet {p['rate_gbps']} Gb/s, netdev {netdev}, "
              f"GIDs {len(ours)} matching ibv_devinfo")


def check_probe_port_down(rec):
    rec.show("probe")
    devices = probe_devices(rec)
    truth = devinfo_ports(rec.text("ibv_devinfo", "out")).get(("rxe2", 1))
    expect(truth is not None, "ibv_devinfo does not list rxe2 port 1")
    p = port_of(devices, "rxe2")
    expect(truth["state"] != 4, f"ibv_devinfo says rxe2:1 is up ({truth}): the fixture is wrong")
    expect(p["state"] == STATE_NAMES.get(truth["state"], "?"),
           f"rxe2:1 state {p['state']!r}, ibv_devinfo {truth['state']}")
    expect(p["phys_state"] == PHYS_NAMES.get(truth["phys"], "?"),
           f"rxe2:1 phys_state {p['phys_state']!r}, ibv_devinfo {truth['phys']}")
    expect(p["healthy"] is False, "rxe2:1 (netdev down) reported healthy")
    print(f"ok: rxe2:1 reported {p['state']}/{p['phys_state']}, not healthy")


def check_write(rec, name, world, bytes_):
    results = []
    for r in range(world):
        rec.show(f"{name}.r{r}")
    for r in range(world):
        lines = rec.json_lines(f"{name}.r{r}")
        expect(lines, f"rank {r} printed no result")
        j = lines[-1]
        expect(rec.rc(f"{name}.r{r}") == 0 and "error" not in j,
               f"rank {r} failed: exit {rec.rc(f'{name}.r{r}')}, {j.get('error')}")
        expect(j["bytes"] == bytes_ and j["mismatches"] == 0 and j["first_mismatch"] == -1,
               f"rank {r}: {j}")
        expect(j["verified_from_rank"] == (r + world - 1) % world, f"rank {r}: {j}")
        expect(j["writes"] >= 64, f"rank {r}: only {j['writes']} writes")
        results.append(j)
    print(f"ok: {world} rank(s), each received {bytes_} bytes by RDMA WRITE "
          f"({results[0]['writes']} writes, {results[0]['transport']}), byte for byte equal; "
          + ", ".join(f"{j['write_mbytes_per_s']:.1f} MB/s" for j in results))


def check_write_error(rec, name, words):
    rec.show(f"{name}.r0")
    lines = rec.json_lines(f"{name}.r0")
    expect(lines, "no result printed")
    j = lines[-1]
    expect(rec.rc(f"{name}.r0") == 2, f"exit {rec.rc(f'{name}.r0')}, expected 2 (bad input)")
    msg = j.get("error", "")
    for w in words:
        expect(w in msg, f"the error does not name {w!r}: {msg!r}")
    print(f"ok: refused with exit 2: {msg}")


def check_unreachable(rec):
    name = "write_unreachable.r0"
    rec.show(name)
    lines = rec.json_lines(name)
    expect(lines, "no result printed")
    j = lines[-1]
    expect(rec.rc(name) == 1, f"exit {rec.rc(name)}, expected 1 (the write failed)")
    msg = j.get("error", "")
    for w in ("rank 0", "rxe1:1"):
        expect(w in msg, f"the error does not name {w!r}: {msg!r}")
    # QP timeout 10 (4.2 ms) x 8 tries: the retry error CQE within ~35 ms, or (rxe on 6.1 never
    # sends one) write()'s bounded wait for a completion, 1 s; the flush's own deadline (20 s)
    # would mean the queue-full wait did not end by itself.
    expect(j["failed_after_ms"] < 10000, f"the failure took {j['failed_after_ms']:.0f} ms")
    print(f"ok: failed after {j['failed_after_ms']:.0f} ms: {msg}")


def stages(lines):
    return {(l["rank"], l["stage"]): l for l in lines}


def check_preflight_rxe1(rec, name="preflight_rxe1"):
    for r in range(2):
        rec.show(f"{name}.r{r}")
    for r in range(2):
        st = stages(rec.json_lines(f"{name}.r{r}"))
        expect(rec.rc(f"{name}.r{r}") == 0, f"rank {r} exit {rec.rc(f'{name}.r{r}')}")
        for s in ("local", "connectivity", "bandwidth", "latency"):
            expect((r, s) in st and st[(r, s)]["ok"], f"rank {r} stage {s}: {st.get((r, s))}")
            expect(st[(r, s)]["nic"] == "rxe1:1", f"rank {r} stage {s} nic {st[(r, s)]['nic']}")
        expect("verbs rxe1:1" in st[(r, "connectivity")]["message"],
               f"rank {r} connectivity not over verbs: {st[(r, 'connectivity')]['message']}")
        expect(st[(r, "bandwidth")]["gbytes_per_s"] > 0, f"rank {r}: no bandwidth figure")
        expect(st[(r, "latency")]["median_us"] > 0, f"rank {r}: no latency figure")
    print("ok: 2 ranks, verbs over rxe1: local, connectivity, bandwidth, latency all passed")


def check_preflight_port_down(rec):
    rec.show("preflight_port_down.r0")
    name = "preflight_port_down.r0"
    expect(rec.rc(name) == 4, f"exit {rec.rc(name)}, expected 4 (unhealthy fabric)")
    st = stages(rec.json_lines(name))
    local = st.get((0, "local"))
    expect(local and not local["ok"], f"local stage did not fail: {local}")
    for w in ("rdma-guest", "rxe2:1", "DOWN"):
        expect(w in local["message"], f"the local stage message does not name {w!r}: {local}")
    conn = st.get((0, "connectivity"))
    expect(conn and not conn["ok"] and conn["message"].startswith("skipped"),
           f"connectivity should be skipped after the local failure: {conn}")
    print(f"ok: exit 4, {local['message']}")


def check_preflight_cli(rec):
    rec.show("preflight_cli_rxe1")
    name = "preflight_cli_rxe1"
    expect(rec.rc(name) == 0, f"topolaunch preflight exited {rec.rc(name)}")
    st = stages(rec.json_lines(name))
    for s in ("local", "connectivity", "bandwidth", "latency"):
        expect((0, s) in st and st[(0, s)]["ok"], f"stage {s}: {st.get((0, s))}")
        expect(st[(0, s)]["node"] == "rdma-guest" and st[(0, s)]["nic"] == "rxe1:1",
               f"stage {s} names {st[(0, s)]['node']} {st[(0, s)]['nic']}")
    expect(abs(st[(0, "bandwidth")]["threshold_gbytes_per_s"] - 0.001 / 8) < 1e-9,
           f"the job's min_bandwidth_gbps (0.001) was not the bound: {st[(0, 'bandwidth')]}")
    expect("GID 1" in st[(0, "local")]["message"],
           f"selection did not pick the IPv4 RoCE v2 GID (index 1): {st[(0, 'local')]['message']}")
    print("ok: topolaunch preflight (full, verbs, rxe1 loopback) passed every stage")


def check_preflight_cli_port_down(rec):
    rec.show("preflight_cli_port_down")
    name = "preflight_cli_port_down"
    rc = rec.rc(name)
    expect(rc in (1, 2), f"exit {rc}, expected 2 (no healthy port) or 1 (a stage failed)")
    err = rec.text(name, "err")
    for w in ("rdma-guest", "rxe2:1", "DOWN"):
        expect(w in err, f"the error does not name {w!r}: {err.strip()!r}")
    print(f"ok: exit {rc}: {err.strip()}")


def parse_perftest(text, columns):
    """The numbers row of an ib_* client report: {column: value}."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= len(columns) and all(re.match(r"^([0-9.]+|inf|-?nan)$", p) for p in parts[:len(columns)]):
            return {c: float(p) for c, p in zip(columns, parts)}
    return None


def check_bench(rec):
    """Our preflight numbers beside perftest's, same boot, alternating: a JSON report of ratios.
    It fails only when a figure is missing (a tool failed), never on the figures themselves."""
    reps = []
    # Alternating in the guest: ours (fresh 16 MiB), perftest 1, ours (one 1 MiB buffer, as
    # ib_write_bw), perftest 2; each of ours is compared with the perftest run next to it.
    for i, ours in ((1, "preflight_rxe1"), (2, "preflight_rxe1_same_buffer")):
        bw_name, lat_name = f"ib_write_bw_{i}.client", f"ib_write_lat_{i}.client"
        for n in (bw_name, lat_name):
            if rec.rc(n) != 0:
                rec.show(n)
                rec.show(n.replace("client", "server"))
            expect(rec.rc(n) == 0, f"{n} exited {rec.rc(n)}")
        bw = parse_perftest(rec.text(bw_name, "out"),
                            ["bytes", "iterations", "bw_peak_gbps", "bw_avg_gbps", "msg_rate_mpps"])
        lat = parse_perftest(rec.text(lat_name, "out"),
                             ["bytes", "iterations", "t_min_us", "t_max_us", "t_typical_us",
                              "t_avg_us", "t_stdev_us", "p99_us", "p999_us"])
        expect(bw and lat, f"no result row in {bw_name} / {lat_name}")
        st = [stages(rec.json_lines(f"{ours}.r{r}")) for r in range(2)]
        for r in range(2):
            expect(rec.rc(f"{ours}.r{r}") == 0, f"{ours} rank {r} exited {rec.rc(f'{ours}.r{r}')}")
        our_bw = [st[r][(r, "bandwidth")]["gbytes_per_s"] * 8 for r in range(2)]
        our_lat = [st[r][(r, "latency")]["median_us"] for r in range(2)]
        # perftest calibrates its cycle counter against /proc/cpuinfo; under TCG that can fail
        # ("Correlation coefficient r^2 < 0.9") and it prints inf: no figure, no ratio.
        def finite(x):
            return x if math.isfinite(x) and x > 0 else None
        bw_avg, lat_typ = finite(bw["bw_avg_gbps"]), finite(lat["t_typical_us"])
        reps.append({
            "rep": i,
            "ours_buffer": "16 MiB fresh memory" if i == 1 else "one 1 MiB buffer (perftest's pattern)",
            "perftest": {"ib_write_bw_avg_gbps": bw["bw_avg_gbps"],
                         "ib_write_lat_typical_us": lat["t_typical_us"],
                         "ib_write_lat_avg_us": lat["t_avg_us"]},
            "ours": {"preflight_bandwidth_gbps_per_rank": our_bw,
                     "preflight_latency_median_us_per_rank": our_lat},
            "bandwidth_ratio": min(our_bw) / bw_avg if bw_avg else None,
            "latency_ratio": max(our_lat) / lat_typ if lat_typ else None,
        })
    def median_of(key):
        values = [r[key] for r in reps if r[key] is not None]
        return statistics.median(values) if values else None
    report = {
        "benchmark": "preflight (verbs) vs perftest on Soft-RoCE rxe1, QEMU/TCG guest, same boot",
        "message_bytes_bandwidth": 1048576, "message_bytes_latency": 8,
        "note": "TCG emulation: functional figures only; ratio = ours / perftest "
                "(bandwidth: >= 0.9 is the target; latency: <= 1.1 is the target); "
                "ours: 32 x 1 MiB RDMA writes, flushed, from the buffer named per rep; "
                "ib_write_bw: 32 x 1 MiB from one buffer; latency: 1000 x 8 B write ping-pong, "
                "median (ours) vs t_typical (ib_write_lat), both half the round trip",
        "reps": reps,
        "bandwidth_ratio_median": median_of("bandwidth_ratio"),
        "latency_ratio_median": median_of("latency_ratio"),
        "guest_suite_ms": int(rec.text("suite", "ms")),
        "timing": json.loads(rec.text("timing", "json")),
    }
    print(json.dumps(report, indent=1))
    with open(os.path.join(rec.out, "bench.json"), "w") as f:
        json.dump(report, f, indent=1)


CHECKS = {
    "probe_rxe": check_probe_rxe,
    "probe_port_down": check_probe_port_down,
    "verbs_write_rxe0": lambda r: check_write(r, "write_rxe0", 2, 4194304),
    "verbs_write_rxe1": lambda r: check_write(r, "write_rxe1", 2, 4194304),
    "verbs_unreachable_peer": check_unreachable,
    "verbs_write_loopback": lambda r: check_write(r, "write_loopback", 1, 2097152),
    "verbs_port_down": lambda r: check_write_error(r, "write_port_down", ["rxe2:1", "not ACTIVE"]),
    "verbs_no_device": lambda r: check_write_error(r, "write_no_device", ["mlx5_7", "does not exist"]),
    "preflight_rxe1": check_preflight_rxe1,
    "preflight_port_down": check_preflight_port_down,
    "preflight_cli": check_preflight_cli,
    "preflight_cli_port_down": check_preflight_cli_port_down,
    "bench_vs_perftest": check_bench,
}


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in CHECKS or sys.argv[2] != "--":
        print(f"usage: check_guest.py {{{','.join(CHECKS)}}} -- QEMU_GUEST_ARGS...", file=sys.stderr)
        return 2
    try:
        out = ensure_results(sys.argv[3:])
        with open(os.path.join(out, "guest-rc")) as f:
            guest_rc = f.read().strip()
        expect(guest_rc == "0", f"the guest script itself failed (exit {guest_rc}); see "
               f"{os.path.join(out, 'guest.log')}")
        CHECKS[sys.argv[1]](Records(out))
    except CheckFailed as e:
        print(f"FAIL {sys.argv[1]}: {e}", flush=True)
        return 1
    print(f"PASS {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
