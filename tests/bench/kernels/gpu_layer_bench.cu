// Times the CUDA kernels on GPT-2 124M shapes (C=768, NH=12, Vp=50304) at B x T tokens:
//  "layer_no_attention": one transformer block's forward + backward WITHOUT the attention core
//    (ln1, qkv GEMM, attention projection, fused residual+ln2, fc GEMM, GELU, fc projection,
//    residual; and their backward). Attention's output and its qkv gradient are inputs: our
//    attention kernel does not exist yet, so this is a partial layer, and the PyTorch twin
//    (gpu_layer_torch.py) times exactly the same partial layer.
//  "classifier": lm-head GEMM (tied wte), fused softmax + cross-entropy forward/backward in place,
//    and the two backward GEMMs.
// Each is timed launched op by op and replayed as one CUDA Graph (CUDA events, median of reps).
//  "kernels": each memory-bound kernel alone on the same shapes (and AdamW, the global norm and
//    the bf16 copy over 124M parameters), with the bytes it must move and the GB/s achieved.
// Prints one JSON object on stdout. Usage: gpu_layer_bench [B] [T]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "adamw.cuh"
#include "bench_cuda.cuh"
#include "classifier.cuh"
#include "encoder.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "residual.cuh"
#include "topolaunch/kernels/graph.hpp"

namespace gpu = topolaunch::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace {

using topolaunch::bench::check;
using topolaunch::bench::fill;
using topolaunch::bench::time_it;
using topolaunch::bench::Timing;

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gpu_layer_bench: %s: cublasLt status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

// One arena for everything, carved in 256-byte aligned pieces (as the plan does).
struct Arena {
  char* base = nullptr;
  std::size_t used = 0, capacity = 0;
  explicit Arena(std::size_t bytes) : capacity(bytes) { check(cudaMalloc(&base, bytes), "arena"); }
  ~Arena() { cudaFree(base); }
  template <class T>
  T* take(std::size_t count) {
    const std::size_t off = (used + 255) & ~std::size_t{255};
    if (off + count * sizeof(T) > capacity) {
      std::fprintf(stderr, "gpu_layer_bench: arena too small\n");
      std::exit(1);
    }
    used = off + count * sizeof(T);
    return reinterpret_cast<T*>(base + off);
  }
};

// Times `step` eagerly and as a captured graph; prints a JSON member.
void bench(const char* name, cudaStream_t stream, const std::function<void()>& step, int reps,
           bool last) {
  for (int i = 0; i < 3; ++i) step();  // warm-up (cuBLASLt heuristics run on first use)
  check(cudaStreamSynchronize(stream), "warm-up");
  const Timing eager = time_it(stream, reps, step);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  step();
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphLaunch(exec, stream), "graph warm-up");
  check(cudaStreamSynchronize(stream), "graph warm-up");
  const Timing replay =
      time_it(stream, reps, [&] { check(cudaGraphLaunch(exec, stream), "launch"); });
  check(cudaGetLastError(), name);
  std::printf(
      "  \"%s\": {\"eager_median_ms\": %.4f, \"eager_min_ms\": %.4f, "
      "\"graph_median_ms\": %.4f, \"graph_min_ms\": %.4f}%s\n",
      name, eager.median_ms, eager.min_ms, replay.median_ms, replay.min_ms, last ? "" : ",");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t B = argc > 1 ? std::atoll(argv[1]) : 16,
                     T = argc > 2 ? std::atoll(argv[2]) : 1024;
  const std::int64_t C = 768, N = B * T, V = 50257, Vp = 50304;
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  gpu::Matmul mm;
  if (!mm.error().empty()) {
    std::fprintf(stderr, "gpu_layer_bench: %s\n", mm.error().c_str());
    return 1;
  }
  std::size_t free0 = 0, total = 0;
  check(cudaMemGetInfo(&free0, &total), "meminfo");
  Arena arena(std::size_t{8} << 30);

