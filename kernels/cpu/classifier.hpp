// Softmax + cross-entropy over the first V of Vp logits (padding columns are ignored and get zero
// gradient). The backward recomputes the softmax from the logits and may write dlogits in place.
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>

namespace topolaunch::kernels::cpu {

template <class F>
void crossentropy_forward(F* losses, const F* logits, const std::int32_t* targets, std::int64_t N,
                          std::int64_t V, std::int64_t Vp) {
#pragma omp parallel for schedule(static) if (N * Vp >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* row = logits + n * Vp;
    F maxv = -INFINITY;
    for (std::int64_t i = 0; i < V; ++i) maxv = row[i] > maxv ? row[i] : maxv;
    F sum = 0;
    for (std::int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - maxv);
    losses[n] = maxv + std::log(sum) - row[targets[n]];
  }
}

// dlogits = (softmax - onehot(target)) * scale; `dlogits` may equal `logits`.
template <class F>
void crossentropy_backward(F* dlogits, const F* logits, const std::int32_t* targets, F scale,
                           std::int64_t N, std::int64_t V, std::int64_t Vp) {
#pragma omp parallel for schedule(static) if (N * Vp >= kParallelMinWork)
  for (std::int64_t n = 0; n < N; ++n) {
    const F* row = logits + n * Vp;
    F maxv = -INFINITY;
    for (std::int64_t i = 0; i < V; ++i) maxv = row[i] > maxv ? row[i] : maxv;
    F sum = 0;
    for (std::int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - maxv);
    const F inv = F(1) / sum;
    const std::int64_t target = targets[n];
    F* drow = dlogits + n * Vp;
    for (std::int64_t i = 0; i < V; ++i) {
      const F p = std::exp(row[i] - maxv) * inv;
      drow[i] = (p - (i == target ? F(1) : F(0))) * scale;
    }
    for (std::int64_t i = V; i < Vp; ++i) drow[i] = 0;
  }
}

}  // namespace topolaunch::kernels::cpu
