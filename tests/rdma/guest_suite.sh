#!/bin/bash
# Runs inside the Soft-RoCE guest (qemu_guest.py), chrooted into the build host's root (read
# only) as root. Sets up the RDMA devices, runs our programs from the build dir and perftest, and
# records each command's output and exit status in $TL_OUT as NAME.out / NAME.err / NAME.rc /
# NAME.ms. It judges nothing itself: check_guest.py reads the records, one meson test per
# behaviour. Devices:
#   rxe0 on lo                      ACTIVE, GIDs fe80::..., ::ffff:127.0.0.1, ::1
#   rxe1 on tldummy0 (192.0.2.1/24) ACTIVE, GID ::ffff:192.0.2.1 (RFC 5737: routes nowhere)
#   rxe2 on tlveth0 (veth, DOWN)    the port-down case
# Environment (from guest.env): TL_OUT, TL_PROBE, TL_PREFLIGHT_WORKER, TL_TOPOLAUNCH,
# TL_WRITE_CHECK.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LC_ALL=C UCX_WARN_UNUSED_ENV_VARS=n
cd /tmp || exit 1
suite_t0=$(date +%s%N)
echo "guest: kernel up for $(cut -d" " -f1 /proc/uptime) s when the suite starts"

# record NAME TIMEOUT_S CMD...: one command, output and status kept under NAME.
record() {
  local name=$1 limit=$2
  shift 2
  local t0
  t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@" >"$TL_OUT/$name.out" 2>"$TL_OUT/$name.err" </dev/null
  echo $? >"$TL_OUT/$name.rc"
  echo $((($(date +%s%N) - t0) / 1000000)) >"$TL_OUT/$name.ms"
  echo "guest: $name exit $(cat "$TL_OUT/$name.rc") in $(cat "$TL_OUT/$name.ms") ms"
}

# ranks NAME N TIMEOUT_S CMD...: N processes of CMD with --dir (a fresh directory store),
# --rank R and --world N appended; rank R's record is NAME.rR.
ranks() {
  local name=$1 world=$2 limit=$3
  shift 3
  local store
  store=$(mktemp -d "/tmp/$name.XXXX")
  local pids=() r
  for ((r = 0; r < world; r++)); do
    record "$name.r$r" "$limit" "$@" --dir "$store" --rank "$r" --world "$world" &
    pids+=($!)
  done
  wait "${pids[@]}"
  rm -rf "$store"
}

