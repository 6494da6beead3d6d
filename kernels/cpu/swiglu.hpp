// SwiGLU (Shazeer 2020, LLaMA's MLP): h = silu(g) * u, silu(g) = g * sigmoid(g), where each row of
// gu (N, 2H) holds the gate g in its first H channels and u in its last H (the two projections as
// one GEMM).
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>

namespace topolaunch::kernels::cpu {

template <class F>
void swiglu_forward(F* h, const F* gu, std::int64_t N, std::int64_t H) {
#pragma omp parallel for schedule(static) if (N * H >= kParallelMinWork / 8)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* g = gu + n * 2 * H;
    const F* u = g + H;
    F* y = h + n * H;
    for (std::int64_t i = 0; i < H; ++i) {
      const F sig = F(1) / (F(1) + std::exp(-g[i]));
      y[i] = g[i] * sig * u[i];
    }
  }
}

// dg += dh * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))); du += dh * silu(g).
template <class F>
void swiglu_backward(F* dgu, const F* dh, const F* gu, std::int64_t N, std::int64_t H) {
#pragma omp parallel for schedule(static) if (N * H >= kParallelMinWork / 8)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* g = gu + n * 2 * H;
    const F* u = g + H;
    const F* d = dh + n * H;
    F* dg = dgu + n * 2 * H;
    F* du = dg + H;
    for (std::int64_t i = 0; i < H; ++i) {
      const F sig = F(1) / (F(1) + std::exp(-g[i]));
      const F silu = g[i] * sig;
      dg[i] += d[i] * u[i] * sig * (F(1) + g[i] * (F(1) - sig));
      du[i] += d[i] * silu;
    }
  }
}

}  // namespace topolaunch::kernels::cpu
