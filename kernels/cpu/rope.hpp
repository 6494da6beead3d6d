// Rotary position embeddings (RoPE, Su et al. 2021; LLaMA's convention): within each head of q
// and k, channel pairs (2i, 2i+1) at position t are rotated by the angle t * theta^(-2i/hs).
// qkv is (B,T,C+2KC) as attention takes it (q at 0, k at C, v at C+KC); v is copied unchanged.
// The angles are computed in double and rounded once, so every float type gets the closest
// cos/sin to the exact rotation.
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace topolaunch::kernels::cpu {

// cos and sin of the rotation of pair i at position t: table[(t * hs/2 + i) * 2 + {0, 1}].
template <class F>
std::vector<F> rope_table(std::int64_t T, std::int64_t hs, double theta) {
  const std::int64_t half = hs / 2;
  std::vector<F> table(static_cast<std::size_t>(T * half * 2));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) *
                           std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
      table[static_cast<std::size_t>((t * half + i) * 2)] = static_cast<F>(std::cos(angle));
      table[static_cast<std::size_t>((t * half + i) * 2 + 1)] = static_cast<F>(std::sin(angle));
    }
  return table;
}

// out = rotate(in) on the q and k heads (direction +1), or the inverse rotation (-1: the
// backward's transpose); v channels pass through. `accumulate`: out += instead of out =.
template <class F>
void rope_apply(F* out, const F* in, std::int64_t B, std::int64_t T, std::int64_t C,
                std::int64_t NH, std::int64_t NKV, double theta, int direction, bool accumulate) {
  const std::int64_t hs = C / NH, half = hs / 2, KC = hs * NKV, W = C + 2 * KC;
  const std::vector<F> table = rope_table<F>(T, hs, theta);
  const F sign = direction > 0 ? F(1) : F(-1);
#pragma omp parallel for collapse(2) schedule(static) if (B * T * W >= kParallelMinWork)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      const F* src = in + (b * T + t) * W;
      F* dst = out + (b * T + t) * W;
      const F* cs = table.data() + t * half * 2;
      // q and k heads are contiguous: NH + NKV heads of hs channels from channel 0.
      for (std::int64_t h = 0; h < NH + NKV; ++h) {
        const F* x = src + h * hs;
        F* y = dst + h * hs;
        for (std::int64_t i = 0; i < half; ++i) {
          const F c = cs[2 * i], s = sign * cs[2 * i + 1];
          const F x0 = x[2 * i], x1 = x[2 * i + 1];
          const F y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
          if (accumulate) {
            y[2 * i] += y0;
            y[2 * i + 1] += y1;
          } else {
            y[2 * i] = y0;
            y[2 * i + 1] = y1;
          }
        }
      }
      for (std::int64_t c = C + KC; c < W; ++c) dst[c] = accumulate ? dst[c] + src[c] : src[c];
    }
  }
}

template <class F>
void rope_forward(F* out, const F* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                  std::int64_t NH, std::int64_t NKV, double theta) {
  rope_apply(out, qkv, B, T, C, NH, NKV, theta, +1, false);
}

// dqkv += R^T dout: the rotation is orthogonal, so its transpose is the rotation by -angle.
template <class F>
void rope_backward(F* dqkv, const F* dout, std::int64_t B, std::int64_t T, std::int64_t C,
                   std::int64_t NH, std::int64_t NKV, double theta) {
  rope_apply(dqkv, dout, B, T, C, NH, NKV, theta, -1, true);
}

}  // namespace topolaunch::kernels::cpu
