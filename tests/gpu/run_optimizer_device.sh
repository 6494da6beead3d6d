#!/usr/bin/env bash
# One device call on a 2-GPU H200 host for the optimizer work (fixed-order global norm,
# multi-tensor AdamW, merged/skipped gradient zeroing): builds everything in parallel, then
#   1. test_cuda_kernels (GPU 1) and test_cuda_backend (GPU 0), side by side;
#   2. ddp_gpt2_bench on both GPUs (bit-identical parameters across ranks), no PyTorch peer yet;
#   3. gpt2_bench (ours: B=64, B=16 graph replay, B=16 op-by-op profile) on GPU 0 while
#      gpt2_torch.py (torch.compile only, B=64 then B=16) runs on GPU 1 (the same H200 model);
#   4. PyTorch DDP + torch.compile on both GPUs when DEADLINE_S leaves room.
# GPT2_CONFIGS: gpt2_bench's configs (default "64:graph 16:graph 16:profile"; the first graph
# config of each batch without a budget is the one compared with PyTorch); TORCH_SYSTEMS=all:
# PyTorch eager as well as torch.compile (default: compile only).
# GPU phases are serialised with flock. At most 8 files in $OUT (the device tool's limit).
# From the repository root (or a snapshot tree of it: see make_snapshot below):
#   OUT=... DEADLINE_S=400 tests/gpu/run_optimizer_device.sh
# On a shared checkout, a snapshot keeps the run away from files others are editing: the last
# commit's kernels/src, kernels/include, kernels/cpu, topology/include and wireup, with this
# tree's kernels/cuda, tests/gpu and tests/bench/kernels (and the carried OpenSSL headers):
#   tests/gpu/run_optimizer_device.sh --snapshot DIR   (then run the script inside DIR)
set -uo pipefail
if [ "${1:-}" = --snapshot ]; then
  dir=$2
  rm -rf "$dir" && mkdir -p "$dir/kernels/cuda" "$dir/tests/bench" "$dir/build-nccl" || exit 3
  git archive HEAD kernels/src kernels/include kernels/cpu topology/include wireup |
    tar -x -C "$dir" || exit 3
  cp -r kernels/cuda/. "$dir/kernels/cuda/" && cp -r tests/gpu "$dir/tests/" &&
    cp -r tests/bench/kernels "$dir/tests/bench/" && cp -r build-nccl/openssl "$dir/build-nccl/" ||
    exit 3
  rm -rf "$dir/tests/bench/kernels/results"
  du -sh "$dir"
  exit 0
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-build-gpu-opt/out}
DEADLINE_S=${DEADLINE_S:-400}
mkdir -p "$OUT" build-gpu-opt
LOCK=$PWD/build-gpu-opt/gpu.lock
LOGS=$(mktemp -d)
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
NVFLAGS=(-std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 --extended-lambda -Ikernels/include
         -Itopology/include -Ikernels/cpu -Ikernels/cuda)

MODE=build OUT=$LOGS/exec tests/gpu/run_cuda_backend.sh > "$LOGS/build_exec.log" 2>&1 &
b_exec=$!
"$NVCC" "${NVFLAGS[@]}" -Xcompiler -fopenmp tests/gpu/test_cuda_kernels.cu \
  kernels/cuda/{adamw,classifier,encoder,gelu,layernorm,matmul,residual}.cu -lcublasLt \
  -o build-gpu-opt/test_cuda_kernels > "$LOGS/build_tk.log" 2>&1 &
b_tk=$!
DDP_ONLY=1 RUN_TORCH_DDP=0 GPU_LOCK=$LOCK OUT=$LOGS/ddp tests/gpu/run_ddp_on_gpu_host.sh \
  > "$LOGS/ddp.log" 2>&1 &
ddp=$!
wait $b_exec; rc_exec=$?
wait $b_tk; rc_tk=$?
echo "builds done at ${SECONDS} s (executor $rc_exec, test_cuda_kernels $rc_tk)"
tail -3 "$LOGS/build_exec.log"; tail -5 "$LOGS/build_tk.log"

