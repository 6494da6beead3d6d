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
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
"$NVCC" --version | tail -1 | tee -a "$OUT/gpu.txt"
"$NVCC" "${FLAGS[@]}" -c kernels/cuda/kernels.cu -o "$BUILD/kernels.o" &
"$NVCC" "${FLAGS[@]}" -c kernels/cuda/matmul.cu -o "$BUILD/matmul.o" &
"$NVCC" "${FLAGS[@]}" -c tests/gpu/test_cuda_kernels.cu -o "$BUILD/test.o" 2>/dev/null &
"$NVCC" "${FLAGS[@]}" -c tests/bench/kernels/gpu_layer_bench.cu -o "$BUILD/bench.o" &
wait
"$NVCC" "${FLAGS[@]}" "$BUILD/test.o" "$BUILD/kernels.o" "$BUILD/matmul.o" -lcublasLt \
  -o "$BUILD/test_cuda_kernels" || { echo "build of test_cuda_kernels failed"; exit 3; }
"$NVCC" "${FLAGS[@]}" "$BUILD/bench.o" "$BUILD/kernels.o" "$BUILD/matmul.o" -lcublasLt \
  -o "$BUILD/gpu_layer_bench" || { echo "build of gpu_layer_bench failed"; exit 3; }
echo "=== test_cuda_kernels"
"$BUILD/test_cuda_kernels" 2>&1 | tee "$OUT/test_cuda_kernels.log"
test_rc=${PIPESTATUS[0]}
echo "test_cuda_kernels exit status: $test_rc"
echo "=== gpu_layer_bench B=16 T=1024"
"$BUILD/gpu_layer_bench" 16 1024 | tee "$OUT/gpu_layer_ours.json" || exit 4
echo "=== gpu_layer_torch B=16 T=1024"
PYTHONUNBUFFERED=1 python3 tests/bench/kernels/gpu_layer_torch.py "$OUT/gpu_layer_ours.json" 16 1024 \
  > "$OUT/gpu_layer_bench.json" 2> "$OUT/gpu_layer_torch.err"
torch_rc=$?
cat "$OUT/gpu_layer_bench.json"
[ $torch_rc -eq 0 ] || tail -20 "$OUT/gpu_layer_torch.err"
exit "$test_rc"
