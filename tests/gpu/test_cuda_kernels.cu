// Each CUDA kernel of kernels/cuda/ against its CPU twin of kernels/cpu/ on random inputs.
// Self-contained (plain main, exit status = number of failed checks) so that it builds on the GPU
// host, which has neither toml++ nor our Catch2 version. Inputs are rounded to bf16 before the CPU
// twin sees them, so both sides start from identical values and the differences measure only the
// kernels' own rounding (bf16 outputs) and summation order (atomics, GEMM tiling).
// Built by meson with -Dcuda=enabled (suite gpu).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "adamw.cuh"
#include "adamw.hpp"
#include "attention.cuh"
#include "attention.hpp"
#include "classifier.cuh"
#include "classifier.hpp"
#include "encoder.cuh"
#include "encoder.hpp"
#include "gelu.cuh"
#include "gelu.hpp"
#include "layernorm.cuh"
#include "layernorm.hpp"
#include "matmul.cuh"
#include "matmul.hpp"
#include "residual.cuh"
#include "residual.hpp"
#include "rmsnorm.cuh"
#include "rmsnorm.hpp"
#include "rope.cuh"
#include "rope.hpp"
#include "swiglu.cuh"
#include "swiglu.hpp"
#include "topolaunch/kernels/graph.hpp"

namespace cpu = topolaunch::kernels::cpu;
namespace gpu = topolaunch::kernels::cuda;
using bf16 = __nv_bfloat16;
using Vec = std::vector<float>;

namespace {

int g_failures = 0;
int g_checks = 0;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, cudaGetErrorString(e));
    std::exit(100);
  }
}

// Device buffer of T, RAII.
template <class T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) {
    check_cuda(cudaMalloc(&p, (count == 0 ? 1 : count) * sizeof(T)), "cudaMalloc");
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

Vec random_vec(std::mt19937& rng, std::size_t n, float lo, float hi, bool to_bf16) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = to_bf16 ? round_bf16(dist(rng)) : dist(rng);
  return v;
}

