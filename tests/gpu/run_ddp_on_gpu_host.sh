#!/usr/bin/env bash
# Builds and runs, on a 2-GPU H200 host, the NCCL communicator's test (tests/gpu/test_nccl.cpp),
# the all-reduce benchmark against PyTorch (tests/bench/kernels/allreduce_{bench.cpp,torch.py})
# and, when the CUDA executor is in the tree (RUN_DDP=0 skips it), data-parallel GPT-2 124M on both
# GPUs against PyTorch DDP + torch.compile (tests/bench/kernels/ddp_gpt2_{bench.cu,torch.py};
# DDP_BATCH, default 64 per GPU). The executor's nvcc build runs in the background meanwhile.
# Run from the repository root. Builds with g++ directly: the GPU host lacks toml++, CLI11 and our
# Catch2 version, and these programs need none of them (wireup's TCP store + NCCL + cudart only).
#
# OpenSSL (wireup's HMAC): the host's headers when it has them, else the copy carried in
# build-nccl/openssl/include (OpenSSL 3.0 headers from the Debian build host); libcrypto.so.3 from
# the host, else build-nccl/openssl/lib. Writes logs and JSON to $OUT (default build-gpu-nccl/out),
# at most 8 files (the device tool's limit).
#
# DDP_ONLY=1: only the data-parallel GPT-2 benchmark (no test_nccl, no all-reduce benchmark);
# RUN_TORCH_DDP=0: without its PyTorch peer; GPU_LOCK=FILE: the benchmark holds flock FILE while it
# runs (a caller running other GPU work beside this script keeps the two apart).
#
# SRC: where every source comes from (default: this tree). On a shared checkout, a snapshot of the
# last commit keeps the run away from files another engineer is editing at that moment:
#   git archive HEAD kernels topology/include wireup tests/gpu tests/bench/kernels | tar -x -C DIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-build-gpu-nccl/out}
BUILD=build-gpu-nccl
mkdir -p "$BUILD/obj" "$BUILD/logs" "$OUT"
CXX=${CXX:-g++}
CUDA=${CUDA:-/usr/local/cuda}
SRC=${SRC:-.}

