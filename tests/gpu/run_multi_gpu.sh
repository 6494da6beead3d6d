#!/usr/bin/env bash
# The runs of issue 9 on however many GPUs this host has (N = 1, 2, 4 or 8), in ONE device call:
#   1. topodiag on the live node (--json, --save-baseline, --dot, the report) beside `nvidia-smi
#      topo -m`, and tests/gpu/compare_topology.py: GPU order, NUMA, CPU affinity and the NV#/link
#      matrix of the two must agree (one line per GPU and per pair).
#   2. `topolaunch map` + `topolaunch run --local` of the GPT-2 124M example with N ranks and the
#      check that each worker's reported binding equals the map (run_launcher_on_gpu_host.sh,
#      RANKS=N).
#   3. all-reduce bus bandwidth 1 MiB .. 1 GiB on N GPUs: ours (allreduce_bench: NcclCommunicator,
#      id through our TCP store) vs torch.distributed.all_reduce (allreduce_torch.py).
#   4. scaling of GPT-2 124M, B=64 per GPU, T=1024, bf16 on N, N/2, ..., 1 GPUs (largest first: it
#      is the figure the issue asks for): ours (ddp_gpt2_bench) vs PyTorch DDP + torch.compile
#      (ddp_gpt2_torch.py), one after the other per GPU count: tokens/s total and per GPU, exposed
#      communication per step.
# Everything is built once on the host (run_launcher_on_gpu_host.sh BUILD_ONLY=1 BUILD_BENCH=1: nvcc
# and g++ over all cores, toml++ and friends from the carried .carry-launcher/).
#
#   tests/gpu/run_multi_gpu.sh --prepare   on the build host: fills .carry-launcher/ (sources of the
#       last commit, tests included; headers; data) and prints the device call to make
#   tests/gpu/run_multi_gpu.sh             on the GPU host, from the repository root
#
# DEADLINE_S (default 570): the whole run's limit in seconds (the device call's timeout_s minus a
#   margin). Every step runs under `timeout` with a budget cut to what is left of it (RESERVE_S,
#   default 15, kept for the summary and the archive); a step that would get less than its minimum
#   is skipped and says so. A step that fails does not stop the ones that do not need it.
# QUICK=1: the dry run for a 2-GPU host (~150 s with the build): launcher job 10 steps, all-reduce
#   up to 64 MiB, GPT-2 5 timed steps on N and 1 GPUs, PyTorch only on N GPUs and without its
#   no_sync pass.
# NGPUS: use that many GPUs (default: all that nvidia-smi lists). SCALING_WORLDS="8 4": those GPU
#   counts instead of N, N/2, ..., 1. DDP_BATCH (64), DDP_STEPS (20; QUICK 5), AR_MAX_MIB (1024;
#   QUICK 64), JOB_STEPS (30; QUICK 10). SKIP_BUILD=1: no build, $BUILD/bin as an earlier call on
#   the same (still warm) machine left it.
#
# Results in $OUT (default build-multi-gpu/out; the device tool brings back at most 8 files):
#   run.log                  everything printed (stage by stage, with the per-check lines)
#   results.jsonl            one JSON line per result: steps' status and time, topology compare,
#                            launcher binding, all-reduce per size, scaling per system and GPU count
#   h200xN.topodiag.json     topodiag --json        } the live node's capture, for the project's
#   h200xN.baseline.json     topodiag --save-baseline } fixtures (our own capture)
#   h200xN.dot               topodiag --dot
#   nvidia-smi-topo.txt      nvidia-smi topo -m, --query-gpu, nvlink status
#   work.tar.gz              the rest: build logs, rank logs, every JSON, the job report
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CARRY=.carry-launcher
LAUNCHER_SCRIPT=tests/gpu/run_launcher_on_gpu_host.sh
ENV_LINE="export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1;"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  "$LAUNCHER_SCRIPT" --prepare
  # the benchmarks and the compare script from the same commit as the rest of the snapshot
  git archive HEAD tests/gpu tests/bench/kernels | tar -x -C "$CARRY/src"
  rm -rf "$CARRY/src/tests/bench/kernels/results" "$CARRY/src/tests/gpu/results"
  if ! git diff --quiet HEAD -- tests/gpu tests/bench/kernels; then
    echo "WARNING: tests/gpu or tests/bench/kernels differ from HEAD; the snapshot holds HEAD's:"
    git diff --stat HEAD -- tests/gpu tests/bench/kernels
  fi
  du -sh "$CARRY"
  cat <<EOT