Dev<bf16>* upload_bf16(const Vec& v) {
  auto* d = new Dev<bf16>(v.size());
  std::vector<bf16> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16(v[i]);
  check_cuda(cudaMemcpy(d->p, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice), "h2d");
  return d;
}
template <class T>
Dev<T>* upload(const std::vector<T>& v) {
  auto* d = new Dev<T>(v.size());
  check_cuda(cudaMemcpy(d->p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "h2d");
  return d;
}
Vec download(const Dev<bf16>& d) {
  check_cuda(cudaDeviceSynchronize(), "kernel");
  std::vector<bf16> h(d.n);
  check_cuda(cudaMemcpy(h.data(), d.p, d.n * sizeof(bf16), cudaMemcpyDeviceToHost), "d2h");
  Vec v(d.n);
  for (std::size_t i = 0; i < d.n; ++i) v[i] = __bfloat162float(h[i]);
  return v;
}
Vec download(const Dev<float>& d) {
  check_cuda(cudaDeviceSynchronize(), "kernel");
  Vec v(d.n);
  check_cuda(cudaMemcpy(v.data(), d.p, d.n * sizeof(float), cudaMemcpyDeviceToHost), "d2h");
  return v;
}

// Passes when |gpu - ref| <= atol + rtol |ref| everywhere, atol = atol_frac * max|ref|.
void compare(const std::string& name, const Vec& got, const Vec& ref, double rtol,
             double atol_frac) {
  ++g_checks;
  double max_ref = 0;
  for (float r : ref) max_ref = std::fmax(max_ref, std::fabs(r));
  const double atol = atol_frac * max_ref + 1e-30;
  double worst = 0, max_abs = 0;
  std::size_t worst_i = 0, bad = 0;
  bool finite = got.size() == ref.size();
  for (std::size_t i = 0; i < ref.size() && finite; ++i) {
    if (!std::isfinite(got[i])) {
      finite = false;
      worst_i = i;
      break;
    }
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    max_abs = std::fmax(max_abs, err);
    const double ratio = err / (atol + rtol * std::fabs(ref[i]));
    if (ratio > 1) ++bad;
    if (ratio > worst) {
      worst = ratio;
      worst_i = i;
    }
  }
  const bool ok = finite && bad == 0;
  if (!ok) ++g_failures;
  std::printf(
      "%-4s %-44s n=%-9zu max_abs_err=%.3e max|ref|=%.3e worst=%.3f (at %zu: gpu %.6g ref "
      "%.6g) rtol=%.0e atol=%.1e%s\n",
      ok ? "ok" : "FAIL", name.c_str(), ref.size(), max_abs, max_ref, worst, worst_i,
      worst_i < got.size() ? got[worst_i] : 0.0f, worst_i < ref.size() ? ref[worst_i] : 0.0f, rtol,
      atol, finite ? "" : " NON-FINITE or size mismatch");
}

constexpr double kBf16Rtol = 1.0 / 64;  // a few bf16 ulps (2^-8) on outputs stored in bf16
constexpr double kBf16Atol = 1.0 / 256;

void test_encoder(std::mt19937& rng, std::int64_t C) {
  const std::int64_t B = 4, T = 64, V = 97;  // small V: many repeated tokens
  const std::string shape = " C=" + std::to_string(C);
  std::uniform_int_distribution<std::int32_t> tok(0, V - 1);
  std::vector<std::int32_t> tokens(B * T);
  for (auto& t : tokens) t = tok(rng);
  const Vec wte = random_vec(rng, V * C, -1, 1, true), wpe = random_vec(rng, T * C, -1, 1, true);
  Vec out_ref(B * T * C);
  cpu::encoder_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  std::unique_ptr<Dev<std::int32_t>> dtok(upload(tokens));
  std::unique_ptr<Dev<bf16>> dwte(upload_bf16(wte)), dwpe(upload_bf16(wpe)),
      dout(new Dev<bf16>(B * T * C));
  gpu::encoder_forward(dout->p, dtok->p, dwte->p, dwpe->p, B, T, C, nullptr);
  compare("encoder_forward" + shape, download(*dout), out_ref, kBf16Rtol, kBf16Atol);

  const Vec dy = random_vec(rng, B * T * C, -1, 1, true);
  Vec gwte = random_vec(rng, V * C, -1, 1, false), gwpe = random_vec(rng, T * C, -1, 1, false);
  std::unique_ptr<Dev<float>> dgwte(upload(gwte)), dgwpe(upload(gwpe));
  std::unique_ptr<Dev<bf16>> ddy(upload_bf16(dy));
  cpu::encoder_backward(gwte.data(), gwpe.data(), dy.data(), tokens.data(), B, T, C);
  gpu::encoder_backward(dgwte->p, dgwpe->p, ddy->p, dtok->p, B, T, C, nullptr);
  compare("encoder_backward dwte (fp32, +=)" + shape, download(*dgwte), gwte, 1e-5, 1e-6);
  compare("encoder_backward dwpe (fp32, +=)" + shape, download(*dgwpe), gwpe, 1e-5, 1e-6);
}

void test_layernorm(std::mt19937& rng, std::int64_t N, std::int64_t C) {
  const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
  const Vec x = random_vec(rng, N * C, -2, 3, true), w = random_vec(rng, C, 0.5, 1.5, true),
            b = random_vec(rng, C, -0.5, 0.5, true);
  Vec y(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  std::unique_ptr<Dev<bf16>> dx(upload_bf16(x)), dw(upload_bf16(w)), db(upload_bf16(b)),
      dy(new Dev<bf16>(N * C));
  std::unique_ptr<Dev<float>> dmean(new Dev<float>(N)), drstd(new Dev<float>(N));
  gpu::layernorm_forward(dy->p, dmean->p, drstd->p, dx->p, dw->p, db->p, N, C, nullptr);
  compare("layernorm_forward y" + shape, download(*dy), y, kBf16Rtol, kBf16Atol);
  compare("layernorm_forward mean" + shape, download(*dmean), mean, 1e-4, 1e-5);
  compare("layernorm_forward rstd" + shape, download(*drstd), rstd, 1e-4, 1e-5);

  // fused residual + layernorm
  const Vec a = random_vec(rng, N * C, -1, 1, true), r = random_vec(rng, N * C, -1, 2, true);
  Vec s(N * C), y2(N * C), mean2(N), rstd2(N);
  // the CUDA kernel stores s in bf16 and normalises the stored value: the reference does the same
  for (std::int64_t i = 0; i < N * C; ++i) s[i] = round_bf16(a[i] + r[i]);
  cpu::layernorm_forward(y2.data(), mean2.data(), rstd2.data(), s.data(), w.data(), b.data(), N, C);
  Vec s_plain(N * C), y3(N * C), mean3(N), rstd3(N);  // and the CPU fused twin, unrounded
  cpu::residual_layernorm_forward(s_plain.data(), y3.data(), mean3.data(), rstd3.data(), a.data(),
                                  r.data(), w.data(), b.data(), N, C);
  std::unique_ptr<Dev<bf16>> da(upload_bf16(a)), dr(upload_bf16(r)), ds(new Dev<bf16>(N * C)),
      dy2(new Dev<bf16>(N * C));
  gpu::residual_layernorm_forward(ds->p, dy2->p, dmean->p, drstd->p, da->p, dr->p, dw->p, db->p, N,
                                  C, nullptr);
  compare("residual_layernorm_forward s" + shape, download(*ds), s_plain, kBf16Rtol, kBf16Atol);
  compare("residual_layernorm_forward y" + shape, download(*dy2), y3, 2 * kBf16Rtol, 2 * kBf16Atol);
  compare("residual_layernorm_forward mean" + shape, download(*dmean), mean2, 1e-4, 1e-5);
  compare("residual_layernorm_forward rstd" + shape, download(*drstd), rstd2, 1e-4, 1e-5);

  // backward, accumulating into random initial gradients
  const Vec g = random_vec(rng, N * C, -1, 1, true);
  Vec dxr = random_vec(rng, N * C, -0.1f, 0.1f, true), dwr = random_vec(rng, C, -1, 1, false),
      dbr = random_vec(rng, C, -1, 1, false);
  std::unique_ptr<Dev<bf16>> dg(upload_bf16(g)), ddx(upload_bf16(dxr));
  std::unique_ptr<Dev<float>> ddw(upload(dwr)), ddb(upload(dbr)), dmean1(upload(mean)),
      drstd1(upload(rstd));
  cpu::layernorm_backward(dxr.data(), dwr.data(), dbr.data(), g.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  gpu::layernorm_backward(ddx->p, ddw->p, ddb->p, dg->p, dx->p, dw->p, dmean1->p, drstd1->p, N, C,
                          nullptr);
  compare("layernorm_backward dx (+=)" + shape, download(*ddx), dxr, kBf16Rtol, kBf16Atol);
  compare("layernorm_backward dw (fp32, +=)" + shape, download(*ddw), dwr, 1e-4, 1e-5);
  compare("layernorm_backward db (fp32, +=)" + shape, download(*ddb), dbr, 1e-4, 1e-5);

  // with dx_sum: the same dx, dw, db, and dx_sum += the column sums of the dx written (bf16),
  // summed in double from the kernel's own output; fresh accumulators
  const Vec dx0 = random_vec(rng, N * C, -0.1f, 0.1f, true),
            sum0 = random_vec(rng, C, -1, 1, false);
  std::unique_ptr<Dev<bf16>> ddx2(upload_bf16(dx0));
  std::unique_ptr<Dev<float>> ddw2(upload(Vec(C, 0.0))), ddb2(upload(Vec(C, 0.0))),
      dsum(upload(sum0));
  gpu::layernorm_backward(ddx2->p, ddw2->p, ddb2->p, dg->p, dx->p, dw->p, dmean1->p, drstd1->p, N,
                          C, nullptr, dsum->p);
  Vec dw_only(C, 0.0), db_only(C, 0.0), dx_ref(dx0);
  cpu::layernorm_backward(dx_ref.data(), dw_only.data(), db_only.data(), g.data(), x.data(),
                          w.data(), mean.data(), rstd.data(), N, C);
  const Vec dx_written = download(*ddx2);
  compare("layernorm_backward dx with dx_sum (+=)" + shape, dx_written, dx_ref, kBf16Rtol,
          kBf16Atol);
  std::vector<double> sum_ref(sum0.begin(), sum0.end());
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) sum_ref[c] += dx_written[n * C + c];
  compare("layernorm_backward dx_sum (fp32, += column sums of dx)" + shape, download(*dsum),
          Vec(sum_ref.begin(), sum_ref.end()), 1e-4, 1e-4);
  compare("layernorm_backward dw with dx_sum" + shape, download(*ddw2), dw_only, 1e-4, 1e-5);
  compare("layernorm_backward db with dx_sum" + shape, download(*ddb2), db_only, 1e-4, 1e-5);
}

// RMSNorm, the fused residual + RMSNorm, and the backward, against kernels/cpu/rmsnorm.hpp.
void test_rmsnorm(std::mt19937& rng, std::int64_t N, std::int64_t C) {
  const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
  const Vec x = random_vec(rng, N * C, -2, 3, true), w = random_vec(rng, C, 0.5, 1.5, true);
  Vec y(N * C), rstd(N);
  cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C);
  std::unique_ptr<Dev<bf16>> dx(upload_bf16(x)), dw(upload_bf16(w)), dy(new Dev<bf16>(N * C));
  std::unique_ptr<Dev<float>> drstd(new Dev<float>(N));
  check_cuda(gpu::rmsnorm_forward(dy->p, drstd->p, dx->p, dw->p, N, C, nullptr), "rmsnorm");
  compare("rmsnorm_forward y" + shape, download(*dy), y, kBf16Rtol, kBf16Atol);
  compare("rmsnorm_forward rstd" + shape, download(*drstd), rstd, 1e-4, 1e-5);
  // fused: s stored in bf16 and normalised as stored
  const Vec a = random_vec(rng, N * C, -1, 1, true), r = random_vec(rng, N * C, -1, 2, true);
  Vec s(N * C), y2(N * C), rstd2(N);
  for (std::int64_t i = 0; i < N * C; ++i) s[i] = round_bf16(a[i] + r[i]);
  cpu::rmsnorm_forward(y2.data(), rstd2.data(), s.data(), w.data(), N, C);
  std::unique_ptr<Dev<bf16>> da(upload_bf16(a)), dr(upload_bf16(r)), ds(new Dev<bf16>(N * C)),
      dy2(new Dev<bf16>(N * C));
  check_cuda(
      gpu::residual_rmsnorm_forward(ds->p, dy2->p, drstd->p, da->p, dr->p, dw->p, N, C, nullptr),
      "residual_rmsnorm");
  compare("residual_rmsnorm_forward s" + shape, download(*ds), s, 0, 0);
  compare("residual_rmsnorm_forward y" + shape, download(*dy2), y2, kBf16Rtol, kBf16Atol);
  compare("residual_rmsnorm_forward rstd" + shape, download(*drstd), rstd2, 1e-4, 1e-5);
  // backward, accumulating into random initial gradients
  const Vec g = random_vec(rng, N * C, -1, 1, true);
  Vec dxr = random_vec(rng, N * C, -0.1f, 0.1f, true), dwr = random_vec(rng, C, -1, 1, false);
  std::unique_ptr<Dev<bf16>> dg(upload_bf16(g)), ddx(upload_bf16(dxr));
  std::unique_ptr<Dev<float>> ddw(upload(dwr)), drstd1(upload(rstd));
  cpu::rmsnorm_backward(dxr.data(), dwr.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  check_cuda(gpu::rmsnorm_backward(ddx->p, ddw->p, dg->p, dx->p, dw->p, drstd1->p, N, C, nullptr),
             "rmsnorm_backward");
  compare("rmsnorm_backward dx (+=)" + shape, download(*ddx), dxr, kBf16Rtol, kBf16Atol);
  compare("rmsnorm_backward dw (fp32, +=)" + shape, download(*ddw), dwr, 1e-4, 1e-5);
}

// Rotary embeddings (forward, and the backward accumulating) against kernels/cpu/rope.hpp.
void test_rope(std::mt19937& rng, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
               std::int64_t NKV) {
  const std::string shape = " B=" + std::to_string(B) + " T=" + std::to_string(T) +
                            " C=" + std::to_string(C) + " NH=" + std::to_string(NH) +
                            " NKV=" + std::to_string(NKV);
  const std::int64_t W = C + 2 * (C / NH * NKV), n = B * T * W;
  const Vec x = random_vec(rng, n, -2, 2, true);
  Vec y(n);
  cpu::rope_forward(y.data(), x.data(), B, T, C, NH, NKV, 10000.0);
  std::unique_ptr<Dev<bf16>> dx(upload_bf16(x)), dy(new Dev<bf16>(n));
  check_cuda(gpu::rope_forward(dy->p, dx->p, B, T, C, NH, NKV, 10000.0, nullptr), "rope");
  compare("rope_forward" + shape, download(*dy), y, kBf16Rtol, kBf16Atol);
  Vec acc = random_vec(rng, n, -0.5f, 0.5f, true);
  std::unique_ptr<Dev<bf16>> dacc(upload_bf16(acc));
  cpu::rope_backward(acc.data(), x.data(), B, T, C, NH, NKV, 10000.0);
  check_cuda(gpu::rope_backward(dacc->p, dx->p, B, T, C, NH, NKV, 10000.0, nullptr),
             "rope_backward");
  compare("rope_backward (+=)" + shape, download(*dacc), acc, kBf16Rtol, kBf16Atol);
}

// SwiGLU against kernels/cpu/swiglu.hpp (the vector path when H % 8 == 0, else scalar).
void test_swiglu(std::mt19937& rng, std::int64_t N, std::int64_t H) {
  const std::string shape = " N=" + std::to_string(N) + " H=" + std::to_string(H);
  const Vec gu = random_vec(rng, N * 2 * H, -4, 4, true);
  Vec h(N * H);
  cpu::swiglu_forward(h.data(), gu.data(), N, H);
  std::unique_ptr<Dev<bf16>> dgu(upload_bf16(gu)), dh(new Dev<bf16>(N * H));
  check_cuda(gpu::swiglu_forward(dh->p, dgu->p, N, H, nullptr), "swiglu");
  compare("swiglu_forward" + shape, download(*dh), h, kBf16Rtol, kBf16Atol);
  const Vec d = random_vec(rng, N * H, -1, 1, true);
  Vec acc = random_vec(rng, N * 2 * H, -0.1f, 0.1f, true);
  std::unique_ptr<Dev<bf16>> dd(upload_bf16(d)), dacc(upload_bf16(acc));
  cpu::swiglu_backward(acc.data(), d.data(), gu.data(), N, H);
  check_cuda(gpu::swiglu_backward(dacc->p, dd->p, dgu->p, N, H, nullptr), "swiglu_backward");
  compare("swiglu_backward (+=)" + shape, download(*dacc), acc, kBf16Rtol, kBf16Atol);
}

// Grouped-query attention (our kernels, each kind) against kernels/cpu/attention.hpp.
void test_gqa_attention(std::mt19937& rng, std::int64_t B, std::int64_t T, std::int64_t NH,
                        std::int64_t NKV) {
  const std::int64_t C = NH * 64, W = C + 2 * NKV * 64;
  const std::string shape = " B=" + std::to_string(B) + " T=" + std::to_string(T) +
                            " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV);
  const Vec qkv = random_vec(rng, B * T * W, -1, 1, true),
            dy = random_vec(rng, B * T * C, -1, 1, true);
  Vec y(B * T * C), lse(B * NH * T), scratch(B * NH * T), dqkv(B * T * W, 0.0f);
  cpu::attention_forward(y.data(), lse.data(), scratch.data(), qkv.data(), B, T, C, NH, NKV);
  // the backward from the CPU's output rounded to bf16, as the GPU reads its own
  Vec yb(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) yb[i] = round_bf16(y[i]);
  cpu::attention_backward(dqkv.data(), scratch.data(), dy.data(), qkv.data(), yb.data(), lse.data(),
                          B, T, C, NH, NKV);
  std::unique_ptr<Dev<bf16>> dqkv_in(upload_bf16(qkv)), ddy(upload_bf16(dy)),
      dyo(new Dev<bf16>(B * T * C));
  std::unique_ptr<Dev<float>> dlse(new Dev<float>(B * NH * T));
  for (auto kind : {gpu::AttentionKernel::simple, gpu::AttentionKernel::tensor_core,
                    gpu::AttentionKernel::tensor_core_w32}) {
    const std::string tag =
        std::string(kind == gpu::AttentionKernel::simple        ? " simple"
                    : kind == gpu::AttentionKernel::tensor_core ? " tensor_core"
                                                                : " tensor_core_w32") +
        shape;
    check_cuda(
        gpu::attention_forward_with(kind, dyo->p, dlse->p, dqkv_in->p, B, T, C, NH, nullptr, NKV),
        "gqa forward");
    compare("gqa attention_forward y" + tag, download(*dyo), y, 2 * kBf16Rtol, 2 * kBf16Atol);
    compare("gqa attention_forward lse" + tag, download(*dlse), lse, 1e-3, 1e-3);
    std::unique_ptr<Dev<bf16>> dgrad(upload_bf16(Vec(B * T * W, 0.0f))), dyb(upload_bf16(yb));
    std::unique_ptr<Dev<float>> dlse_ref(upload(lse));
    Dev<char> ws(gpu::attention_backward_workspace_bytes(B, T, C, NH));
    check_cuda(gpu::attention_backward_with(kind, dgrad->p, ws.p, ddy->p, dqkv_in->p, dyb->p,
                                            dlse_ref->p, B, T, C, NH, nullptr, NKV),
               "gqa backward");
    compare("gqa attention_backward dqkv" + tag, download(*dgrad), dqkv, 4 * kBf16Rtol,
            4 * kBf16Atol);
  }
  ++g_checks;
  const bool refused =
      NKV == NH || gpu::attention_backward_with(gpu::AttentionKernel::tensor_core_atomic, nullptr,
                                                nullptr, nullptr, nullptr, nullptr, nullptr, B, T,
                                                C, NH, nullptr, NKV) == cudaErrorInvalidValue;
  if (!refused) ++g_failures;
  std::printf("%-4s tensor_core_atomic refuses grouped-query attention%s\n",
              refused ? "ok" : "FAIL", shape.c_str());
}

// The sharded optimizer's pieces: a partial sum of squares (no root) in the norm's fixed order,
// and a segment added into a gradient shard.
void test_shard_pieces(std::mt19937& rng) {
  const Vec a = random_vec(rng, 100003, -1, 1, false), b = random_vec(rng, 4099, -1, 1, false);
  double ref = 0;
  for (float v : a) ref += static_cast<double>(v) * v;
  for (float v : b) ref += static_cast<double>(v) * v;
  std::unique_ptr<Dev<float>> da(upload(a)), db(upload(b)), out(new Dev<float>(1)),
      partials(new Dev<float>(gpu::kNormPartials));
  std::vector<gpu::MultiTensorEntry> entries(2);
  entries[0].grad = da->p;
  entries[0].n = static_cast<std::int64_t>(a.size());
  entries[1].grad = db->p;
  entries[1].n = static_cast<std::int64_t>(b.size());
  const std::int64_t chunks = gpu::layout_multi_tensor(entries, gpu::MultiTensorUse::global_norm);
  std::unique_ptr<Dev<gpu::MultiTensorEntry>> table(upload(entries));
  gpu::sum_of_squares_multi(out->p, partials->p, table->p, 2, chunks, nullptr);
  compare("sum_of_squares_multi (no root)", download(*out), Vec{static_cast<float>(ref)}, 1e-5, 0);
  Vec shard = random_vec(rng, 1000, -1, 1, false), seg = random_vec(rng, 1000, -1, 1, false);
  std::unique_ptr<Dev<float>> dshard(upload(shard)), dseg(upload(seg));
  gpu::add_in_place(dshard->p, dseg->p, 1000, nullptr);
  for (std::size_t i = 0; i < shard.size(); ++i) shard[i] += seg[i];
  compare("add_in_place (gradient shard += segment)", download(*dshard), shard, 0, 0);
}

void test_elementwise(std::mt19937& rng, std::int64_t n) {
  const std::string shape = " n=" + std::to_string(n);
  const Vec x = random_vec(rng, n, -4, 4, true), dy = random_vec(rng, n, -1, 1, true);
  Vec y(n), dx = random_vec(rng, n, -1, 1, true);
  std::unique_ptr<Dev<bf16>> dxv(upload_bf16(x)), ddy(upload_bf16(dy)), dyv(new Dev<bf16>(n)),
      ddx(upload_bf16(dx));
  cpu::gelu_forward(y.data(), x.data(), n);
  gpu::gelu_forward(dyv->p, dxv->p, n, nullptr);
  compare("gelu_forward" + shape, download(*dyv), y, kBf16Rtol, kBf16Atol);
  cpu::gelu_backward(dx.data(), dy.data(), x.data(), n);
  gpu::gelu_backward(ddx->p, ddy->p, dxv->p, n, nullptr);
  compare("gelu_backward (+=)" + shape, download(*ddx), dx, kBf16Rtol, kBf16Atol);
  // a gradient's first write (the executor skips its zero): dx = dy * gelu'(x), whatever dx held
  Vec dx_first(n, 0.0f);
  cpu::gelu_backward(dx_first.data(), dy.data(), x.data(), n);
  std::unique_ptr<Dev<bf16>> ddx_stale(upload_bf16(Vec(n, 7.0f)));
  gpu::gelu_backward_overwrite(ddx_stale->p, ddy->p, dxv->p, n, nullptr);
  compare("gelu_backward_overwrite (=)" + shape, download(*ddx_stale), dx_first, kBf16Rtol,
          kBf16Atol);

  Vec r(n);
  cpu::residual_forward(r.data(), x.data(), dy.data(), n);
  gpu::residual_forward(dyv->p, dxv->p, ddy->p, n, nullptr);
  compare("residual_forward" + shape, download(*dyv), r, kBf16Rtol, kBf16Atol);
  Vec da = random_vec(rng, n, -1, 1, true), db = random_vec(rng, n, -1, 1, true);
  std::unique_ptr<Dev<bf16>> dda(upload_bf16(da)), ddb(upload_bf16(db));
  cpu::residual_backward(da.data(), db.data(), dy.data(), n);
  gpu::residual_backward(dda->p, ddb->p, ddy->p, n, nullptr);
  compare("residual_backward da (+=)" + shape, download(*dda), da, kBf16Rtol, kBf16Atol);
  compare("residual_backward db (+=)" + shape, download(*ddb), db, kBf16Rtol, kBf16Atol);
  // da == db (both gradients into one buffer): each element gets dy twice
  cpu::residual_backward(da.data(), da.data(), dy.data(), n);
  gpu::residual_backward(dda->p, dda->p, ddy->p, n, nullptr);
  compare("residual_backward da == db (+= twice)" + shape, download(*dda), da, kBf16Rtol,
          kBf16Atol);
}

// Every classifier kernel against the CPU reference: losses only, dlogits only (out of place),
// both fused in place (dlogits overwrite the logits). `expect_staged`: the shape must take the
// staged kernels (a silent fallback to row_per_block would leave them untested).
void test_classifier(std::mt19937& rng, std::int64_t N, std::int64_t V, std::int64_t Vp,
                     bool expect_staged) {
  const std::string shape =
      " N=" + std::to_string(N) + " V=" + std::to_string(V) + " Vp=" + std::to_string(Vp);
  const Vec logits = random_vec(rng, N * Vp, -6, 6, true);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(V - 1));
  std::vector<std::int32_t> targets(N);
  for (auto& t : targets) t = tok(rng);
  targets[0] = static_cast<std::int32_t>(V - 1);  // the last real column, inside the padded pack
  if (N > 1) targets[1] = 0;
  const float scale = 1.0f / static_cast<float>(N);
  Vec losses(N), dlogits(N * Vp);
  cpu::crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
  cpu::crossentropy_backward(dlogits.data(), logits.data(), targets.data(), scale, N, V, Vp);
  std::unique_ptr<Dev<bf16>> dl(upload_bf16(logits)), dd(new Dev<bf16>(N * Vp));
  std::unique_ptr<Dev<std::int32_t>> dt(upload(targets));
  std::unique_ptr<Dev<float>> dloss(new Dev<float>(N)), dscale(upload(Vec{scale}));
  gpu::crossentropy_forward(dloss->p, dl->p, dt->p, N, V, Vp, nullptr);
  compare("crossentropy_forward losses" + shape, download(*dloss), losses, 1e-5, 1e-6);
  gpu::crossentropy_backward(dd->p, dl->p, dt->p, dscale->p, N, V, Vp, nullptr);
  compare("crossentropy_backward dlogits" + shape, download(*dd), dlogits, kBf16Rtol, 1e-3);
  const gpu::ClassifierKernel kinds[] = {
      gpu::ClassifierKernel::row_per_block, gpu::ClassifierKernel::staged_1024,
      gpu::ClassifierKernel::staged_512, gpu::ClassifierKernel::staged_1024_half_exp};
  for (const gpu::ClassifierKernel kind : kinds) {
    const std::string name = std::string(" [") + gpu::classifier_kernel_name(kind) + "]" + shape;
    auto ran = [&](gpu::ClassifierKernel got, const char* what) {
      ++g_checks;
      const bool ok =
          got == kind || (!expect_staged && got == gpu::ClassifierKernel::row_per_block);
      if (!ok) ++g_failures;
      std::printf("%-4s %s%s ran %s\n", ok ? "ok" : "FAIL", what, name.c_str(),
                  gpu::classifier_kernel_name(got));
    };
    std::unique_ptr<Dev<bf16>> dlk(upload_bf16(logits));
    check_cuda(cudaMemset(dloss->p, 0, N * sizeof(float)), "memset");
    ran(gpu::crossentropy_with(kind, dloss->p, nullptr, dlk->p, dt->p, nullptr, N, V, Vp, nullptr),
        "crossentropy losses");
    compare("crossentropy losses" + name, download(*dloss), losses, 1e-5, 1e-6);
    check_cuda(cudaMemset(dd->p, 0xff, N * Vp * sizeof(bf16)), "memset");  // NaN: all written
    ran(gpu::crossentropy_with(kind, nullptr, dd->p, dlk->p, dt->p, dscale->p, N, V, Vp, nullptr),
        "crossentropy dlogits");
    compare("crossentropy dlogits" + name, download(*dd), dlogits, kBf16Rtol, 1e-3);
    check_cuda(cudaMemset(dloss->p, 0, N * sizeof(float)), "memset");
    ran(gpu::crossentropy_with(kind, dloss->p, dlk->p, dlk->p, dt->p, dscale->p, N, V, Vp, nullptr),
        "crossentropy fused in place");
    compare("crossentropy fused losses (in place)" + name, download(*dloss), losses, 1e-5, 1e-6);
    compare("crossentropy fused dlogits (in place)" + name, download(*dlk), dlogits, kBf16Rtol,
            1e-3);
  }
  // the public fused function, in place, captured into a CUDA graph (as the executor runs it:
  // the staged kernel's launch sets its shared-memory limit, which must not break a capture)
  check_cuda(cudaMemset(dloss->p, 0, N * sizeof(float)), "memset");
  {
    cudaStream_t stream;
    check_cuda(cudaStreamCreate(&stream), "stream");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
    gpu::crossentropy_forward_backward(dloss->p, dl->p, dl->p, dt->p, dscale->p, N, V, Vp, stream);
    check_cuda(cudaStreamEndCapture(stream, &graph), "end capture (crossentropy_forward_backward)");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
    check_cuda(cudaStreamSynchronize(stream), "graph run");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  compare("crossentropy_forward_backward losses (in place, graph)" + shape, download(*dloss),
          losses, 1e-5, 1e-6);
  compare("crossentropy_forward_backward dlogits (in place, graph)" + shape, download(*dl), dlogits,
          kBf16Rtol, 1e-3);
}

// offset > 0 starts every buffer `offset` floats into its allocation (unaligned: scalar path).
void test_adamw(std::mt19937& rng, std::int64_t n, std::int64_t offset) {
  const std::string shape = " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
  Vec p = random_vec(rng, n, -1, 1, false), m = random_vec(rng, n, -0.01f, 0.01f, false),
      v = random_vec(rng, n, 0, 1e-4f, false), grad = random_vec(rng, n, -0.01f, 0.01f, false);
  // global norm over the gradient: the CPU twin sums in double, the GPU in fp32 atomics
  const double norm_ref = std::sqrt(cpu::sum_of_squares(grad.data(), n));
  // each buffer holds `offset` leading zeros before the n values the kernels see
  auto padded = [&](const Vec& x) {
    Vec out(offset, 0.0f);
    out.insert(out.end(), x.begin(), x.end());
    return out;
  };
  auto unpadded = [&](const Vec& x) { return Vec(x.begin() + offset, x.end()); };
  std::unique_ptr<Dev<float>> dp(upload(padded(p))), dm(upload(padded(m))), dv(upload(padded(v))),
      dg(upload(padded(grad))), dnorm(new Dev<float>(1));
  check_cuda(cudaMemset(dnorm->p, 0, sizeof(float)), "memset");
  gpu::sum_of_squares(dnorm->p, dg->p + offset, n, nullptr);
  gpu::sqrt_in_place(dnorm->p, nullptr);
  compare("global norm (sum_of_squares + sqrt)" + shape, download(*dnorm),
          Vec{static_cast<float>(norm_ref)}, 1e-5, 0);

  namespace tk = topolaunch::kernels;
  Vec sc(tk::kNumScalars, 0);
  sc[tk::kLearningRate] = 1e-3f;
  sc[tk::kBeta1] = 0.9f;
  sc[tk::kBeta2] = 0.95f;
  sc[tk::kEpsilon] = 1e-8f;
  sc[tk::kWeightDecay] = 0.1f;
  sc[tk::kStep] = 3;
  sc[tk::kGradClip] = static_cast<float>(norm_ref / 2);  // clipping active
  std::unique_ptr<Dev<float>> dsc(upload(sc));
  std::unique_ptr<Dev<bf16>> dpb(new Dev<bf16>(n + offset));
  for (bool decayed : {true, false}) {
    cpu::AdamWScalars s{sc[tk::kLearningRate],
                        sc[tk::kBeta1],
                        sc[tk::kBeta2],
                        sc[tk::kEpsilon],
                        sc[tk::kWeightDecay],
                        sc[tk::kStep],
                        0.5};
    cpu::adamw_update(p.data(), m.data(), v.data(), grad.data(), n, s, decayed);
    gpu::adamw_update(dp->p + offset, dpb->p + offset, dm->p + offset, dv->p + offset,
                      dg->p + offset, n, dsc->p, dnorm->p, decayed, nullptr);
    const std::string tag = (decayed ? " (decayed)" : " (no decay)") + shape;
    compare("adamw_update param" + tag, unpadded(download(*dp)), p, 1e-6, 1e-6);
    compare("adamw_update m" + tag, unpadded(download(*dm)), m, 1e-5, 1e-6);
    compare("adamw_update v" + tag, unpadded(download(*dv)), v, 1e-5, 1e-6);
    compare("adamw_update bf16 copy" + tag, unpadded(download(*dpb)), p, 1.0 / 128, 0);
  }
  // the bf16 working copy alone (to_bf16), from the updated fp32 parameters
  check_cuda(cudaMemset(dpb->p, 0, (n + offset) * sizeof(bf16)), "memset");
  gpu::to_bf16(dpb->p + offset, dp->p + offset, n, nullptr);
  Vec pb = unpadded(download(*dp));  // exact: rounding of the GPU's own fp32 values
  for (auto& x : pb) x = round_bf16(x);
  compare("to_bf16" + shape, unpadded(download(*dpb)), pb, 0, 0);
}

// The multi-tensor optimizer against the per-tensor kernels on a table of tensors of mixed sizes
// (n % 4 tails, one unaligned: scalar path, one without a bf16 copy, decayed or not): AdamW must
// be bit-identical to adamw_update per tensor; the fixed-order global norm within 1e-5 of the
// double-precision reference and bit-identical from one run to the next.
void test_multi_tensor(std::mt19937& rng) {
  const std::vector<std::int64_t> sizes = {768, 1000003, 3, 2304 * 768, 50304 * 768 / 16, 1001, 7};
  const std::size_t k = sizes.size();
  struct Buffers {
    std::unique_ptr<Dev<float>> p, m, v, g;
    std::unique_ptr<Dev<bf16>> pb;
  };
  std::vector<Buffers> a(k), b(k);  // a: per-tensor kernels, b: multi-tensor
  std::vector<Vec> grads(k);
  double sum_sq = 0;
  auto same_bits = [](const Vec& x, const Vec& y) {
    if (x.size() != y.size()) return false;
    return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  std::vector<gpu::MultiTensorEntry> adam(k), norm(k);
  for (std::size_t i = 0; i < k; ++i) {
    const std::int64_t n = sizes[i], off = i == 5 ? 1 : 0;  // tensor 5 unaligned
    Vec p = random_vec(rng, n + off, -1, 1, false),
        m = random_vec(rng, n + off, -0.01f, 0.01f, false),
        v = random_vec(rng, n + off, 0, 1e-4f, false),
        g = random_vec(rng, n + off, -0.01f, 0.01f, false);
    grads[i] = Vec(g.begin() + off, g.end());
    for (float x : grads[i]) sum_sq += static_cast<double>(x) * x;
    for (auto* s : {&a[i], &b[i]}) {
      s->p.reset(upload(p));
      s->m.reset(upload(m));
      s->v.reset(upload(v));
      s->g.reset(upload(g));
      s->pb.reset(new Dev<bf16>(n + off));
      check_cuda(cudaMemset(s->pb->p, 0, (n + off) * sizeof(bf16)), "memset");
    }
    adam[i].param = b[i].p->p + off;
    adam[i].param_bf16 = i == 2 ? nullptr : b[i].pb->p + off;  // tensor 2 without a bf16 copy
    adam[i].m = b[i].m->p + off;
    adam[i].v = b[i].v->p + off;
    adam[i].grad = b[i].g->p + off;
    adam[i].n = n;
    adam[i].decayed = i % 2;
    norm[i].grad = b[i].g->p + off;
    norm[i].n = n;
  }
  const std::int64_t adam_blocks = gpu::layout_multi_tensor(adam, gpu::MultiTensorUse::adamw);
  const std::int64_t norm_chunks = gpu::layout_multi_tensor(norm, gpu::MultiTensorUse::global_norm);
  std::unique_ptr<Dev<gpu::MultiTensorEntry>> dadam(upload(adam)), dnorm_table(upload(norm));
  std::unique_ptr<Dev<float>> dnorm(new Dev<float>(2)),
      dpartials(new Dev<float>(gpu::kNormPartials));
  gpu::global_norm_multi(dnorm->p, dpartials->p, dnorm_table->p, static_cast<int>(k), norm_chunks,
                         nullptr);
  const Vec first = download(*dnorm);
  const double norm_ref = std::sqrt(sum_sq);
  compare("global_norm_multi vs double reference", Vec{first[0]}, Vec{static_cast<float>(norm_ref)},
          1e-5, 0);
  bool repeat_same = true;
  for (int r = 0; r < 5; ++r) {
    gpu::global_norm_multi(dnorm->p, dpartials->p, dnorm_table->p, static_cast<int>(k), norm_chunks,
                           nullptr);
    repeat_same = repeat_same && same_bits(Vec{download(*dnorm)[0]}, Vec{first[0]});
  }
  ++g_checks;
  if (!repeat_same) ++g_failures;
  std::printf("%-4s global_norm_multi bit-identical over 6 runs (%.9g)\n",
              repeat_same ? "ok" : "FAIL", first[0]);

  namespace tk = topolaunch::kernels;
  Vec sc(tk::kNumScalars, 0);
  sc[tk::kLearningRate] = 1e-3f;
  sc[tk::kBeta1] = 0.9f;
  sc[tk::kBeta2] = 0.95f;
  sc[tk::kEpsilon] = 1e-8f;
  sc[tk::kWeightDecay] = 0.1f;
  sc[tk::kStep] = 5;
  sc[tk::kGradClip] = static_cast<float>(norm_ref / 2);  // clipping active
  std::unique_ptr<Dev<float>> dsc(upload(sc));
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = 0; i < k; ++i) {
      const std::int64_t off = i == 5 ? 1 : 0;
      gpu::adamw_update(a[i].p->p + off, i == 2 ? nullptr : a[i].pb->p + off, a[i].m->p + off,
                        a[i].v->p + off, a[i].g->p + off, sizes[i], dsc->p, dnorm->p, i % 2 == 1,
                        nullptr);
    }
    gpu::adamw_update_multi(dadam->p, static_cast<int>(k), adam_blocks, dsc->p, dnorm->p, nullptr);
  }
  for (std::size_t i = 0; i < k; ++i) {
    const bool same = same_bits(download(*a[i].p), download(*b[i].p)) &&
                      same_bits(download(*a[i].m), download(*b[i].m)) &&
                      same_bits(download(*a[i].v), download(*b[i].v)) &&
                      same_bits(download(*a[i].pb), download(*b[i].pb));
    ++g_checks;
    if (!same) ++g_failures;
    std::printf("%-4s adamw_update_multi == adamw_update bit for bit, tensor %zu n=%lld%s\n",
                same ? "ok" : "FAIL", i, static_cast<long long>(sizes[i]),
                i == 5   ? " (unaligned)"
                : i == 2 ? " (no bf16 copy)"
                         : "");
  }
}

// bias_backward alone: dbias += column sums of dy (N, OC), reference summed in double.
void test_bias_backward(std::mt19937& rng, std::int64_t N, std::int64_t OC) {
  const std::string shape = " N=" + std::to_string(N) + " OC=" + std::to_string(OC);
  const Vec dy = random_vec(rng, N * OC, -1, 1, true);
  Vec dbias = random_vec(rng, OC, -1, 1, false);
  std::unique_ptr<Dev<bf16>> ddy(upload_bf16(dy));
  std::unique_ptr<Dev<float>> ddb(upload(dbias));
  gpu::bias_backward(ddb->p, ddy->p, N, OC, nullptr);
  for (std::int64_t c = 0; c < OC; ++c) {
    double sum = 0;
    for (std::int64_t r = 0; r < N; ++r) sum += dy[r * OC + c];
    dbias[c] = static_cast<float>(dbias[c] + sum);
  }
  // fp32 partial sums of up to N terms of magnitude <= 1: absolute error ~ sqrt(N) * 2^-24 * N
  compare("bias_backward (fp32, +=)" + shape, download(*ddb), dbias, 1e-5, 1e-5);
}

void test_matmul(std::mt19937& rng, gpu::Matmul& mm, std::int64_t N, std::int64_t C,
                 std::int64_t OC, bool with_bias) {
  const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                            " OC=" + std::to_string(OC) + (with_bias ? " +bias" : "");
  const Vec x = random_vec(rng, N * C, -1, 1, true), w = random_vec(rng, OC * C, -0.1f, 0.1f, true),
            bias = random_vec(rng, OC, -1, 1, true);
  Vec y(N * OC);
  cpu::matmul_forward(y.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
  std::unique_ptr<Dev<bf16>> dx(upload_bf16(x)), dw(upload_bf16(w)), db(upload_bf16(bias)),
      dy(new Dev<bf16>(N * OC));
  cublasStatus_t st =
      mm.matmul_forward(dy->p, dx->p, dw->p, with_bias ? db->p : nullptr, N, C, OC, nullptr);
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAIL matmul_forward%s: cublasLt status %d\n", shape.c_str(), static_cast<int>(st));
    ++g_failures;
    ++g_checks;
    return;
  }
  compare("matmul_forward" + shape, download(*dy), y, kBf16Rtol, kBf16Atol);

  const Vec g = random_vec(rng, N * OC, -1, 1, true);
  Vec gx = random_vec(rng, N * C, -1, 1, true), gw = random_vec(rng, OC * C, -1, 1, false),
      gb = random_vec(rng, OC, -1, 1, false);
  std::unique_ptr<Dev<bf16>> dg(upload_bf16(g)), dgx(upload_bf16(gx));
  std::unique_ptr<Dev<float>> dgw(upload(gw)), dgb(upload(gb));
  cpu::matmul_backward(gx.data(), gw.data(), gb.data(), g.data(), x.data(), w.data(), N, C, OC);
  st = mm.matmul_backward(dgx->p, dgw->p, dgb->p, dg->p, dx->p, dw->p, N, C, OC, nullptr);
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAIL matmul_backward%s: cublasLt status %d\n", shape.c_str(),
                static_cast<int>(st));
    ++g_failures;
    ++g_checks;
    return;
  }
  compare("matmul_backward dx (+=)" + shape, download(*dgx), gx, kBf16Rtol, kBf16Atol);
  compare("matmul_backward dw (fp32, +=)" + shape, download(*dgw), gw, 1e-4, 1e-5);
  compare("matmul_backward dbias (fp32, +=)" + shape, download(*dgb), gb, 1e-4, 1e-5);
}

