// LayerNorm (eps 1e-5, as GPT-2) and the fused residual-add + LayerNorm. CPU reference.
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>

namespace topolaunch::kernels::cpu {

inline constexpr double kLayerNormEpsilon = 1e-5;

// y (N,C) = (x - mean) * rstd * w + b; mean, rstd (N) are saved for the backward.
template <class F>
void layernorm_forward(F* y, F* mean, F* rstd, const F* x, const F* w, const F* b, std::int64_t N,
                       std::int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* xr = x + n * C;
    F m = 0;
    for (std::int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<F>(C);
    F var = 0;
    for (std::int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= static_cast<F>(C);
    const F s = F(1) / std::sqrt(var + static_cast<F>(kLayerNormEpsilon));
    F* yr = y + n * C;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

// s = a + b1; y = layernorm(s). One pass over memory instead of two (llm.c fused_residual_forward).
template <class F>
void residual_layernorm_forward(F* s, F* y, F* mean, F* rstd, const F* a, const F* b1, const F* w,
                                const F* b, std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    F* sr = s + n * C;
    const F* ar = a + n * C;
    const F* br = b1 + n * C;
    for (std::int64_t c = 0; c < C; ++c) sr[c] = ar[c] + br[c];
    F m = 0;
    for (std::int64_t c = 0; c < C; ++c) m += sr[c];
    m /= static_cast<F>(C);
    F var = 0;
    for (std::int64_t c = 0; c < C; ++c) var += (sr[c] - m) * (sr[c] - m);
    var /= static_cast<F>(C);
    const F r = F(1) / std::sqrt(var + static_cast<F>(kLayerNormEpsilon));
    F* yr = y + n * C;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = (sr[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

// dx += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * w;
// dw += sum_n dy * norm; db += sum_n dy. The weight gradients are reduced by channel slices, so
// the result does not depend on the thread count.
template <class F>
void layernorm_backward(F* dx, F* dw, F* db, const F* dy, const F* x, const F* w, const F* mean,
                        const F* rstd, std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* dyr = dy + n * C;
    const F* xr = x + n * C;
    const F m = mean[n], s = rstd[n];
    F dnorm_mean = 0, dnorm_norm_mean = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const F norm = (xr[c] - m) * s;
      const F dnorm = w[c] * dyr[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<F>(C);
    dnorm_norm_mean /= static_cast<F>(C);
    F* dxr = dx + n * C;
    for (std::int64_t c = 0; c < C; ++c) {
      const F norm = (xr[c] - m) * s;
      const F dnorm = w[c] * dyr[c];
      dxr[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  constexpr std::int64_t kSlice = 16;
  const std::int64_t slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t sl = 0; sl < slices; ++sl) {
    const std::int64_t c0 = sl * kSlice, c1 = c0 + kSlice < C ? c0 + kSlice : C;
    F accw[kSlice] = {}, accb[kSlice] = {};
    for (std::int64_t n = 0; n < N; ++n) {
      const F* dyr = dy + n * C;
      const F* xr = x + n * C;
      for (std::int64_t c = c0; c < c1; ++c) {
        accw[c - c0] += dyr[c] * (xr[c] - mean[n]) * rstd[n];
        accb[c - c0] += dyr[c];
      }
    }
    for (std::int64_t c = c0; c < c1; ++c) {
      dw[c] += accw[c - c0];
      db[c] += accb[c - c0];
    }
  }
}

}  // namespace topolaunch::kernels::cpu
