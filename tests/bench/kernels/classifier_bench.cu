// The fused classifier (crossentropy_forward_backward: losses and dlogits written in place over
// the bf16 logits) with each of its kernels, GPT-2's vocabulary (V = 50257, Vp = 50304), at the
// row counts given (default N = 16384 and 65536: B = 16 and 64 at T = 1024). Per kernel: median
// and min ms of one launch (kLaunches back-to-back launches per timed rep, eager, and the same
// from a captured CUDA graph), the bytes the kernel must move (the logits read once, dlogits
// written once, targets read, losses written) and GB/s. JSON on stdout; no pass/fail on timing.
// Usage: classifier_bench [N ...]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "bench_cuda.cuh"
#include "classifier.cuh"

namespace gpu = topolaunch::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace {

using topolaunch::bench::check;
using topolaunch::bench::fill;
using topolaunch::bench::time_it;
using topolaunch::bench::Timing;

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> rows;
  for (int i = 1; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
  if (rows.empty()) rows = {16384, 65536};
  constexpr std::int64_t V = 50257, Vp = 50304;
  constexpr int kLaunches = 10, kReps = 15;
  const std::int64_t max_n = *std::max_element(rows.begin(), rows.end());
  bf16* logits = nullptr;
  float *losses = nullptr, *scale = nullptr;
  std::int32_t* targets = nullptr;
  check(cudaMalloc(&logits, max_n * Vp * sizeof(bf16)), "logits");
  check(cudaMalloc(&losses, max_n * sizeof(float)), "losses");
  check(cudaMalloc(&scale, sizeof(float)), "scale");
  check(cudaMalloc(&targets, max_n * sizeof(std::int32_t)), "targets");
  {
    std::vector<std::int32_t> t(max_n);
    std::uint32_t h = 12345;
    for (auto& v : t) {
      h = h * 1664525u + 1013904223u;
      v = static_cast<std::int32_t>((h >> 8) % V);
    }
    check(cudaMemcpy(targets, t.data(), t.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice),
          "h2d");
  }
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "stream");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf(
      "{\n  \"system\": \"topolaunch classifier kernels\", \"device\": \"%s\", \"V\": %lld, "
      "\"Vp\": %lld, \"launches_per_rep\": %d, \"reps\": %d,\n  \"runs\": [",
      prop.name, static_cast<long long>(V), static_cast<long long>(Vp), kLaunches, kReps);
  const gpu::ClassifierKernel kinds[] = {
      gpu::ClassifierKernel::row_per_block, gpu::ClassifierKernel::staged_1024,
      gpu::ClassifierKernel::staged_512, gpu::ClassifierKernel::staged_1024_half_exp,
      gpu::ClassifierKernel::automatic};
  for (std::size_t ri = 0; ri < rows.size(); ++ri) {
    const std::int64_t N = rows[ri];
    const float sc = 1.0f / static_cast<float>(N);
    check(cudaMemcpy(scale, &sc, sizeof sc, cudaMemcpyHostToDevice), "h2d");
    const double bytes = 2.0 * N * Vp * sizeof(bf16) + 8.0 * N;
    std::printf("%s\n    {\"N\": %lld, \"bytes\": %.0f, \"kernels\": {", ri == 0 ? "" : ",",
                static_cast<long long>(N), bytes);
    for (std::size_t ki = 0; ki < std::size(kinds); ++ki) {
      const gpu::ClassifierKernel kind = kinds[ki];
      // fresh logits for each kernel (the fused kernel overwrites them with dlogits)
      fill(logits, N * Vp, 7u + static_cast<std::uint32_t>(ki), 6.0f, stream);
      gpu::ClassifierKernel ran = kind;
      auto rep = [&] {
        for (int l = 0; l < kLaunches; ++l)
          ran = gpu::crossentropy_with(kind, losses, logits, logits, targets, scale, N, V, Vp,
                                       stream);
      };
      rep();  // warm-up
      check(cudaStreamSynchronize(stream), gpu::classifier_kernel_name(kind));
      const Timing eager = time_it(stream, kReps, rep);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
      rep();
      check(cudaStreamEndCapture(stream, &graph), "end capture");
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      check(cudaGraphLaunch(exec, stream), "graph warm-up");
      check(cudaStreamSynchronize(stream), "graph warm-up");
      const Timing graphed =
          time_it(stream, kReps, [&] { check(cudaGraphLaunch(exec, stream), "graph launch"); });
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      check(cudaGetLastError(), gpu::classifier_kernel_name(kind));
      const double ms = eager.median_ms / kLaunches, gms = graphed.median_ms / kLaunches;
      std::printf(
          "%s\n      \"%s\": {\"ran\": \"%s\", \"median_ms\": %.5f, \"min_ms\": %.5f, "
          "\"GB_per_s\": %.1f, \"graph_median_ms\": %.5f, \"graph_GB_per_s\": %.1f}",
          ki == 0 ? "" : ",", gpu::classifier_kernel_name(kind), gpu::classifier_kernel_name(ran),
          ms, eager.min_ms / kLaunches, bytes / (ms * 1e-3) / 1e9, gms, bytes / (gms * 1e-3) / 1e9);
      std::fflush(stdout);
    }
    std::printf("}}");
  }
  std::printf("\n  ]\n}\n");
  cudaFree(targets);
  cudaFree(scale);
  cudaFree(losses);
  cudaFree(logits);
  check(cudaStreamDestroy(stream), "stream");
  return 0;
}
