// The CUDA attention kernels (kernels/cuda/attention.cu) against the CPU reference
// (kernels/cpu/attention.hpp, run in double on the same bf16-rounded inputs), for every
// implementation (simple, tensor_core, tensor_core_m64, tensor_core_w32, tensor_core_atomic) and
// the default behind attention.cuh: y, lse and dqkv on several shapes (T=1, T not a multiple of the
// 64-row tiles, T=1024, B>1, NH>1); dqkv accumulates (random initial gradient; and twice from zero
// gives twice once); unsupported head sizes are refused. Plain main, exit status 0 only when every
// check passes. "quick" leaves out the T=1024 shapes (for compute-sanitizer runs); "only=KIND"
// checks one implementation (or "default": the attention.cuh entry points and refusals).
// "only=cudnn": cuDNN's fused attention (attention_cudnn.cuh) with the same checks, except that its
// backward OVERWRITES dqkv (checked on a NaN-poisoned dqkv), plus the cross checks that make the
// two implementations interchangeable op by op: cuDNN's lse equals ours, cuDNN's forward feeds our
// backward and ours feeds cuDNN's. Without a cuDNN build, only=cudnn fails and "all" says so.
//
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90,code=sm_90 -Xcompiler -fopenmp
//        -Ikernels/cpu -Ikernels/cuda tests/gpu/test_attention.cu kernels/cuda/attention.cu
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "attention.hpp"
#include "attention_cudnn.cuh"

namespace cpu = topolaunch::kernels::cpu;
namespace gpu = topolaunch::kernels::cuda;
using bf16 = __nv_bfloat16;
using Vec = std::vector<double>;

namespace {

int g_failures = 0;
int g_checks = 0;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, cudaGetErrorString(e));
    std::exit(100);
  }
}

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

double round_bf16(double v) { return __bfloat162float(__float2bfloat16(static_cast<float>(v))); }

Vec random_bf16(std::mt19937& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = round_bf16(dist(rng));
  return v;
}
void upload(Dev<bf16>& d, const Vec& v) {
  std::vector<bf16> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16(static_cast<float>(v[i]));
  check_cuda(cudaMemcpy(d.p, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice), "h2d");
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
  std::vector<float> h(d.n);
  check_cuda(cudaMemcpy(h.data(), d.p, d.n * sizeof(float), cudaMemcpyDeviceToHost), "d2h");
  return Vec(h.begin(), h.end());
}

// Passes when |got - ref| <= atol + rtol |ref| everywhere, atol = atol_frac * max|ref|.
void compare(const std::string& name, const Vec& got, const Vec& ref, double rtol,
             double atol_frac) {
  ++g_checks;
  double max_ref = 0;
  for (double r : ref) max_ref = std::fmax(max_ref, std::fabs(r));
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
    const double err = std::fabs(got[i] - ref[i]);
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
      "%-4s %-58s n=%-9zu max_abs_err=%.3e max|ref|=%.3e worst=%.3f (at %zu: gpu %.6g ref %.6g) "
      "bad=%zu%s\n",
      ok ? "ok" : "FAIL", name.c_str(), ref.size(), max_abs, max_ref, worst, worst_i,
      worst_i < got.size() ? got[worst_i] : 0.0, worst_i < ref.size() ? ref[worst_i] : 0.0, bad,
      finite ? "" : " NON-FINITE or size mismatch");
}

void expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) ++g_failures;
  std::printf("%-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
}

const char* kind_name(gpu::AttentionKernel k) {
  switch (k) {
    case gpu::AttentionKernel::simple:
      return "simple";
    case gpu::AttentionKernel::tensor_core:
      return "tensor_core";
    case gpu::AttentionKernel::tensor_core_m64:
      return "tensor_core_m64";
    case gpu::AttentionKernel::tensor_core_w32:
      return "tensor_core_w32";
    case gpu::AttentionKernel::tensor_core_atomic:
      return "tensor_core_atomic";
  }
  return "?";
}

