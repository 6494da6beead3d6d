// Where train.precision = "fp8" spends a block GEMM's time, against the bf16 GEMM of the same
// shape in the same run (the peer): per GPT-2 layer (qkv C->3C, attention projection C->C, fc
// C->4C with GELU, fc projection 4C->C with DGELU in its dx) at N tokens, each part timed alone:
//   forward: the casts of x and w (E4M3), the FP8 GEMM; bf16: the GEMM
//   dx:      the cast of dy (E5M2), the transposed cast of w, the FP8 GEMM with the split
//            accumulator and with fast accumulation; bf16: the GEMM
//   dW:      the transposed casts of x and dy, dy's two casts from one read (fp8_cast_dual), the
//            FP8 GEMM (fp32 += , both accumulations); bf16: the GEMM
// and checks on the way that fp8_cast_dual writes the same bytes as fp8_cast + fp8_cast_transpose
// and that the FP8 dW is within FP8's error of the bf16 one. Each GEMM is tuned at its first call
// (a fresh Matmul per variant, as the executor's). Prints one JSON object on stdout.
// Usage: fp8_gemm_bench N:C [N:C ...]   (default 65536:768 16384:1280 16384:1600)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_cuda.cuh"
#include "fp8.cuh"
#include "matmul.cuh"

namespace gpu = topolaunch::kernels::cuda;
namespace bench = topolaunch::bench;
using bf16 = __nv_bfloat16;

namespace {

constexpr int kReps = 15;

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "fp8_gemm_bench: %s: cublasLt status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(std::size_t n) { bench::check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

// Median ms of one call (after one warm-up call and a synchronisation).
double ms_of(const std::function<void()>& fn) {
  return bench::time_it(nullptr, kReps, fn, 1).median_ms;
}

std::vector<std::uint8_t> host_bytes(const void* p, std::size_t n) {
  std::vector<std::uint8_t> h(n);
  bench::check(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), "copy");
  return h;
}

// |a - b| / |b| over two fp32 device arrays (Frobenius norms).
double relative_difference(const float* a, const float* b, std::size_t n) {
  std::vector<float> ha(n), hb(n);
  bench::check(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost), "copy");
  bench::check(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost), "copy");
  double d = 0, r = 0;
  for (std::size_t i = 0; i < n; ++i) {
    d += (static_cast<double>(ha[i]) - hb[i]) * (static_cast<double>(ha[i]) - hb[i]);
    r += static_cast<double>(hb[i]) * hb[i];
  }
  return r > 0 ? std::sqrt(d / r) : 0.0;
}

