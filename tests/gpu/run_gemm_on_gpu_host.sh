#!/usr/bin/env bash
# Builds and runs, on an H200 host, the CUDA kernel tests (tests/gpu/test_cuda_kernels.cu, which
# hold the GEMM autotune and fused bias-gradient checks) and the GEMM benchmark against PyTorch
# (tests/bench/kernels/gemm_bench.cu + gemm_torch.py, at N = 16384 and 65536 tokens). With two
# GPUs the test runs on the first while the benchmark runs on the second (with one, one after the
# other). Run from the repository root; builds with nvcc directly, as run_on_gpu_host.sh does.
# Writes logs and JSON to $OUT (default: build-gpu/out). Exit status: the test's.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-build-gpu/out}
BUILD=build-gpu-gemm
mkdir -p "$BUILD" "$OUT"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
FLAGS=(-std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 --extended-lambda
       -Xcompiler=-fopenmp -Ikernels/include -Itopology/include -Ikernels/cpu -Ikernels/cuda)
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv \
  | tee "$OUT/gpu.txt"
"$NVCC" --version | tail -1 | tee -a "$OUT/gpu.txt"
gpus=$(nvidia-smi -L | wc -l)

{
  KERNEL_OBJS=()
  for op in adamw classifier encoder gelu layernorm matmul residual; do
    "$NVCC" "${FLAGS[@]}" -c "kernels/cuda/$op.cu" -o "$BUILD/$op.o" &
    KERNEL_OBJS+=("$BUILD/$op.o")
  done
  "$NVCC" "${FLAGS[@]}" -c tests/gpu/test_cuda_kernels.cu -o "$BUILD/test.o" &
  "$NVCC" "${FLAGS[@]}" -c tests/bench/kernels/gemm_bench.cu -o "$BUILD/gemm_bench.o" &
  wait
  "$NVCC" "${FLAGS[@]}" "$BUILD/test.o" "${KERNEL_OBJS[@]}" -lcublasLt \
    -o "$BUILD/test_cuda_kernels"
  "$NVCC" "${FLAGS[@]}" "$BUILD/gemm_bench.o" "$BUILD/matmul.o" -lcublasLt \
    -o "$BUILD/gemm_bench"
} > "$OUT/build.log" 2>&1
if [ ! -x "$BUILD/test_cuda_kernels" ] || [ ! -x "$BUILD/gemm_bench" ]; then
  echo "build failed"
  tail -40 "$OUT/build.log"
  exit 3
fi

run_test() {
  # fewer OpenMP threads for the CPU references: the benchmark beside it needs a core to launch
  CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=${TEST_OMP_THREADS:-16} \
    timeout "${TEST_TIMEOUT_S:-120}" "$BUILD/test_cuda_kernels" \
    > "$OUT/test_cuda_kernels.log" 2>&1
  echo "test_cuda_kernels exit status: $?" >> "$OUT/test_cuda_kernels.log"
}
run_bench() {
  local dev=$(( gpus > 1 ? 1 : 0 ))
  CUDA_VISIBLE_DEVICES=$dev timeout "${BENCH_TIMEOUT_S:-90}" "$BUILD/gemm_bench" 16384 65536 \
    > "$OUT/gemm_ours.json" 2> "$OUT/gemm_bench.err" || { echo "gemm_bench failed"; return 4; }
  CUDA_VISIBLE_DEVICES=$dev PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT_S:-90}" \
    python3 tests/bench/kernels/gemm_torch.py "$OUT/gemm_ours.json" \
    > "$OUT/gemm_bench.json" 2>> "$OUT/gemm_bench.err" || { echo "gemm_torch.py failed"; return 5; }
}
if [ "$gpus" -gt 1 ]; then
  run_test &
  test_pid=$!
  run_bench
  bench_rc=$?
  wait "$test_pid"
else
  run_test
  run_bench
  bench_rc=$?
fi
echo "=== test_cuda_kernels"
grep -v '^ok ' "$OUT/test_cuda_kernels.log"
echo "$(grep -c '^ok ' "$OUT/test_cuda_kernels.log") ok lines"
echo "=== gemm bench (rc $bench_rc)"
tail -5 "$OUT/gemm_bench.err"
python3 - "$OUT/gemm_bench.json" <<'EOF' || cat "$OUT/gemm_ours.json"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["op"] == "dw_bias":
        print(f'{r["N"]:6} {r["layer"]:9} dw_bias sep {r["separate_ms"]:.4f} fused {r["fused_ms"]:.4f} '
              f'measured {r["measured_ms"]:.4f} ({r["measured_choice"]}) torch {r.get("torch_ms", 0):.4f}')
    else:
        print(f'{r["N"]:6} {r["layer"]:9} {r["op"]:7} heur {r["heuristic_ms"]:.4f} tuned {r["tuned_ms"]:.4f} '
              f'torch {r.get("torch_ms", 0):.4f} tuned {r["tuned_tflops"]} TF/s torch/tuned {r.get("torch_over_tuned")}'
              f' idx {[k["chosen_index"] for k in r["keys"]]}')
print(json.dumps(d.get("step_gemm_estimate")))
EOF
test_rc=$(sed -n 's/^test_cuda_kernels exit status: //p' "$OUT/test_cuda_kernels.log")
exit "${test_rc:-1}"
