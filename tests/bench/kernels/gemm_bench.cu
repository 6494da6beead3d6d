// Times each GEMM of GPT-2 124M (C=768, Vp=50304) through kernels/cuda/matmul.cu at N tokens:
// qkv 768->2304, attention projection 768->768, fc 768->3072, fc projection 3072->768, lm head
// 768->50304; per layer the forward (y = x w^T + bias, bf16), dx (= dy w, bf16, overwritten as
// the executor does for a first contribution) and dW (+= dy^T x, fp32), each with cuBLASLt's
// heuristic-first algorithm (autotune off) and with the autotuned one; for layers with a bias also
// dW + dbias with the separate bias pass and with the fused BGRADB epilogue, and which one the
// measured choice took. Timing: CUDA events, kCallsPerRep back-to-back calls per rep (fewer for
// long GEMMs), median of kReps reps after warm-up. gemm_torch.py adds torch.matmul's time for the
// same shapes in the same run. Prints one JSON object on stdout.
// Usage: gemm_bench N [N ...]   (e.g. 16384 65536 = B 16 and 64 at T 1024)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "matmul.cuh"

namespace gpu = topolaunch::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace {

constexpr int kReps = 15;
constexpr int kCallsPerRep = 10;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gemm_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gemm_bench: %s: cublasLt status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(std::size_t n) { check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

__global__ void fill_kernel(bf16* p, std::size_t n, float scale, std::uint32_t seed) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  p[i] = __float2bfloat16(scale * (static_cast<float>(h & 0xffff) / 32768.0f - 1.0f));
}
void fill(bf16* p, std::size_t n, float scale, std::uint32_t seed) {
  fill_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(p, n, scale, seed);
  check(cudaGetLastError(), "fill");
}

// Median ms per call: one warm-up call, then kReps reps of `calls` back-to-back calls.
float time_ms(const std::function<void()>& fn) {
  fn();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  // one timed call decides how many calls a rep holds (long GEMMs: fewer)
  check(cudaEventRecord(a), "record");
  fn();
  check(cudaEventRecord(b), "record");
  check(cudaEventSynchronize(b), "sync");
  float one = 0;
  check(cudaEventElapsedTime(&one, a, b), "elapsed");
  const int calls = one > 1.0f ? 2 : kCallsPerRep;
  std::vector<float> ms;
  for (int r = 0; r < kReps; ++r) {
    check(cudaEventRecord(a), "record");
    for (int c = 0; c < calls; ++c) fn();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Layer {
  const char* name;
  std::int64_t C, OC;
  bool bias;
};

// The one key a fresh Matmul tuned for one op (its first call): chosen index etc.
std::string tuning_json(const gpu::Matmul& mm) {
  std::string s = "[";
  for (const auto& t : mm.tuning_report()) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s{\"m\":%lld,\"n\":%lld,\"k\":%lld,\"epilogue\":%d,\"candidates\":%d,"
                  "\"timed\":%d,\"chosen_index\":%d,\"tune_heuristic_ms\":%.5f,"
                  "\"tune_chosen_ms\":%.5f}",
                  s.size() > 1 ? "," : "", static_cast<long long>(t.m), static_cast<long long>(t.n),
                  static_cast<long long>(t.k), t.epilogue, t.candidates, t.timed, t.chosen_index,
                  t.heuristic_ms, t.chosen_ms);
    s += buf;
  }
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> Ns;
  for (int i = 1; i < argc; ++i) Ns.push_back(std::atoll(argv[i]));
  if (Ns.empty()) Ns = {16384, 65536};
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  const Layer layers[] = {{"qkv", 768, 2304, true},
                          {"attn_proj", 768, 768, true},
                          {"fc", 768, 3072, true},
                          {"fc_proj", 3072, 768, true},
                          {"lm_head", 768, 50304, false}};
  std::printf("{\"bench\":\"gemm\",\"device\":\"%s\",\"reps\":%d,\"rows\":[\n", prop.name, kReps);
  bool first_row = true;
  auto row = [&](const std::string& body) {
    std::printf("%s  {%s}", first_row ? "" : ",\n", body.c_str());
    first_row = false;
    std::fflush(stdout);
  };
  for (const std::int64_t N : Ns) {
    for (const Layer& L : layers) {
      const std::int64_t C = L.C, OC = L.OC;
      Dev<bf16> x(N * C), w(OC * C), b(OC), y(N * OC), dy(N * OC), dx(N * C);
      Dev<float> dw(OC * C), dbias(OC);
      fill(x.p, N * C, 1.0f, 1);
      fill(w.p, OC * C, 0.05f, 2);
      fill(b.p, OC, 0.1f, 3);
      fill(dy.p, N * OC, 0.01f, 4);
      check(cudaMemset(dw.p, 0, OC * C * sizeof(float)), "memset");
      check(cudaMemset(dbias.p, 0, OC * sizeof(float)), "memset");
      const double flop = 2.0 * static_cast<double>(N) * C * OC;
      const bf16* bias = L.bias ? b.p : nullptr;
      // op: runs one call on the given Matmul
      using Op = std::function<void(gpu::Matmul&)>;
      const std::pair<const char*, Op> ops[] = {
          {"fwd",
           [&](gpu::Matmul& m) {
             check(m.matmul_forward(y.p, x.p, w.p, bias, N, C, OC, nullptr), "forward");
           }},
          {"dx",
           [&](gpu::Matmul& m) {
             check(m.matmul_backward_dx(dx.p, dy.p, w.p, N, C, OC, nullptr, true), "dx");
           }},
          {"dw", [&](gpu::Matmul& m) {
             check(m.matmul_backward_dw(dw.p, nullptr, dy.p, x.p, N, C, OC, nullptr), "dw");
           }}};
      for (const auto& [op_name, op] : ops) {
        gpu::Matmul heuristic, tuned;
        heuristic.set_autotune(false);
        const float h_ms = time_ms([&] { op(heuristic); });
        op(tuned);  // first use: tunes (timed separately below)
        check(cudaDeviceSynchronize(), "tune");
        const float t_ms = time_ms([&] { op(tuned); });
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "\"N\":%lld,\"layer\":\"%s\",\"C\":%lld,\"OC\":%lld,\"op\":\"%s\","
                      "\"heuristic_ms\":%.5f,\"tuned_ms\":%.5f,\"tuned_tflops\":%.1f,"
                      "\"heuristic_tflops\":%.1f,\"tuned_over_heuristic\":%.3f,\"keys\":",
                      static_cast<long long>(N), L.name, static_cast<long long>(C),
                      static_cast<long long>(OC), op_name, h_ms, t_ms, flop / t_ms / 1e9,
                      flop / h_ms / 1e9, h_ms / t_ms);
        row(std::string(buf) + tuning_json(tuned));
      }
      if (L.bias) {
        // dW + dbias: the separate pass and the fused epilogue, each over a tuned GEMM
        gpu::Matmul separate, fused, measured;
        separate.set_fused_bias_grad(gpu::FusedBiasGrad::never);
        fused.set_fused_bias_grad(gpu::FusedBiasGrad::always);
        auto dwb = [&](gpu::Matmul& m) {
          check(m.matmul_backward_dw(dw.p, dbias.p, dy.p, x.p, N, C, OC, nullptr), "dw+dbias");
        };
        const float s_ms = time_ms([&] { dwb(separate); });
        const float f_ms = time_ms([&] { dwb(fused); });
        dwb(measured);
        check(cudaDeviceSynchronize(), "measure");
        const float m_ms = time_ms([&] { dwb(measured); });
        const auto fused_report = fused.bias_report();
        const auto measured_report = measured.bias_report();
        const bool supported = !fused_report.empty() && fused_report[0].fused_supported;
        const gpu::BiasGradChoice choice =
            measured_report.empty() ? gpu::BiasGradChoice{} : measured_report[0];
        char buf[768];
        std::snprintf(
            buf, sizeof buf,
            "\"N\":%lld,\"layer\":\"%s\",\"C\":%lld,\"OC\":%lld,\"op\":\"dw_bias\","
            "\"separate_ms\":%.5f,\"fused_ms\":%.5f,\"fused_supported\":%s,\"measured_ms\":%.5f,"
            "\"measured_choice\":\"%s\",\"choice_separate_ms\":%.5f,\"choice_fused_ms\":%.5f,"
            "\"separate_over_fused\":%.3f",
            static_cast<long long>(N), L.name, static_cast<long long>(C),
            static_cast<long long>(OC), s_ms, f_ms, supported ? "true" : "false", m_ms,
            choice.fused ? "fused" : "separate", choice.separate_ms, choice.fused_ms, s_ms / f_ms);
        row(buf);
      }
    }
  }
  std::printf("\n]}\n");
  return 0;
}