struct Layer {
  const char* name;
  std::int64_t C, OC;
  bool gelu_out;  // forward: GELU in the epilogue (fc)
  bool gelu_in;   // dx: DGELU in the epilogue (fc projection)
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
  for (int i = 1; i < argc; ++i) {
    long long n = 0, c = 0;
    if (std::sscanf(argv[i], "%lld:%lld", &n, &c) != 2 || n <= 0 || c <= 0) {
      std::fprintf(stderr, "fp8_gemm_bench: argument %d: %s is not N:C\n", i, argv[i]);
      return 2;
    }
    shapes.emplace_back(n, c);
  }
  if (shapes.empty()) shapes = {{65536, 768}, {16384, 1280}, {16384, 1600}};
  cudaDeviceProp prop{};
  bench::check(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("{\"bench\":\"fp8_gemm\",\"device\":\"%s\",\"reps\":%d,\"rows\":[\n", prop.name,
              kReps);
  bool first_row = true;
  bool all_ok = true;
  // the scales' sites (zeroed history: scale 1) and the step scalar
  Dev<gpu::Fp8Scaling> sites(4);
  Dev<float> step(1);
  bench::check(cudaMemset(sites.p, 0, 4 * sizeof(gpu::Fp8Scaling)), "memset");
  bench::check(cudaMemset(step.p, 0, sizeof(float)), "memset");
  gpu::Fp8Scaling* const sx = sites.p;
  gpu::Fp8Scaling* const sw = sites.p + 1;
  gpu::Fp8Scaling* const sdy = sites.p + 2;
  for (const auto& [N, C] : shapes) {
    const Layer layers[] = {{"qkv", C, 3 * C, false, false},
                            {"attn_proj", C, C, false, false},
                            {"fc", C, 4 * C, true, false},
                            {"fc_proj", 4 * C, C, false, true}};
    for (const Layer& L : layers) {
      const std::int64_t LC = L.C, OC = L.OC;
      Dev<bf16> x(N * LC), w(OC * LC), y(N * OC), pre(N * std::max(OC, LC)), dy(N * OC), dx(N * LC);
      Dev<float> dw(OC * LC), dw8(OC * LC);
      Dev<std::uint8_t> x8(N * LC), xt8(N * LC), w8(OC * LC), wt8(OC * LC), dy8(N * OC),
          dyt8(N * OC), dual8(N * OC), dualt8(N * OC);
      bench::fill(x.p, N * LC, 1, 1.0f);
      bench::fill(w.p, OC * LC, 2, 0.05f);
      bench::fill(dy.p, N * OC, 3, 0.01f);
      bench::fill(pre.p, N * std::max(OC, LC), 4, 1.0f);
      const double flop = 2.0 * static_cast<double>(N) * LC * OC;
      auto tflops = [&](double ms) { return flop / ms / 1e9; };

      // bf16, the peer
      gpu::Matmul bf;
      const double bf_fwd = ms_of([&] {
        check(L.gelu_out ? bf.matmul_forward_gelu(y.p, pre.p, x.p, w.p, nullptr, N, LC, OC, nullptr)
                         : bf.matmul_forward(y.p, x.p, w.p, nullptr, N, LC, OC, nullptr),
              "bf16 forward");
      });
      const double bf_dx = ms_of([&] {
        check(L.gelu_in ? bf.matmul_backward_dx_dgelu(dx.p, dy.p, pre.p, w.p, N, LC, OC, nullptr)
                        : bf.matmul_backward_dx(dx.p, dy.p, w.p, N, LC, OC, nullptr, true),
              "bf16 dx");
      });
      bench::check(cudaMemset(dw.p, 0, OC * LC * sizeof(float)), "memset");
      check(bf.matmul_backward_dw(dw.p, nullptr, dy.p, x.p, N, LC, OC, nullptr), "bf16 dw");
      const double bf_dw = ms_of([&] {
        check(bf.matmul_backward_dw(dw.p, nullptr, dy.p, x.p, N, LC, OC, nullptr), "dw");
      });

      // fp8 casts
      const double cast_x = ms_of(
          [&] { gpu::fp8_cast(x8.p, x.p, N * LC, gpu::Fp8Format::e4m3, sx, step.p, nullptr); });
      const double cast_w = ms_of(
          [&] { gpu::fp8_cast(w8.p, w.p, OC * LC, gpu::Fp8Format::e4m3, sw, step.p, nullptr); });
      const double cast_t_w = ms_of([&] {
        gpu::fp8_cast_transpose(wt8.p, w.p, OC, LC, gpu::Fp8Format::e4m3, sw, step.p, nullptr);
      });
      const double cast_dy = ms_of(
          [&] { gpu::fp8_cast(dy8.p, dy.p, N * OC, gpu::Fp8Format::e5m2, sdy, step.p, nullptr); });
      const double cast_t_x = ms_of([&] {
        gpu::fp8_cast_transpose(xt8.p, x.p, N, LC, gpu::Fp8Format::e4m3, sx, step.p, nullptr);
      });
      const double cast_t_dy = ms_of([&] {
        gpu::fp8_cast_transpose(dyt8.p, dy.p, N, OC, gpu::Fp8Format::e5m2, sdy, step.p, nullptr);
      });
      const double dual_dy = ms_of([&] {
        gpu::fp8_cast_dual(dual8.p, dualt8.p, dy.p, N, OC, gpu::Fp8Format::e5m2, sdy, step.p,
                           nullptr);
      });
      bench::check(cudaDeviceSynchronize(), "casts");
      const std::size_t dy_bytes = static_cast<std::size_t>(N * OC);
      const bool dual_same = host_bytes(dual8.p, dy_bytes) == host_bytes(dy8.p, dy_bytes) &&
                             host_bytes(dualt8.p, dy_bytes) == host_bytes(dyt8.p, dy_bytes);
      all_ok = all_ok && dual_same;

      // fp8 GEMMs: split accumulator (the default) and fast accumulation, each its own Matmul
      const float* inv_x = &sx->scale_inv;
      const float* inv_w = &sw->scale_inv;
      const float* inv_dy = &sdy->scale_inv;
      gpu::Matmul f8, f8fast;
      f8fast.set_fp8_backward_fast_accum(true);
      const double fwd8 = ms_of([&] {
        check(f8.matmul_forward_fp8(y.p, L.gelu_out ? pre.p : nullptr, x8.p, inv_x, w8.p, inv_w,
                                    nullptr, N, LC, OC, nullptr),
              "fp8 forward");
      });
      auto dx8_on = [&](gpu::Matmul& m) {
        return ms_of([&] {
          check(m.matmul_backward_dx_fp8(dx.p, L.gelu_in ? pre.p : nullptr, dy8.p, inv_dy, wt8.p,
                                         inv_w, N, LC, OC, nullptr, true),
                "fp8 dx");
        });
      };
      const double dx8 = dx8_on(f8), dx8_fast = dx8_on(f8fast);
      double dw8_ms[2] = {0, 0}, dw8_diff[2] = {0, 0};
      gpu::Matmul* dw_mm[2] = {&f8, &f8fast};
      for (int v = 0; v < 2; ++v) {
        bench::check(cudaMemset(dw8.p, 0, OC * LC * sizeof(float)), "memset");
        check(dw_mm[v]->matmul_backward_dw_fp8(dw8.p, xt8.p, inv_x, dyt8.p, inv_dy, N, LC, OC,
                                               nullptr),
              "fp8 dw");
        bench::check(cudaMemset(dw.p, 0, OC * LC * sizeof(float)), "memset");
        check(bf.matmul_backward_dw(dw.p, nullptr, dy.p, x.p, N, LC, OC, nullptr), "bf16 dw");
        bench::check(cudaDeviceSynchronize(), "dw");
        dw8_diff[v] = relative_difference(dw8.p, dw.p, static_cast<std::size_t>(OC * LC));
        dw8_ms[v] = ms_of([&] {
          check(dw_mm[v]->matmul_backward_dw_fp8(dw8.p, xt8.p, inv_x, dyt8.p, inv_dy, N, LC, OC,
                                                 nullptr),
                "fp8 dw");
        });
      }
      all_ok = all_ok && dw8_diff[0] < 0.1 && dw8_diff[1] < 0.1;

      char buf[2048];
      std::snprintf(
          buf, sizeof buf,
          "{\"N\":%lld,\"layer\":\"%s\",\"C\":%lld,\"OC\":%lld,"
          "\"bf16\":{\"fwd_ms\":%.4f,\"dx_ms\":%.4f,\"dw_ms\":%.4f,\"fwd_tflops\":%.0f,"
          "\"dx_tflops\":%.0f,\"dw_tflops\":%.0f},"
          "\"fp8\":{\"cast_x_ms\":%.4f,\"cast_w_ms\":%.4f,\"fwd_gemm_ms\":%.4f,"
          "\"fwd_gemm_tflops\":%.0f,\"cast_dy_ms\":%.4f,\"cast_t_w_ms\":%.4f,"
          "\"dx_gemm_ms\":%.4f,\"dx_gemm_fast_ms\":%.4f,\"dx_gemm_tflops\":%.0f,"
          "\"dx_gemm_fast_tflops\":%.0f,\"cast_t_x_ms\":%.4f,\"cast_t_dy_ms\":%.4f,"
          "\"dual_dy_ms\":%.4f,\"dual_same_bytes\":%s,\"dw_gemm_ms\":%.4f,"
          "\"dw_gemm_fast_ms\":%.4f,\"dw_gemm_tflops\":%.0f,\"dw_gemm_fast_tflops\":%.0f,"
          "\"dw_rel_diff\":%.4f,\"dw_fast_rel_diff\":%.4f},"
          "\"fwd_fp8_over_bf16\":%.3f,\"dx_fp8_over_bf16\":%.3f,\"dx_fast_fp8_over_bf16\":%.3f}",
          static_cast<long long>(N), L.name, static_cast<long long>(LC), static_cast<long long>(OC),
          bf_fwd, bf_dx, bf_dw, tflops(bf_fwd), tflops(bf_dx), tflops(bf_dw), cast_x, cast_w, fwd8,
          tflops(fwd8), cast_dy, cast_t_w, dx8, dx8_fast, tflops(dx8), tflops(dx8_fast), cast_t_x,
          cast_t_dy, dual_dy, dual_same ? "true" : "false", dw8_ms[0], dw8_ms[1], tflops(dw8_ms[0]),
          tflops(dw8_ms[1]), dw8_diff[0], dw8_diff[1], (cast_x + cast_w + fwd8) / bf_fwd,
          (cast_dy + cast_t_w + dx8) / bf_dx, (cast_dy + cast_t_w + dx8_fast) / bf_dx);
      std::printf("%s  %s", first_row ? "" : ",\n", buf);
      first_row = false;
      std::fflush(stdout);
    }
  }
  std::printf("\n],\"checks_ok\":%s}\n", all_ok ? "true" : "false");
  return all_ok ? 0 : 1;
}
