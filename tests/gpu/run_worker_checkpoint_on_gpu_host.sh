#!/usr/bin/env bash
# Checkpoints, SIGUSR1 and per-step communication of the GPU worker (kernels/cuda/cuda_worker.cpp),
# ON A 2-GPU H200 HOST. Builds topolaunch and topolaunch-worker the way
# tests/gpu/run_launcher_on_gpu_host.sh does (BUILD_ONLY=1: its build stage alone; its --prepare
# fills .carry-launcher/ on the Debian build host: name that in the device call's carry), then:
#   (a) a small GPT (bf16, CUDA backend) for STEPS steps, uninterrupted, every step's loss in a
#       metrics file;
#   (b) the same job sent SIGUSR1 once its metrics file passes step SIGNAL_AT: exit status 75, the
#       "stopped by SIGUSR1 after step S; checkpoint ..." line, the checkpoint file;
#   (c) the same job again (train.resume = true): resumes at S, runs S+1..STEPS; its losses are
#       compared with (a)'s, bit for bit and by the largest difference;
#   (d) GPT-2 124M on 2 GPUs through `topolaunch run --local` (one rank per GPU, NCCL): the
#       per-step communication lines (all-reduce bytes, ms, exposed ms against the plan and a
#       deliberately tight [budget], whose warnings name the keys), then SIGUSR1 to the launcher
#       (it relays it to both workers): both ranks stop after the same step, exit 75, checkpoint;
#   (e) checkpoints across backends: (b)'s GPU checkpoint resumed by the CPU worker (fp32), a CPU
#       worker's checkpoint resumed by the GPU worker: the next step's loss against the other
#       backend's (bf16 vs fp32 forward: within 1e-2 relative).
# Each stage runs under `timeout` (or a watchdog where the test signals the process itself). Everything goes to $OUT (5 files): build.log, single.log,
# ddp.log, result.json, summary.txt.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CARRY=.carry-launcher
OUT=${OUT:-build-gpu-ckpt/out}
BUILD=${BUILD:-build-gpu-launcher}
WORK=$PWD/build-gpu-ckpt
STEPS=${STEPS:-300}
SIGNAL_AT=${SIGNAL_AT:-100}
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK"/*
T0=$SECONDS
stage() { echo; echo "=== STAGE $1 (at $((SECONDS - T0)) s)"; }
declare -A RC
# watchdog PID SECONDS: the `timeout` of a background child that we signal ourselves.
watchdog() {
  # (1 s naps, output to /dev/null: killing it leaves no long sleep holding the log pipe open)
  ( for _ in $(seq 1 "$2"); do kill -0 "$1" 2>/dev/null || exit 0; sleep 1; done
    kill -TERM "$1" 2>/dev/null; sleep 10; kill -KILL "$1" 2>/dev/null ) > /dev/null 2>&1 &
  WATCHDOG=$!
}

stage "build (tests/gpu/run_launcher_on_gpu_host.sh, BUILD_ONLY=1)"
# (STEPS=5, SINGLE_START_BY_S=0: should a version of that script lack BUILD_ONLY, its own job
# stays short)
BUILD_ONLY=1 STEPS=5 SINGLE_START_BY_S=0 BUILD=$BUILD OUT=$WORK/build-out timeout 150 bash tests/gpu/run_launcher_on_gpu_host.sh \
  > "$WORK/build.txt" 2>&1
RC[build]=$?
grep -E "^(---|compile FAILED|link|compiler warnings|objects compiled|build done)" "$WORK/build.txt"
{ cat "$WORK/build.txt"; echo "##### compiler output"; cat "$WORK/build-out/build.log" 2>/dev/null; } \
  > "$OUT/build.log"
export PATH="$PWD/$BUILD/bin:$PATH"
DATA="$PWD/$CARRY/data/Rdata.rdb"
[ -f "$DATA" ] || DATA=/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb

# --- (a), (b), (c): one GPU, a small GPT -------------------------------------------------------
cat > "$WORK/small.toml" <<EOT
[model]
kind = "gpt2"
n_layer = 4
n_embd = 256
n_head = 4
block_size = 128

[data]
kind = "janeaustenr"
path = "$DATA"

