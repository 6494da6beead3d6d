#!/usr/bin/env bash
# Builds, ON A 2-GPU H200 HOST (or one of RANKS GPUs), `topolaunch` (the launcher), `topodiag` and
# `topolaunch-worker` with the CUDA backend and NCCL, then runs the data-parallel GPT-2 124M job
# configs/jobs/gpt2-124m-h200x2.toml (RANKS=2; other RANKS: the same job with ranks_per_node=RANKS)
# through the launcher: `topolaunch map`, `topolaunch run`, a check that the binding each worker
# reports (GPU PCI bus id, CPU affinity, NUMA memory policy: read back by the worker itself) equals
# the rank map, the job report, the loss and tokens/s; then the same job on one GPU without the
# launcher, for the scaling ratio.
#
# The host (../shared/GPU-HOST.md) has g++ 13, nvcc, NCCL, hwloc, ibverbs and libcrypto, but no
# toml++ and perhaps no fmt / CLI11 / nlohmann-json / OpenSSL / zlib headers, no UCX headers and no
# Slurm, and no network. So this is a plain g++/nvcc build (no meson): every header-only library
# the host lacks comes from .carry-launcher/inc/<library>/ (fmt header-only, FMT_HEADER_ONLY=1), UCX
# is left out (open_ucx_transport answers "not built"; [rdma] preflight = "off" never calls it), and
# wireup has the TCP store only (no PMIx/PMI2).
#
#   tests/gpu/run_launcher_on_gpu_host.sh --prepare   on the Debian build host: fills the git-ignored
#       .carry-launcher/ (headers, the Jane Austen data, a snapshot of the last commit's sources
#       with this checkout's kernels/cuda/cuda_worker.* over it); name it in the device call's carry
#   tests/gpu/run_launcher_on_gpu_host.sh              on the GPU host, from the repository root
#
# SRC: the sources to build (default .carry-launcher/src when it exists, else this tree).
# RANKS (default 2): ranks of the job, one per GPU. JOB_CONFIG=FILE: that job file instead.
# BUILD_ONLY=1: stop after the build. SKIP_BUILD=1: no build, use $BUILD/bin as it is.
# BUILD_BENCH=1: also ddp_gpt2_bench and allreduce_bench (tests/bench/kernels, from
#   $SRC/tests when the snapshot has them, else this tree) into $BUILD/bin, on the same objects.
# SINGLE_GPU=0: no single-GPU reference run at the end.
# (tests/gpu/run_multi_gpu.sh drives this script for the any-GPU-count runs of issue 9.)
# Logs go to $OUT (default build-gpu-launcher/out): build.log map.txt job.log ranks.log report.json
# binding.txt single.log (7 files; the device tool brings back 8).
# Every stage prints "=== STAGE <name>" and "--- <name>: ok|FAILED"; a failed stage does not stop
# the ones that do not need it.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CARRY=.carry-launcher

