// Times our causal attention (kernels/cuda/attention.cu) on GPT-2 124M shapes: T, NH=12, hs=64,
// for the given batch sizes: forward (y, lse) and backward (delta + dK/dV + dQ, accumulating into
// dqkv), each implementation, CUDA events, median of reps; and a "cudnn" row: cuDNN's fused
// attention through attention_cudnn.cuh (its backward overwrites dqkv), when built with it. Prints
// one JSON object on stdout; attention_torch.py adds PyTorch's scaled_dot_product_attention from
// the same device run. Usage: attention_bench [T] [B...]    (default: 1024 16 64)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "attention.cuh"
#include "attention_cudnn.cuh"
#include "bench_cuda.cuh"

namespace gpu = topolaunch::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace {

using topolaunch::bench::check;
using topolaunch::bench::fill;
using topolaunch::bench::time_it;
using topolaunch::bench::Timing;

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t T = argc > 1 ? std::atoll(argv[1]) : 1024;
  std::vector<std::int64_t> batches;
  for (int i = 2; i < argc; ++i) batches.push_back(std::atoll(argv[i]));
  if (batches.empty()) batches = {16, 64};
  const std::int64_t NH = 12, C = 768, hs = 64;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("{\n \"device\": \"%s\", \"T\": %lld, \"NH\": %lld, \"hs\": %lld,\n", prop.name,
              static_cast<long long>(T), static_cast<long long>(NH), static_cast<long long>(hs));
  std::printf(
      " \"note\": \"causal; fwd = y + lse; bwd = delta + dK/dV + dQ accumulated into dqkv "
      "(B,T,3C); "
      "median of reps, CUDA events; tflops counts the causal half: fwd 2, bwd 5 matmuls of "
      "2*B*NH*T*T/2*hs\",\n \"runs\": [");
  const struct {
    gpu::AttentionKernel kind;
    const char* name;
  } kinds[] = {{gpu::AttentionKernel::tensor_core, "tensor_core"},
               {gpu::AttentionKernel::tensor_core_m64, "tensor_core_m64"},
               {gpu::AttentionKernel::tensor_core_w32, "tensor_core_w32"},
               {gpu::AttentionKernel::tensor_core_atomic, "tensor_core_atomic"},
               {gpu::AttentionKernel::simple, "simple"}};
  bool first = true;
  for (const std::int64_t B : batches) {
    const std::int64_t n_qkv = B * T * 3 * C, n_y = B * T * C;
    bf16 *qkv, *y, *dy, *dqkv;
    float* lse;
    void* ws;
    check(cudaMalloc(&qkv, n_qkv * sizeof(bf16)), "malloc");
    check(cudaMalloc(&dqkv, n_qkv * sizeof(bf16)), "malloc");
    check(cudaMalloc(&y, n_y * sizeof(bf16)), "malloc");
    check(cudaMalloc(&dy, n_y * sizeof(bf16)), "malloc");
    check(cudaMalloc(&lse, B * NH * T * sizeof(float)), "malloc");
    check(cudaMalloc(&ws, gpu::attention_backward_workspace_bytes_with(
                              gpu::AttentionKernel::tensor_core_atomic, B, T, C, NH)),
          "malloc");  // the largest of all kinds
    fill(qkv, n_qkv, 1, 2.0f);
    fill(dy, n_y, 2, 1.0f);
    check(cudaMemset(dqkv, 0, n_qkv * sizeof(bf16)), "memset");
    const double gflop_unit = 2.0 * B * NH * T * T / 2 * hs / 1e9;  // one causal matmul
    for (const auto& k : kinds) {
      const int reps = k.kind == gpu::AttentionKernel::simple ? 5 : 30;
      const Timing f = time_it(
          nullptr, reps,
          [&] {
            check(gpu::attention_forward_with(k.kind, y, lse, qkv, B, T, C, NH, nullptr),
                  "forward");
          },
          3);
      const Timing b = time_it(
          nullptr, reps,
          [&] {
            check(gpu::attention_backward_with(k.kind, dqkv, ws, dy, qkv, y, lse, B, T, C, NH,
                                               nullptr),
                  "backward");
          },
          3);
      check(cudaDeviceSynchronize(), "run");
      std::printf(
          "%s\n  {\"impl\": \"%s\", \"B\": %lld, \"fwd_median_ms\": %.4f, \"fwd_min_ms\": %.4f, "
          "\"bwd_median_ms\": %.4f, \"bwd_min_ms\": %.4f, \"fwd_tflops\": %.1f, "
          "\"bwd_tflops\": %.1f}",
          first ? "" : ",", k.name, static_cast<long long>(B), f.median_ms, f.min_ms, b.median_ms,
          b.min_ms, 2 * gflop_unit / f.median_ms, 5 * gflop_unit / b.median_ms);
      first = false;
      std::fflush(stdout);
    }
    // cuDNN's fused attention on the same buffers (its own workspace)
    if (!gpu::cudnn_attention_built()) {
      std::printf("%s\n  {\"impl\": \"cudnn\", \"B\": %lld, \"error\": \"not built\"}",
                  first ? "" : ",", static_cast<long long>(B));
    } else if (auto att = gpu::CudnnAttention::create(B, T, C, NH); !att) {
      std::string msg = att.error().message;
      for (auto& ch : msg)
        if (ch == '"' || ch == '\\') ch = '\'';
      std::printf("%s\n  {\"impl\": \"cudnn\", \"B\": %lld, \"error\": \"%s\"}", first ? "" : ",",
                  static_cast<long long>(B), msg.c_str());
    } else {
      const auto& a = **att;
      void* cws = nullptr;
      check(cudaMalloc(&cws, std::max<std::size_t>(a.workspace_bytes(), 1)), "malloc");
      auto must = [](const topolaunch::Status& st) {
        if (!st) {
          std::fprintf(stderr, "attention_bench: %s\n", st.error().message.c_str());
          std::exit(1);
        }
      };
      const Timing f = time_it(
          nullptr, 30, [&] { must(a.forward(y, lse, qkv, cws, nullptr)); }, 3);
      const Timing b = time_it(
          nullptr, 30, [&] { must(a.backward(dqkv, dy, qkv, y, lse, cws, nullptr)); }, 3);
      check(cudaDeviceSynchronize(), "run");
      std::printf(
          "%s\n  {\"impl\": \"cudnn\", \"B\": %lld, \"fwd_median_ms\": %.4f, \"fwd_min_ms\": "
          "%.4f, \"bwd_median_ms\": %.4f, \"bwd_min_ms\": %.4f, \"fwd_tflops\": %.1f, "
          "\"bwd_tflops\": %.1f, \"workspace_bytes\": %zu, \"version\": \"%s\"}",
          first ? "" : ",", static_cast<long long>(B), f.median_ms, f.min_ms, b.median_ms, b.min_ms,
          2 * gflop_unit / f.median_ms, 5 * gflop_unit / b.median_ms, a.workspace_bytes(),
          a.version().c_str());
      cudaFree(cws);
      // every engine configuration that finalized, each with the workspace it asks for: the
      // executor times only those whose workspace fits the planned room
      auto& sel = **att;
      for (const bool backward : {false, true}) {
        const int first_selected = sel.selected(backward);
        for (int i = 0; i < sel.candidates(backward); ++i) {
          sel.select(backward, i);
          const std::size_t ws_bytes = sel.workspace_bytes();
          const std::size_t engine_ws = backward ? sel.backward_engine_workspace_bytes()
                                                 : sel.forward_engine_workspace_bytes();
          void* cand_ws = nullptr;
          double median = -1, minimum = -1;
          const char* error = nullptr;
          if (cudaMalloc(&cand_ws, std::max<std::size_t>(ws_bytes, 1)) != cudaSuccess) {
            cudaGetLastError();
            error = "no memory for its workspace";
          } else {
            bool failed = false;
            const Timing t = time_it(
                nullptr, 30,
                [&] {
                  const topolaunch::Status st =
                      backward ? sel.backward(dqkv, dy, qkv, y, lse, cand_ws, nullptr)
                               : sel.forward(y, lse, qkv, cand_ws, nullptr);
                  if (!st) failed = true;
                },
                3);
            if (cudaDeviceSynchronize() != cudaSuccess || failed) {
              cudaGetLastError();
              error = "failed to run";
            } else {
              median = t.median_ms;
              minimum = t.min_ms;
            }
            cudaFree(cand_ws);
          }
          std::printf(
              ",\n  {\"impl\": \"cudnn_candidate\", \"B\": %lld, \"pass\": \"%s\", "
              "\"index\": %d, \"engine\": %lld, \"config\": \"%s\", "
              "\"engine_workspace_bytes\": %zu, \"median_ms\": %.4f, \"min_ms\": %.4f, "
              "\"tflops\": %.1f%s%s%s}",
              static_cast<long long>(B), backward ? "bwd" : "fwd", i,
              static_cast<long long>(sel.candidate_engine(backward, i)),
              sel.candidate_description(backward, i).c_str(), engine_ws, median, minimum,
              median > 0 ? (backward ? 5 : 2) * gflop_unit / median : 0.0,
              error != nullptr ? ", \"error\": \"" : "", error != nullptr ? error : "",
              error != nullptr ? "\"" : "");
          std::fflush(stdout);
        }
        sel.select(backward, first_selected);
      }
    }
    first = false;
    std::fflush(stdout);
    cudaFree(qkv);
    cudaFree(dqkv);
    cudaFree(y);
    cudaFree(dy);
    cudaFree(lse);
    cudaFree(ws);
  }
  std::printf("\n ]\n}\n");
  return 0;
}
