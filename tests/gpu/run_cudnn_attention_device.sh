#!/usr/bin/env bash
# cuDNN's fused attention beside ours, in one device call on a 2-GPU H200 host (from the repository
# root, with .carry-cudnn-frontend carried): GPU 1 runs tests/gpu/run_on_gpu_host.sh ONLY=attention
# (test_attention for every implementation incl. cudnn, attention_bench ours vs cudnn vs torch);
# GPU 0 builds the executor (run_cuda_backend.sh MODE=build), runs test_cuda_backend (attention =
# own, cudnn, auto) and gpt2_bench at B=64 (own vs auto) and B=16 (auto). At most 8 files in $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-build-gpu/cudnn-out}
mkdir -p "$OUT"
T0=$SECONDS
(
  CUDA_VISIBLE_DEVICES=1 ONLY=attention MEMCHECK=0 OUT=/tmp/cudnn-att \
    timeout "${ATTENTION_TIMEOUT_S:-270}" tests/gpu/run_on_gpu_host.sh
  echo "run_on_gpu_host.sh ONLY=attention exit status: $? at $((SECONDS - T0)) s"
  cp /tmp/cudnn-att/test_attention.log "$OUT/" 2>/dev/null
  cp /tmp/cudnn-att/attention_bench.json "$OUT/" 2>/dev/null \
    || cp /tmp/cudnn-att/attention_ours.json "$OUT/" 2>/dev/null
  tail -5 /tmp/cudnn-att/attention_torch.err /tmp/cudnn-att/attention_cudnn_build.log 2>/dev/null
) > "$OUT/attention.log" 2>&1 &
att_pid=$!
(
  MODE=build OUT=/tmp/cudnn-exec timeout "${BUILD_TIMEOUT_S:-170}" tests/gpu/run_cuda_backend.sh
  echo "run_cuda_backend.sh MODE=build exit status: $? at $((SECONDS - T0)) s"
  echo "=== test_cuda_backend (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout 60 build-gpu-exec/test_cuda_backend > "$OUT/test_cuda_backend.log" 2>&1
  echo "test_cuda_backend exit status: $? at $((SECONDS - T0)) s"
  grep -E "^FAIL|attention" "$OUT/test_cuda_backend.log"
  echo "=== gpt2_bench 64:graph:own 64:graph:auto 16:graph:auto (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout 50 build-gpu-exec/gpt2_bench 64:graph:own 64:graph:auto \
    16:graph:auto > "$OUT/gpt2_bench.jsonl" 2>&1
  echo "gpt2_bench exit status: $? at $((SECONDS - T0)) s"
) > "$OUT/executor.log" 2>&1 &
exec_pid=$!
wait "$att_pid" "$exec_pid"
cat "$OUT/attention.log" "$OUT/executor.log"
grep -h '"attention"' "$OUT/gpt2_bench.jsonl" | cut -c1-400
echo "done in $((SECONDS - T0)) s"