// The GELU epilogues: y = gelu(x @ w^T + bias) with the pre-activation kept, and the backward
// with gelu' fused into the dx GEMM (dpre overwritten).
void test_matmul_gelu(std::mt19937& rng, gpu::Matmul& mm, std::int64_t N, std::int64_t C,
                      std::int64_t OC) {
  const std::string shape =
      " N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
  const Vec x = random_vec(rng, N * C, -1, 1, true), w = random_vec(rng, OC * C, -0.1f, 0.1f, true),
            bias = random_vec(rng, OC, -1, 1, true);
  Vec pre(N * OC), y(N * OC);
  cpu::matmul_forward(pre.data(), x.data(), w.data(), bias.data(), N, C, OC);
  cpu::gelu_forward(y.data(), pre.data(), N * OC);
  std::unique_ptr<Dev<bf16>> dx(upload_bf16(x)), dw(upload_bf16(w)), db(upload_bf16(bias)),
      dy(new Dev<bf16>(N * OC)), dpre(new Dev<bf16>(N * OC));
  cublasStatus_t st =
      mm.matmul_forward_gelu(dy->p, dpre->p, dx->p, dw->p, db->p, N, C, OC, nullptr);
  ++g_checks;
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAIL matmul_forward_gelu%s: cublasLt status %d\n", shape.c_str(),
                static_cast<int>(st));
    ++g_failures;
    return;
  }
  --g_checks;
  compare("matmul_forward_gelu pre" + shape, download(*dpre), pre, kBf16Rtol, kBf16Atol);
  compare("matmul_forward_gelu y" + shape, download(*dy), y, kBf16Rtol, kBf16Atol);

  // backward of out = g @ w2^T with g = gelu(h): h (N,OC) is the GELU input, w2 (C2,OC)
  const std::int64_t C2 = C;
  const Vec h = random_vec(rng, N * OC, -3, 3, true),
            w2 = random_vec(rng, C2 * OC, -0.1f, 0.1f, true),
            dout = random_vec(rng, N * C2, -1, 1, true);
  Vec g(N * OC);
  cpu::gelu_forward(g.data(), h.data(), N * OC);
  for (auto& v : g) v = round_bf16(v);
  Vec dg(N * OC, 0.0f), dh(N * OC, 0.0f), gw = random_vec(rng, C2 * OC, -1, 1, false),
                                          gb = random_vec(rng, C2, -1, 1, false);
  std::unique_ptr<Dev<bf16>> dh_in(upload_bf16(h)), dg_in(upload_bf16(g)), dw2(upload_bf16(w2)),
      ddout(upload_bf16(dout)), ddh(new Dev<bf16>(N * OC));
  std::unique_ptr<Dev<float>> dgw(upload(gw)), dgb(upload(gb));
  cpu::matmul_backward(dg.data(), gw.data(), gb.data(), dout.data(), g.data(), w2.data(), N, OC,
                       C2);
  cpu::gelu_backward(dh.data(), dg.data(), h.data(), N * OC);
  st = mm.matmul_backward_dgelu(ddh->p, dgw->p, dgb->p, ddout->p, dg_in->p, dh_in->p, dw2->p, N, OC,
                                C2, nullptr);
  ++g_checks;
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAIL matmul_backward_dgelu%s: cublasLt status %d\n", shape.c_str(),
                static_cast<int>(st));
    ++g_failures;
    return;
  }
  --g_checks;
  compare("matmul_backward_dgelu dpre (=)" + shape, download(*ddh), dh, kBf16Rtol, kBf16Atol);
  compare("matmul_backward_dgelu dw (fp32, +=)" + shape, download(*dgw), gw, 1e-4, 1e-5);
  compare("matmul_backward_dgelu dbias (fp32, +=)" + shape, download(*dgb), gb, 1e-4, 1e-5);
}