  // parameters (bf16 working copies) and their fp32 gradients
  bf16 *ln1w = arena.take<bf16>(C), *ln1b = arena.take<bf16>(C), *ln2w = arena.take<bf16>(C),
       *ln2b = arena.take<bf16>(C);
  bf16 *wqkv = arena.take<bf16>(3 * C * C), *bqkv = arena.take<bf16>(3 * C),
       *wproj = arena.take<bf16>(C * C), *bproj = arena.take<bf16>(C),
       *wfc = arena.take<bf16>(4 * C * C), *bfc = arena.take<bf16>(4 * C),
       *wfcp = arena.take<bf16>(4 * C * C), *bfcp = arena.take<bf16>(C);
  float* grads = arena.take<float>(12 * C * C + 13 * C);
  float *g_ln1w = grads, *g_ln1b = g_ln1w + C, *g_ln2w = g_ln1b + C, *g_ln2b = g_ln2w + C,
        *g_wqkv = g_ln2b + C, *g_bqkv = g_wqkv + 3 * C * C, *g_wproj = g_bqkv + 3 * C,
        *g_bproj = g_wproj + C * C, *g_wfc = g_bproj + C, *g_bfc = g_wfc + 4 * C * C,
        *g_wfcp = g_bfc + 4 * C, *g_bfcp = g_wfcp + 4 * C * C;
  // activations
  bf16 *x = arena.take<bf16>(N * C), *ln1 = arena.take<bf16>(N * C),
       *qkv = arena.take<bf16>(N * 3 * C), *yatt = arena.take<bf16>(N * C),
       *att = arena.take<bf16>(N * C), *s = arena.take<bf16>(N * C), *ln2 = arena.take<bf16>(N * C),
       *h = arena.take<bf16>(N * 4 * C), *g = arena.take<bf16>(N * 4 * C),
       *o = arena.take<bf16>(N * C), *out = arena.take<bf16>(N * C);
  float *mean1 = arena.take<float>(N), *rstd1 = arena.take<float>(N), *mean2 = arena.take<float>(N),
        *rstd2 = arena.take<float>(N);
  // activation gradients
  bf16 *dout = arena.take<bf16>(N * C), *dqkv = arena.take<bf16>(N * 3 * C),
       *dg = arena.take<bf16>(N * 4 * C), *dh = arena.take<bf16>(N * 4 * C),
       *dln2 = arena.take<bf16>(N * C), *ds = arena.take<bf16>(N * C),
       *dyatt = arena.take<bf16>(N * C), *dln1 = arena.take<bf16>(N * C),
       *dx = arena.take<bf16>(N * C);
  const float std_w = 0.02f * 1.7320508f;  // uniform with std 0.02
  fill(ln1w, C, 1, 1.0f), fill(ln1b, C, 2, 0.1f), fill(ln2w, C, 3, 1.0f), fill(ln2b, C, 4, 0.1f);
  fill(wqkv, 3 * C * C, 5, std_w), fill(bqkv, 3 * C, 6, 0.01f), fill(wproj, C * C, 7, std_w);
  fill(bproj, C, 8, 0.01f), fill(wfc, 4 * C * C, 9, std_w), fill(bfc, 4 * C, 10, 0.01f);
  fill(wfcp, 4 * C * C, 11, std_w), fill(bfcp, C, 12, 0.01f);
  fill(x, N * C, 13, 1.0f), fill(yatt, N * C, 14, 1.0f), fill(dout, N * C, 15, 1e-3f);
  fill(dqkv, N * 3 * C, 16, 1e-3f);
  check(cudaDeviceSynchronize(), "init");

