// Causal multi-head self-attention that never materialises the (T,T) probabilities in the arena:
// the forward saves only the output and the per-row log-sum-exp; the backward recomputes the
// probabilities row by row (the flash-attention schedule, so the CUDA twin can share the plan).
// qkv is (B,T,3C) with q, k, v at channel offsets 0, C, 2C; head h uses channels [h*hs, (h+1)*hs).
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>

namespace topolaunch::kernels::cpu {

// scratch: (B*NH, T) workspace, one row of scores per (batch, head) task.
template <class F>
void attention_forward(F* y, F* lse, F* scratch, const F* qkv, std::int64_t B, std::int64_t T,
                       std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = C / NH, C3 = 3 * C;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel for collapse(2) schedule(static) if (B * T * T * C >= kParallelMinWork)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      F* s = scratch + (b * NH + h) * T;
      for (std::int64_t t = 0; t < T; ++t) {
        const F* q = qkv + (b * T + t) * C3 + h * hs;
        F maxv = -INFINITY;
        for (std::int64_t j = 0; j <= t; ++j) {
          const F* k = qkv + (b * T + j) * C3 + C + h * hs;
          F dot = 0;
#pragma omp simd reduction(+ : dot)
          for (std::int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          s[j] = dot * scale;
          if (s[j] > maxv) maxv = s[j];
        }
        F sum = 0;
        for (std::int64_t j = 0; j <= t; ++j) {
          s[j] = std::exp(s[j] - maxv);
          sum += s[j];
        }
        const F inv = F(1) / sum;
        F* out = y + (b * T + t) * C + h * hs;
        for (std::int64_t i = 0; i < hs; ++i) out[i] = 0;
        for (std::int64_t j = 0; j <= t; ++j) {
          const F p = s[j] * inv;
          const F* v = qkv + (b * T + j) * C3 + 2 * C + h * hs;
#pragma omp simd
          for (std::int64_t i = 0; i < hs; ++i) out[i] += p * v[i];
        }
        lse[(b * NH + h) * T + t] = maxv + std::log(sum);
      }
    }
  }
}

// dqkv += d(attention)/d(qkv) . dy. Each (batch, head) task owns its slice of dqkv.
template <class F>
void attention_backward(F* dqkv, F* scratch, const F* dy, const F* qkv, const F* y, const F* lse,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = C / NH, C3 = 3 * C;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel for collapse(2) schedule(static) if (B * T * T * C >= kParallelMinWork)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      F* p = scratch + (b * NH + h) * T;
      for (std::int64_t t = 0; t < T; ++t) {
        const F* q = qkv + (b * T + t) * C3 + h * hs;
        const F* dout = dy + (b * T + t) * C + h * hs;
        const F* out = y + (b * T + t) * C + h * hs;
        const F l = lse[(b * NH + h) * T + t];
        F D = 0;
        for (std::int64_t i = 0; i < hs; ++i) D += dout[i] * out[i];
        F* dq = dqkv + (b * T + t) * C3 + h * hs;
        for (std::int64_t j = 0; j <= t; ++j) {
          const F* k = qkv + (b * T + j) * C3 + C + h * hs;
          const F* v = qkv + (b * T + j) * C3 + 2 * C + h * hs;
          F dot = 0, dp = 0;
#pragma omp simd reduction(+ : dot, dp)
          for (std::int64_t i = 0; i < hs; ++i) {
            dot += q[i] * k[i];
            dp += dout[i] * v[i];
          }
          p[j] = std::exp(dot * scale - l);
          const F ds = p[j] * (dp - D) * scale;
          F* dk = dqkv + (b * T + j) * C3 + C + h * hs;
          F* dv = dqkv + (b * T + j) * C3 + 2 * C + h * hs;
#pragma omp simd
          for (std::int64_t i = 0; i < hs; ++i) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
            dv[i] += p[j] * dout[i];
          }
        }
      }
    }
  }
}

}  // namespace topolaunch::kernels::cpu