[train]
batch = 8
seq_len = 128
steps = $STEPS
precision = "bf16"
learning_rate = 1e-3
warmup_steps = 20
min_lr_fraction = 0.1
weight_decay = 0.1
grad_clip = 1.0
grad_accum = 1
log_every = 50
EOT
small() {  # small LABEL [--set ...]: runs the worker on GPU 0, log in $WORK/LABEL.log
  local label=$1; shift
  CUDA_VISIBLE_DEVICES=0 env -u WORLD_SIZE -u RANK timeout 60 topolaunch-worker "$WORK/small.toml" \
    --set train.metrics_file="\"$WORK/$label.jsonl\"" "$@" > "$WORK/$label.log" 2>&1
}
stage "(a) uninterrupted: $STEPS steps"
small a --set train.checkpoint_dir="\"$WORK/ckpt-a\"" --set train.resume=false
RC[a]=$?
echo "exit status ${RC[a]}"; grep -E "^(step|done|throughput|topolaunch-worker)" "$WORK/a.log"

stage "(b) SIGUSR1 once step $SIGNAL_AT is logged"
# Not under `timeout` (it would take the signal itself): the worker is our child, a watchdog kills
# it after 60 s.
CUDA_VISIBLE_DEVICES=0 env -u WORLD_SIZE -u RANK topolaunch-worker "$WORK/small.toml" \
  --set train.metrics_file="\"$WORK/b.jsonl\"" --set train.checkpoint_dir="\"$WORK/ckpt-b\"" \
  --set train.resume=false > "$WORK/b.log" 2>&1 &
pid=$!
watchdog $pid 60
for _ in $(seq 1 3000); do
  n=$(cat "$WORK/b.jsonl" 2>/dev/null | wc -l)
  [ "${n:-0}" -ge "$SIGNAL_AT" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.01
done
kill -USR1 $pid 2>/dev/null && echo "SIGUSR1 sent after $n logged steps"
wait $pid
RC[b]=$?
kill $WATCHDOG 2>/dev/null
echo "exit status ${RC[b]} (expected 75)"
grep -E "^(step|stopped|done|topolaunch-worker)" "$WORK/b.log"
ls -l "$WORK/ckpt-b/"

cp -r "$WORK/ckpt-b" "$WORK/ckpt-e"  # (b)'s checkpoint for (e): (c) overwrites ckpt-b at its end
stage "(c) resumed from (b)'s checkpoint"
small c --set train.checkpoint_dir="\"$WORK/ckpt-b\"" --set train.resume=true
RC[c]=$?
echo "exit status ${RC[c]}"; grep -E "^(resumed|step|done|topolaunch-worker)" "$WORK/c.log"

# (e) the checkpoint between backends: (b)'s GPU checkpoint resumed by the CPU worker (fp32) for
# one step, whose loss (computed from the restored weights) is compared with (a)'s at that step;
# and a CPU checkpoint (3 steps) resumed by the GPU worker and by the CPU worker for step 4.
stage "(e) GPU checkpoint -> CPU worker, CPU checkpoint -> GPU worker"
stop=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\);.*/\1/p' "$WORK/b.log")
if [ -n "$stop" ]; then
  small e_gpu_to_cpu --set train.precision='"fp32"' --set train.steps=$((stop + 1)) \
    --set train.checkpoint_dir="\"$WORK/ckpt-e\""
  RC[e1]=$?
else
  RC[e1]=1; echo "no stop step in (b): skipped"
fi
small f_cpu3 --set train.precision='"fp32"' --set train.steps=3 --set train.resume=false \
  --set train.checkpoint_dir="\"$WORK/ckpt-f\""
cp -r "$WORK/ckpt-f" "$WORK/ckpt-g"
small f_cpu4 --set train.precision='"fp32"' --set train.steps=4 --set train.checkpoint_dir="\"$WORK/ckpt-f\""
small g_cpu_to_gpu --set train.steps=4 --set train.checkpoint_dir="\"$WORK/ckpt-g\""
RC[e2]=$?
for f in e_gpu_to_cpu f_cpu3 f_cpu4 g_cpu_to_gpu; do echo "--- $f"; grep -E "^(resumed|step|done|topolaunch-worker)" "$WORK/$f.log"; done

for f in a b c e_gpu_to_cpu f_cpu3 f_cpu4 g_cpu_to_gpu; do echo "##### $f.log"; cat "$WORK/$f.log"; echo "##### $f.jsonl";
  cat "$WORK/$f.jsonl" 2>/dev/null; done > "$OUT/single.log"

# --- (d): two GPUs through the launcher, GPT-2 124M ---------------------------------------------
cat > "$WORK/ddp.toml" <<EOT
[job]
name = "gpt2-124m-ckpt-x2"
nodes = 1
ranks_per_node = 2
restarts = 0
heartbeat_timeout = "3m"
stop_grace = "60s"

[mapping]
policy = "auto"

[budget]
memory = "32GiB"
gpu_memory = "60GiB"
comm_per_step = "64MiB"            # deliberately below the ~249 MB a rank sends: must warn
comm_exposed_per_step = "10us"     # deliberately tight: must warn