  // the layer as named ops, so that each can also be timed alone
  auto zero = [&](bf16* p, std::int64_t n) {
    check(cudaMemsetAsync(p, 0, n * sizeof(bf16), stream), "zero");
  };
  const std::vector<std::pair<const char*, std::function<void()>>> layer_ops = {
      {"ln1",
       [&] {
         check(gpu::layernorm_forward(ln1, mean1, rstd1, x, ln1w, ln1b, N, C, stream), "ln1");
       }},
      {"qkv", [&] { check(mm.matmul_forward(qkv, ln1, wqkv, bqkv, N, C, 3 * C, stream), "qkv"); }},
      {"attproj",
       [&] { check(mm.matmul_forward(att, yatt, wproj, bproj, N, C, C, stream), "attproj"); }},
      {"residual_ln2",
       [&] {
         check(gpu::residual_layernorm_forward(s, ln2, mean2, rstd2, x, att, ln2w, ln2b, N, C,
                                               stream),
               "ln2");
       }},
      {"fc", [&] { check(mm.matmul_forward(h, ln2, wfc, bfc, N, C, 4 * C, stream), "fc"); }},
      {"gelu", [&] { gpu::gelu_forward(g, h, N * 4 * C, stream); }},
      {"fcproj",
       [&] { check(mm.matmul_forward(o, g, wfcp, bfcp, N, 4 * C, C, stream), "fcproj"); }},
      {"residual", [&] { gpu::residual_forward(out, s, o, N * C, stream); }},
      // backward: out = s + o, so dO = dOut (read in place) and dS starts as a copy of dOut
      {"zero_grads",
       [&] {
         zero(dg, N * 4 * C), zero(dh, N * 4 * C), zero(dln2, N * C), zero(dyatt, N * C),
             zero(dln1, N * C);
         check(cudaMemcpyAsync(ds, dout, N * C * sizeof(bf16), cudaMemcpyDeviceToDevice, stream),
               "copy");
       }},
      {"fcproj_bwd",
       [&] {
         check(mm.matmul_backward(dg, g_wfcp, g_bfcp, dout, g, wfcp, N, 4 * C, C, stream),
               "fcproj bwd");
       }},
      {"gelu_bwd", [&] { gpu::gelu_backward(dh, dg, h, N * 4 * C, stream); }},
      {"fc_bwd",
       [&] {
         check(mm.matmul_backward(dln2, g_wfc, g_bfc, dh, ln2, wfc, N, C, 4 * C, stream), "fc bwd");
       }},
      {"ln2_bwd",
       [&] {
         check(
             gpu::layernorm_backward(ds, g_ln2w, g_ln2b, dln2, s, ln2w, mean2, rstd2, N, C, stream),
             "ln2 bwd");
       }},
      {"attproj_bwd",
       [&] {
         check(mm.matmul_backward(dyatt, g_wproj, g_bproj, ds, yatt, wproj, N, C, C, stream),
               "attproj bwd");
       }},
      {"qkv_bwd",
       [&] {
         check(mm.matmul_backward(dln1, g_wqkv, g_bqkv, dqkv, ln1, wqkv, N, C, 3 * C, stream),
               "qkv bwd");
       }},
      // s = x + att: dX = dS (the copy), dAtt = dS (read in place above); ln1's backward adds
      {"ln1_bwd",
       [&] {
         check(cudaMemcpyAsync(dx, ds, N * C * sizeof(bf16), cudaMemcpyDeviceToDevice, stream),
               "copy");
         check(
             gpu::layernorm_backward(dx, g_ln1w, g_ln1b, dln1, x, ln1w, mean1, rstd1, N, C, stream),
             "ln1 bwd");
       }},
  };
  auto layer = [&] {
    for (const auto& op : layer_ops) op.second();
  };

  // classifier: logits (N,Vp) = lnf (N,C) @ wte (Vp,C)^T; fused CE; dlnf += dlogits @ wte;
  // dwte += dlogits^T lnf
  bf16 *wte = arena.take<bf16>(Vp * C), *logits = arena.take<bf16>(N * Vp),
       *dlnf = arena.take<bf16>(N * C);
  float *g_wte = arena.take<float>(Vp * C), *losses = arena.take<float>(N),
        *scale = arena.take<float>(1);
  std::int32_t* targets = arena.take<std::int32_t>(N);
  fill(wte, Vp * C, 17, std_w);
  {
    std::mt19937 rng(7);
    std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(V - 1));
    std::vector<std::int32_t> t(N);
    for (auto& v : t) v = tok(rng);
    check(cudaMemcpy(targets, t.data(), N * sizeof(std::int32_t), cudaMemcpyHostToDevice), "h2d");
    const float sc = 1.0f / static_cast<float>(N);
    check(cudaMemcpy(scale, &sc, sizeof sc, cudaMemcpyHostToDevice), "h2d");
  }
  auto classifier = [&] {
    check(mm.matmul_forward(logits, ln1, wte, nullptr, N, C, Vp, stream), "lm head");
    gpu::crossentropy_forward_backward(losses, logits, logits, targets, scale, N, V, Vp, stream);
    check(cudaMemsetAsync(dlnf, 0, N * C * sizeof(bf16), stream), "zero");
    check(mm.matmul_backward(dlnf, g_wte, nullptr, logits, ln1, wte, N, C, Vp, stream), "lm bwd");
  };

  std::size_t free1 = 0;
  check(cudaMemGetInfo(&free1, &total), "meminfo");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf(
      "{\n  \"system\": \"topolaunch cuda kernels\", \"device\": \"%s\", \"B\": %lld, "
      "\"T\": %lld,\n  \"arena_used_bytes\": %zu, \"arena_allocated_bytes\": %zu,\n",
      prop.name, static_cast<long long>(B), static_cast<long long>(T), arena.used, free0 - free1);
  bench("layer_no_attention", stream, layer, 30, false);
  std::printf("  \"layer_ops_median_ms\": {");
  for (std::size_t i = 0; i < layer_ops.size(); ++i) {
    const Timing t = time_it(stream, 20, layer_ops[i].second);
    std::printf("%s\"%s\": %.4f", i == 0 ? "" : ", ", layer_ops[i].first, t.median_ms);
  }
  std::printf("},\n");
  bench("classifier", stream, classifier, 20, false);