// Every GEMM key a Matmul tuned eagerly: timed (not the untimed fallback), a valid index into
// the heuristic's list, the chosen one no slower than the heuristic's first.
void check_tuned(const gpu::Matmul& mm, const std::string& name) {
  ++g_checks;
  const auto report = mm.tuning_report();
  int bad = 0;
  for (const auto& t : report) {
    const bool ok = t.tuned && t.timed > 0 && t.chosen_index >= 0 &&
                    t.chosen_index < t.candidates && t.chosen_ms > 0 &&
                    t.chosen_ms <= t.heuristic_ms;
    if (!ok) {
      ++bad;
      std::printf(
          "     untuned key m=%lld n=%lld k=%lld epilogue=%d tuned=%d timed=%d chosen=%d/%d\n",
          static_cast<long long>(t.m), static_cast<long long>(t.n), static_cast<long long>(t.k),
          t.epilogue, t.tuned ? 1 : 0, t.timed, t.chosen_index, t.candidates);
    }
  }
  const bool ok = bad == 0 && !report.empty();
  if (!ok) ++g_failures;
  std::printf("%-4s %s: %zu GEMM keys tuned at first use (%d not)\n", ok ? "ok" : "FAIL",
              name.c_str(), report.size(), bad);
}

// The fused bias gradient (BGRADB into a scratch, added into dbias) against the separate pass,
// on identical inputs with nonzero initial dw and dbias: dbias within fp32 summation tolerance,
// dw equal up to the GEMM algorithm (both Matmuls tune independently).
void test_fused_bias_grad(std::mt19937& rng, std::int64_t N, std::int64_t C, std::int64_t OC) {
  const std::string shape =
      " N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
  const Vec x = random_vec(rng, N * C, -1, 1, true), g = random_vec(rng, N * OC, -1, 1, true),
            gw = random_vec(rng, OC * C, -1, 1, false), gb = random_vec(rng, OC, -1, 1, false);
  std::unique_ptr<Dev<bf16>> dx(upload_bf16(x)), dg(upload_bf16(g));
  Vec result_dw[2], result_db[2];
  bool supported = false;
  for (int fused = 0; fused < 2; ++fused) {
    gpu::Matmul mm;
    mm.set_fused_bias_grad(fused ? gpu::FusedBiasGrad::always : gpu::FusedBiasGrad::never);
    std::unique_ptr<Dev<float>> dgw(upload(gw)), dgb(upload(gb));
    // twice: the first call decides (and tunes), the second takes the cached path
    for (int rep = 0; rep < 2; ++rep) {
      const cublasStatus_t st =
          mm.matmul_backward_dw(dgw->p, dgb->p, dg->p, dx->p, N, C, OC, nullptr);
      if (st != CUBLAS_STATUS_SUCCESS) {
        std::printf("FAIL matmul_backward_dw%s fused=%d: cublasLt status %d\n", shape.c_str(),
                    fused, static_cast<int>(st));
        ++g_failures;
        ++g_checks;
        return;
      }
    }
    result_dw[fused] = download(*dgw);
    result_db[fused] = download(*dgb);
    if (fused) {
      const auto report = mm.bias_report();
      supported = report.size() == 1 && report[0].fused && report[0].fused_supported;
    }
  }
  ++g_checks;
  if (!supported) {
    ++g_failures;
    std::printf("FAIL fused bias gradient%s: cuBLASLt has no BGRADB algorithm (fp32 D, bf16 A/B)\n",
                shape.c_str());
    return;
  }
  --g_checks;
  // reference for dbias: two calls, each adds the column sums
  Vec db_ref = gb;
  for (std::int64_t c = 0; c < OC; ++c) {
    double sum = 0;
    for (std::int64_t r = 0; r < N; ++r) sum += g[r * OC + c];
    db_ref[c] = static_cast<float>(gb[c] + 2 * sum);
  }
  compare("bias grad separate (x2, +=)" + shape, result_db[0], db_ref, 1e-5, 1e-5);
  compare("bias grad fused BGRADB (x2, +=)" + shape, result_db[1], db_ref, 1e-5, 1e-5);
  compare("bias grad fused == separate" + shape, result_db[1], result_db[0], 1e-5, 1e-5);
  compare("dw with fused bias == separate" + shape, result_dw[1], result_dw[0], 1e-4, 1e-5);
}