if [ "${1:-}" = "--prepare" ]; then
  set -e
  rm -rf "$CARRY"
  mkdir -p "$CARRY/inc/fmt" "$CARRY/inc/cli11" "$CARRY/inc/json" "$CARRY/inc/toml" \
    "$CARRY/inc/zlib" "$CARRY/inc/openssl" "$CARRY/data" "$CARRY/src"
  cp -r /usr/include/fmt "$CARRY/inc/fmt/"
  cp -r /usr/include/CLI "$CARRY/inc/cli11/"
  cp -r /usr/include/nlohmann "$CARRY/inc/json/"
  cp -r /usr/include/toml++ "$CARRY/inc/toml/"
  cp /usr/include/zlib.h /usr/include/zconf.h "$CARRY/inc/zlib/"
  cp -r /usr/include/openssl "$CARRY/inc/openssl/"
  cp /usr/include/x86_64-linux-gnu/openssl/*.h "$CARRY/inc/openssl/openssl/"
  cp /usr/lib/R/site-library/janeaustenr/data/Rdata.* "$CARRY/data/"
  git archive HEAD kernels topology wireup rdma launcher configs/jobs | tar -x -C "$CARRY/src"
  cp kernels/cuda/cuda_worker.hpp kernels/cuda/cuda_worker.cpp "$CARRY/src/kernels/cuda/"
  cp configs/jobs/gpt2-124m-h200x2.toml "$CARRY/src/configs/jobs/"
  grep -qx '/.carry-launcher/' .git/info/exclude || echo '/.carry-launcher/' >> .git/info/exclude
  du -sh "$CARRY"
  exit 0
fi

OUT=${OUT:-build-gpu-launcher/out}
BUILD=${BUILD:-build-gpu-launcher}
SRC=${SRC:-}
if [ -z "$SRC" ]; then
  if [ -d "$CARRY/src/kernels" ]; then SRC=$CARRY/src; else SRC=.; fi
fi
mkdir -p "$BUILD/obj" "$BUILD/bin" "$OUT"
CXX=${CXX:-g++}
CUDA=${CUDA:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA/bin/nvcc}
JOBS=${JOBS:-$(nproc)}
RANKS=${RANKS:-2}
BUILD_ONLY=${BUILD_ONLY:-0}
SKIP_BUILD=${SKIP_BUILD:-0}
BUILD_BENCH=${BUILD_BENCH:-0}
BENCH_SRC=$SRC
[ -f "$BENCH_SRC/tests/bench/kernels/ddp_gpt2_bench.cu" ] || BENCH_SRC=.
T0=$SECONDS
stage() { echo; echo "=== STAGE $1 (at $((SECONDS - T0)) s)"; }
result() { if [ "$2" -eq 0 ]; then echo "--- $1: ok"; else echo "--- $1: FAILED (status $2)"; fi; }

stage "host"
{
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
  nvidia-smi topo -m
  echo "nproc $(nproc); numa nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
  $CXX --version | head -1; "$NVCC" --version | tail -1
  grep -h "define NCCL_\(MAJOR\|MINOR\|PATCH\)" /usr/include/nccl.h "$CUDA/include/nccl.h" 2>/dev/null
  echo "sources: $SRC"
} 2>&1 | tee "$BUILD/gpu.txt"

# --- what the host has, what comes from the carried headers -----------------------------------
INC=()
DEFS=()
LIBS=()
# FORCE_CARRIED=1: the carried copy even where the host has one (to check this script's fallback).
pick() {  # pick NAME HEADER CARRIED_DIR
  if [ "${FORCE_CARRIED:-0}" != 1 ] && [ -f "/usr/include/$2" ]; then
    echo "$1: the host's /usr/include/$2"
  elif [ -f "$3/$2" ]; then
    echo "$1: carried ($3)"
    INC+=(-I"$3")
  else
    echo "$1: MISSING (neither /usr/include/$2 nor $3/$2)"
  fi
}
stage "dependencies"
{  # (a group, not a subshell: pick() fills INC/DEFS/LIBS here)
  pick CLI11 CLI/CLI.hpp "$CARRY/inc/cli11"
  pick nlohmann-json nlohmann/json.hpp "$CARRY/inc/json"
  pick toml++ toml++/toml.h "$CARRY/inc/toml"
  pick zlib zlib.h "$CARRY/inc/zlib"
  pick OpenSSL openssl/hmac.h "$CARRY/inc/openssl"
  # fmt: the host's headers and libfmt when both exist, else header-only (ours or carried).
  FMT_SO=$(ls /usr/lib/x86_64-linux-gnu/libfmt.so 2>/dev/null | head -1)
  if [ "${FORCE_CARRIED:-0}" != 1 ] && [ -f /usr/include/fmt/format.h ] && [ -n "$FMT_SO" ]; then
    echo "fmt: the host's headers and $FMT_SO"; LIBS+=(-lfmt)
  elif [ "${FORCE_CARRIED:-0}" != 1 ] && [ -f /usr/include/fmt/format-inl.h ]; then
    echo "fmt: the host's headers, header-only (FMT_HEADER_ONLY=1)"; DEFS+=(-DFMT_HEADER_ONLY=1)
  else
    echo "fmt: carried, header-only (FMT_HEADER_ONLY=1)"
    INC+=(-I"$CARRY/inc/fmt"); DEFS+=(-DFMT_HEADER_ONLY=1)
  fi
  for h in hwloc.h infiniband/verbs.h pmix.h nccl.h ucp/api/ucp.h slurm/spank.h; do
    if [ -f "/usr/include/$h" ] || [ -f "$CUDA/include/$h" ]; then echo "have $h"; else echo "no $h"; fi
  done
} > "$BUILD/deps.txt" 2>&1
HAVE_VERBS=0; [ -f /usr/include/infiniband/verbs.h ] && HAVE_VERBS=1
cat "$BUILD/deps.txt"
CRYPTO=$(ls /usr/lib/x86_64-linux-gnu/libcrypto.so* 2>/dev/null | head -1)
ZLIB=$(ls /usr/lib/x86_64-linux-gnu/libz.so* 2>/dev/null | head -1)
echo "libcrypto: ${CRYPTO:-MISSING}; libz: ${ZLIB:-MISSING}; verbs: $HAVE_VERBS"

OURINC=(-I"$SRC/topology/include" -I"$SRC/wireup/include" -I"$SRC/rdma/include"
        -I"$SRC/launcher/include" -I"$SRC/kernels/include" -I"$SRC/kernels/cpu"
        -I"$SRC/kernels/cuda")
CXXFLAGS=(-std=c++20 -O2 -g0 -pthread -Wall -Wextra "${DEFS[@]}" "${OURINC[@]}" "${INC[@]}"
          -I"$CUDA/include")
NVFLAGS=(-std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 --extended-lambda "${OURINC[@]}")

# --- build: every object in parallel, nvcc first (the long pole) -----------------------------
diag_rc=1; bench_rc=0
if [ "$SKIP_BUILD" = 1 ]; then
stage "build (skipped: SKIP_BUILD=1, using $BUILD/bin)"
launcher_rc=1; [ -x "$BUILD/bin/topolaunch" ] && launcher_rc=0
worker_rc=1; [ -x "$BUILD/bin/topolaunch-worker" ] && worker_rc=0
[ -x "$BUILD/bin/topodiag" ] && diag_rc=0
result "topolaunch present" $launcher_rc
result "topolaunch-worker present" $worker_rc
else
stage "build"
rm -f "$BUILD"/obj/*.o "$BUILD"/obj/*.failed
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.1; done; }
cc() {  # cc OBJ_NAME SOURCE [extra flags...]
  local obj=$1 src=$2; shift 2
  throttle
  ( $CXX "${CXXFLAGS[@]}" "$@" -c "$src" -o "$BUILD/obj/$obj.o" > "$BUILD/obj/$obj.log" 2>&1 \
      || touch "$BUILD/obj/$obj.failed" ) &
}
nv() {  # nv OBJ_NAME SOURCE [extra flags...]
  local obj=$1 src=$2; shift 2
  throttle
  ( "$NVCC" "${NVFLAGS[@]}" "$@" -c "$src" -o "$BUILD/obj/$obj.o" > "$BUILD/obj/$obj.log" 2>&1 \
      || touch "$BUILD/obj/$obj.failed" ) &
}
# LAUNCHER_ONLY=1: the launcher alone (a check of this script on a host without GPUs).
LAUNCHER_ONLY=${LAUNCHER_ONLY:-0}
CUDNN_LIBS=()
if [ "$LAUNCHER_ONLY" != 1 ]; then
  source "$(dirname "${BASH_SOURCE[0]}")/cudnn_flags.sh"
  for f in cuda_backend adamw attention classifier encoder gelu layernorm matmul residual; do
    [ -f "$SRC/kernels/cuda/$f.cu" ] && nv "cu_$f" "$SRC/kernels/cuda/$f.cu"
  done
  [ -f "$SRC/kernels/cuda/attention_cudnn.cu" ] &&
    nv cu_attention_cudnn "$SRC/kernels/cuda/attention_cudnn.cu" "${CUDNN_FLAGS[@]}"
  if [ "$BUILD_BENCH" = 1 ]; then
    nv bench_ddp_gpt2 "$BENCH_SRC/tests/bench/kernels/ddp_gpt2_bench.cu" -I"$BENCH_SRC/tests/gpu"
  fi
fi
# the UCX entry point of the preflight, absent in this build
cat > "$BUILD/obj/ucx_absent.cpp" <<'EOT'
// Generated by tests/gpu/run_launcher_on_gpu_host.sh: this host has no UCX headers.
#include "topolaunch/rdma/endpoint.hpp"
namespace topolaunch::rdma {
Result<std::unique_ptr<Transport>> open_ucx_transport(int, const UcxTransportOptions&) {
  return make_error("rdma: this topolaunch was built without UCX (no UCX headers on the build host); "
                    "set [rdma] preflight = \"off\" or use the verbs transport", 2);
}
}  // namespace topolaunch::rdma
EOT
cat > "$BUILD/obj/verbs_absent.cpp" <<'EOT'
// Generated by tests/gpu/run_launcher_on_gpu_host.sh: this host has no ibverbs headers.
#include "topolaunch/rdma/endpoint.hpp"
namespace topolaunch::rdma {
Result<std::unique_ptr<Transport>> open_verbs_transport(int, const VerbsTransportOptions&) {
  return make_error("rdma: this topolaunch was built without ibverbs; set [rdma] preflight = \"off\"", 2);
}
}  // namespace topolaunch::rdma
EOT
for f in "$SRC"/topology/src/*.cpp "$SRC"/topology/src/diagnose/*.cpp "$SRC"/topology/src/rankmap/*.cpp; do
  cc "topo_$(basename "$(dirname "$f")")_$(basename "$f" .cpp)" "$f"
done
for f in auth backend frame net pmi2_codec pmi2_store pmix_store tcp_client tcp_server; do
  cc "wireup_$f" "$SRC/wireup/src/$f.cpp"
done
RDMA=(directory_store bf16 probe select blob endpoint_common preflight)
[ "$HAVE_VERBS" = 1 ] && RDMA+=(verbs_qp verbs_transport)
for f in "${RDMA[@]}"; do cc "rdma_$f" "$SRC/rdma/src/$f.cpp"; done
cc rdma_ucx_absent "$BUILD/obj/ucx_absent.cpp"
[ "$HAVE_VERBS" = 1 ] || cc rdma_verbs_absent "$BUILD/obj/verbs_absent.cpp"
for f in "$SRC"/launcher/src/*.cpp; do cc "launcher_$(basename "$f" .cpp)" "$f"; done
if [ "$LAUNCHER_ONLY" != 1 ]; then
  for f in graph plan job data checkpoint communicator_tcp communicator_ucx_stub worker; do
    cc "kernels_$f" "$SRC/kernels/src/$f.cpp" -O3 -fopenmp -Wno-restrict
  done
  cc kernels_cpu_backend "$SRC/kernels/cpu/cpu_backend.cpp" -O3 -fopenmp
  cc kernels_worker_main "$SRC/kernels/src/worker_main.cpp" -DTOPOLAUNCH_WITH_CUDA=1
  cc cuda_worker "$SRC/kernels/cuda/cuda_worker.cpp" -DTOPOLAUNCH_WITH_CUDA=1
  cc nccl_communicator "$SRC/kernels/cuda/nccl_communicator.cpp"
  if [ "$BUILD_BENCH" = 1 ]; then
    cc bench_nccl_env "$SRC/kernels/cuda/nccl_communicator_env.cpp"
    cc bench_allreduce "$BENCH_SRC/tests/bench/kernels/allreduce_bench.cpp" -I"$BENCH_SRC/tests/gpu"
  fi
fi
# topodiag (not 'topo_*': those objects are the topology library linked into topolaunch)
cc diag_topodiag_main "$SRC/topology/topodiag/main.cpp" '-DTOPOLAUNCH_VERSION="gpu-host-build"'
wait
build_rc=0
for f in "$BUILD"/obj/*.failed; do
  [ -e "$f" ] || continue
  build_rc=1; n=$(basename "$f" .failed)
  echo "compile FAILED: $n"; head -30 "$BUILD/obj/$n.log"
done
cat "$BUILD"/obj/*.log > "$OUT/build.log" 2>/dev/null
grep -c "warning:" "$OUT/build.log" | sed 's/^/compiler warnings: /'
echo "objects compiled in $((SECONDS - T0)) s"

o() { for n in "$@"; do ls "$BUILD"/obj/$n.o 2>/dev/null; done; }
launcher_rc=1
if $CXX -o "$BUILD/bin/topolaunch" $(o 'launcher_*' 'topo_*' 'wireup_*' 'rdma_*') \
     -lhwloc $([ "$HAVE_VERBS" = 1 ] && echo -libverbs) $CRYPTO "${LIBS[@]}" -ldl -pthread \
     >> "$OUT/build.log" 2>&1; then
  launcher_rc=0
else
  echo "link topolaunch FAILED:"; tail -20 "$OUT/build.log"
fi
result "build topolaunch" $launcher_rc
if $CXX -o "$BUILD/bin/topodiag" $(o diag_topodiag_main 'topo_*') -lhwloc "${LIBS[@]}" -ldl -pthread \
     >> "$OUT/build.log" 2>&1; then
  diag_rc=0
else
  echo "link topodiag FAILED:"; tail -20 "$OUT/build.log"
fi
result "build topodiag" $diag_rc
worker_rc=1
if [ "$LAUNCHER_ONLY" = 1 ]; then
  echo "LAUNCHER_ONLY=1: topolaunch-worker not built"
elif $CXX -fopenmp -o "$BUILD/bin/topolaunch-worker" $(o 'kernels_*' 'cu_*' cuda_worker nccl_communicator 'wireup_*') \
     -L"$CUDA/lib64" -lcublasLt "${CUDNN_LIBS[@]}" -lcudart -lnccl $CRYPTO $ZLIB "${LIBS[@]}" -ldl -pthread \
     >> "$OUT/build.log" 2>&1; then
  worker_rc=0
else
  echo "link topolaunch-worker FAILED:"; tail -20 "$OUT/build.log"
fi
result "build topolaunch-worker" $worker_rc
if [ "$BUILD_BENCH" = 1 ] && [ "$LAUNCHER_ONLY" != 1 ]; then
  # the benchmarks take what they need from one archive of the worker's objects (less its main)
  rm -f "$BUILD/obj/libbench_deps.a"
  ar rcs "$BUILD/obj/libbench_deps.a" $(o 'kernels_*' 'cu_*' nccl_communicator bench_nccl_env 'wireup_*' \
    | grep -v '/kernels_worker_main\.o$') >> "$OUT/build.log" 2>&1 || bench_rc=1
  if ! $CXX -fopenmp -o "$BUILD/bin/ddp_gpt2_bench" $(o bench_ddp_gpt2) "$BUILD/obj/libbench_deps.a" \
         -L"$CUDA/lib64" -lcublasLt "${CUDNN_LIBS[@]}" -lcudart -lnccl $CRYPTO $ZLIB "${LIBS[@]}" -ldl -pthread >> "$OUT/build.log" 2>&1; then
    bench_rc=1; echo "link ddp_gpt2_bench FAILED:"; tail -20 "$OUT/build.log"
  fi
  if ! $CXX -fopenmp -o "$BUILD/bin/allreduce_bench" $(o bench_allreduce) "$BUILD/obj/libbench_deps.a" \
         -L"$CUDA/lib64" -lcudart -lnccl $CRYPTO $ZLIB "${LIBS[@]}" -ldl -pthread >> "$OUT/build.log" 2>&1; then
    bench_rc=1; echo "link allreduce_bench FAILED:"; tail -20 "$OUT/build.log"
  fi
  result "build ddp_gpt2_bench + allreduce_bench" $bench_rc
fi
echo "build done at $((SECONDS - T0)) s"
fi  # SKIP_BUILD
export PATH="$PWD/$BUILD/bin:$PATH"
if [ "$BUILD_ONLY" = 1 ]; then
  echo "=== SUMMARY (BUILD_ONLY=1): build topolaunch $launcher_rc, topodiag $diag_rc," \
    "worker $worker_rc, benches $bench_rc (0 = ok); total $((SECONDS - T0)) s"
  exit $(( launcher_rc || $diag_rc || worker_rc || bench_rc ))
fi

# --- the job --------------------------------------------------------------------------------
# RANKS=2: the x2 job as it is; other counts: the same job with that many ranks (the 8-rank
# configs/jobs/gpt2-124m-h200.toml is the multi-node job: token data file, RDMA preflight).
JOB_SRC=${JOB_CONFIG:-$SRC/configs/jobs/gpt2-124m-h200x2.toml}
JOB_NAME=gpt2-124m-h200x$RANKS
[ -n "${JOB_CONFIG:-}" ] && JOB_NAME=$(basename "$JOB_CONFIG" .toml)
JOB="$PWD/$BUILD/$JOB_NAME.toml"
DATA="$PWD/$CARRY/data/Rdata.rdb"
[ -f "$DATA" ] || DATA=/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb
# the carried data file, the step count (STEPS) and, without JOB_CONFIG, RANKS for this run
RANK_EDIT=()
if [ -z "${JOB_CONFIG:-}" ] && [ "$RANKS" != 2 ]; then
  RANK_EDIT=(-e "s|^ranks_per_node = .*|ranks_per_node = $RANKS           # one rank per GPU (RANKS)|"
             -e "s|^name = .*|name = \"$JOB_NAME\"|")
fi
sed -e "s|^kind = \"janeaustenr\".*|kind = \"janeaustenr\"\npath = \"$DATA\"|" \
    -e "s|^steps = .*|steps = ${STEPS:-40}|" "${RANK_EDIT[@]}" "$JOB_SRC" > "$JOB"
echo "job file: $JOB (from $JOB_SRC, RANKS=$RANKS)"; grep -E "^(name|ranks_per_node|steps) =" "$JOB"
JOBDIR="$PWD/$BUILD/job"
rm -rf "$JOBDIR"

stage "topolaunch map"
map_rc=1
if [ $launcher_rc -eq 0 ]; then
  { timeout 60 topolaunch map "$JOB"; echo "exit status $?"; } > "$OUT/map.txt" 2>&1
  timeout 60 topolaunch map "$JOB" --json > "$BUILD/map.json" 2>> "$OUT/map.txt"
  map_rc=$?
  cat "$OUT/map.txt"; echo "--- map --json:" >> "$OUT/map.txt"; cat "$BUILD/map.json" >> "$OUT/map.txt"
fi
result "topolaunch map" $map_rc

stage "topolaunch run ($RANKS ranks, GPT-2 124M, bf16, NCCL)"
run_rc=1
if [ $launcher_rc -eq 0 ] && [ $worker_rc -eq 0 ]; then
  timeout "${RUN_TIMEOUT_S:-170}" topolaunch run "$JOB" --local --job-dir "$JOBDIR" 2>&1 | tee "$OUT/job.log"
  run_rc=${PIPESTATUS[0]}
  cp "$JOBDIR/report.json" "$OUT/report.json" 2>/dev/null || echo "no report.json in $JOBDIR"
  {
    for f in "$JOBDIR"/attempt-*/rank-*.log; do echo "##### $f"; cat "$f"; done
    echo "##### $JOBDIR/rankmap.json"; cat "$JOBDIR/rankmap.json"
  } > "$OUT/ranks.log" 2>&1
