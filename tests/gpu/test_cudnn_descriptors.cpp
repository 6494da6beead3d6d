// cuDNN fused attention's graphs (kernels/cuda/attention_cudnn.cu) as far as a host without a GPU
// can check them: every tensor and operation descriptor of the forward graph, the backward graph
// and the backward with its padding mask is created, set and finalized by libcudnn, and the
// operations finalize into one operation graph, for the attention shapes of GPT-2 124M to 1.5B and
// of the GPU tests; shapes cuDNN's engines cannot take are refused with the reason. What needs a
// device (handle, heuristics, plans, results) is test_attention only=cudnn's. Without a cuDNN
// build the check says so and passes only if the stub refuses. Plain main: one line per check,
// exit status 0 only when every check passes.
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>

#include "attention_cudnn.cuh"

namespace gpu = topolaunch::kernels::cuda;

int main() {
  int failures = 0, checks = 0;
  auto expect = [&](bool ok, const std::string& what) {
    ++checks;
    if (!ok) ++failures;
    std::printf("%-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  };
  if (!gpu::cudnn_attention_built()) {
    const auto s = gpu::check_cudnn_attention_descriptors(1, 64, 64, 1);
    expect(!s && s.error().message.find("libcudnn 9") != std::string::npos,
           "no cuDNN build: the stub refuses, naming what is missing (" +
               (s ? std::string("accepted") : s.error().message) + ")");
    std::printf("%d of %d checks passed\n", checks - failures, checks);
    return failures == 0 ? 0 : 1;
  }
  // (B, T, C, NH): GPT-2 124M, 350M, 774M, 1.5B at T = 1024; the shapes of test_attention
  for (const auto& [B, T, C, NH] : {std::tuple<int, int, int, int>{64, 1024, 768, 12},
                                    {16, 1024, 1024, 16},
                                    {8, 1024, 1280, 20},
                                    {8, 1024, 1600, 25},
                                    {1, 1, 64, 1},
                                    {1, 64, 64, 1},
                                    {2, 100, 128, 2},
                                    {1, 200, 192, 3},
                                    {3, 129, 768, 12},
                                    {2, 1024, 128, 2}}) {
    const auto s = gpu::check_cudnn_attention_descriptors(B, T, C, NH);
    expect(s.ok(), "descriptors and operation graphs finalize for B=" + std::to_string(B) +
                       " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                       " NH=" + std::to_string(NH) + (s ? "" : ": " + s.error().message));
  }
  const auto odd = gpu::check_cudnn_attention_descriptors(1, 64, 100, 2);
  expect(!odd && odd.error().message.find("head size 50") != std::string::npos,
         "head size 50 (not a multiple of 8) refused: " +
             (odd ? std::string("accepted") : odd.error().message));
  const auto bad = gpu::check_cudnn_attention_descriptors(1, 64, 96, 5);
  expect(
      !bad && bad.error().message.find("invalid shape") != std::string::npos,
      "C not a multiple of NH refused: " + (bad ? std::string("accepted") : bad.error().message));
  std::printf("%d of %d checks passed\n", checks - failures, checks);
  return failures == 0 ? 0 : 1;
}