#ifndef TL_BENCH_BASELINE_API
  // The cuBLASLt GELU epilogues against the separate GEMM + GELU kernel, as the layer uses them:
  // forward fc then gelu vs fc with GELU_AUX_BIAS (h kept); backward (zeroed dg, dh) fcproj dx
  // GEMM then gelu_backward vs one DGELU GEMM writing dh (the dw GEMM and bias in both).
  // (Left out when built against the previous kernels, which lack these functions.)
  {
    const auto separate_fwd = [&] {
      check(mm.matmul_forward(h, ln2, wfc, bfc, N, C, 4 * C, stream), "fc");
      gpu::gelu_forward(g, h, N * 4 * C, stream);
    };
    const auto fused_fwd = [&] {
      check(mm.matmul_forward_gelu(g, h, ln2, wfc, bfc, N, C, 4 * C, stream), "fc gelu");
    };
    const auto separate_bwd = [&] {
      zero(dg, N * 4 * C), zero(dh, N * 4 * C);
      check(mm.matmul_backward(dg, g_wfcp, g_bfcp, dout, g, wfcp, N, 4 * C, C, stream),
            "fcproj bwd");
      gpu::gelu_backward(dh, dg, h, N * 4 * C, stream);
    };
    const auto fused_bwd = [&] {
      check(mm.matmul_backward_dgelu(dh, g_wfcp, g_bfcp, dout, g, h, wfcp, N, 4 * C, C, stream),
            "fcproj bwd dgelu");
    };
    const std::pair<const char*, std::function<void()>> variants[] = {
        {"fc_then_gelu", separate_fwd},
        {"fc_gelu_epilogue", fused_fwd},
        {"fcproj_bwd_then_gelu_bwd", separate_bwd},
        {"fcproj_bwd_dgelu_epilogue", fused_bwd}};
    std::printf("  \"gelu_epilogue_median_ms\": {");
    bool first = true;
    for (const auto& [name, fn] : variants) {
      for (int i = 0; i < 3; ++i) fn();
      check(cudaStreamSynchronize(stream), name);
      const Timing t = time_it(stream, 20, fn);
      std::printf("%s\"%s\": %.4f", first ? "" : ", ", name, t.median_ms);
      first = false;
    }
    std::printf("},\n");
  }
