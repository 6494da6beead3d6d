#!/usr/bin/env bash
# Builds the CUDA executor, its test and the GPT-2 benchmark with nvcc/g++ on an H200 host (that
# host has no toml++ and another Catch2; these programs need neither) and runs them. From the
# repository root:
#   MODE=test  tests/gpu/run_cuda_backend.sh   test_cuda_backend + the PyTorch reference of the
#                                              small GPT + a short GPT-2 124M smoke run
#   MODE=build tests/gpu/run_cuda_backend.sh   only build (test_cuda_backend, gpt2_bench)
#   MODE=bench tests/gpu/run_cuda_backend.sh   test_cuda_backend, then gpt2_bench (B=16, 64, 8
#                                              graph vs op by op, B=64 under 16 GiB, op profile
#                                              at B=16) + gpt2_torch.py (eager, compile)
# Logs and JSON go to $OUT (default build-gpu-exec/out).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODE=${MODE:-test}
OUT=${OUT:-build-gpu-exec/out}
BUILD=build-gpu-exec
mkdir -p "$BUILD" "$OUT"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
# USE_COMMITTED_KERNELS=1: build the op files below and their headers as committed (carried in
# .carry-cudaexec/committed/), not their working copies, so that measured figures belong to a
# commit.
KERNEL_OPS=(adamw attention classifier encoder gelu layernorm matmul residual)
CUDA_SRC=kernels/cuda
if [ "${USE_COMMITTED_KERNELS:-0}" = 1 ]; then
  CUDA_SRC=$BUILD/src
  rm -rf "$CUDA_SRC"; mkdir -p "$CUDA_SRC"
  cp kernels/cuda/*.cu kernels/cuda/*.cuh kernels/cuda/*.hpp kernels/cuda/*.cpp "$CUDA_SRC"/
  cp .carry-cudaexec/committed/* "$CUDA_SRC"/
  echo "using the committed op files (${KERNEL_OPS[*]})"
fi
INC=(-Ikernels/include -Itopology/include -Ikernels/cpu -I"$CUDA_SRC")
NVFLAGS=(-std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 --extended-lambda "${INC[@]}")
CXXFLAGS=(-std=c++20 -O3 -fopenmp "${INC[@]}")
source "$(dirname "${BASH_SOURCE[0]}")/cudnn_flags.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv \
  | tee "$OUT/gpu.txt"
"$NVCC" --version | tail -1 | tee -a "$OUT/gpu.txt"

build() {
  local t0=$SECONDS pids=() objs=()
  rm -f "$BUILD"/*.o
  for src in kernels/src/graph.cpp kernels/src/plan.cpp kernels/cpu/cpu_backend.cpp; do
    local o="$BUILD/$(basename "$src").o"
    objs+=("$o")
    g++ "${CXXFLAGS[@]}" -c "$src" -o "$o" & pids+=($!)
  done
  local kernel_srcs=() kernel_objs=() committed_objs=()
  for f in "${KERNEL_OPS[@]}"; do
    kernel_srcs+=("$CUDA_SRC/$f.cu")
    kernel_objs+=("$BUILD/$f.cu.o")
    committed_objs+=("$BUILD/committed/$f.cu.o")
  done
  for src in "${kernel_srcs[@]}" "$CUDA_SRC"/cuda_backend.cu tests/gpu/test_cuda_backend.cu \
             tests/bench/kernels/gpt2_bench.cu; do
    "$NVCC" "${NVFLAGS[@]}" -c "$src" -o "$BUILD/$(basename "$src").o" & pids+=($!)
  done
  "$NVCC" "${NVFLAGS[@]}" "${CUDNN_FLAGS[@]}" -c kernels/cuda/attention_cudnn.cu \
    -o "$BUILD/attention_cudnn.cu.o" > "$BUILD/attention_cudnn_build.log" 2>&1 &
  local cudnn_pid=$!
  # the committed kernels too (test mode: a second test binary, to tell our failures from theirs)
  mkdir -p "$BUILD/committed"
  if [ "$MODE" = test ]; then
    for f in "${KERNEL_OPS[@]}"; do
      [ -f ".carry-cudaexec/committed/$f.cu" ] &&
        { "$NVCC" "${NVFLAGS[@]}" -c ".carry-cudaexec/committed/$f.cu" -o "$BUILD/committed/$f.cu.o" & }
    done
  fi
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  wait "$cudnn_pid"
  wait
  if [ ! -f "$BUILD/attention_cudnn.cu.o" ] && [ ${#CUDNN_FLAGS[@]} -gt 0 ]; then
    echo "cuDNN attention: attention_cudnn.cu did not build WITH cuDNN; building it without:"
    tail -20 "$BUILD/attention_cudnn_build.log"
    CUDNN_FLAGS=(); CUDNN_LIBS=()
    "$NVCC" "${NVFLAGS[@]}" -c kernels/cuda/attention_cudnn.cu -o "$BUILD/attention_cudnn.cu.o"
  fi
  # an op file whose working copy does not build: the committed version carried in
  # .carry-cudaexec/committed/.
  for f in "${KERNEL_OPS[@]}"; do
    if [ ! -f "$BUILD/$f.cu.o" ] && [ -f ".carry-cudaexec/committed/$f.cu" ]; then
      echo "$f.cu did not build; using the committed version (.carry-cudaexec/committed/$f.cu)"
      "$NVCC" "${NVFLAGS[@]}" -c ".carry-cudaexec/committed/$f.cu" -o "$BUILD/$f.cu.o"
    fi
  done
  rc=0
  for o in "${objs[@]}" "${kernel_objs[@]}" "$BUILD"/{attention_cudnn,cuda_backend,test_cuda_backend,gpt2_bench}.cu.o; do
    [ -f "$o" ] || { echo "missing $o"; rc=1; }
  done
  [ $rc -eq 0 ] || { echo "compile failed"; return 3; }
  local lib=("${objs[@]}" "${kernel_objs[@]}" "$BUILD/attention_cudnn.cu.o"
             "$BUILD/cuda_backend.cu.o")
  "$NVCC" "${NVFLAGS[@]}" -Xcompiler=-fopenmp "$BUILD/test_cuda_backend.cu.o" "${lib[@]}" \
    -lcublasLt "${CUDNN_LIBS[@]}" -lgomp -o "$BUILD/test_cuda_backend" || return 3
  "$NVCC" "${NVFLAGS[@]}" -Xcompiler=-fopenmp "$BUILD/gpt2_bench.cu.o" "${lib[@]}" \
    -lcublasLt "${CUDNN_LIBS[@]}" -lgomp -o "$BUILD/gpt2_bench" || return 3
  local have_committed=1
  for o in "${committed_objs[@]}"; do [ -f "$o" ] || have_committed=0; done
  if [ "$MODE" = test ] && [ "$have_committed" = 1 ]; then
    "$NVCC" "${NVFLAGS[@]}" -Xcompiler=-fopenmp "$BUILD/test_cuda_backend.cu.o" "${objs[@]}" \
      "${committed_objs[@]}" "$BUILD/attention_cudnn.cu.o" \
      "$BUILD/cuda_backend.cu.o" -lcublasLt "${CUDNN_LIBS[@]}" -lgomp \
      -o "$BUILD/test_cuda_backend_committed"
  fi
  echo "built in $((SECONDS - t0)) s"
}

# topolaunch-worker with the CUDA backend (train.precision = "bf16"): toml++ and zlib's headers
# come from the carried .carry-cudaexec/include (the host has neither dev package).
build_worker() {
  local pids=() objs=() rc=0
  for src in kernels/src/graph.cpp kernels/src/plan.cpp kernels/src/job.cpp kernels/src/data.cpp \
             kernels/src/checkpoint.cpp kernels/src/communicator_tcp.cpp \
             kernels/src/communicator_ucx_stub.cpp kernels/src/worker.cpp \
             kernels/src/worker_main.cpp kernels/cpu/cpu_backend.cpp "$CUDA_SRC"/cuda_worker.cpp; do
    local o="$BUILD/w_$(basename "$src").o"
    objs+=("$o")
    g++ "${CXXFLAGS[@]}" -DTOPOLAUNCH_WITH_CUDA=1 -I.carry-cudaexec/include \
      -I/usr/local/cuda/include -c "$src" -o "$o" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] || { echo "worker compile failed"; return 3; }
  local zlib=$(ls /usr/lib/x86_64-linux-gnu/libz.so* 2>/dev/null | head -1)
  local kernel_objs=()
  for f in "${KERNEL_OPS[@]}"; do kernel_objs+=("$BUILD/$f.cu.o"); done
  "$NVCC" "${NVFLAGS[@]}" -Xcompiler=-fopenmp "${objs[@]}" "${kernel_objs[@]}" \
    "$BUILD/attention_cudnn.cu.o" "$BUILD/cuda_backend.cu.o" -lcublasLt "${CUDNN_LIBS[@]}" -lgomp \
    $zlib -o "$BUILD/topolaunch-worker"
}

# Rebuild only when a source changed since the last build on this machine (a warm machine keeps
# build-gpu-exec/ between calls).
SOURCES=(kernels/src/*.cpp kernels/include/topolaunch/kernels/*.hpp kernels/cpu/* kernels/cuda/*
         tests/gpu/test_cuda_backend.cu tests/bench/kernels/gpt2_bench.cu)
STAMP=$(cat "${SOURCES[@]}" | md5sum | cut -d' ' -f1)-committed${USE_COMMITTED_KERNELS:-0}-cudnn${#CUDNN_FLAGS[@]}
if [ -x "$BUILD/gpt2_bench" ] && [ -x "$BUILD/test_cuda_backend" ] && \
   [ "$(cat "$BUILD/stamp" 2>/dev/null)" = "$STAMP" ]; then
  echo "build-gpu-exec is up to date ($STAMP)" | tee "$OUT/build.log"
else
  rm -f "$BUILD/stamp"
  build 2>&1 | tee "$OUT/build.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 3
  echo "$STAMP" > "$BUILD/stamp"
fi

[ "$MODE" != build ] || exit 0

if [ "$MODE" = test ]; then
  build_worker > "$OUT/worker_build.log" 2>&1 &
  worker_build_pid=$!
  echo "=== test_cuda_backend"
  "$BUILD/test_cuda_backend" "$OUT" 2>&1 | tee "$OUT/test_cuda_backend.log"
  test_rc=${PIPESTATUS[0]}
  echo "test_cuda_backend exit status: $test_rc"
  if [ "$test_rc" -ne 0 ] && [ -x "$BUILD/test_cuda_backend_committed" ]; then
    echo "=== test_cuda_backend with the COMMITTED op files"
    mkdir -p "$OUT/committed"
    "$BUILD/test_cuda_backend_committed" "$OUT/committed" 2>&1 | tee "$OUT/test_cuda_backend_committed.log"
    echo "test_cuda_backend (committed kernels) exit status: ${PIPESTATUS[0]}"
  fi
  echo "=== gpt2_torch_reference"
  if [ -f "$OUT/gpt2_small.json" ]; then
    PYTHONUNBUFFERED=1 timeout 120 python3 tests/bench/kernels/gpt2_torch_reference.py "$OUT" \
      > "$OUT/gpt2_torch_reference.json" 2> "$OUT/gpt2_torch_reference.err"
    ref_rc=$?
    cat "$OUT/gpt2_torch_reference.json"; tail -5 "$OUT/gpt2_torch_reference.err"
    echo "gpt2_torch_reference exit status: $ref_rc"
  else
    ref_rc=9
  fi
  echo "=== topolaunch-worker, train.precision = bf16 (CUDA backend)"
  if wait "$worker_build_pid"; then
    cat > "$OUT/job.toml" <<EOT
[model]
kind = "gpt2"
n_layer = 2
n_embd = 128
n_head = 2
block_size = 128
[data]
kind = "text"
path = "README.md"
[train]
batch = 16
seq_len = 128
steps = 60
learning_rate = 3e-3
log_every = 10
precision = "bf16"
metrics_file = "$OUT/worker_metrics.jsonl"
EOT
    timeout 60 "$BUILD/topolaunch-worker" "$OUT/job.toml" 2>&1 | tee "$OUT/worker.log"
    echo "topolaunch-worker exit status: ${PIPESTATUS[0]}"
  else
    tail -20 "$OUT/worker_build.log"; echo "worker build failed (see worker_build.log)"
  fi
  echo "=== gpt2_bench smoke (B=16 graph, B=8 op by op)"
  timeout 60 "$BUILD/gpt2_bench" 16:graph 8:op_by_op 2>&1 | tee "$OUT/gpt2_smoke.jsonl"
  exit $(( test_rc != 0 || ref_rc != 0 ))
fi

# Few files come back from the device: intermediates in $LOGS, the joined JSON lines in $OUT.
LOGS=$(mktemp -d)
echo "=== test_cuda_backend (the build being measured is the one tested)"
"$BUILD/test_cuda_backend" > "$LOGS/test.log" 2>&1
echo "test_cuda_backend exit status: $?"; grep -E "^FAIL|checks failed" "$LOGS/test.log"
echo "=== gpt2_bench (ours)"
"$BUILD/gpt2_bench" ${OURS_CONFIGS:-} 2>"$LOGS/gpt2_bench.err" | tee "$LOGS/gpt2_ours.jsonl"
tail -5 "$LOGS/gpt2_bench.err"
echo "=== gpt2_torch.py (eager, compile)"
PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT_S:-370} python3 tests/bench/kernels/gpt2_torch.py "$LOGS/gpt2_ours.jsonl" \
  ${TORCH_BATCHES:-16 64} 2>"$LOGS/gpt2_torch.err" | tee "$LOGS/gpt2_torch.jsonl"
tail -5 "$LOGS/gpt2_torch.err"
cat "$LOGS/gpt2_ours.jsonl" "$LOGS/gpt2_torch.jsonl" > "$OUT/gpt2_bench.jsonl"
