// What the CUDA kernel benchmarks (attention_bench, gpu_layer_bench, classifier_bench) share:
// exit with a message on a CUDA error, deterministic bf16 fills from a hash of the index, and
// CUDA-event timing of one launch (median and min over reps). Each benchmark is one program of
// one translation unit, so the definitions live here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>  // program_invocation_short_name

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace topolaunch::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
                 cudaGetErrorString(e));
    std::exit(1);
  }
}

// p[i] uniform in [-scale, scale), the same values for the same (n, seed) on every run
static __global__ void fill_kernel(__nv_bfloat16* p, std::int64_t n, std::uint32_t seed,
                                   float scale) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  p[i] = __float2bfloat16((static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f) * 2 * scale);
}

inline void fill(__nv_bfloat16* p, std::int64_t n, std::uint32_t seed, float scale,
                 cudaStream_t stream = nullptr) {
  fill_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, n, seed, scale);
  check(cudaGetLastError(), "fill");
}

struct Timing {
  double median_ms, min_ms;
};

// `launch` enqueues on `stream`; `warmup` untimed calls first (then the device is synchronised).
inline Timing time_it(cudaStream_t stream, int reps, const std::function<void()>& launch,
                      int warmup = 0) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < warmup; ++i) launch();
  if (warmup > 0) check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(a, stream), "record");
    launch();
    check(cudaEventRecord(b, stream), "record");
    check(cudaEventSynchronize(b), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

}  // namespace topolaunch::bench
