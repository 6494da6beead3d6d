// Residual add: y = a + b, and its backward (the gradient fans out to both branches).
#pragma once

#include "parallel.hpp"

#include <cstdint>

namespace topolaunch::kernels::cpu {

template <class F>
void residual_forward(F* y, const F* a, const F* b, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinWork)
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <class F>
void residual_backward(F* da, F* db, const F* dy, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinWork)
  for (std::int64_t i = 0; i < n; ++i) {
    da[i] += dy[i];
    db[i] += dy[i];
  }
}

}  // namespace topolaunch::kernels::cpu