[rdma]
preflight = "off"

[wireup]
backend = "tcp"

[worker]
env = { NCCL_DEBUG = "WARN", NCCL_NVLS_ENABLE = "0" }

[model]
kind = "gpt2"
n_layer = 12
n_embd = 768
n_head = 12
block_size = 1024
vocab_size = 50257
padded_vocab = 50304

[data]
kind = "janeaustenr"
path = "$DATA"

[train]
batch = 4
seq_len = 1024
steps = 400
precision = "bf16"
learning_rate = 6e-4
warmup_steps = 10
grad_accum = 1
log_every = 10
EOT
stage "(d) 2 ranks, topolaunch run --local, SIGUSR1 to the launcher after step 30"
JOBDIR=$WORK/ddp-job
topolaunch run "$WORK/ddp.toml" --local --job-dir "$JOBDIR" > "$WORK/ddp-launcher.log" 2>&1 &
lpid=$!
watchdog $lpid 70  # SIGTERM (the launcher stops its workers), SIGKILL 10 s later
for _ in $(seq 1 9000); do
  grep -qE "^step +30/" "$JOBDIR"/attempt-*/rank-0.log 2>/dev/null && break
  kill -0 $lpid 2>/dev/null || break
  sleep 0.01
done
kill -USR1 $lpid 2>/dev/null && echo "SIGUSR1 sent to topolaunch (pid $lpid)"
wait $lpid
RC[d]=$?
kill $WATCHDOG 2>/dev/null
echo "topolaunch exit status ${RC[d]} (3: stopped for requeue)"
{
  echo "##### topolaunch"; cat "$WORK/ddp-launcher.log"
  for f in "$JOBDIR"/attempt-*/rank-*.log; do echo "##### $f"; cat "$f"; done
  echo "##### checkpoints"; find "$JOBDIR" -name 'checkpoint.bin*' -exec ls -l {} \;
} > "$OUT/ddp.log" 2>&1
grep -hE "^(step|comm|warning|stopped|rank [0-9]+ stopped)" "$JOBDIR"/attempt-*/rank-*.log

stage "checks"
python3 - "$WORK" "$JOBDIR" "$OUT/result.json" "${RC[a]}" "${RC[b]}" "${RC[c]}" "${RC[d]}" \
  "${RC[build]}" "$STEPS" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, re, sys
work, jobdir, out = sys.argv[1:4]
rc_a, rc_b, rc_c, rc_d, rc_build, steps = map(int, sys.argv[4:10])
def losses(name):
    d = {}
    try:
        for line in open(os.path.join(work, name + ".jsonl")):
            r = json.loads(line); d[r["step"]] = r
    except OSError:
        pass
    return d
a, b, c = losses("a"), losses("b"), losses("c")
blog = open(os.path.join(work, "b.log"), errors="replace").read()
m = re.search(r"stopped by SIGUSR1 after step (\d+); checkpoint (\S+) \(exit 75", blog)
stop = int(m.group(1)) if m else None
ckpt = m.group(2) if m else None
res = {"build_rc": rc_build, "a_rc": rc_a, "b_rc": rc_b, "c_rc": rc_c,
       "steps": steps, "b_stopped_after": stop,
       "b_checkpoint_bytes": os.path.getsize(ckpt) if ckpt and os.path.exists(ckpt) else None}
checks = {}
checks["a_finished"] = rc_a == 0 and len(a) == steps
checks["b_exit_75_and_line"] = rc_b == 75 and stop is not None and stop < steps
checks["b_checkpoint_file"] = res["b_checkpoint_bytes"] is not None
# (a) and (b) are the same run up to the stop; the executor's GEMM autotune times candidate
# algorithms at first use, so two runs may pick different ones (different summation order): equal
# within 1e-2, and how many are bit-identical is reported.
b_rel = [abs(a[s]["loss"] - r["loss"]) / abs(a[s]["loss"]) for s, r in b.items() if s in a]
res["b_steps_bit_identical_to_a"] = sum(1 for s, r in b.items() if s in a and a[s]["loss"] == r["loss"])
res["b_steps"] = len(b)
res["b_max_rel_loss_diff_to_a"] = max(b_rel) if b_rel else None
checks["b_losses_match_a_before_stop"] = bool(b) and len(b_rel) == len(b) and max(b_rel) <= 1e-2
clog = open(os.path.join(work, "c.log"), errors="replace").read()
checks["c_resumed_at_stop"] = stop is not None and f"at step {stop}" in clog and rc_c == 0
tail = [s for s in range(stop + 1, steps + 1)] if stop else []
same = [s for s in tail if s in c and s in a and c[s]["loss"] == a[s]["loss"]]
diffs = [abs(c[s]["loss"] - a[s]["loss"]) for s in tail if s in c and s in a]
rel = [abs(c[s]["loss"] - a[s]["loss"]) / abs(a[s]["loss"]) for s in tail if s in c and s in a]
res.update({"resumed_steps": len([s for s in tail if s in c]),
            "resumed_losses_bit_identical": len(same),
            "resumed_max_abs_loss_diff": max(diffs) if diffs else None,
            "resumed_max_rel_loss_diff": max(rel) if rel else None,
            "loss_first_last_a": [a.get(1, {}).get("loss"), a.get(steps, {}).get("loss")]})
