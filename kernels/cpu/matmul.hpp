// y (N,OC) = x (N,C) @ w(OC,C)^T + bias, and its backward. Blocked so that each loaded weight row
// serves several input rows, with `omp simd` reductions (vectorised without -ffast-math; the
// summation order is fixed, so results are deterministic for any thread count).
#pragma once

#include "parallel.hpp"

#include <cstdint>

namespace topolaunch::kernels::cpu {

template <class F>
void matmul_forward(F* y, const F* x, const F* w, const F* bias, std::int64_t N, std::int64_t C,
                    std::int64_t OC) {
  constexpr std::int64_t kRows = 4;
  const std::int64_t row_tiles = (N + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (N * C * OC >= kParallelMinWork)
  for (std::int64_t tile = 0; tile < row_tiles; ++tile) {
    const std::int64_t n0 = tile * kRows;
    if (n0 + kRows <= N) {
      const F* x0 = x + n0 * C;
      const F* x1 = x0 + C;
      const F* x2 = x1 + C;
      const F* x3 = x2 + C;
      for (std::int64_t o = 0; o < OC; ++o) {
        const F* wr = w + o * C;
        F s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (std::int64_t c = 0; c < C; ++c) {
          s0 += x0[c] * wr[c];
          s1 += x1[c] * wr[c];
          s2 += x2[c] * wr[c];
          s3 += x3[c] * wr[c];
        }
        const F bo = bias != nullptr ? bias[o] : F(0);
        y[(n0 + 0) * OC + o] = s0 + bo;
        y[(n0 + 1) * OC + o] = s1 + bo;
        y[(n0 + 2) * OC + o] = s2 + bo;
        y[(n0 + 3) * OC + o] = s3 + bo;
      }
    } else {
      for (std::int64_t n = n0; n < N; ++n) {
        const F* xr = x + n * C;
        for (std::int64_t o = 0; o < OC; ++o) {
          const F* wr = w + o * C;
          F s = 0;
#pragma omp simd reduction(+ : s)
          for (std::int64_t c = 0; c < C; ++c) s += xr[c] * wr[c];
          y[n * OC + o] = s + (bias != nullptr ? bias[o] : F(0));
        }
      }
    }
  }
}

// dx += dy @ w; dw += dy^T @ x; dbias += sum_n dy. dx rows and dw rows are owned by one thread
// each (axpy inner loops over C, vectorised).
template <class F>
void matmul_backward(F* dx, F* dw, F* dbias, const F* dy, const F* x, const F* w, std::int64_t N,
                     std::int64_t C, std::int64_t OC) {
#pragma omp parallel for schedule(static) if (N * C * OC >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    F* dxr = dx + n * C;
    const F* dyr = dy + n * OC;
    for (std::int64_t o = 0; o < OC; ++o) {
      const F d = dyr[o];
      const F* wr = w + o * C;
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) dxr[c] += d * wr[c];
    }
  }
#pragma omp parallel for schedule(static) if (N * C * OC >= kParallelMinWork)
  for (std::int64_t o = 0; o < OC; ++o) {
    F* dwr = dw + o * C;
    F db = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const F d = dy[n * OC + o];
      db += d;
      const F* xr = x + n * C;
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) dwr[c] += d * xr[c];
    }
    if (dbias != nullptr) dbias[o] += db;
  }
}

}  // namespace topolaunch::kernels::cpu
