// Causal multi-head self-attention that never materialises the (T,T) probabilities in the arena:
// the forward saves only the output and the per-row log-sum-exp; the backward recomputes the
// probabilities row by row (the flash-attention schedule, so the CUDA twin can share the plan).
// qkv is (B,T,C+2KC) with q, k, v at channel offsets 0, C, C+KC; query head h uses channels
// [h*hs, (h+1)*hs) of q and key/value head h / (NH/NKV) of k and v (grouped-query attention;
// NKV = NH, KC = C is multi-head attention as GPT-2 has it, qkv (B,T,3C)).
#pragma once

#include "parallel.hpp"

#include <cmath>
#include <cstdint>

namespace topolaunch::kernels::cpu {

// scratch: (B*NH, T) workspace, one row of scores per (batch, head) task. NKV = 0: NH.
template <class F>
void attention_forward(F* y, F* lse, F* scratch, const F* qkv, std::int64_t B, std::int64_t T,
                       std::int64_t C, std::int64_t NH, std::int64_t NKV = 0) {
  if (NKV <= 0) NKV = NH;
  const std::int64_t hs = C / NH, KC = hs * NKV, W = C + 2 * KC, group = NH / NKV;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel for collapse(2) schedule(static) if (B * T * T * C >= kParallelMinWork)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      F* s = scratch + (b * NH + h) * T;
      const std::int64_t kh = h / group;
      for (std::int64_t t = 0; t < T; ++t) {
        const F* q = qkv + (b * T + t) * W + h * hs;
        F maxv = -INFINITY;
        for (std::int64_t j = 0; j <= t; ++j) {
          const F* k = qkv + (b * T + j) * W + C + kh * hs;
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
          const F* v = qkv + (b * T + j) * W + C + KC + kh * hs;
#pragma omp simd
          for (std::int64_t i = 0; i < hs; ++i) out[i] += p * v[i];
        }
        lse[(b * NH + h) * T + t] = maxv + std::log(sum);
      }
    }
  }
}

// dqkv += d(attention)/d(qkv) . dy. Each (batch, key/value head) task owns its slice of dqkv: the
// dq of its group's query heads and the dk, dv its group's heads add into, in head order (so the
// result does not depend on the thread count).
template <class F>
void attention_backward(F* dqkv, F* scratch, const F* dy, const F* qkv, const F* y, const F* lse,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                        std::int64_t NKV = 0) {
  if (NKV <= 0) NKV = NH;
  const std::int64_t hs = C / NH, KC = hs * NKV, W = C + 2 * KC, group = NH / NKV;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
#pragma omp parallel for collapse(2) schedule(static) if (B * T * T * C >= kParallelMinWork)
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t kh = 0; kh < NKV; ++kh) {
      for (std::int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        F* p = scratch + (b * NH + h) * T;
        for (std::int64_t t = 0; t < T; ++t) {
          const F* q = qkv + (b * T + t) * W + h * hs;
          const F* dout = dy + (b * T + t) * C + h * hs;
          const F* out = y + (b * T + t) * C + h * hs;
          const F l = lse[(b * NH + h) * T + t];
          F D = 0;
          for (std::int64_t i = 0; i < hs; ++i) D += dout[i] * out[i];
          F* dq = dqkv + (b * T + t) * W + h * hs;
          for (std::int64_t j = 0; j <= t; ++j) {
            const F* k = qkv + (b * T + j) * W + C + kh * hs;
            const F* v = qkv + (b * T + j) * W + C + KC + kh * hs;
            F dot = 0, dp = 0;
#pragma omp simd reduction(+ : dot, dp)
            for (std::int64_t i = 0; i < hs; ++i) {
              dot += q[i] * k[i];
              dp += dout[i] * v[i];
            }
            p[j] = std::exp(dot * scale - l);
            const F ds = p[j] * (dp - D) * scale;
            F* dk = dqkv + (b * T + j) * W + C + kh * hs;
            F* dv = dqkv + (b * T + j) * W + C + KC + kh * hs;
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
}

// Decoding with a KV cache: the attention of one new position `t` (its q, and its k and v already
// written at row t of the caches) over rows 0..t of k_cache and v_cache (rows of C channels, head
// h at [h*hs, (h+1)*hs)). y (C): the output of every head. scores: t + 1 floats. The same sums in
// the same order as attention_forward's row t.
template <class F>
void attention_cached_forward(F* y, F* scores, const F* q, const F* k_cache, const F* v_cache,
                              std::int64_t t, std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = C / NH;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  for (std::int64_t h = 0; h < NH; ++h) {
    const F* qh = q + h * hs;
    F maxv = -INFINITY;
    for (std::int64_t j = 0; j <= t; ++j) {
      const F* k = k_cache + j * C + h * hs;
      F dot = 0;
#pragma omp simd reduction(+ : dot)
      for (std::int64_t i = 0; i < hs; ++i) dot += qh[i] * k[i];
      scores[j] = dot * scale;
      if (scores[j] > maxv) maxv = scores[j];
    }
    F sum = 0;
    for (std::int64_t j = 0; j <= t; ++j) {
      scores[j] = std::exp(scores[j] - maxv);
      sum += scores[j];
    }
    const F inv = F(1) / sum;
    F* out = y + h * hs;
    for (std::int64_t i = 0; i < hs; ++i) out[i] = 0;
    for (std::int64_t j = 0; j <= t; ++j) {
      const F p = scores[j] * inv;
      const F* v = v_cache + j * C + h * hs;
#pragma omp simd
      for (std::int64_t i = 0; i < hs; ++i) out[i] += p * v[i];
    }
  }
}

}  // namespace topolaunch::kernels::cpu
