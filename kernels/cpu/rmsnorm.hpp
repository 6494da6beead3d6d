// RMSNorm (LLaMA; eps 1e-5) and the fused residual-add + RMSNorm. CPU reference.
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>

namespace topolaunch::kernels::cpu {

inline constexpr double kRmsNormEpsilon = 1e-5;

// y (N,C) = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); rstd (N) is saved for the backward.
template <class F>
void rmsnorm_forward(F* y, F* rstd, const F* x, const F* w, std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* xr = x + n * C;
    F ss = 0;
    for (std::int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const F r = F(1) / std::sqrt(ss / static_cast<F>(C) + static_cast<F>(kRmsNormEpsilon));
    F* yr = y + n * C;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
    rstd[n] = r;
  }
}

// s = a + b; y = rmsnorm(s): one pass over memory instead of two.
template <class F>
void residual_rmsnorm_forward(F* s, F* y, F* rstd, const F* a, const F* b, const F* w,
                              std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    F* sr = s + n * C;
    const F* ar = a + n * C;
    const F* br = b + n * C;
    F ss = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      sr[c] = ar[c] + br[c];
      ss += sr[c] * sr[c];
    }
    const F r = F(1) / std::sqrt(ss / static_cast<F>(C) + static_cast<F>(kRmsNormEpsilon));
    F* yr = y + n * C;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = sr[c] * r * w[c];
    rstd[n] = r;
  }
}

// dx += rstd * (dnorm - x * rstd^2 * mean(dnorm * x)), dnorm = dy * w; dw += sum_n dy * x * rstd.
// The weight gradient is reduced by channel slices, so the result does not depend on the thread
// count.
template <class F>
void rmsnorm_backward(F* dx, F* dw, const F* dy, const F* x, const F* w, const F* rstd,
                      std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* dyr = dy + n * C;
    const F* xr = x + n * C;
    const F r = rstd[n];
    F dot = 0;
    for (std::int64_t c = 0; c < C; ++c) dot += w[c] * dyr[c] * xr[c];
    const F k = dot / static_cast<F>(C) * r * r;
    F* dxr = dx + n * C;
    for (std::int64_t c = 0; c < C; ++c) dxr[c] += (w[c] * dyr[c] - xr[c] * k) * r;
  }
  constexpr std::int64_t kSlice = 16;
  const std::int64_t slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinWork)
  for (std::int64_t sl = 0; sl < slices; ++sl) {
    const std::int64_t c0 = sl * kSlice, c1 = c0 + kSlice < C ? c0 + kSlice : C;
    F acc[kSlice] = {};
    for (std::int64_t n = 0; n < N; ++n) {
      const F* dyr = dy + n * C;
      const F* xr = x + n * C;
      for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += dyr[c] * xr[c] * rstd[n];
    }
    for (std::int64_t c = c0; c < c1; ++c) dw[c] += acc[c - c0];
  }
}

}  // namespace topolaunch::kernels::cpu