// Tolerances: y and dqkv are bf16 (and the tensor-core path rounds P and dS to bf16 before their
// products); lse is fp32 from exact bf16 products. A numpy model of those bf16 roundings at T=1024
// reaches about a quarter of the y and dqkv bounds; tiling errors (a key or query missed, doubled
// or misplaced) show most on the small shapes, where one key is a large share of each row.
constexpr double kYRtol = 1.0 / 128, kYAtol = 1.0 / 256;
constexpr double kLseRtol = 1e-4, kLseAtol = 1e-4;
constexpr double kGradRtol = 1.0 / 64, kGradAtol = 1.0 / 128;

// Which implementations to check: all of them, or one ("default" = the entry points of
// attention.cuh), so that a fault in one kind cannot hide the results of the others.
struct Selection {
  std::string only;         // empty: everything
  bool skip_cudnn = false;  // not built (only without only=cudnn)
  bool has(const char* name) const {
    if (skip_cudnn && std::string(name) == "cudnn") return false;
    return only.empty() || only == name;
  }
};

void upload(Dev<float>& d, const Vec& v) {
  std::vector<float> h(v.begin(), v.end());
  check_cuda(cudaMemcpy(d.p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), "h2d");
}

void test_cudnn_candidate(const gpu::CudnnAttention& att, const Vec& qkv, const Vec& dy,
                          const Vec& y_ref, const Vec& lse_ref, const Vec& grad_ref, std::int64_t B,
                          std::int64_t T, std::int64_t C, std::int64_t NH, const std::string& tag);

// cuDNN's fused attention on one shape against the double reference (same tolerances as ours).
void test_cudnn_shape(const Vec& qkv, const Vec& dy, const Vec& y_ref, const Vec& lse_ref,
                      const Vec& grad_ref, std::int64_t B, std::int64_t T, std::int64_t NH) {
  const std::int64_t C = 64 * NH;
  const std::string tag =
      " [cudnn] B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH);
  auto created = gpu::CudnnAttention::create(B, T, C, NH);
  if (!created) {
    // cuDNN may refuse a degenerate shape (one token); every other shape must be accepted
    if (T < 64) {
      std::printf("note cudnn refused%s: %s (not counted)\n", tag.c_str(),
                  created.error().message.c_str());
      return;
    }
    expect(false, "CudnnAttention::create" + tag + ": " + created.error().message);
    return;
  }
  auto& att = **created;
  // every engine configuration cuDNN offers (the executor may select any of them by timing):
  // candidate i of the forward with candidate i of the backward (the last where one has fewer)
  const int n_fwd = att.candidates(false), n_bwd = att.candidates(true);
  expect(n_fwd >= 1 && n_bwd >= 1, "cudnn candidates" + tag);
  for (int i = 0; i < std::max(n_fwd, n_bwd); ++i) {
    att.select(false, std::min(i, n_fwd - 1));
    att.select(true, std::min(i, n_bwd - 1));
    test_cudnn_candidate(att, qkv, dy, y_ref, lse_ref, grad_ref, B, T, C, NH,
                         tag + " candidate " + std::to_string(i) + "/" +
                             std::to_string(std::max(n_fwd, n_bwd)) +
                             " (fwd: " + att.candidate_description(false, att.selected(false)) +
                             "; bwd: " + att.candidate_description(true, att.selected(true)) + ")");
  }
}