The device call (carry: [".carry-launcher"]; the script itself runs from the working tree):
  dry run on 2 GPUs (~120-150 s of script after the machine starts, build included):
    kind: nvidia-h200-x2   timeout_s: 240   carry: [".carry-launcher"]
    command: $ENV_LINE QUICK=1 DEADLINE_S=225 bash tests/gpu/run_multi_gpu.sh
  issue 9 on 8 GPUs (~400 s estimated; DEADLINE_S bounds it):
    kind: nvidia-h200-x8   timeout_s: 600   carry: [".carry-launcher"]
    command: $ENV_LINE DEADLINE_S=575 bash tests/gpu/run_multi_gpu.sh
EOT
  exit 0
fi

OUT=${OUT:-build-multi-gpu/out}
BUILD=${BUILD:-build-multi-gpu}
case $BUILD in /*) echo "run_multi_gpu.sh: BUILD=$BUILD: give a path relative to the repository root"; exit 2 ;; esac
WORK=$BUILD/work
DEADLINE_S=${DEADLINE_S:-570}
RESERVE_S=${RESERVE_S:-15}
QUICK=${QUICK:-0}
SRC=${SRC:-}
if [ -z "$SRC" ]; then
  if [ -d "$CARRY/src/kernels" ]; then SRC=$CARRY/src; else SRC=.; fi
fi
BENCH_SRC=$SRC
[ -f "$BENCH_SRC/tests/bench/kernels/ddp_gpt2_torch.py" ] || BENCH_SRC=.
if [ "$QUICK" = 1 ]; then
  DDP_STEPS=${DDP_STEPS:-5}; AR_MAX_MIB=${AR_MAX_MIB:-64}; JOB_STEPS=${JOB_STEPS:-10}
else
  DDP_STEPS=${DDP_STEPS:-20}; AR_MAX_MIB=${AR_MAX_MIB:-1024}; JOB_STEPS=${JOB_STEPS:-30}
fi
DDP_BATCH=${DDP_BATCH:-64}
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"
RESULTS=$WORK/results.jsonl
: > "$RESULTS"
T0=$SECONDS

left() { echo $((DEADLINE_S - (SECONDS - T0) - RESERVE_S)); }
# budget NOMINAL MIN: the seconds a step may take (its nominal, cut to what is left), 0 = skip it
budget() {
  local l; l=$(left)
  if [ "$l" -lt "$2" ]; then echo 0; elif [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi
}
stage() { echo; echo "=== STAGE $1 (at $((SECONDS - T0)) s, $(left) s left before the reserve)"; }
# record NAME STATUS SECONDS [NOTE]: one line in results.jsonl; STATUS a number or "skipped"
record() {
  local status=$2
  [ "$status" = skipped ] && status='"skipped"'
  printf '{"kind": "step", "name": "%s", "status": %s, "seconds": %s, "note": "%s"}\n' \
    "$1" "$status" "$3" "${4:-}" >> "$RESULTS"
  if [ "$2" = 0 ]; then echo "--- $1: ok ($3 s)"
  elif [ "$2" = skipped ]; then echo "--- $1: skipped${4:+ ($4)}"
  else echo "--- $1: FAILED (status $2, $3 s)${4:+ $4}"; fi
}
skip() { echo "skipped: $(left) s left, the step needs at least $2 s"; record "$1" skipped 0 "too little time left"; }
# GPU processes a finished step left behind (its own children: the device machine runs nothing
# else) would slow or block the next step: killed, by pid, and named.
reap_gpu() {
  local pids
  pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' | grep -E '^[0-9]+$')
  [ -n "$pids" ] || return 0
  echo "after $1: GPU processes still running, killed: $(echo "$pids" | tr '\n' ' ')"
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  sleep 2
}

main() {
  echo "run_multi_gpu.sh: DEADLINE_S=$DEADLINE_S QUICK=$QUICK SRC=$SRC BENCH_SRC=$BENCH_SRC"
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST" \
    "NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
  local n_gpus
  n_gpus=${NGPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  echo "GPUs: $n_gpus; $(nproc) cores; $(date -u +%FT%TZ)"
  if [ "$n_gpus" -lt 1 ]; then
    echo "no GPU (nvidia-smi -L lists none): nothing to run"; record gpus 1 0 "no GPU"; return 1
  fi
  local worlds=${SCALING_WORLDS:-}
  if [ -z "$worlds" ]; then  # N, then the powers of two below it
    worlds=$n_gpus
    local k=1
    while [ $((k * 2)) -lt "$n_gpus" ]; do k=$((k * 2)); done
    while [ "$k" -ge 1 ]; do [ "$k" -lt "$n_gpus" ] && worlds="$worlds $k"; k=$((k / 2)); done
    [ "$QUICK" = 1 ] && [ "$n_gpus" -gt 1 ] && worlds="$n_gpus 1"
  fi
  echo "scaling over GPU counts: $worlds"
  local name=h200x$n_gpus b t rc
  local bin=$PWD/$BUILD/bin

  # --- build --------------------------------------------------------------------------------
  stage "build (topolaunch, topolaunch-worker, topodiag, ddp_gpt2_bench, allreduce_bench)"
  b=$(budget 240 60); t=$SECONDS
  if [ "${SKIP_BUILD:-0}" = 1 ]; then
    echo "SKIP_BUILD=1: using $bin as it is"; ls "$bin"; record build 0 0 "SKIP_BUILD=1: binaries of an earlier call"
  elif [ "$b" -eq 0 ]; then skip build 60; else
    mkdir -p "$WORK/build"
    timeout -k 10 "$b" env BUILD_ONLY=1 BUILD_BENCH=1 RANKS="$n_gpus" SRC="$SRC" BUILD="$BUILD" \
      OUT="$WORK/build" bash "$LAUNCHER_SCRIPT"
    rc=$?
    record build "$rc" $((SECONDS - t))
  fi

  # --- 1. topodiag vs nvidia-smi ----------------------------------------------------------------
  stage "1. topodiag on the live node vs nvidia-smi topo -m"
  local d=$WORK/topodiag
  mkdir -p "$d"
  {
    echo "##### nvidia-smi topo -m"; nvidia-smi topo -m
    echo "##### nvidia-smi --query-gpu=index,pci.bus_id,name,memory.total"
    nvidia-smi --query-gpu=index,pci.bus_id,name,memory.total --format=csv,noheader
    echo "##### nvidia-smi nvlink --status"; timeout 20 nvidia-smi nvlink --status
    echo "##### NUMA nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
  } > "$d/nvidia-smi-topo.txt" 2>&1
  nvidia-smi topo -m > "$d/topo-m.txt" 2>&1
  nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader > "$d/gpus.csv" 2>&1
  sed -n '1,/^#####.*--query-gpu/p' "$d/nvidia-smi-topo.txt"
  b=$(budget 60 20); t=$SECONDS
  if [ "$b" -eq 0 ]; then skip topodiag 20; elif [ ! -x "$bin/topodiag" ]; then
    echo "no $bin/topodiag (build failed)"; record topodiag 3 0 "not built"
  else
    local per=$((b / 6 > 5 ? b / 6 : 5)) r_report r_json r_save r_dot r_self
    timeout "$per" "$bin/topodiag" -v > "$d/report.txt" 2>&1; r_report=$?
    timeout "$per" "$bin/topodiag" --json > "$d/$name.topodiag.json" 2> "$d/json.err"; r_json=$?
    timeout "$per" "$bin/topodiag" --save-baseline "$d/$name.baseline.json" > /dev/null 2> "$d/save.err"; r_save=$?
    timeout "$per" "$bin/topodiag" --dot > "$d/$name.dot" 2> "$d/dot.err"; r_dot=$?
    # the node against the baseline it has just written: no finding may come out of that
    timeout "$per" "$bin/topodiag" --baseline "$d/$name.baseline.json" > "$d/self-check.txt" 2>&1; r_self=$?
    cat "$d/report.txt"
    echo "exit status (0 ok, 1 errors, 3 warnings only, 4 data source missing): report $r_report," \
      "--json $r_json, --save-baseline $r_save, --dot $r_dot, --baseline <own> $r_self"
    cat "$d"/*.err
    if command -v dot > /dev/null; then dot -Tpng "$d/$name.dot" -o "$d/$name.png" 2>&1; fi
    # topodiag's exit status reports findings (warnings on a VM are expected); what fails this
    # step is an output that is missing or unreadable, or the comparison
    rc=0
    python3 -c 'import json,sys; json.load(open(sys.argv[1])); json.load(open(sys.argv[2]))' \
      "$d/$name.topodiag.json" "$d/$name.baseline.json" || rc=2
    grep -q "digraph\|graph " "$d/$name.dot" || { echo "--dot printed no graph"; rc=2; }
    echo "--- comparison with nvidia-smi (per GPU, per pair):"
    python3 "$BENCH_SRC/tests/gpu/compare_topology.py" "$d/topo-m.txt" "$d/gpus.csv" \
      "$d/$name.topodiag.json" --jsonl "$RESULTS" | tee "$d/compare.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    record topodiag "$rc" $((SECONDS - t)) "exit statuses: report $r_report json $r_json baseline $r_save dot $r_dot self-check $r_self"
  fi

  # --- 2. topolaunch map + run with N ranks ----------------------------------------------------
  stage "2. topolaunch map + run --local, $n_gpus ranks, binding vs map"
  b=$(budget 150 50); t=$SECONDS
  if [ "$b" -eq 0 ]; then skip launcher 50; else
    mkdir -p "$WORK/launcher"
    timeout -k 15 "$b" env SKIP_BUILD=1 RANKS="$n_gpus" SINGLE_GPU=0 STEPS="$JOB_STEPS" SRC="$SRC" \
      BUILD="$BUILD" OUT="$WORK/launcher" RUN_TIMEOUT_S=$((b - 45)) bash "$LAUNCHER_SCRIPT"
    rc=$?
    record launcher "$rc" $((SECONDS - t))
    reap_gpu launcher
  fi

  # --- 3. all-reduce bus bandwidth --------------------------------------------------------------
  local a=$WORK/allreduce
  mkdir -p "$a"
  stage "3. all-reduce busbw 1 MiB .. $AR_MAX_MIB MiB on $n_gpus GPUs: ours vs torch.distributed"
  if [ "$n_gpus" -lt 2 ]; then
    echo "one GPU: no all-reduce to measure"; record allreduce_ours skipped 0 "one GPU"
  else
    b=$(budget 90 25); t=$SECONDS
    if [ "$b" -eq 0 ]; then skip allreduce_ours 25; else
      timeout -k 10 "$b" "$bin/allreduce_bench" --world "$n_gpus" --max-mib "$AR_MAX_MIB" \
        --timeout-s $((b - 10)) --out "$a/ours.json" 2> "$a/ours.log"
      rc=$?
      if [ $rc -eq 0 ]; then grep -E "bytes .* busbw" "$a/ours.log"; else tail -15 "$a/ours.log"; fi
      record allreduce_ours "$rc" $((SECONDS - t))
      reap_gpu allreduce_ours
    fi
    b=$(budget 120 30); t=$SECONDS
    if [ ! -s "$a/ours.json" ]; then
      echo "no ours.json: torch's all-reduce not run (it takes the sizes from ours)"
      record allreduce_torch skipped 0 "no ours.json"
    elif [ "$b" -eq 0 ]; then skip allreduce_torch 30; else
      PYTHONUNBUFFERED=1 timeout -k 10 "$b" python3 "$BENCH_SRC/tests/bench/kernels/allreduce_torch.py" \
        "$a/ours.json" > "$a/allreduce.json" 2> "$a/torch.log"
      rc=$?
      [ $rc -eq 0 ] || tail -20 "$a/torch.log"
      record allreduce_torch "$rc" $((SECONDS - t))
      reap_gpu allreduce_torch
    fi
  fi

  # --- 4. scaling --------------------------------------------------------------------------------
  local s=$WORK/scaling k ours
  mkdir -p "$s"
  for k in $worlds; do
    stage "4. GPT-2 124M B=$DDP_BATCH/GPU T=1024 bf16 on $k GPU(s): ours (ddp_gpt2_bench)"
    b=$(budget 120 40); t=$SECONDS
    if [ "$b" -eq 0 ]; then skip "scaling_ours_w$k" 40; else
      timeout -k 10 "$b" "$bin/ddp_gpt2_bench" --world "$k" --batch "$DDP_BATCH" --seq 1024 \
        --steps "$DDP_STEPS" --timeout-s $((b - 10)) --out "$s/ours_w$k.json" > "$s/ours_w$k.log" 2>&1
      rc=$?
      if [ $rc -eq 0 ]; then grep -E "^rank" "$s/ours_w$k.log"; else tail -$((k + 15)) "$s/ours_w$k.log"; fi
      record "scaling_ours_w$k" "$rc" $((SECONDS - t))
      reap_gpu "scaling_ours_w$k"
    fi
    if [ "$QUICK" = 1 ] && [ "$k" != "$n_gpus" ]; then
      echo "QUICK=1: PyTorch DDP only on $n_gpus GPUs"; continue
    fi
    stage "4. GPT-2 124M B=$DDP_BATCH/GPU on $k GPU(s): PyTorch DDP + torch.compile"
    b=$(budget 180 60); t=$SECONDS
    if [ "$b" -eq 0 ]; then skip "scaling_torch_w$k" 60; continue; fi
    ours=$s/ours_w$k.json; [ -s "$ours" ] || ours=none
    DDP_TORCH_RAW=$s/torch_raw_w$k.json DDP_TORCH_NO_SYNC=$([ "$QUICK" = 1 ] && echo 0 || echo 1) \
      PYTHONUNBUFFERED=1 timeout -k 10 "$b" python3 "$BENCH_SRC/tests/bench/kernels/ddp_gpt2_torch.py" \
      "$ours" "$DDP_BATCH" 1024 "$DDP_STEPS" "$k" > "$s/ddp_w$k.json" 2> "$s/torch_w$k.log"
    rc=$?
    [ $rc -eq 0 ] || { echo "ddp_gpt2_torch.py status $rc:"; tail -15 "$s/torch_w$k.log"; }
    record "scaling_torch_w$k" "$rc" $((SECONDS - t)) \
      "$([ -s "$s/torch_raw_w$k.json" ] && echo "figures written" || echo "no figures")"
    reap_gpu "scaling_torch_w$k"
  done

  # --- summary ---------------------------------------------------------------------------------
  stage "summary"
  python3 - "$WORK" "$n_gpus" <<'EOF'
import glob, json, os, re, sys
work, n = sys.argv[1], int(sys.argv[2])
results = os.path.join(work, "results.jsonl")
lines = []

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

# launcher: binding verdict and the job's throughput
binding = None
try:
    text = open(os.path.join(work, "launcher", "binding.txt")).read()
    m = re.search(r"binding check: (PASS|FAIL)", text)
    binding = m.group(1) if m else None
except OSError:
    pass
throughput = None
try:
    for line in open(os.path.join(work, "launcher", "job.log"), errors="replace"):
        if "throughput" in line:
            throughput = line.strip()
except OSError:
    pass
report = load(os.path.join(work, "launcher", "report.json")) or {}
lines.append({"kind": "launcher", "ranks": n, "binding_check": binding,
              "outcome": report.get("outcome"), "wall_s": report.get("wall_s"),
              "throughput_line": throughput})

# all-reduce
ar = load(os.path.join(work, "allreduce", "allreduce.json"))
ours_ar = load(os.path.join(work, "allreduce", "ours.json"))
if ar:
    print(f'all-reduce on {ar["world_size"]} GPUs, fp32 sum: ours NCCL {ar["ours"]["nccl_version"]}, '
          f'torch {ar["torch"]["version"]} NCCL {ar["torch"]["nccl_version"]}')
    print(f'{"MiB":>6} {"ours busbw":>11} {"torch busbw":>12} {"ours/torch":>10}')
    for r in ar["rows"]:
        print(f'{r["mib"]:6.0f} {r["ours_busbw_GBps"]:11.1f} {r["torch_busbw_GBps"]:12.1f} '
              f'{r["ratio_busbw_ours_over_torch"]:10.3f}')
        lines.append({"kind": "allreduce", "world_size": ar["world_size"], **r})
elif ours_ar:
    for r in ours_ar["results"]:
        lines.append({"kind": "allreduce", "world_size": ours_ar["world_size"], "bytes": r["bytes"],
                      "ours_busbw_GBps": r["busbw_GBps"], "torch_busbw_GBps": None})

# scaling: ours_w*.json, and torch from ddp_w*.json or, when that run was cut short, its raw file
rows = {}
for path in glob.glob(os.path.join(work, "scaling", "ours_w*.json")):
    d = load(path)
    if d:
        rows.setdefault(d["world_size"], {})["ours"] = d
for path in glob.glob(os.path.join(work, "scaling", "torch_raw_w*.json")):
    d = load(path)
    if d:
        rows.setdefault(d["world_size"], {})["torch"] = d
base = {sys_: rows.get(1, {}).get(sys_, {}).get("tokens_per_s_per_gpu") for sys_ in ("ours", "torch")}
print()
print(f'{"GPUs":>4} | {"ours tok/s":>11} {"per GPU":>9} {"exposed ms":>10} {"eff":>5} | '
      f'{"torch tok/s":>11} {"per GPU":>9} {"exposed ms":>10} {"eff":>5} | {"ours/torch":>10}')
for k in sorted(rows, reverse=True):
    cells = []
    for sys_ in ("ours", "torch"):
        d = rows[k].get(sys_)
        if not d:
            cells.append(f'{"-":>11} {"-":>9} {"-":>10} {"-":>5}')
            continue
        eff = None
        if base[sys_]:
            eff = d["tokens_per_s_per_gpu"] / base[sys_]
        exposed = d.get("exposed_comm_ms")
        cells.append(f'{d["tokens_per_s_total"]:>11,.0f} {d["tokens_per_s_per_gpu"]:>9,.0f} '
                     f'{exposed if exposed is not None else "-":>10} '
                     f'{format(eff, ".2f") if eff else "-":>5}')
        line = {"kind": "scaling", "system": sys_, "world_size": k,
                "batch_per_gpu": d.get("batch_per_gpu"), "seq_len": d.get("seq_len"),
                "steps": d.get("steps"), "step_ms": d.get("step_ms"),
                "tokens_per_s_total": d.get("tokens_per_s_total"),
                "tokens_per_s_per_gpu": d.get("tokens_per_s_per_gpu"),
                "exposed_comm_ms": exposed, "step_ms_no_comm": d.get("step_ms_no_comm"),
                "scaling_efficiency_vs_1gpu": round(eff, 3) if eff else None,
                "system_name": d.get("system"), "nccl_version": d.get("nccl_version")}
        if sys_ == "ours":
            line.update({k2: d.get(k2) for k2 in ("comm_ms", "comm_span_ms", "overlap", "buckets",
                                                    "bytes_per_step", "params_identical_across_ranks")})
        if k == 8:
            line["goal_tokens_per_s"] = 4.6e6
            line["llm_c_8xh100_tokens_per_s"] = 3.77e6
        lines.append(line)
    o, t = rows[k].get("ours"), rows[k].get("torch")
    ratio = o["tokens_per_s_total"] / t["tokens_per_s_total"] if o and t else None
    print(f'{k:>4} | {cells[0]} | {cells[1]} | {format(ratio, ".3f") if ratio else "-":>10}')
    if ratio:
        lines.append({"kind": "scaling_ratio", "world_size": k, "ratio_tokens_per_s_ours_over_torch": round(ratio, 3)})
if 8 in rows and rows[8].get("ours"):
    print(f'8 GPUs ours: {rows[8]["ours"]["tokens_per_s_total"]:,.0f} tok/s (goal 4.6M; llm.c 8xH100 3.77M)')
print("(eff = tokens/s per GPU / the 1-GPU figure; exposed = step time - the same step without "
      "the all-reduces)")
with open(results, "a") as f:
    for line in lines:
        f.write(json.dumps(line) + "\n")
EOF
  echo
  echo "=== steps:"
  python3 - "$RESULTS" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("kind") == "step":
        print("  %-22s %-8s %4s s  %s" % (d["name"], d["status"], d["seconds"], d["note"]))
EOF
  echo "total $((SECONDS - T0)) s (DEADLINE_S $DEADLINE_S)"
}

main 2>&1 | tee "$WORK/run.log"

# --- what comes back (at most 8 files) --------------------------------------------------------
cp "$WORK/run.log" "$RESULTS" "$OUT/" 2>/dev/null
cp "$WORK"/topodiag/*.topodiag.json "$WORK"/topodiag/*.baseline.json "$WORK"/topodiag/*.dot \
  "$WORK/topodiag/nvidia-smi-topo.txt" "$OUT/" 2>/dev/null
tar -czf "$OUT/work.tar.gz" -C "$BUILD" work 2>/dev/null
ls -la "$OUT"
# the status: 0 when every step that ran succeeded (a skipped step is not a success: 3)
python3 - "$RESULTS" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind": "step"' in l]
failed = [s["name"] for s in steps if s["status"] not in (0, "skipped")]
skipped = [s["name"] for s in steps if s["status"] == "skipped"]
print("failed:", " ".join(failed) or "none", "| skipped:", " ".join(skipped) or "none")
sys.exit(1 if failed or not steps else 3 if skipped else 0)
EOF