# --- devices -------------------------------------------------------------------------------
hostname rdma-guest
ip link set lo up
rdma link add rxe0 type rxe netdev lo
ip link add tldummy0 type dummy
ip addr add 192.0.2.1/24 dev tldummy0
ip link set tldummy0 up
rdma link add rxe1 type rxe netdev tldummy0
ip link add tlveth0 type veth peer name tlveth1 # both ends stay DOWN
rdma link add rxe2 type rxe netdev tlveth0
# The IPv4 GID appears when the address event reaches rxe: wait for it (bounded).
for _ in $(seq 1 50); do
  grep -qs "ffff:c000:0201" /sys/class/infiniband/rxe1/ports/1/gids/* && break
  sleep 0.1
done
record setup_links 20 rdma link show
record ibv_devinfo 20 ibv_devinfo -v

# --- (a) probe -----------------------------------------------------------------------------
record probe 60 "$TL_PROBE" --no-cuda

# --- (b) RC connections through our verbs transport, RDMA WRITE verified byte for byte ------
ranks write_rxe0 2 90 "$TL_WRITE_CHECK" --device rxe0 --gid 1 --bytes 4194304
ranks write_rxe1 2 90 "$TL_WRITE_CHECK" --device rxe1 --gid 1 --bytes 4194304
# A peer nobody answers for (a GID on the dummy's subnet): 200 writes, QP timeout 10 (4 ms).
# (rxe0 <-> rxe1 is no such test: rxe hands a packet to the device of the netdev it arrived
# on, and everything local arrives on lo, so that pair never connects either.)
ranks write_unreachable 1 60 "$TL_WRITE_CHECK" --device rxe1 --gid 1 --bytes 4096 \
  --unreachable-gid ::ffff:192.0.2.99 --qp-timeout 10 --timeout-ms 20000
ranks write_loopback 1 90 "$TL_WRITE_CHECK" --device rxe1 --gid 1 --bytes 2097152
ranks write_port_down 1 30 "$TL_WRITE_CHECK" --device rxe2 --gid 0 --bytes 65536
ranks write_no_device 1 30 "$TL_WRITE_CHECK" --device mlx5_7 --gid 0 --bytes 65536

# --- (c) preflight: two ranks over rxe1, the CLI on rxe1, and the down port -----------------
# Bandwidth: 32 x 1 MiB RDMA writes; latency: 8 B write ping-pong (same sizes as perftest below).
pf_args=(--transport verbs --gid 1 --level full --message 1048576 --total 33554432
  --buffer 16777216 --iters 1000 --timeout-ms 30000 --node rdma-guest)
ranks preflight_rxe1 2 120 "$TL_PREFLIGHT_WORKER" --device rxe1 "${pf_args[@]}"
ranks preflight_port_down 1 60 "$TL_PREFLIGHT_WORKER" --device rxe2 --transport verbs --gid 0 \
  --level quick --timeout-ms 10000 --node rdma-guest

job() { # job NAME NICS: a job config whose [rdma] table names NICS
  cat >"/tmp/$1.toml" <<EOF
[job]
name = "rdma-guest"

[rdma]
nics = "$2"
preflight = "full"
preflight_timeout = "30s"
# Soft-RoCE under TCG emulation moves ~0.05-0.1 GB/s: the default bound (0.9 x the 2.5 Gb/s
# port rate rxe reports) would fail; this suite checks function, not speed.
min_bandwidth_gbps = 0.001
EOF
}
job job_rxe1 "=rxe1:1"
job job_down "=rxe2:1"
record preflight_cli_rxe1 120 "$TL_TOPOLAUNCH" preflight /tmp/job_rxe1.toml --json \
  --transport verbs --node rdma-guest
record preflight_cli_port_down 60 "$TL_TOPOLAUNCH" preflight /tmp/job_down.toml --json \
  --transport verbs --node rdma-guest

# --- (d) perftest on the same device, same boot, alternating with ours ---------------------
perftest() { # perftest NAME TOOL ARGS...: server and client of an ib_* tool on 127.0.0.1
  local name=$1 tool=$2
  shift 2
  local port=${*: -1}
  record "$name.server" 60 "$tool" "$@" &
  local spid=$!
  # The client gives up at once when nobody listens yet: wait for the server's port.
  for _ in $(seq 1 200); do
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  record "$name.client" 60 "$tool" "$@" 127.0.0.1
  wait $spid
}
perftest ib_write_bw_1 ib_write_bw -d rxe1 -i 1 -x 1 -s 1048576 -n 32 -F --report_gbits -p 18515
perftest ib_write_lat_1 ib_write_lat -d rxe1 -i 1 -x 1 -s 8 -n 1000 -F -p 18516
# perftest's pattern: the same 1 MiB buffer rewritten (the run above writes 16 MiB of fresh
# memory, the headline figure).
ranks preflight_rxe1_same_buffer 2 120 "$TL_PREFLIGHT_WORKER" --device rxe1 "${pf_args[@]}" \
  --buffer 1048576
perftest ib_write_bw_2 ib_write_bw -d rxe1 -i 1 -x 1 -s 1048576 -n 32 -F --report_gbits -p 18517
perftest ib_write_lat_2 ib_write_lat -d rxe1 -i 1 -x 1 -s 8 -n 1000 -F -p 18518

echo $((($(date +%s%N) - suite_t0) / 1000000)) >"$TL_OUT/suite.ms"
echo "guest: suite done in $(cat "$TL_OUT/suite.ms") ms"
exit 0