void test_cudnn_candidate(const gpu::CudnnAttention& att, const Vec& qkv, const Vec& dy,
                          const Vec& y_ref, const Vec& lse_ref, const Vec& grad_ref, std::int64_t B,
                          std::int64_t T, std::int64_t C, std::int64_t NH, const std::string& tag) {
  std::printf("note cudnn%s: %s, workspace %zu bytes\n", tag.c_str(), att.version().c_str(),
              att.workspace_bytes());
  Dev<bf16> d_qkv(qkv.size()), d_dy(dy.size()), d_y(y_ref.size()), d_dqkv(qkv.size());
  Dev<float> d_lse(lse_ref.size());
  Dev<unsigned char> d_ws(att.workspace_bytes());
  const std::size_t own_ws_bytes = gpu::attention_backward_workspace_bytes(B, T, C, NH);
  Dev<unsigned char> d_own_ws(own_ws_bytes);
  upload(d_qkv, qkv);
  upload(d_dy, dy);
  auto ok = [&](const topolaunch::Status& st, const std::string& what) {
    if (!st) expect(false, what + tag + ": " + st.error().message);
    return static_cast<bool>(st);
  };
  // forward into NaN-poisoned outputs
  check_cuda(cudaMemset(d_y.p, 0xff, d_y.n * sizeof(bf16)), "memset y");
  check_cuda(cudaMemset(d_lse.p, 0xff, d_lse.n * sizeof(float)), "memset lse");
  if (!ok(att.forward(d_y.p, d_lse.p, d_qkv.p, d_ws.p, nullptr), "cudnn forward")) return;
  const Vec y_cudnn = download(d_y), lse_cudnn = download(d_lse);
  compare("cudnn forward y" + tag, y_cudnn, y_ref, kYRtol, kYAtol);
  compare("cudnn forward lse (== the reference's natural-log lse)" + tag, lse_cudnn, lse_ref,
          kLseRtol, kLseAtol);

  // backward on the reference's y and lse, into a NaN-poisoned dqkv: it must overwrite all of it
  upload(d_y, y_ref);
  upload(d_lse, lse_ref);
  check_cuda(cudaMemset(d_dqkv.p, 0xff, d_dqkv.n * sizeof(bf16)), "memset dqkv");
  if (!ok(att.backward(d_dqkv.p, d_dy.p, d_qkv.p, d_y.p, d_lse.p, d_ws.p, nullptr),
          "cudnn backward"))
    return;
  compare("cudnn backward dqkv (overwrites a NaN-poisoned dqkv)" + tag, download(d_dqkv), grad_ref,
          kGradRtol, kGradAtol);

  // cross 1: cuDNN's forward (y, lse) -> our backward (accumulating into zeros)
  upload(d_y, y_cudnn);
  upload(d_lse, lse_cudnn);
  check_cuda(cudaMemset(d_dqkv.p, 0, d_dqkv.n * sizeof(bf16)), "memset dqkv");
  check_cuda(gpu::attention_backward(d_dqkv.p, d_own_ws.p, d_dy.p, d_qkv.p, d_y.p, d_lse.p, B, T, C,
                                     NH, nullptr),
             "own backward on cudnn forward");
  compare("cross: cudnn forward + own backward dqkv" + tag, download(d_dqkv), grad_ref, kGradRtol,
          kGradAtol);

  // cross 2: our forward (y, lse) -> cuDNN's backward; and our lse equals cuDNN's
  check_cuda(gpu::attention_forward(d_y.p, d_lse.p, d_qkv.p, B, T, C, NH, nullptr), "own forward");
  compare("cross: own lse == cudnn lse" + tag, download(d_lse), lse_cudnn, kLseRtol, kLseAtol);
  check_cuda(cudaMemset(d_dqkv.p, 0xff, d_dqkv.n * sizeof(bf16)), "memset dqkv");
  if (!ok(att.backward(d_dqkv.p, d_dy.p, d_qkv.p, d_y.p, d_lse.p, d_ws.p, nullptr),
          "cudnn backward on own forward"))
    return;
  compare("cross: own forward + cudnn backward dqkv" + tag, download(d_dqkv), grad_ref, kGradRtol,
          kGradAtol);
}