{
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
  nvidia-smi topo -m
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
  grep -h "define NCCL_\(MAJOR\|MINOR\|PATCH\)" /usr/include/nccl.h "$CUDA/include/nccl.h" 2>/dev/null
  $CXX --version | head -1
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

SSL_INC=()
if ! echo '#include <openssl/hmac.h>' | $CXX -x c++ -fsyntax-only - 2>/dev/null; then
  echo "no OpenSSL headers on this host: using build-nccl/openssl/include"
  SSL_INC=(-Ibuild-nccl/openssl/include)
fi
CRYPTO=/usr/lib/x86_64-linux-gnu/libcrypto.so.3
RPATH=()
if [ ! -e "$CRYPTO" ]; then
  echo "no libcrypto.so.3 on this host: using build-nccl/openssl/lib"
  CRYPTO=build-nccl/openssl/lib/libcrypto.so.3
  RPATH=(-Wl,-rpath,"$PWD/build-nccl/openssl/lib")
fi

INC=(-I"$SRC/kernels/include" -I"$SRC/topology/include" -I"$SRC/kernels/cpu" -I"$SRC/kernels/cuda"
     -I"$SRC/wireup/include" -I"$SRC/tests/gpu")
FLAGS=(-std=c++20 -O2 -pthread "${INC[@]}" -I"$SRC/wireup/src" -I"$CUDA/include" "${SSL_INC[@]}")

# The data-parallel benchmark needs the executor (nvcc, minutes of compile): started now, in the
# background, linked once the objects below exist.
RUN_DDP=${RUN_DDP:-1}
[ -f "$SRC/kernels/cuda/cuda_backend.cu" ] || RUN_DDP=0
NVCC=${NVCC:-$CUDA/bin/nvcc}
NVFLAGS=(-std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 --extended-lambda "${INC[@]}")
source "$(dirname "${BASH_SOURCE[0]}")/cudnn_flags.sh"
if [ "$RUN_DDP" = 1 ]; then
  (
    t0=$SECONDS
    rm -f "$BUILD/obj/DDP_FAILED"
    throttle() { while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-$(nproc)}" ]; do sleep 0.2; done; }
    cudnn_src=(); [ ! -f "$SRC/kernels/cuda/attention_cudnn.cu" ] || cudnn_src=(kernels/cuda/attention_cudnn.cu)
    for src in kernels/cuda/{adamw,attention,classifier,encoder,gelu,layernorm,matmul,residual}.cu \
               kernels/cuda/cuda_backend.cu tests/bench/kernels/ddp_gpt2_bench.cu "${cudnn_src[@]}"; do
      throttle
      extra=(); [ "$src" != kernels/cuda/attention_cudnn.cu ] || extra=("${CUDNN_FLAGS[@]}")
      "$NVCC" "${NVFLAGS[@]}" "${extra[@]}" -c "$SRC/$src" -o "$BUILD/obj/ddp_$(basename "$src").o" \
        || touch "$BUILD/obj/DDP_FAILED" &
    done
    for src in kernels/src/graph.cpp kernels/src/plan.cpp kernels/cpu/cpu_backend.cpp; do
      throttle
      $CXX -std=c++20 -O3 -fopenmp "${INC[@]}" -c "$SRC/$src" -o "$BUILD/obj/ddp_$(basename "$src").o" \
        || touch "$BUILD/obj/DDP_FAILED" &
    done
    wait
    rc=0; [ ! -e "$BUILD/obj/DDP_FAILED" ] || rc=1
    echo "ddp objects compiled in $((SECONDS - t0)) s (status $rc)"
    exit $rc
  ) > "$BUILD/logs/ddp_build.log" 2>&1 &
  ddp_build_pid=$!
fi
JOBS=${JOBS:-$(nproc)}
compile() {  # compile SRC OBJ, at most JOBS at a time
  while [ "$(jobs -rp | wc -l)" -ge "$((JOBS + 1))" ]; do sleep 0.2; done
  $CXX "${FLAGS[@]}" -c "$1" -o "$2" || touch "$BUILD/obj/FAILED" &
}
rm -f "$BUILD/obj/FAILED"
for f in auth backend frame net pmi2_codec pmi2_store pmix_store tcp_client tcp_server; do
  compile "$SRC/wireup/src/$f.cpp" "$BUILD/obj/wireup_$f.o"
done
compile "$SRC/kernels/cuda/nccl_communicator.cpp" "$BUILD/obj/nccl.o"
compile "$SRC/kernels/cuda/nccl_communicator_env.cpp" "$BUILD/obj/nccl_env.o"
compile "$SRC/tests/gpu/test_nccl.cpp" "$BUILD/obj/test_nccl.o"
compile "$SRC/tests/bench/kernels/allreduce_bench.cpp" "$BUILD/obj/bench.o"
for p in $(jobs -p); do [ "$p" = "${ddp_build_pid:-}" ] || wait "$p"; done
[ ! -e "$BUILD/obj/FAILED" ] || { echo "compile failed"; exit 3; }
LIBS=("$BUILD"/obj/wireup_*.o "$BUILD/obj/nccl.o" "$BUILD/obj/nccl_env.o" -L"$CUDA/lib64"
      -lnccl -lcudart "$CRYPTO" "${RPATH[@]}" -pthread)
$CXX -o "$BUILD/test_nccl" "$BUILD/obj/test_nccl.o" "${LIBS[@]}" || { echo "link test_nccl failed"; exit 3; }
$CXX -o "$BUILD/allreduce_bench" "$BUILD/obj/bench.o" "${LIBS[@]}" || { echo "link bench failed"; exit 3; }

test_rc=0
if [ "${DDP_ONLY:-0}" != 1 ]; then
echo "=== test_nccl"
TEST_NCCL_LOG_DIR="$BUILD/logs" timeout 260 "$BUILD/test_nccl" 2>&1 | tee "$OUT/test_nccl.log" | grep -E "^(FAIL|PASS|test_nccl|error after|after)"
test_rc=${PIPESTATUS[0]}
echo "test_nccl exit status: $test_rc"

echo "=== allreduce_bench (ours) 1 MiB .. 1 GiB"
timeout 120 "$BUILD/allreduce_bench" --out "$OUT/allreduce_ours.json" 2> "$BUILD/logs/bench.err"
bench_rc=$?
tail -12 "$BUILD/logs/bench.err"
if [ $bench_rc -eq 0 ]; then
  echo "=== allreduce_torch (torch.distributed, NCCL)"
  PYTHONUNBUFFERED=1 timeout 120 python3 "$SRC/tests/bench/kernels/allreduce_torch.py" "$OUT/allreduce_ours.json" \
    > "$OUT/allreduce_bench.json" 2> "$BUILD/logs/allreduce_torch.err"
  torch_rc=$?
  python3 - "$OUT/allreduce_bench.json" <<'EOF' || tail -20 "$BUILD/logs/allreduce_torch.err"
import json, sys
d = json.load(open(sys.argv[1]))
print("ours nccl", d["ours"]["nccl_version"], "| torch", d["torch"]["version"], "nccl", d["torch"]["nccl_version"])
print(f'{"MiB":>6} {"ours busbw":>11} {"torch busbw":>12} {"ratio":>6} {"ours call ms":>13}')
for r in d["rows"]:
    print(f'{r["mib"]:6.0f} {r["ours_busbw_GBps"]:11.1f} {r["torch_busbw_GBps"]:12.1f} {r["ratio_busbw_ours_over_torch"]:6.3f} {r["ours_per_call_event_ms_median"]:13.4f}')
EOF
  cat "$BUILD/logs/allreduce_torch.err" >> "$OUT/errors.log"
  echo "allreduce_torch exit status: $torch_rc"
else
  echo "allreduce_bench failed (exit $bench_rc)"; cat "$BUILD/logs/bench.err" | tail -30
fi

fi  # DDP_ONLY

ddp_rc=0
if [ "$RUN_DDP" = 1 ]; then
  echo "=== ddp_gpt2_bench (ours), 2 GPUs, B=${DDP_BATCH:-64}/GPU, T=1024 (at ${SECONDS} s)"
  wait "$ddp_build_pid"; build_rc=$?
  cat "$BUILD/logs/ddp_build.log" >> "$OUT/errors.log"
  tail -3 "$BUILD/logs/ddp_build.log"
  if [ $build_rc -eq 0 ] && $CXX -fopenmp -o "$BUILD/ddp_gpt2_bench" "$BUILD"/obj/ddp_*.o \
       "${LIBS[@]}" -lcublasLt "${CUDNN_LIBS[@]}" >> "$OUT/errors.log" 2>&1; then
    ${GPU_LOCK:+flock "$GPU_LOCK"} timeout 150 "$BUILD/ddp_gpt2_bench" --batch "${DDP_BATCH:-64}" --out "$OUT/ddp_ours.json" \
      2>&1 | tee -a "$OUT/errors.log" | grep -E "^rank|FATAL|failed"
    ddp_rc=${PIPESTATUS[0]}
    echo "ddp_gpt2_bench exit status: $ddp_rc"; cat "$OUT/ddp_ours.json" 2>/dev/null
  else
    echo "ddp_gpt2_bench build failed (see errors.log)"; tail -20 "$OUT/errors.log"; ddp_rc=3
  fi
  if [ "${RUN_TORCH_DDP:-1}" = 0 ]; then
    echo "ddp_gpt2_torch.py not run (RUN_TORCH_DDP=0)"
  elif [ $SECONDS -lt "${TORCH_DDP_START_BY_S:-230}" ]; then
    echo "=== ddp_gpt2_torch.py (PyTorch DDP + torch.compile) (at ${SECONDS} s)"
    ours=$OUT/ddp_ours.json; [ -s "$ours" ] || ours=none
    # DEADLINE_S: the whole run's limit (the device call's); PyTorch stops 5 s before it.
    torch_timeout=${TORCH_DDP_TIMEOUT_S:-200}
    if [ -n "${DEADLINE_S:-}" ] && [ $((DEADLINE_S - SECONDS - 5)) -lt "$torch_timeout" ]; then
      torch_timeout=$((DEADLINE_S - SECONDS - 5))
    fi
    DDP_TORCH_RAW=$OUT/ddp_torch_raw.json PYTHONUNBUFFERED=1 timeout "$torch_timeout" python3 "$SRC/tests/bench/kernels/ddp_gpt2_torch.py" \
      "$ours" "${DDP_BATCH:-64}" 1024 20 > "$OUT/ddp_gpt2.json" 2>> "$OUT/errors.log"
    echo "ddp_gpt2_torch exit status: $?"; cat "$OUT/ddp_gpt2.json"
  else
    echo "ddp_gpt2_torch.py skipped: ${SECONDS} s already spent (TORCH_DDP_START_BY_S)"
  fi
fi
echo "total ${SECONDS} s"
exit "$test_rc"
