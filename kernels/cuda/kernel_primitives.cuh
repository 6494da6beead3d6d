// What the kernel files of kernels/cuda share (private to them; the op headers do not include it):
// warp reductions, 16-byte packs of bf16, cp.async, the SFU exponential, and the host-side launch
// sizing and alignment checks that choose between a kernel's vectorised and scalar paths.
//
// Conventions of every op file (<op>.cu, declared in <op>.cuh, the twin of kernels/cpu/<op>.hpp):
// activations and their gradients bf16, parameters read as a bf16 copy, parameter gradients,
// LayerNorm statistics, losses and optimizer state fp32 (fp32 master weights), fp32 arithmetic
// throughout. Memory-bound kernels use 16-byte vector accesses wherever sizes and alignment allow
// and keep a scalar kernel for the rest (same results). Every kernel runs on the given stream and
// never synchronises with the host, so a whole step can be captured as one CUDA Graph; per-step
// scalars (loss scale, learning rate, step, clip) are read from device memory for the same reason.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace topolaunch::kernels::cuda {

using bf16 = __nv_bfloat16;

constexpr int kWarp = 32;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// 2^x on the SFU (ex2.approx.ftz: flushes denormal results to 0, exp2(-inf) = 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- 16-byte packs of bf16 -----------------------------------------------------------------
// 8 bf16 = 16 bytes.
struct alignas(16) Pack8 {
  bf16 v[8];
};
__device__ __forceinline__ Pack8 load8(const bf16* p) { return *reinterpret_cast<const Pack8*>(p); }
// Streaming load (read once: evict first), for data no later kernel reads from L2.
__device__ __forceinline__ Pack8 load8_stream(const bf16* p) {
  const int4 v = __ldcs(reinterpret_cast<const int4*>(p));
  Pack8 r;
  memcpy(&r, &v, sizeof r);
  return r;
}
__device__ __forceinline__ void store8(bf16* p, const Pack8& v) {
  *reinterpret_cast<Pack8*>(p) = v;
}
// Two bf16 (round to nearest) in one 32-bit word, lo in the low half.
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  std::uint32_t w;
  memcpy(&w, &b, sizeof w);
  return w;
}

// ---- cp.async (global -> shared, sm_80+) ----------------------------------------------------
__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Every committed group but the newest N is complete (and visible to this thread).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Vectorised elementwise kernel: fn(i) handles 16-byte pack i (n8 packs in all).
template <class Fn>
__global__ void elementwise8_kernel(std::int64_t n8, Fn fn) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n8) fn(i);
}

// ---- host side: launch sizing and the checks that pick the vector paths ----------------------
inline unsigned blocks_for(std::int64_t work, int per_block) {
  const std::int64_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
inline bool aligned16_all(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!aligned16(p)) return false;
  return true;
}
// The multiprocessor count of the current device (a host-side query: capturable).
inline int multiprocessors() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms <= 0)
    return 132;
  return sms;
}

// Median ms of `reps` runs of fn (enqueues on stream; false: it failed) timed by CUDA events,
// after one untimed warm-up run (it also loads the kernels' modules and tunes GEMMs); < 0 when a
// run or the timing failed (the CUDA error is cleared). Synchronises: eager use only.
template <class Fn>
float median_event_ms(Fn&& fn, cudaStream_t stream, int reps) {
  if (!fn()) return -1;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    cudaGetLastError();
    return -1;
  }
  std::vector<float> ms;
  for (int rep = 0; rep < reps; ++rep) {
    cudaEventRecord(start, stream);
    const bool ok = fn();
    cudaEventRecord(stop, stream);
    float t = 0;
    if (!ok || cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&t, start, stop) != cudaSuccess) {
      ms.clear();
      break;
    }
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (ms.empty()) {
    cudaGetLastError();
    return -1;
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace topolaunch::kernels::cuda