void test_shape(std::mt19937& rng, const Selection& sel, std::int64_t B, std::int64_t T,
                std::int64_t NH) {
  const std::int64_t C = 64 * NH, C3 = 3 * C;
  const std::string shape =
      " B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH);
  const Vec qkv = random_bf16(rng, B * T * C3, -2, 2);
  const Vec dy = random_bf16(rng, B * T * C, -1, 1);
  const Vec dqkv0 = random_bf16(rng, B * T * C3, -0.25, 0.25);

  // reference in double
  Vec y_ref(B * T * C), lse_ref(B * NH * T), scratch(B * NH * T);
  cpu::attention_forward(y_ref.data(), lse_ref.data(), scratch.data(), qkv.data(), B, T, C, NH);
  Vec grad_ref(B * T * C3, 0.0);  // the gradient alone, from zero
  cpu::attention_backward(grad_ref.data(), scratch.data(), dy.data(), qkv.data(), y_ref.data(),
                          lse_ref.data(), B, T, C, NH);
  Vec dqkv_ref(dqkv0);
  for (std::size_t i = 0; i < dqkv_ref.size(); ++i) dqkv_ref[i] += grad_ref[i];

  Dev<bf16> d_qkv(qkv.size()), d_dy(dy.size()), d_y(y_ref.size()), d_dqkv(dqkv0.size());
  Dev<float> d_lse(lse_ref.size());
  // the largest workspace of all kinds (the atomic kind's); the default's must not exceed it
  const std::size_t ws_bytes = gpu::attention_backward_workspace_bytes_with(
      gpu::AttentionKernel::tensor_core_atomic, B, T, C, NH);
  Dev<unsigned char> d_ws(ws_bytes);
  expect(gpu::attention_backward_workspace_bytes(B, T, C, NH) <= ws_bytes &&
             gpu::attention_backward_workspace_bytes_with(gpu::AttentionKernel::tensor_core, B, T,
                                                          C, NH) ==
                 static_cast<std::size_t>(B * NH * T) * sizeof(float),
         "workspace bytes" + shape);
  upload(d_qkv, qkv);
  upload(d_dy, dy);

  for (auto kind : {gpu::AttentionKernel::simple, gpu::AttentionKernel::tensor_core,
                    gpu::AttentionKernel::tensor_core_m64, gpu::AttentionKernel::tensor_core_w32,
                    gpu::AttentionKernel::tensor_core_atomic}) {
    if (!sel.has(kind_name(kind))) continue;
    const std::string tag = std::string(" [") + kind_name(kind) + "]" + shape;
    check_cuda(cudaMemset(d_y.p, 0xff, d_y.n * sizeof(bf16)), "memset y");  // NaN poison
    check_cuda(cudaMemset(d_lse.p, 0xff, d_lse.n * sizeof(float)), "memset lse");
    cudaError_t e =
        gpu::attention_forward_with(kind, d_y.p, d_lse.p, d_qkv.p, B, T, C, NH, nullptr);
    if (e != cudaSuccess) {
      expect(false, "attention_forward" + tag + ": " + cudaGetErrorString(e));
      continue;
    }
    const Vec y = download(d_y);
    compare("attention_forward y" + tag, y, y_ref, kYRtol, kYAtol);
    compare("attention_forward lse" + tag, download(d_lse), lse_ref, kLseRtol, kLseAtol);

    // backward on the reference's y (rounded to bf16, as the arena holds it) and lse
    upload(d_y, y_ref);
    {
      std::vector<float> l(lse_ref.begin(), lse_ref.end());
      check_cuda(cudaMemcpy(d_lse.p, l.data(), l.size() * sizeof(float), cudaMemcpyHostToDevice),
                 "h2d lse");
    }
    upload(d_dqkv, dqkv0);
    e = gpu::attention_backward_with(kind, d_dqkv.p, d_ws.p, d_dy.p, d_qkv.p, d_y.p, d_lse.p, B, T,
                                     C, NH, nullptr);
    if (e != cudaSuccess) {
      expect(false, "attention_backward" + tag + ": " + cudaGetErrorString(e));
      continue;
    }
    compare("attention_backward dqkv (+= random)" + tag, download(d_dqkv), dqkv_ref, kGradRtol,
            kGradAtol);

    // from zero, once and twice: twice must be double once (accumulation, not overwrite)
    check_cuda(cudaMemset(d_dqkv.p, 0, d_dqkv.n * sizeof(bf16)), "memset dqkv");
    check_cuda(gpu::attention_backward_with(kind, d_dqkv.p, d_ws.p, d_dy.p, d_qkv.p, d_y.p, d_lse.p,
                                            B, T, C, NH, nullptr),
               "backward once");
    const Vec once = download(d_dqkv);
    compare("attention_backward dqkv (from 0)" + tag, once, grad_ref, kGradRtol, kGradAtol);
    check_cuda(gpu::attention_backward_with(kind, d_dqkv.p, d_ws.p, d_dy.p, d_qkv.p, d_y.p, d_lse.p,
                                            B, T, C, NH, nullptr),
               "backward twice");
    Vec twice_expected(once);
    for (auto& v : twice_expected) v *= 2;
    compare("attention_backward dqkv twice == 2 x once" + tag, download(d_dqkv), twice_expected,
            1.0 / 128, 1.0 / 1024);
  }

  if (sel.has("cudnn")) test_cudnn_shape(qkv, dy, y_ref, lse_ref, grad_ref, B, T, NH);

  // the default behind attention.cuh
  if (!sel.has("default")) return;
  check_cuda(gpu::attention_forward(d_y.p, d_lse.p, d_qkv.p, B, T, C, NH, nullptr), "default fwd");
  compare("attention_forward y [default]" + shape, download(d_y), y_ref, kYRtol, kYAtol);
  upload(d_y, y_ref);
  upload(d_dqkv, dqkv0);
  check_cuda(gpu::attention_backward(d_dqkv.p, d_ws.p, d_dy.p, d_qkv.p, d_y.p, d_lse.p, B, T, C, NH,
                                     nullptr),
             "default bwd");
  compare("attention_backward dqkv (+= random) [default]" + shape, download(d_dqkv), dqkv_ref,
          kGradRtol, kGradAtol);
}

}  // namespace