#endif

  // Each memory-bound kernel alone: kLaunches back-to-back launches per timed rep (so that the
  // events' own cost is spread), median over reps; bytes = what the kernel must read and write
  // at least (each input once, each output once), GB/s = bytes / median time.
  {
    const std::int64_t P = 124475904;  // GPT-2 124M parameters (Vp = 50304)
    float* opt = nullptr;
    bf16* p_bf16 = nullptr;
    check(cudaMalloc(&opt, 4 * P * sizeof(float)), "optimizer state");
    check(cudaMalloc(&p_bf16, P * sizeof(bf16)), "bf16 params");
    float *p32 = opt, *m32 = opt + P, *v32 = opt + 2 * P, *g32 = opt + 3 * P;
    float* scalars = arena.take<float>(topolaunch::kernels::kNumScalars);
    float* norm = arena.take<float>(1);
    float* wte_grad_pos = arena.take<float>(T * C);
    {
      std::vector<float> sc(topolaunch::kernels::kNumScalars, 0.0f);
      sc[topolaunch::kernels::kLearningRate] = 6e-4f;
      sc[topolaunch::kernels::kBeta1] = 0.9f;
      sc[topolaunch::kernels::kBeta2] = 0.95f;
      sc[topolaunch::kernels::kEpsilon] = 1e-8f;
      sc[topolaunch::kernels::kWeightDecay] = 0.1f;
      sc[topolaunch::kernels::kStep] = 1;
      sc[topolaunch::kernels::kGradClip] = 1.0f;
      check(cudaMemcpy(scalars, sc.data(), sc.size() * sizeof(float), cudaMemcpyHostToDevice),
            "h2d");
      const float one = 1.0f;
      check(cudaMemcpy(norm, &one, sizeof one, cudaMemcpyHostToDevice), "h2d");
      check(cudaMemset(opt, 0, 4 * P * sizeof(float)), "zero optimizer");
      check(cudaMemset(wte_grad_pos, 0, T * C * sizeof(float)), "zero");
    }
    std::int32_t* tokens = targets;                               // random ids in [0, V)
    const double bc = static_cast<double>(N) * C * sizeof(bf16);  // one (N, C) bf16 tensor
    struct Kernel {
      const char* name;
      double bytes;
      std::function<void()> launch;
    };
    const std::vector<Kernel> kernels = {
        {"encoder_forward", 2 * bc + T * C * 2.0 + N * 4.0,
         [&] { gpu::encoder_forward(x, tokens, wte, wte, B, T, C, stream); }},
        {"encoder_backward", bc + 2 * (N * C * 4.0) + 2 * (T * C * 4.0) + N * 4.0,
         [&] { gpu::encoder_backward(g_wte, wte_grad_pos, dout, tokens, B, T, C, stream); }},
        {"layernorm_forward", 2 * bc + 8.0 * N,
         [&] {
           check(gpu::layernorm_forward(ln1, mean1, rstd1, x, ln1w, ln1b, N, C, stream), "ln");
         }},
        {"residual_layernorm_forward", 4 * bc + 8.0 * N,
         [&] {
           check(gpu::residual_layernorm_forward(s, ln2, mean2, rstd2, x, att, ln2w, ln2b, N, C,
                                                 stream),
                 "res ln");
         }},
        {"layernorm_backward", 4 * bc + 8.0 * N,
         [&] {
           check(gpu::layernorm_backward(dx, g_ln1w, g_ln1b, dln1, x, ln1w, mean1, rstd1, N, C,
                                         stream),
                 "ln bwd");
         }},
        {"gelu_forward", 2 * 4 * bc, [&] { gpu::gelu_forward(g, h, N * 4 * C, stream); }},
        {"gelu_backward", 4 * 4 * bc, [&] { gpu::gelu_backward(dh, dg, h, N * 4 * C, stream); }},
        {"residual_forward", 3 * bc, [&] { gpu::residual_forward(out, s, o, N * C, stream); }},
        {"residual_backward", 5 * bc,
         [&] { gpu::residual_backward(dyatt, dln2, dout, N * C, stream); }},
        {"crossentropy_forward_backward", 2.0 * N * Vp * sizeof(bf16) + 8.0 * N,
         [&] {
           gpu::crossentropy_forward_backward(losses, logits, logits, targets, scale, N, V, Vp,
                                              stream);
         }},
#ifndef TL_BENCH_BASELINE_API
        // the earlier classifier kernel (one block per row), for the comparison in the same run
        {"crossentropy_forward_backward_row_per_block", 2.0 * N * Vp * sizeof(bf16) + 8.0 * N,
         [&] {
           gpu::crossentropy_with(gpu::ClassifierKernel::row_per_block, losses, logits, logits,
                                  targets, scale, N, V, Vp, stream);
         }},
#endif
        {"bias_backward_768", bc, [&] { gpu::bias_backward(g_bproj, dout, N, C, stream); }},
        {"bias_backward_3072", 4 * bc, [&] { gpu::bias_backward(g_bfc, dh, N, 4 * C, stream); }},
        {"sum_of_squares_124M", 4.0 * P, [&] { gpu::sum_of_squares(norm, g32, P, stream); }},
        {"adamw_124M", 30.0 * P,
         [&] { gpu::adamw_update(p32, p_bf16, m32, v32, g32, P, scalars, norm, true, stream); }},
        {"to_bf16_124M", 6.0 * P, [&] { gpu::to_bf16(p_bf16, p32, P, stream); }},
    };
    constexpr int kLaunches = 10;
    std::printf("  \"kernel_launches_per_rep\": %d,\n  \"kernels\": {\n", kLaunches);
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      const Kernel& k = kernels[i];
      auto rep = [&] {
        for (int l = 0; l < kLaunches; ++l) k.launch();
      };
      rep();  // warm-up
      check(cudaStreamSynchronize(stream), k.name);
      const Timing t = time_it(stream, 20, rep);
      const double ms = t.median_ms / kLaunches;
      std::printf(
          "   \"%s\": {\"median_ms\": %.5f, \"min_ms\": %.5f, \"bytes\": %.0f, "
          "\"GB_per_s\": %.1f}%s\n",
          k.name, ms, t.min_ms / kLaunches, k.bytes, k.bytes / (ms * 1e-3) / 1e9,
          i + 1 == kernels.size() ? "" : ",");
    }
    std::printf("  }\n");
    check(cudaGetLastError(), "kernels");
    cudaFree(p_bf16);
    cudaFree(opt);
  }
  std::printf("}\n");
  check(cudaStreamDestroy(stream), "stream");
  return 0;
}
