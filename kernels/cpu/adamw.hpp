// Global gradient norm (for clipping) and AdamW (decoupled weight decay, applied to matrices only).
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace topolaunch::kernels::cpu {

// Sum of squares in fixed-size chunks summed in order: deterministic for any thread count.
template <class F>
double sum_of_squares(const F* g, std::int64_t n) {
  constexpr std::int64_t kChunk = 1 << 14;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (std::int64_t k = 0; k < chunks; ++k) {
    const std::int64_t i0 = k * kChunk, i1 = i0 + kChunk < n ? i0 + kChunk : n;
    double s = 0;
    for (std::int64_t i = i0; i < i1; ++i)
      s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    partial[static_cast<std::size_t>(k)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

struct AdamWScalars {
  double learning_rate, beta1, beta2, epsilon, weight_decay;
  double step;        // 1-based
  double clip_scale;  // multiplies the gradient (global-norm clipping)
};

template <class F>
void adamw_update(F* param, F* m, F* v, const F* grad, std::int64_t n, const AdamWScalars& s,
                  bool decayed) {
  const F b1 = static_cast<F>(s.beta1), b2 = static_cast<F>(s.beta2);
  const F c1 = static_cast<F>(1.0 - std::pow(s.beta1, s.step));
  const F c2 = static_cast<F>(1.0 - std::pow(s.beta2, s.step));
  const F lr = static_cast<F>(s.learning_rate), eps = static_cast<F>(s.epsilon);
  const F wd = decayed ? static_cast<F>(s.weight_decay) : F(0);
  const F clip = static_cast<F>(s.clip_scale);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinWork)
  for (std::int64_t i = 0; i < n; ++i) {
    const F g = grad[i] * clip;
    m[i] = b1 * m[i] + (F(1) - b1) * g;
    v[i] = b2 * v[i] + (F(1) - b2) * g * g;
    const F mhat = m[i] / c1, vhat = v[i] / c2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
  }
}

}  // namespace topolaunch::kernels::cpu