{
  echo "=== test_cuda_kernels (GPU 1) and test_cuda_backend (GPU 0)"
  flock "$LOCK" bash -c '
    CUDA_VISIBLE_DEVICES=1 build-gpu-opt/test_cuda_kernels > '"$LOGS"'/tk.log 2>&1 &
    CUDA_VISIBLE_DEVICES=0 build-gpu-exec/test_cuda_backend '"$LOGS"' > '"$LOGS"'/tb.log 2>&1
    echo "test_cuda_backend exit status: $?" >> '"$LOGS"'/tb.log
    # the PyTorch reference of the same small GPT (reads gpt2_small.json the test wrote)
    CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1 timeout 120 python3 \
      tests/bench/kernels/gpt2_torch_reference.py '"$LOGS"' >> '"$LOGS"'/tb.log 2>&1
    echo "gpt2_torch_reference exit status: $?" >> '"$LOGS"'/tb.log
    wait $!; echo "test_cuda_kernels exit status: $?" >> '"$LOGS"'/tk.log'
  cat "$LOGS/tk.log" "$LOGS/tb.log"
} > "$OUT/tests.log" 2>&1
grep -E "^FAIL|exit status|checks passed|multi|fixed order|merged" "$OUT/tests.log"

echo "=== ddp_gpt2_bench (ours), waiting for it (at ${SECONDS} s)"
wait $ddp
cp "$LOGS/ddp.log" "$OUT/ddp.log"
cp "$LOGS/ddp/ddp_ours.json" "$OUT/ddp_ours.json" 2>/dev/null
grep -E "^rank|FATAL|failed|exit status|identical|compiled in" "$OUT/ddp.log"
cat "$OUT/ddp_ours.json" 2>/dev/null

echo "=== gpt2_bench ours (GPU 0) beside torch.compile (GPU 1) (at ${SECONDS} s)"
torch_budget=$((DEADLINE_S - SECONDS - 10))
[ $torch_budget -le 200 ] || torch_budget=200
flock "$LOCK" bash -c '
  CUDA_VISIBLE_DEVICES=1 TORCH_SYSTEMS='"${TORCH_SYSTEMS:-compile}"' PYTHONUNBUFFERED=1 timeout '"$torch_budget"' \
    python3 tests/bench/kernels/gpt2_torch.py '"$OUT"'/gpt2_ours.jsonl 64 16 \
    > '"$OUT"'/gpt2_torch.jsonl 2> '"$LOGS"'/torch.err &
  CUDA_VISIBLE_DEVICES=0 build-gpu-exec/gpt2_bench '"${GPT2_CONFIGS:-64:graph 16:graph 16:profile}"' \
    > '"$OUT"'/gpt2_ours.jsonl 2> '"$LOGS"'/ours.err
  echo "gpt2_bench exit status: $?"
  wait $!; echo "gpt2_torch exit status: $?"'
cat "$OUT/gpt2_ours.jsonl" "$OUT/gpt2_torch.jsonl"
tail -3 "$LOGS/ours.err" "$LOGS/torch.err"

echo "=== PyTorch DDP + torch.compile (at ${SECONDS} s)"
left=$((DEADLINE_S - SECONDS - 5))
if [ $left -ge 60 ] && [ -s "$OUT/ddp_ours.json" ]; then
  DDP_TORCH_RAW=$LOGS/ddp_torch_raw.json PYTHONUNBUFFERED=1 timeout $left \
    python3 tests/bench/kernels/ddp_gpt2_torch.py "$OUT/ddp_ours.json" 64 1024 20 \
    > "$OUT/ddp_gpt2.json" 2> "$LOGS/ddp_torch.err"
  echo "ddp_gpt2_torch exit status: $?"; cat "$OUT/ddp_gpt2.json"; tail -3 "$LOGS/ddp_torch.err"
else
  echo "skipped: ${left} s left"
fi
cat "$LOGS/build_exec.log" "$LOGS/build_tk.log" "$LOGS"/*.err > "$OUT/build_and_errors.log" 2>/dev/null
echo "total ${SECONDS} s"