fi
result "topolaunch run" $run_rc

stage "binding check (what each worker reports vs the map)"
python3 - "$BUILD/map.json" "$JOBDIR" > "$OUT/binding.txt" 2>&1 <<'EOF'
import glob, json, os, re, sys

def ids(text):  # "0-3,8" -> {0,1,2,3,8}
    out = set()
    for part in filter(None, text.strip().split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out

def bus(text):  # "00000000:1B:00.0" / "0000:1b:00.0" -> (0, 0x1b, 0, 0)
    m = re.match(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", text.strip())
    return tuple(int(g or "0", 16) for g in m.groups()) if m else None

def ranks_of(path):
    d = json.load(open(path))
    d = d.get("map", d)
    return {r["rank"]: r for r in d["ranks"]}

maps = {}
for label, path in (("topolaunch map", sys.argv[1]), ("the run's rankmap.json",
                                                      os.path.join(sys.argv[2], "rankmap.json"))):
    try:
        maps[label] = ranks_of(path)
    except Exception as e:
        print(f"{label}: cannot read {path}: {e}")
reported = {}
for log in glob.glob(os.path.join(sys.argv[2], "attempt-*", "rank-*.log")):
    for line in open(log, errors="replace"):
        m = re.search(r"rank (\d+) binding: cuda device (\d+) \((.*), pci (\S+), "
                      r"CUDA_VISIBLE_DEVICES=(\S*)\) \| cpus (\S+) \| numa (\S+) \(memory policy (\S+)\)", line)
        if m:
            reported[int(m.group(1))] = m
ok = bool(maps) and bool(reported)
if not reported:
    print("no worker reported its binding (no 'rank N binding:' line in the rank logs)")
for label, ranks in maps.items():
    if len(ranks) != len(reported):
        print(f"{label}: {len(ranks)} ranks, {len(reported)} reported bindings")
        ok = False
    for r, want in sorted(ranks.items()):
        got = reported.get(r)
        if got is None:
            print(f"{label}: rank {r}: no binding reported"); ok = False; continue
        env = want.get("env", {})
        want_bus = [bus(b) for b in env.get("TOPOLAUNCH_GPU_BUSIDS", "").split(",") if b]
        checks = [
            ("gpu pci", [bus(got.group(4))] == want_bus, got.group(4), env.get("TOPOLAUNCH_GPU_BUSIDS")),
            ("CUDA_VISIBLE_DEVICES", got.group(5) == env.get("CUDA_VISIBLE_DEVICES"), got.group(5),
             env.get("CUDA_VISIBLE_DEVICES")),
            ("cpus", ids(got.group(6)) == ids(want["cpus"]), got.group(6), want["cpus"]),
        ]
        if "TOPOLAUNCH_NUMA" in env:  # memory bound to the rank's NUMA node
            checks.append(("numa", got.group(8) == "bind" and ids(got.group(7)) == {int(env["TOPOLAUNCH_NUMA"])},
                           f"{got.group(7)} ({got.group(8)})", env["TOPOLAUNCH_NUMA"]))
        else:
            checks.append(("numa", True, f"{got.group(7)} ({got.group(8)})", f"not bound (map numa {want.get('numa')})"))
        for name, good, g, w in checks:
            print(f"{label}: rank {r} {name}: worker {g} | map {w} -> {'ok' if good else 'MISMATCH'}")
            ok = ok and good
print("binding check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
bind_rc=$?
cat "$OUT/binding.txt"
result "binding check" $bind_rc

stage "loss and throughput"
python3 - "$OUT/job.log" "$OUT/report.json" <<'EOF'
import json, re, sys
losses = [(int(m.group(1)), float(m.group(2)), m.group(3)) for m in
          re.finditer(r"step\s+(\d+)/\d+ \| loss ([0-9.]+) .*?\| (\d+) tok/s", open(sys.argv[1], errors="replace").read())]
for s, l, t in losses:
    print(f"step {s}: loss {l:.4f}, {t} tok/s")
if len(losses) >= 2:
    print("loss falls:", "yes" if losses[-1][1] < losses[0][1] - 0.5 else "NO",
          f"({losses[0][1]:.4f} -> {losses[-1][1]:.4f})")
for line in open(sys.argv[1], errors="replace"):
    if "throughput:" in line or "done:" in line: print(line.rstrip())
try:
    r = json.load(open(sys.argv[2]))
    print("report:", json.dumps({k: r[k] for k in r if k in ("outcome", "wall_s", "all_started_s", "world_size", "attempts")}))
except Exception as e:
    print("report.json:", e)
EOF

stage "the same job on one GPU, no launcher (scaling reference)"
single_rc=1
if [ "${SINGLE_GPU:-1}" = 0 ]; then
  echo "skipped (SINGLE_GPU=0)"; single_rc=0
elif [ $worker_rc -eq 0 ] && [ $((SECONDS - T0)) -lt "${SINGLE_START_BY_S:-270}" ]; then
  (cd "$BUILD" && CUDA_VISIBLE_DEVICES=0 timeout 60 env -u WORLD_SIZE -u RANK topolaunch-worker \
     --set train.steps=20 "$JOB") > "$OUT/single.log" 2>&1
  single_rc=$?
  grep -E "^step|throughput|done|error|topolaunch-worker:" "$OUT/single.log"
else
  echo "skipped (worker not built, or $((SECONDS - T0)) s already spent)"
fi
result "single GPU" $single_rc

echo
echo "=== SUMMARY: build topolaunch $launcher_rc, build worker $worker_rc, map $map_rc, run $run_rc," \
  "binding $bind_rc, single GPU $single_rc (0 = ok); total $((SECONDS - T0)) s"
exit $(( launcher_rc || worker_rc || map_rc || run_rc || bind_rc ))
