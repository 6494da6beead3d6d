#!/usr/bin/env bash
# Issue 7's GPU-host check: builds topolaunch-rdma-probe with g++ on an H200 host (no meson, no
# UCX there; fmt and nlohmann-json headers come from the git-ignored .carry-probe/ that
# `--prepare` fills on the Debian build host) and runs it with --register-gpu: the probe's CUDA
# dma-buf / GPUDirect capability and registration prediction per GPU, then the dma-buf export of
# GPU memory (the first half of the dma-buf registration path) to show the prediction holds.
# Beside it, what the host itself says: RDMA devices, nvidia_peermem, the driver's view.
#   tests/gpu/run_rdma_probe_on_gpu_host.sh --prepare    (build host)
#   tests/gpu/run_rdma_probe_on_gpu_host.sh              (GPU host; logs in $OUT)
set -uo pipefail
CARRY=.carry-probe
if [ "${1:-}" = "--prepare" ]; then
  set -e
  rm -rf "$CARRY"; mkdir -p "$CARRY/inc"
  cp -r /usr/include/fmt /usr/include/nlohmann "$CARRY/inc/"
  grep -qx '/.carry-probe/' .git/info/exclude || echo '/.carry-probe/' >> .git/info/exclude
  exit 0
fi
OUT=${OUT:-build-gpu-probe/out}
BUILD=build-gpu-probe
mkdir -p "$BUILD/obj" "$OUT"
INC=(-Itopology/include -Itopology/src -Irdma/include -Irdma/src -Iwireup/include)
[ -d /usr/include/nlohmann ] || INC+=(-I"$CARRY/inc")
[ -d /usr/include/fmt ] && [ -f /usr/lib/x86_64-linux-gnu/libfmt.so ] && FMT=(-lfmt) ||
  { INC+=(-I"$CARRY/inc"); FMT=(-DFMT_HEADER_ONLY=1); }
SOURCES=(topology/src/*.cpp topology/src/diagnose/*.cpp topology/src/rankmap/*.cpp
         rdma/src/directory_store.cpp rdma/src/bf16.cpp rdma/src/probe.cpp rdma/src/select.cpp
         rdma/src/blob.cpp rdma/tools/rdma_probe.cpp)
echo "=== build (${#SOURCES[@]} sources)"
pids=()
for s in "${SOURCES[@]}"; do
  o="$BUILD/obj/$(echo "$s" | tr / _).o"
  g++ -std=c++20 -O1 "${INC[@]}" "${FMT[0]}" -c "$s" -o "$o" 2>>"$OUT/build.log" &
  pids+=($!)
done
fail=0; for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [ $fail = 0 ]; then
  libfmt=(); [ "${FMT[0]}" = -lfmt ] && libfmt=(-lfmt)
  g++ "$BUILD"/obj/*.o -o "$BUILD/topolaunch-rdma-probe" -lhwloc -ldl "${libfmt[@]}" \
    2>>"$OUT/build.log" || fail=1
fi
[ $fail = 0 ] || { echo "build FAILED"; tail -30 "$OUT/build.log"; }
echo "=== the host"
{
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv
  echo "--- /sys/class/infiniband:"; ls -l /sys/class/infiniband 2>&1
  echo "--- nvidia_peermem / nv_peer_mem loaded:"; grep -E 'nvidia_peermem|nv_peer_mem' /proc/modules || echo "(none)"
  echo "--- kernel: $(uname -r)"; grep -i dma_buf /proc/kallsyms 2>/dev/null | head -2 | cut -c1-60
} 2>&1 | tee "$OUT/host.txt"
if [ $fail = 0 ]; then
  echo "=== topolaunch-rdma-probe --register-gpu"
  "$BUILD/topolaunch-rdma-probe" --register-gpu > "$OUT/probe.json" 2> "$OUT/probe.err"
  echo "exit status $?" | tee -a "$OUT/probe.err"
  cat "$OUT/probe.json" "$OUT/probe.err"
fi