checks["c_losses_match_a"] = bool(tail) and len(diffs) == len(tail) and max(rel) <= 1e-2
# (e)
e, f4, g4 = losses("e_gpu_to_cpu"), losses("f_cpu4"), losses("g_cpu_to_gpu")
def rel(x, y):
    return abs(x - y) / abs(y) if x is not None and y is not None else None
e_rel = rel(e.get(stop + 1, {}).get("loss"), a.get(stop + 1, {}).get("loss")) if stop else None
g_rel = rel(g4.get(4, {}).get("loss"), f4.get(4, {}).get("loss"))
res.update({"e_gpu_ckpt_on_cpu_step": stop + 1 if stop else None,
            "e_cpu_loss": e.get(stop + 1, {}).get("loss") if stop else None,
            "e_gpu_loss": a.get(stop + 1, {}).get("loss") if stop else None, "e_rel_diff": e_rel,
            "e_cpu_ckpt_on_gpu_step4_loss": g4.get(4, {}).get("loss"),
            "e_cpu_step4_loss": f4.get(4, {}).get("loss"), "e_cpu_to_gpu_rel_diff": g_rel})
checks["e_gpu_checkpoint_loads_on_cpu"] = e_rel is not None and e_rel <= 1e-2
checks["e_cpu_checkpoint_loads_on_gpu"] = g_rel is not None and g_rel <= 1e-2
# (d)
ranks = {}
for f in glob.glob(os.path.join(jobdir, "attempt-*", "rank-*.log")):
    r = int(re.search(r"rank-(\d+)\.log", f).group(1)); ranks[r] = open(f, errors="replace").read()
stops = {}
for r, text in ranks.items():
    m0 = re.search(r"stopped by SIGUSR1 after step (\d+)", text) or \
         re.search(r"rank \d+ stopped after step (\d+)", text)
    stops[r] = int(m0.group(1)) if m0 else None
comm = [dict(zip(("step", "payload_mb", "buckets", "sent_mb", "ms", "exposed_ms", "plan_sent_mb",
                  "plan_ms", "plan_exposed_ms"), (float(x) for x in mm.groups())))
        for mm in re.finditer(r"comm +(\d+)/\d+ \| all-reduce ([0-9.]+) MB in (\d+) buckets, "
                              r"([0-9.]+) MB sent per rank \| ([0-9.]+) ms \| exposed ([0-9.]+) ms"
                              r" \| plan: ([0-9.]+) MB sent, ([0-9.]+) ms, exposed ([0-9.]+) ms",
                              ranks.get(0, ""))]
warnings = re.findall(r"^warning: .*$", ranks.get(0, ""), re.M)
ckpts = glob.glob(os.path.join(jobdir, "**", "checkpoint.bin"), recursive=True)
res.update({"d_rc": rc_d, "d_stopped_after_by_rank": stops, "d_comm_lines": comm,
            "d_warnings": warnings, "d_checkpoints": {p: os.path.getsize(p) for p in ckpts}})
checks["d_both_ranks_same_stop_step"] = len(stops) == 2 and None not in stops.values() and \
    len(set(stops.values())) == 1
checks["d_comm_lines"] = len(comm) >= 2
checks["d_budget_warnings_name_keys"] = any("budget.comm_per_step" in w for w in warnings) and \
    any("budget.comm_exposed_per_step" in w for w in warnings)
checks["d_checkpoint_written"] = bool(ckpts)
res["checks"] = checks
res["pass"] = all(checks.values())
json.dump(res, open(out, "w"), indent=1)
for k, v in checks.items(): print(f"{k}: {'ok' if v else 'FAILED'}")
print(json.dumps({k: v for k, v in res.items() if k not in ("d_comm_lines", "checks")}))
for l in comm: print("comm", l)
print("PASS" if res["pass"] else "FAIL")
sys.exit(0 if res["pass"] else 1)
PY
rc=$?
echo "total $((SECONDS - T0)) s"
exit $rc