// A key first used while the stream is capturing: no tuning (no synchronisation inside the
// capture), the heuristic's first, and the captured graph computes the right result; the bias
// gradient under FusedBiasGrad::measured falls back to the separate pass.
void test_matmul_capture_first_use(std::mt19937& rng, std::int64_t N, std::int64_t C,
                                   std::int64_t OC) {
  const std::string shape =
      " N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
  const Vec x = random_vec(rng, N * C, -1, 1, true), w = random_vec(rng, OC * C, -0.1f, 0.1f, true),
            bias = random_vec(rng, OC, -1, 1, true), g = random_vec(rng, N * OC, -1, 1, true);
  Vec y(N * OC), gx = random_vec(rng, N * C, -1, 1, true),
                 gw = random_vec(rng, OC * C, -1, 1, false), gb = random_vec(rng, OC, -1, 1, false);
  std::unique_ptr<Dev<bf16>> dx(upload_bf16(x)), dw(upload_bf16(w)), db(upload_bf16(bias)),
      dy(new Dev<bf16>(N * OC)), dg(upload_bf16(g)), dgx(upload_bf16(gx));
  std::unique_ptr<Dev<float>> dgw(upload(gw)), dgb(upload(gb));
  cpu::matmul_forward(y.data(), x.data(), w.data(), bias.data(), N, C, OC);
  cpu::matmul_backward(gx.data(), gw.data(), gb.data(), g.data(), x.data(), w.data(), N, C, OC);
  gpu::Matmul mm;
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const cublasStatus_t s1 = mm.matmul_forward(dy->p, dx->p, dw->p, db->p, N, C, OC, stream);
  const cublasStatus_t s2 =
      mm.matmul_backward(dgx->p, dgw->p, dgb->p, dg->p, dx->p, dw->p, N, C, OC, stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ++g_checks;
  if (s1 != CUBLAS_STATUS_SUCCESS || s2 != CUBLAS_STATUS_SUCCESS || end != cudaSuccess) {
    ++g_failures;
    std::printf("FAIL matmul under capture at first use%s: status %d %d, end capture: %s\n",
                shape.c_str(), static_cast<int>(s1), static_cast<int>(s2), cudaGetErrorString(end));
    return;
  }
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
  check_cuda(cudaStreamSynchronize(stream), "graph run");
  int tuned = 0;
  const auto report = mm.tuning_report();
  for (const auto& t : report) tuned += t.tuned ? 1 : 0;
  const auto bias_choice = mm.bias_report();
  const bool ok =
      tuned == 0 && report.size() == 3 && bias_choice.size() == 1 && !bias_choice[0].fused;
  if (!ok) ++g_failures;
  std::printf("%-4s capture at first use%s: %zu keys, %d tuned (want 0), bias fused=%d (want 0)\n",
              ok ? "ok" : "FAIL", shape.c_str(), report.size(), tuned,
              bias_choice.empty() ? -1 : static_cast<int>(bias_choice[0].fused));
  compare("captured matmul_forward" + shape, download(*dy), y, kBf16Rtol, kBf16Atol);
  compare("captured matmul_backward dx (+=)" + shape, download(*dgx), gx, kBf16Rtol, kBf16Atol);
  compare("captured matmul_backward dw (fp32, +=)" + shape, download(*dgw), gw, 1e-4, 1e-5);
  compare("captured matmul_backward dbias (fp32, +=)" + shape, download(*dgb), gb, 1e-4, 1e-5);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace

int main() {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "test_cuda_kernels: no CUDA device visible: run it on a GPU host\n");
    return 100;
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  std::mt19937 rng(1234);
  test_encoder(rng, 768);
  test_encoder(rng, 36);  // C % 8 != 0: scalar kernels
  test_layernorm(rng, 256, 768);
  test_layernorm(rng, 4096, 768);  // many rows per warp in the backward, every block busy
  test_layernorm(rng, 300, 1024);
  test_layernorm(rng, 64, 200);   // C % 8 == 0 but fewer than 32 packs per row
  test_layernorm(rng, 37, 100);   // ragged: C not a multiple of 32, N not of 8
  test_layernorm(rng, 64, 1600);  // GPT-2 1558M width, the largest supported
  {
    ++g_checks;
    const cudaError_t e = gpu::layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                 nullptr, 4, 1601, nullptr);
    const bool ok = e == cudaErrorInvalidValue;
    if (!ok) ++g_failures;
    std::printf("%-4s layernorm_forward refuses C=1601 (cudaErrorInvalidValue)\n",
                ok ? "ok" : "FAIL");
  }
  test_rmsnorm(rng, 256, 768);
  test_rmsnorm(rng, 64, 2048);  // the 1B LLaMA's width (beyond LayerNorm's register rows)
  test_rmsnorm(rng, 37, 100);   // ragged: scalar paths
  test_rope(rng, 2, 64, 256, 4, 2);
  test_rope(rng, 1, 17, 128, 2, 2);  // multi-head layout, odd T
  test_swiglu(rng, 256, 688);
  test_swiglu(rng, 33, 100);  // H % 8 != 0: scalar kernels
  test_gqa_attention(rng, 2, 128, 4, 2);
  test_gqa_attention(rng, 1, 100, 4, 1);  // one key/value head, T not a multiple of the tiles
  test_gqa_attention(rng, 1, 64, 2, 2);   // multi-head through the same path
  test_shard_pieces(rng);
  test_elementwise(rng, 256 * 3072);
  test_elementwise(rng, 1001);                   // scalar path (n % 8 != 0)
  test_classifier(rng, 64, 50257, 50304, true);  // GPT-2, fewer rows than multiprocessors
  // GPT-2 with more rows than multiprocessors, N not a multiple of the grid: rows per block
  // differ, the stages are refilled and reused
  test_classifier(rng, 301, 50257, 50304, true);
  test_classifier(rng, 16, 3000, 3008, true);    // V % 8 != 0 inside the last pack
  test_classifier(rng, 300, 7, 16, true);        // one real pack, then a padding-only pack
  test_classifier(rng, 16, 1000, 1003, false);   // Vp % 8 != 0: two-pass kernel
  test_classifier(rng, 4, 70000, 70000, false);  // too long a row for registers: two-pass kernel
  test_adamw(rng, 1 << 20, 0);
  test_adamw(rng, 1000003, 0);  // n % 4 != 0: the tail
  test_adamw(rng, 1000, 1);     // unaligned buffers: scalar kernels
  test_multi_tensor(rng);
  test_bias_backward(rng, 4096, 3072);
  test_bias_backward(rng, 1000, 776);
  test_bias_backward(rng, 37, 100);  // OC % 8 != 0: scalar kernel
  gpu::Matmul mm;
  if (!mm.error().empty()) {
    std::printf("FAIL cuBLASLt setup: %s\n", mm.error().c_str());
    return 1 + g_failures;
  }
  // mm: autotune on (the default), bias gradient fused or not as measured; mm_heuristic: the
  // heuristic's first algorithm and the separate bias pass (the behaviour before autotune)
  gpu::Matmul mm_heuristic;
  mm_heuristic.set_autotune(false);
  mm_heuristic.set_fused_bias_grad(gpu::FusedBiasGrad::never);
  for (gpu::Matmul* m : {&mm, &mm_heuristic}) {
    std::printf("-- matmul, autotune %s\n", m->autotune() ? "on" : "off");
    test_matmul(rng, *m, 256, 768, 2304, true);   // qkv
    test_matmul(rng, *m, 256, 768, 768, true);    // attention projection
    test_matmul(rng, *m, 256, 768, 3072, true);   // fc
    test_matmul(rng, *m, 256, 3072, 768, true);   // fc projection
    test_matmul(rng, *m, 256, 768, 3072, false);  // no bias
    test_matmul(rng, *m, 64, 768, 50304, false);  // lm head (padded vocabulary)
    test_matmul(rng, *m, 100, 64, 200, true);     // small, odd
    test_matmul_gelu(rng, *m, 256, 768, 3072);    // fc (forward) and fc projection (backward)
    test_matmul_gelu(rng, *m, 100, 64, 200);
  }
  check_tuned(mm, "autotune on");
  for (const auto& b : mm.bias_report())
    std::printf(
        "     bias grad N=%lld C=%lld OC=%lld: fused=%d supported=%d separate %.4f ms, "
        "fused %.4f ms\n",
        static_cast<long long>(b.N), static_cast<long long>(b.C), static_cast<long long>(b.OC),
        b.fused ? 1 : 0, b.fused_supported ? 1 : 0, b.separate_ms, b.fused_ms);
  {
    ++g_checks;
    int tuned = 0;
    for (const auto& t : mm_heuristic.tuning_report()) tuned += t.tuned ? 1 : 0;
    const bool ok = tuned == 0 && !mm_heuristic.tuning_report().empty();
    if (!ok) ++g_failures;
    std::printf("%-4s autotune off: %d of %zu keys tuned (want 0)\n", ok ? "ok" : "FAIL", tuned,
                mm_heuristic.tuning_report().size());
  }
  test_fused_bias_grad(rng, 4096, 768, 2304);  // qkv
  test_fused_bias_grad(rng, 4096, 3072, 768);  // fc projection
  test_fused_bias_grad(rng, 1000, 64, 200);    // small, odd
  test_matmul_capture_first_use(rng, 256, 768, 2304);
  check_cuda(cudaDeviceSynchronize(), "final");
  std::printf("%d of %d checks passed\n", g_checks - g_failures, g_checks);
  return g_failures == 0 ? 0 : 1;
}
