#!/usr/bin/env bash
# Builds and runs, on an H200 host, the CUDA kernel tests (tests/gpu/test_cuda_kernels.cu) and the
# kernel benchmark against PyTorch (tests/bench/kernels/gpu_layer_*). Run from the repository
# root. Builds with nvcc directly: the GPU host has no toml++ and another Catch2, and the kernels
# need neither. Writes logs and JSON to $OUT (default: build-gpu/out).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-build-gpu/out}
BUILD=build-gpu
mkdir -p "$BUILD" "$OUT"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
FLAGS=(-std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 --extended-lambda
       -Xcompiler=-fopenmp -Ikernels/include -Itopology/include -Ikernels/cpu -Ikernels/cuda)
source "$(dirname "${BASH_SOURCE[0]}")/cudnn_flags.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
"$NVCC" --version | tail -1 | tee -a "$OUT/gpu.txt"

# Attention (kernels/cuda/attention.cu): its test against the CPU reference, a compute-sanitizer
# pass on the small shapes, and the benchmark against PyTorch SDPA. ONLY=attention runs just this.
run_attention() {
  local rc
  "$NVCC" "${FLAGS[@]}" -Xptxas -v -c kernels/cuda/attention.cu -o "$BUILD/attention.o" \
    > "$OUT/attention_ptxas.log" 2>&1 &
  "$NVCC" "${FLAGS[@]}" -c tests/gpu/test_attention.cu -o "$BUILD/test_attention.o" &
  "$NVCC" "${FLAGS[@]}" -c tests/bench/kernels/attention_bench.cu -o "$BUILD/attention_bench.o" &
  rm -f "$BUILD/attention_cudnn.o"
  "$NVCC" "${FLAGS[@]}" "${CUDNN_FLAGS[@]}" -c kernels/cuda/attention_cudnn.cu \
    -o "$BUILD/attention_cudnn.o" > "$OUT/attention_cudnn_build.log" 2>&1 &
  wait
  if [ ! -f "$BUILD/attention_cudnn.o" ] && [ ${#CUDNN_FLAGS[@]} -gt 0 ]; then
    echo "cuDNN attention: attention_cudnn.cu did not build WITH cuDNN; building it without:"
    tail -20 "$OUT/attention_cudnn_build.log"
    CUDNN_FLAGS=(); CUDNN_LIBS=()
    "$NVCC" "${FLAGS[@]}" -c kernels/cuda/attention_cudnn.cu -o "$BUILD/attention_cudnn.o"
  fi
  [ -f "$BUILD/attention_cudnn.o" ] || { echo "build of attention_cudnn.cu failed"; return 3; }
  "$NVCC" "${FLAGS[@]}" "$BUILD/test_attention.o" "$BUILD/attention.o" "$BUILD/attention_cudnn.o" \
    "${CUDNN_LIBS[@]}" -o "$BUILD/test_attention" \
    || { echo "build of test_attention failed"; cat "$OUT/attention_ptxas.log"; return 3; }
  "$NVCC" "${FLAGS[@]}" "$BUILD/attention_bench.o" "$BUILD/attention.o" "$BUILD/attention_cudnn.o" \
    "${CUDNN_LIBS[@]}" -o "$BUILD/attention_bench" || { echo "build of attention_bench failed"; return 3; }
  if command -v cuobjdump > /dev/null; then
    cuobjdump --dump-sass "$BUILD/attention.o" | grep -c HMMA > "$OUT/attention_hmma_count.txt"
  else
    echo "cuobjdump not on this host" > "$OUT/attention_hmma_count.txt"
  fi
  echo "=== test_attention"
  # one process per implementation: a fault in one cannot hide the others' results
  rc=0
  : > "$OUT/test_attention.log"
  local kinds=(simple tensor_core tensor_core_m64 tensor_core_w32 tensor_core_atomic default)
  [ ${#CUDNN_FLAGS[@]} -eq 0 ] || kinds+=(cudnn)
  for kind in "${kinds[@]}"; do
    timeout 60 "$BUILD/test_attention" "only=$kind" >> "$OUT/test_attention.log" 2>&1
    kind_rc=$?
    echo "test_attention only=$kind exit status: $kind_rc" | tee -a "$OUT/test_attention.log"
    [ "$kind_rc" -eq 0 ] || rc=1
  done
  grep -v '^ok \|exit status' "$OUT/test_attention.log" | head -40
  echo "test_attention: $(grep -c '^ok ' "$OUT/test_attention.log") ok, $(grep -c '^FAIL' "$OUT/test_attention.log") FAIL"
  echo "=== attention_bench T=1024 B=16,64"
  if timeout 100 "$BUILD/attention_bench" 1024 16 64 > "$OUT/attention_ours.json"; then
    PYTHONUNBUFFERED=1 timeout 120 python3 tests/bench/kernels/attention_torch.py "$OUT/attention_ours.json" \
      > "$OUT/attention_bench.json" 2> "$OUT/attention_torch.err"
    [ $? -eq 0 ] || tail -20 "$OUT/attention_torch.err"
    cat "$OUT/attention_bench.json"
  else
    echo "attention_bench failed"; cat "$OUT/attention_ours.json"; [ "$rc" -ne 0 ] || rc=4
  fi
  [ "${MEMCHECK:-1}" = 1 ] || { echo "memcheck left out (MEMCHECK=0)"; return "$rc"; }
  echo "=== compute-sanitizer memcheck test_attention quick"
  local san
  san=$(command -v compute-sanitizer || echo "$(dirname "$NVCC")/compute-sanitizer")
  timeout 50 "$san" --tool memcheck "$BUILD/test_attention" quick \
    > "$OUT/test_attention_memcheck.log" 2>&1
  echo "memcheck exit status: $?"; tail -3 "$OUT/test_attention_memcheck.log"
  return "$rc"
}
if [ "${ONLY:-}" = attention ]; then
  run_attention
  exit $?
fi
KERNEL_OBJS=()  # the op files of kernels/cuda but attention (run_attention builds it)
for op in adamw classifier encoder gelu layernorm matmul residual; do
  "$NVCC" "${FLAGS[@]}" -c "kernels/cuda/$op.cu" -o "$BUILD/$op.o" &
  KERNEL_OBJS+=("$BUILD/$op.o")
done
"$NVCC" "${FLAGS[@]}" -c tests/gpu/test_cuda_kernels.cu -o "$BUILD/test.o" 2>/dev/null &
"$NVCC" "${FLAGS[@]}" -c tests/bench/kernels/gpu_layer_bench.cu -o "$BUILD/bench.o" &
# BASELINE_DIR=dir with an earlier kernels.cu and matmul.cu (and the headers they were written
# against): gpu_layer_bench is also built against those, so that the kernels' before/after
# timings come from the same run (the bench built with -DTL_BENCH_BASELINE_API leaves out what
# the earlier API lacks).
if [ -n "${BASELINE_DIR:-}" ]; then
  "$NVCC" -I"$BASELINE_DIR" "${FLAGS[@]}" -c "$BASELINE_DIR/kernels.cu" -o "$BUILD/kernels_before.o" &
  "$NVCC" -I"$BASELINE_DIR" "${FLAGS[@]}" -c "$BASELINE_DIR/matmul.cu" -o "$BUILD/matmul_before.o" &
  "$NVCC" -I"$BASELINE_DIR" "${FLAGS[@]}" -DTL_BENCH_BASELINE_API \
    -c tests/bench/kernels/gpu_layer_bench.cu -o "$BUILD/bench_before.o" &
fi
wait
"$NVCC" "${FLAGS[@]}" "$BUILD/test.o" "${KERNEL_OBJS[@]}" -lcublasLt \
  -o "$BUILD/test_cuda_kernels" || { echo "build of test_cuda_kernels failed"; exit 3; }
"$NVCC" "${FLAGS[@]}" "$BUILD/bench.o" "${KERNEL_OBJS[@]}" -lcublasLt \
  -o "$BUILD/gpu_layer_bench" || { echo "build of gpu_layer_bench failed"; exit 3; }
if [ -n "${BASELINE_DIR:-}" ]; then
  "$NVCC" "${FLAGS[@]}" "$BUILD/bench_before.o" "$BUILD/kernels_before.o" "$BUILD/matmul_before.o" \
    -lcublasLt -o "$BUILD/gpu_layer_bench_before" || echo "build of gpu_layer_bench_before failed"
fi
echo "=== test_cuda_kernels"
"$BUILD/test_cuda_kernels" 2>&1 | tee "$OUT/test_cuda_kernels.log"
test_rc=${PIPESTATUS[0]}
echo "test_cuda_kernels exit status: $test_rc"
echo "=== gpu_layer_bench B=16 T=1024"
"$BUILD/gpu_layer_bench" 16 1024 | tee "$OUT/gpu_layer_ours.json" || exit 4
before_json=()
if [ -x "$BUILD/gpu_layer_bench_before" ]; then
  echo "=== gpu_layer_bench (kernels of $BASELINE_DIR) B=16 T=1024"
  "$BUILD/gpu_layer_bench_before" 16 1024 > "$OUT/gpu_layer_ours_before.json" \
    && before_json=("$OUT/gpu_layer_ours_before.json")
fi
echo "=== gpu_layer_torch B=16 T=1024"
PYTHONUNBUFFERED=1 python3 tests/bench/kernels/gpu_layer_torch.py "$OUT/gpu_layer_ours.json" 16 1024 \
  "${before_json[@]}" > "$OUT/gpu_layer_bench.json" 2> "$OUT/gpu_layer_torch.err"
torch_rc=$?
cat "$OUT/gpu_layer_bench.json"
[ $torch_rc -eq 0 ] || tail -20 "$OUT/gpu_layer_torch.err"
# ONLY=kernels: the kernel tests and benchmarks above, without the attention part
if [ "${ONLY:-}" = kernels ]; then
  exit "$test_rc"
fi
run_attention
attention_rc=$?
[ "$test_rc" -ne 0 ] || test_rc=$attention_rc
exit "$test_rc"
