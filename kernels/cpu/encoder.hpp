// Token + position embedding. CPU reference, templated on the float type (float for training,
// double for finite-difference gradient checks).
#pragma once

#include "parallel.hpp"

#include <cstdint>

namespace topolaunch::kernels::cpu {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; wpe may be null (no learned positions, e.g. the MLP).
template <class F>
void encoder_forward(F* out, const std::int32_t* tokens, const F* wte, const F* wpe, std::int64_t B,
                     std::int64_t T, std::int64_t C) {
#pragma omp parallel for collapse(2) schedule(static) if (B * T * C >= kParallelMinWork)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      F* o = out + (b * T + t) * C;
      const F* e = wte + static_cast<std::int64_t>(tokens[b * T + t]) * C;
      if (wpe != nullptr) {
        const F* p = wpe + t * C;
        for (std::int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else {
        for (std::int64_t c = 0; c < C; ++c) o[c] = e[c];
      }
    }
  }
}

// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t]. Threads own channel slices, so the
// scatter has no races and the summation order is fixed (deterministic for any thread count).
template <class F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const std::int32_t* tokens, std::int64_t B,
                      std::int64_t T, std::int64_t C) {
  constexpr std::int64_t kSlice = 16;
  const std::int64_t slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static) if (B * T * C >= kParallelMinWork)
  for (std::int64_t s = 0; s < slices; ++s) {
    const std::int64_t c0 = s * kSlice, c1 = c0 + kSlice < C ? c0 + kSlice : C;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t t = 0; t < T; ++t) {
        const F* d = dout + (b * T + t) * C;
        F* e = dwte + static_cast<std::int64_t>(tokens[b * T + t]) * C;
        for (std::int64_t c = c0; c < c1; ++c) e[c] += d[c];
        if (dwpe != nullptr) {
          F* p = dwpe + t * C;
          for (std::int64_t c = c0; c < c1; ++c) p[c] += d[c];
        }
      }
    }
  }
}

}  // namespace topolaunch::kernels::cpu
