#!/usr/bin/env bash
# Builds and runs, on an H200 host, the classifier's before/after: test_cuda_kernels (every
# kernel, the classifier kernels each against the CPU reference), classifier_bench (each
# classifier kernel at N = 16384 and 65536, in one process: row_per_block is the earlier kernel)
# and, if time is left, gpu_layer_bench B=16 (its crossentropy_forward_backward rows). Run from
# the repository root; writes logs and JSON to $OUT (default: build-gpu/out). Each step under
# `timeout`; the whole script stays inside ~170 s.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-build-gpu/out}
BUILD=build-gpu-classifier
mkdir -p "$BUILD" "$OUT"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
FLAGS=(-std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 --extended-lambda
       -Xcompiler=-fopenmp -Ikernels/include -Itopology/include -Ikernels/cpu -Ikernels/cuda)
start=$SECONDS
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  "$NVCC" --version | tail -1
} | tee "$OUT/gpu.txt"
timeout 120 "$NVCC" "${FLAGS[@]}" -Xptxas -v -c kernels/cuda/classifier.cu \
  -o "$BUILD/classifier.o" > "$OUT/kernels_ptxas.log" 2>&1 &
KERNEL_OBJS=("$BUILD/classifier.o")
for op in adamw encoder gelu layernorm matmul residual; do
  timeout 120 "$NVCC" "${FLAGS[@]}" -c "kernels/cuda/$op.cu" -o "$BUILD/$op.o" &
  KERNEL_OBJS+=("$BUILD/$op.o")
done
timeout 120 "$NVCC" "${FLAGS[@]}" -c tests/gpu/test_cuda_kernels.cu -o "$BUILD/test.o" &
timeout 120 "$NVCC" "${FLAGS[@]}" -c tests/bench/kernels/classifier_bench.cu \
  -o "$BUILD/classifier_bench.o" &
timeout 120 "$NVCC" "${FLAGS[@]}" -c tests/bench/kernels/gpu_layer_bench.cu -o "$BUILD/bench.o" &
wait
"$NVCC" "${FLAGS[@]}" "$BUILD/test.o" "${KERNEL_OBJS[@]}" -lcublasLt \
  -o "$BUILD/test_cuda_kernels" || { echo "build of test_cuda_kernels failed"; tail -30 "$OUT/kernels_ptxas.log"; exit 3; }
"$NVCC" "${FLAGS[@]}" "$BUILD/classifier_bench.o" "$BUILD/classifier.o" \
  -o "$BUILD/classifier_bench" || { echo "build of classifier_bench failed"; exit 3; }
"$NVCC" "${FLAGS[@]}" "$BUILD/bench.o" "${KERNEL_OBJS[@]}" -lcublasLt \
  -o "$BUILD/gpu_layer_bench" || echo "build of gpu_layer_bench failed"
echo "built in $((SECONDS - start)) s"
grep -A2 "crossentropy_staged_kernelILb1ELb1E" "$OUT/kernels_ptxas.log" | grep -E "Used|spill"
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass "$BUILD/classifier.o" |
    awk '/Function :/ {f = $3} /MUFU|LDGSTS|STG|BAR.SYNC|LDL|STL/ {
      split($0, a, /[ ;]+/); for (i in a) if (a[i] ~ /^(MUFU|LDGSTS|STG|BAR|LDL|STL)/) n[f " " a[i]]++ }
      END {for (k in n) if (k ~ /crossentropy/) print n[k], k}' | sort -k2 > "$OUT/classifier_sass_counts.txt"
fi
echo "=== test_cuda_kernels"
timeout 60 "$BUILD/test_cuda_kernels" > "$OUT/test_cuda_kernels.log" 2>&1
test_rc=$?
echo "test_cuda_kernels exit status: $test_rc"
grep -v '^ok ' "$OUT/test_cuda_kernels.log" | head -40
echo "test_cuda_kernels: $(grep -c '^ok ' "$OUT/test_cuda_kernels.log") ok, $(grep -c '^FAIL' "$OUT/test_cuda_kernels.log") FAIL"
grep -c '^ok .*crossentropy' "$OUT/test_cuda_kernels.log" | sed 's/^/crossentropy checks ok: /'
echo "=== classifier_bench N=16384 65536 ($((SECONDS - start)) s)"
timeout 50 "$BUILD/classifier_bench" 16384 65536 > "$OUT/classifier_bench.json" 2> "$OUT/classifier_bench.err"
echo "classifier_bench exit status: $?"
cat "$OUT/classifier_bench.json" "$OUT/classifier_bench.err"
left=$((165 - (SECONDS - start)))
if [ -x "$BUILD/gpu_layer_bench" ] && [ "$left" -gt 20 ]; then
  echo "=== gpu_layer_bench B=16 T=1024 (timeout $left s)"
  timeout "$left" "$BUILD/gpu_layer_bench" 16 1024 > "$OUT/gpu_layer_ours.json" 2>&1
  echo "gpu_layer_bench exit status: $?"
  grep crossentropy "$OUT/gpu_layer_ours.json"
fi
echo "total $((SECONDS - start)) s"
exit "$test_rc"
