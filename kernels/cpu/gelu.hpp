// GELU, tanh approximation (GPT-2): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>

namespace topolaunch::kernels::cpu {

inline constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)

template <class F>
void gelu_forward(F* y, const F* x, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork / 8)
  for (std::int64_t i = 0; i < n; ++i) {
    const F v = x[i];
    const F u = static_cast<F>(kGeluScale) * (v + F(0.044715) * v * v * v);
    y[i] = F(0.5) * v * (F(1) + std::tanh(u));
  }
}

template <class F>
void gelu_backward(F* dx, const F* dy, const F* x, std::int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork / 8)
  for (std::int64_t i = 0; i < n; ++i) {
    const F v = x[i];
    const F u = static_cast<F>(kGeluScale) * (v + F(0.044715) * v * v * v);
    const F th = std::tanh(u);
    const F sech2 = F(1) - th * th;
    const F du = static_cast<F>(kGeluScale) * (F(1) + F(3) * F(0.044715) * v * v);
    dx[i] += dy[i] * (F(0.5) * (F(1) + th) + F(0.5) * v * sech2 * du);
  }
}

}  // namespace topolaunch::kernels::cpu