// argv[1] == "quick": only the shapes with T <= 200 (for runs under compute-sanitizer).
int main(int argc, char** argv) {
  bool quick = false;
  Selection sel;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "quick") {
      quick = true;
    } else if (arg.rfind("only=", 0) == 0 &&
               (arg == "only=simple" || arg == "only=tensor_core" ||
                arg == "only=tensor_core_m64" || arg == "only=tensor_core_w32" ||
                arg == "only=tensor_core_atomic" || arg == "only=default" || arg == "only=cudnn")) {
      sel.only = arg.substr(5);
    } else {
      std::fprintf(stderr,
                   "usage: test_attention [quick] [only=simple|tensor_core|tensor_core_m64|"
                   "tensor_core_w32|tensor_core_atomic|default|cudnn]\n");
      return 2;
    }
  }
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "test_attention: no CUDA device visible: run it on a GPU host\n");
    return 100;
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d, %d SMs)%s%s\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, sel.only.empty() ? "" : ", only ", sel.only.c_str());
  if (!gpu::cudnn_attention_built()) {
    if (sel.only == "cudnn") {
      std::fprintf(stderr,
                   "test_attention: only=cudnn but this build has no cuDNN attention (build "
                   "attention_cudnn.cu with -DTOPOLAUNCH_WITH_CUDNN and libcudnn 9)\n");
      return 1;
    }
    if (sel.only.empty()) std::printf("note cudnn: not built, its checks are left out\n");
    sel.skip_cudnn = true;
  }
  std::mt19937 rng(4321);
  test_shape(rng, sel, 1, 1, 1);     // one token
  test_shape(rng, sel, 1, 64, 1);    // exactly one tile
  test_shape(rng, sel, 2, 100, 2);   // T not a multiple of the tile, B>1, NH>1
  test_shape(rng, sel, 1, 200, 3);   // three tiles and a tail; 128-row forward blocks with a tail
  test_shape(rng, sel, 3, 129, 12);  // GPT-2 width, one row past two tiles
  if (!quick) {
    test_shape(rng, sel, 1, 1024, 12);  // GPT-2 124M sequence
    test_shape(rng, sel, 2, 1024, 2);   // B>1 at T=1024
  }
  if (sel.has("default")) {
    expect(gpu::attention_supported(768, 12), "attention_supported(C=768, NH=12)");
    expect(!gpu::attention_supported(768, 8), "!attention_supported(C=768, NH=8): head size 96");
    expect(gpu::attention_forward(nullptr, nullptr, nullptr, 1, 16, 768, 8, nullptr) ==
               cudaErrorInvalidValue,
           "attention_forward refuses head size 96 (cudaErrorInvalidValue)");
    expect(gpu::attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 16, 768,
                                   8, nullptr) == cudaErrorInvalidValue,
           "attention_backward refuses head size 96 (cudaErrorInvalidValue)");
  }
  check_cuda(cudaDeviceSynchronize(), "final");
  std::printf("%d of %d checks passed\n", g_checks - g_failures, g_checks);
  return g_failures == 0 && g_checks > 0 ? 0 : 1;
}
