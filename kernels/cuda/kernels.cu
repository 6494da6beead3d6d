// The CUDA kernels of cuda_kernels.cuh. Memory-bound kernels: one warp per row for the row-wise
// ops (C = 768 is 24 values per lane, held in registers between the passes), 16-byte vector
// accesses wherever sizes and alignment allow (the scalar kernels remain for the rest), fp32
// arithmetic throughout. The classifier reads each row of logits once (staged through shared
// memory by a persistent grid, see crossentropy_staged_kernel).
#include "cuda_kernels.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "topolaunch/kernels/graph.hpp"

namespace topolaunch::kernels::cuda {
namespace {

constexpr float kLayerNormEpsilon = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr int kWarp = 32;
constexpr std::int64_t kMaxLayerNormChannels = 1600;  // GPT-2 1558M

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

unsigned blocks_for(std::int64_t work, int per_block) {
  const std::int64_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// 8 bf16 = 16 bytes.
struct alignas(16) Pack8 {
  bf16 v[8];
};
bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// ---- encoder -------------------------------------------------------------------------------
__global__ void encoder_forward_kernel(bf16* out, const std::int32_t* tokens, const bf16* wte,
                                       const bf16* wpe, std::int64_t BT, std::int64_t T,
                                       std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= BT * C) return;
  const std::int64_t row = i / C, c = i % C, t = row % T;
  float v = __bfloat162float(wte[static_cast<std::int64_t>(tokens[row]) * C + c]);
  if (wpe != nullptr) v += __bfloat162float(wpe[t * C + c]);
  out[i] = __float2bfloat16(v);
}

__global__ void encoder_backward_kernel(float* dwte, float* dwpe, const bf16* dout,
                                        const std::int32_t* tokens, std::int64_t BT, std::int64_t T,
                                        std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= BT * C) return;
  const std::int64_t row = i / C, c = i % C, t = row % T;
  const float d = __bfloat162float(dout[i]);
  atomicAdd(&dwte[static_cast<std::int64_t>(tokens[row]) * C + c], d);
  if (dwpe != nullptr) atomicAdd(&dwpe[t * C + c], d);
}

// ---- layernorm -----------------------------------------------------------------------------
// One warp per row; each lane keeps its kPerLane values in registers between the passes (the
// host picks the smallest instantiation with kPerLane * 32 >= C; C up to kMaxLayerNormChannels).
template <bool kResidual, int kPerLane>
__global__ void layernorm_forward_kernel(bf16* s, bf16* y, float* mean, float* rstd, const bf16* a,
                                         const bf16* b1, const bf16* w, const bf16* b,
                                         std::int64_t N, int C) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t row =
      blockIdx.x * static_cast<std::int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= N) return;
  const bf16* ar = a + row * C;
  const bf16* br = kResidual ? b1 + row * C : nullptr;
  float vals[kPerLane];
  float sum = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + k * kWarp;
    float v = 0;
    if (c < C) {
      v = __bfloat162float(ar[c]);
      if constexpr (kResidual) {
        // s is stored in bf16 and normalised as stored (what the backward will read back)
        const bf16 sv = __float2bfloat16(v + __bfloat162float(br[c]));
        s[row * C + c] = sv;
        v = __bfloat162float(sv);
      }
    }
    vals[k] = v;
    sum += v;
  }
  const float m = warp_sum(sum) / static_cast<float>(C);
  float var = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + k * kWarp;
    if (c < C) var += (vals[k] - m) * (vals[k] - m);
  }
  var = warp_sum(var) / static_cast<float>(C);
  const float r = rsqrtf(var + kLayerNormEpsilon);
  bf16* yr = y + row * C;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + k * kWarp;
    if (c < C)
      yr[c] = __float2bfloat16((vals[k] - m) * r * __bfloat162float(w[c]) + __bfloat162float(b[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// Block: 8 warps, a grid-stride loop over rows (warp per row). Each lane accumulates dw/db of
// its channels in registers over all its rows; then one shared-memory add per channel per warp
// and one global atomicAdd per channel per block.
template <int kPerLane>
__global__ void layernorm_backward_kernel(bf16* dx, float* dw, float* db, const bf16* dy,
                                          const bf16* x, const bf16* w, const float* mean,
                                          const float* rstd, std::int64_t N, int C) {
  extern __shared__ float shared[];
  float* sdw = shared;
  float* sdb = shared + C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sdw[c] = sdb[c] = 0;
  __syncthreads();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  float accw[kPerLane], accb[kPerLane], wv[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + k * kWarp;
    accw[k] = accb[k] = 0;
    wv[k] = c < C ? __bfloat162float(w[c]) : 0.0f;
  }
  for (std::int64_t row = blockIdx.x * static_cast<std::int64_t>(warps) + warp; row < N;
       row += static_cast<std::int64_t>(gridDim.x) * warps) {
    const bf16* dyr = dy + row * C;
    const bf16* xr = x + row * C;
    const float m = mean[row], s = rstd[row];
    float norm[kPerLane], d[kPerLane];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int c = lane + k * kWarp;
      norm[k] = c < C ? (__bfloat162float(xr[c]) - m) * s : 0.0f;
      d[k] = c < C ? __bfloat162float(dyr[c]) : 0.0f;
      const float dnorm = wv[k] * d[k];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm[k];
      accw[k] += d[k] * norm[k];
      accb[k] += d[k];
    }
    dnorm_mean = warp_sum(dnorm_mean) / static_cast<float>(C);
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / static_cast<float>(C);
    bf16* dxr = dx + row * C;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int c = lane + k * kWarp;
      if (c < C) {
        const float g = (wv[k] * d[k] - dnorm_mean - norm[k] * dnorm_norm_mean) * s;
        dxr[c] = __float2bfloat16(__bfloat162float(dxr[c]) + g);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + k * kWarp;
    if (c < C) {
      atomicAdd(&sdw[c], accw[k]);
      atomicAdd(&sdb[c], accb[k]);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    atomicAdd(&dw[c], sdw[c]);
    atomicAdd(&db[c], sdb[c]);
  }
}

// Calls launch.template operator()<kPerLane>() with the smallest instantiation that holds C.
template <class Launch>
cudaError_t dispatch_per_lane(std::int64_t C, Launch&& launch) {
  if (C <= 4 * kWarp) return launch.template operator()<4>();
  if (C <= 8 * kWarp) return launch.template operator()<8>();
  if (C <= 16 * kWarp) return launch.template operator()<16>();
  if (C <= 24 * kWarp) return launch.template operator()<24>();
  if (C <= 32 * kWarp) return launch.template operator()<32>();
  if (C <= 50 * kWarp) return launch.template operator()<50>();  // GPT-2 1558M: C = 1600
  return cudaErrorInvalidValue;
}

// ---- elementwise ---------------------------------------------------------------------------
__device__ __forceinline__ float gelu(float v) {
  const float u = kGeluScale * (v + 0.044715f * v * v * v);
  return 0.5f * v * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float v) {
  const float u = kGeluScale * (v + 0.044715f * v * v * v);
  const float th = tanhf(u);
  const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
  return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
}

// Vectorised elementwise kernels: each thread handles one Pack8 (n % 8 == 0 and 16-byte aligned
// pointers), else the scalar kernel below.
template <class Fn>
__global__ void elementwise8_kernel(std::int64_t n8, Fn fn) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n8) fn(i);
}

__global__ void gelu_forward_kernel(bf16* y, const bf16* x, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(gelu(__bfloat162float(x[i])));
}
__global__ void gelu_backward_kernel(bf16* dx, const bf16* dy, const bf16* x, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    dx[i] = __float2bfloat16(__bfloat162float(dx[i]) +
                             __bfloat162float(dy[i]) * gelu_grad(__bfloat162float(x[i])));
}
__global__ void residual_forward_kernel(bf16* y, const bf16* a, const bf16* b, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}
__global__ void residual_backward_kernel(bf16* da, bf16* db, const bf16* dy, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float d = __bfloat162float(dy[i]);
    da[i] = __float2bfloat16(__bfloat162float(da[i]) + d);
    db[i] = __float2bfloat16(__bfloat162float(db[i]) + d);
  }
}

// ---- classifier ----------------------------------------------------------------------------
constexpr int kClassifierThreads = 1024;

// Block-wide online softmax statistics of one row: max and sum of exp(v - max).
__device__ void row_softmax_stats(const bf16* row, std::int64_t V, float& max_out, float& sum_out) {
  __shared__ float smax[kClassifierThreads / kWarp], ssum[kClassifierThreads / kWarp];
  float m = -INFINITY, s = 0;
  for (std::int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = __bfloat162float(row[i]);
    if (v > m) {
      s = s * __expf(m - v) + 1.0f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  // combine (m, s) pairs across the warp, then across warps
  const float wm = warp_max(m);
  s = (m == -INFINITY) ? 0.0f : s * __expf(m - wm);
  s = warp_sum(s);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    smax[warp] = wm;
    ssum[warp] = s;
  }
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  float bm = -INFINITY;
  for (int k = 0; k < warps; ++k) bm = fmaxf(bm, smax[k]);
  float bs = 0;
  for (int k = 0; k < warps; ++k)
    bs += (smax[k] == -INFINITY) ? 0.0f : ssum[k] * __expf(smax[k] - bm);
  max_out = bm;
  sum_out = bs;
  __syncthreads();  // smax/ssum may be reused by the caller's next row
}

template <bool kForward, bool kBackward>
__global__ void crossentropy_kernel(float* losses, bf16* dlogits, const bf16* logits,
                                    const std::int32_t* targets, const float* scale, std::int64_t V,
                                    std::int64_t Vp) {
  const std::int64_t n = blockIdx.x;
  const bf16* row = logits + n * Vp;
  float m, s;
  row_softmax_stats(row, V, m, s);
  const std::int32_t target = targets[n];
  if (kForward && threadIdx.x == 0) losses[n] = m + logf(s) - __bfloat162float(row[target]);
  if constexpr (kBackward) {
    // every thread has read the row (the stats call ends with a barrier), so writing in place
    // is safe
    const float inv = 1.0f / s, sc = *scale;
    bf16* drow = dlogits + n * Vp;
    for (std::int64_t i = threadIdx.x; i < Vp; i += blockDim.x) {
      float g = 0;
      if (i < V)
        g = (__expf(__bfloat162float(row[i]) - m) * inv - (i == target ? 1.0f : 0.0f)) * sc;
      drow[i] = __float2bfloat16(g);
    }
  }
}

// ---- optimizer -----------------------------------------------------------------------------
__global__ void sum_of_squares_kernel(float* out, const float* g, std::int64_t n) {
  float acc = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    acc += g[i] * g[i];
  acc = warp_sum(acc);
  if (threadIdx.x % kWarp == 0) atomicAdd(out, acc);
}
__global__ void sqrt_kernel(float* x) { *x = sqrtf(*x); }

// One AdamW element (every AdamW kernel goes through it, so the per-tensor, vector and
// multi-tensor kernels give bit-identical results).
__device__ __forceinline__ float adamw_one(float& p, float& mi, float& vi, float g, float b1,
                                           float b2, float c1, float c2, float lr, float eps,
                                           float wd) {
  mi = b1 * mi + (1.0f - b1) * g;
  vi = b2 * vi + (1.0f - b2) * g * g;
  p = p - lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * p);
  return p;
}

__global__ void adamw_kernel(float* param, bf16* param_bf16, float* m, float* v, const float* grad,
                             std::int64_t n, const float* sc, const float* grad_norm,
                             bool decayed) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float b1 = sc[kBeta1], b2 = sc[kBeta2], step = sc[kStep];
  const float clip = sc[kGradClip], norm = *grad_norm;
  const float clip_scale = clip > 0 && norm > clip ? clip / norm : 1.0f;
  const float c1 = 1.0f - powf(b1, step), c2 = 1.0f - powf(b2, step);
  const float wd = decayed ? sc[kWeightDecay] : 0.0f;
  float p = param[i], mi = m[i], vi = v[i];
  adamw_one(p, mi, vi, grad[i] * clip_scale, b1, b2, c1, c2, sc[kLearningRate], sc[kEpsilon], wd);
  m[i] = mi;
  v[i] = vi;
  param[i] = p;
  if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16(p);
}

__global__ void to_bf16_kernel(bf16* out, const float* in, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(in[i]);
}

// Column sums of dy (N,OC): block (32 x 8) covers 32 columns; each of the 8 row-groups strides
// over rows, partials combined in shared memory, one atomicAdd per column per block.
__global__ void bias_backward_kernel(float* dbias, const bf16* dy, std::int64_t N, std::int64_t OC,
                                     std::int64_t rows_per_block) {
  __shared__ float part[8][kWarp + 1];
  const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(kWarp) + threadIdx.x;
  const std::int64_t r0 = blockIdx.y * rows_per_block;
  const std::int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc = 0;
  if (col < OC)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += 8)
      acc += __bfloat162float(dy[r * OC + col]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float s = 0;
    for (int k = 0; k < 8; ++k) s += part[k][threadIdx.x];
    atomicAdd(&dbias[col], s);
  }
}

// dbias += part (the fused bias gradient, written by cuBLASLt's BGRADB epilogue).
__global__ void bias_grad_add_kernel(float* dbias, const float* part, std::int64_t OC) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < OC) dbias[i] += part[i];
}

// ---- 16-byte vectorised kernels ------------------------------------------------------------
// The paths below need 16-byte aligned pointers and sizes in whole 16-byte packs; the host
// functions check that and otherwise take the scalar kernels above (same results).

__device__ __forceinline__ Pack8 load8(const bf16* p) { return *reinterpret_cast<const Pack8*>(p); }
// Streaming load (read once: evict first), for data no later kernel reads from L2.
__device__ __forceinline__ Pack8 load8_stream(const bf16* p) {
  const int4 v = __ldcs(reinterpret_cast<const int4*>(p));
  Pack8 r;
  memcpy(&r, &v, sizeof r);
  return r;
}
__device__ __forceinline__ void store8(bf16* p, const Pack8& v) {
  *reinterpret_cast<Pack8*>(p) = v;
}

// LayerNorm forward, one warp per row, lane l holds 16-byte packs l, l+32, ... of the row.
template <bool kResidual, int kPacks>
__global__ void __launch_bounds__(256)
    layernorm_forward_vec_kernel(bf16* s, bf16* y, float* mean, float* rstd, const bf16* a,
                                 const bf16* b1, const bf16* w, const bf16* b, std::int64_t N,
                                 int C) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t row =
      blockIdx.x * static_cast<std::int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= N) return;
  const int packs = C / 8;
  Pack8 in[kPacks], res[kPacks];
  // all loads first: kPacks (x2 with the residual) 16-byte loads in flight per lane
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarp;
    if (p < packs) {
      in[k] = load8(a + row * C + p * 8);
      if constexpr (kResidual) res[k] = load8(b1 + row * C + p * 8);
    }
  }
  float vals[kPacks][8];
  float sum = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarp;
#pragma unroll
    for (int j = 0; j < 8; ++j) vals[k][j] = 0;
    if (p < packs) {
      if constexpr (kResidual) {
        // s is stored in bf16 and normalised as stored (what the backward will read back)
        Pack8 sv;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          sv.v[j] = __float2bfloat16(__bfloat162float(in[k].v[j]) + __bfloat162float(res[k].v[j]));
        store8(s + row * C + p * 8, sv);
        in[k] = sv;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        vals[k][j] = __bfloat162float(in[k].v[j]);
        sum += vals[k][j];
      }
    }
  }
  const float m = warp_sum(sum) / static_cast<float>(C);
  float var = 0;
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
    if (lane + k * kWarp < packs)
#pragma unroll
      for (int j = 0; j < 8; ++j) var += (vals[k][j] - m) * (vals[k][j] - m);
  var = warp_sum(var) / static_cast<float>(C);
  const float r = rsqrtf(var + kLayerNormEpsilon);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarp;
    if (p < packs) {
      const Pack8 wp = load8(w + p * 8), bp = load8(b + p * 8);
      Pack8 out;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        out.v[j] = __float2bfloat16((vals[k][j] - m) * r * __bfloat162float(wp.v[j]) +
                                    __bfloat162float(bp.v[j]));
      store8(y + row * C + p * 8, out);
    }
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// LayerNorm backward, one warp per row (grid-stride over rows), 16-byte loads of dy, x, w and
// the dx being accumulated, all issued before the row's reductions. A lane always holds the same
// channels, so it sums their dw/db over all its rows in its warp's own shared-memory area (not in
// registers: that would halve the warps per SM), laid out [pack-of-lane k][half h][lane] in
// float4s so that a warp's 16-byte accesses hit distinct banks. At the end the block adds its
// warps' areas and then dw/db with 16-byte fp32 atomics (sm_90), one per 4 channels per block.
constexpr int kLayerNormBackwardThreads = 256;
template <int kPacks>
constexpr std::size_t layernorm_backward_smem_bytes() {
  return std::size_t{kLayerNormBackwardThreads / kWarp} * 2 * kPacks * 2 * kWarp * sizeof(float4);
}
template <int kPacks>
__global__ void __launch_bounds__(kLayerNormBackwardThreads, kPacks <= 3 ? 2 : 1)
    layernorm_backward_vec_kernel(bf16* dx, float* dw, float* db, const bf16* dy, const bf16* x,
                                  const bf16* w, const float* mean, const float* rstd,
                                  std::int64_t N, int C) {
  extern __shared__ float4 shared4[];
  constexpr int kArea = 2 * kPacks * kWarp;  // float4s of one of dw/db for one warp
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  float4* accw = shared4 + warp * 2 * kArea;  // this warp's dw area, then its db area
  float4* accb = accw + kArea;
  for (int q = lane; q < 2 * kArea; q += kWarp) accw[q] = make_float4(0, 0, 0, 0);
  __syncwarp();
  const int packs = C / 8;
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t row = blockIdx.x * static_cast<std::int64_t>(warps) + warp; row < N;
       row += static_cast<std::int64_t>(gridDim.x) * warps) {
    Pack8 dyp[kPacks], xp[kPacks], dxp[kPacks], wp[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = lane + k * kWarp;
      if (p < packs) {
        wp[k] = load8(w + p * 8);  // L1 hits after the first row
        dyp[k] = load8_stream(dy + row * C + p * 8);
        xp[k] = load8_stream(x + row * C + p * 8);
        dxp[k] = load8(dx + row * C + p * 8);
      }
    }
    const float m = mean[row], s = rstd[row];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (lane + k * kWarp < packs) {
        float aw[8], ab[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float norm = (__bfloat162float(xp[k].v[j]) - m) * s;
          const float d = __bfloat162float(dyp[k].v[j]);
          const float dnorm = __bfloat162float(wp[k].v[j]) * d;
          dnorm_mean += dnorm;
          dnorm_norm_mean += dnorm * norm;
          aw[j] = d * norm;
          ab[j] = d;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = (k * 2 + h) * kWarp + lane;
          float4 cw = accw[q], cb = accb[q];
          cw.x += aw[4 * h], cw.y += aw[4 * h + 1], cw.z += aw[4 * h + 2], cw.w += aw[4 * h + 3];
          cb.x += ab[4 * h], cb.y += ab[4 * h + 1], cb.z += ab[4 * h + 2], cb.w += ab[4 * h + 3];
          accw[q] = cw;
          accb[q] = cb;
        }
      }
    }
    dnorm_mean = warp_sum(dnorm_mean) * inv_c;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) * inv_c;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = lane + k * kWarp;
      if (p < packs) {
        Pack8 out;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float norm = (__bfloat162float(xp[k].v[j]) - m) * s;
          const float g = (__bfloat162float(wp[k].v[j]) * __bfloat162float(dyp[k].v[j]) -
                           dnorm_mean - norm * dnorm_norm_mean) *
                          s;
          out.v[j] = __float2bfloat16(__bfloat162float(dxp[k].v[j]) + g);
        }
        store8(dx + row * C + p * 8, out);
      }
    }
  }
  __syncthreads();
  // float4 q of an area holds channels ((q / 64) * 32 + q % 32) * 8 + ((q / 32) % 2) * 4 .. +3
  for (int q = threadIdx.x; q < 2 * kArea; q += blockDim.x) {
    const int qa = q % kArea;  // q < kArea: dw, else db
    const int pack = (qa / (2 * kWarp)) * kWarp + qa % kWarp;
    if (pack >= packs) continue;
    float4 sum = make_float4(0, 0, 0, 0);
    for (int v = 0; v < warps; ++v) {
      const float4 t = shared4[v * 2 * kArea + q];
      sum.x += t.x, sum.y += t.y, sum.z += t.z, sum.w += t.w;
    }
    float* dst = (q < kArea ? dw : db) + pack * 8 + ((qa / kWarp) % 2) * 4;
    atomicAdd(reinterpret_cast<float4*>(dst), sum);  // C % 8 == 0, dw/db 16-byte aligned
  }
}

// GELU (tanh form) through the logistic function: 0.5 (1 + tanh(u)) = sigmoid(2u), so that
// gelu(v) = v sigmoid(2u) and gelu'(v) = s + 2 v s (1 - s) du with s = sigmoid(2u). One __expf
// and one fast division instead of tanhf, and accurate in the tails too (1 + tanh(u) would
// cancel for v << 0). u is clamped at -40, where s is ~1e-35 already: __expf cannot overflow.
__device__ __forceinline__ float gelu_sigmoid(float v) {
  const float u = fmaxf(kGeluScale * (v + 0.044715f * v * v * v), -40.0f);
  return __fdividef(1.0f, 1.0f + __expf(-2.0f * u));
}
__device__ __forceinline__ float gelu_fast(float v) { return v * gelu_sigmoid(v); }
__device__ __forceinline__ float gelu_grad_fast(float v) {
  const float s = gelu_sigmoid(v);
  const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
  return s + 2.0f * v * s * (1.0f - s) * du;
}

// Cross-entropy over one row per block of 1024 threads: the row is read once with 16-byte
// loads into registers (kPacks packs per thread), the (max, sum of exp) pairs are combined in
// one block reduction, and dlogits are written from the registers: one read and one write of
// the logits. The target's logit is read before the block's barrier, so in-place is safe.
constexpr int kClassifierVecThreads = 1024;
template <bool kForward, bool kBackward, int kPacks>
__global__ void __launch_bounds__(kClassifierVecThreads)
    crossentropy_vec_kernel(float* losses, bf16* dlogits, const bf16* logits,
                            const std::int32_t* targets, const float* scale, std::int64_t V,
                            std::int64_t Vp) {
  __shared__ float smax[kClassifierVecThreads / kWarp], ssum[kClassifierVecThreads / kWarp];
  const std::int64_t n = blockIdx.x;
  const bf16* row = logits + n * Vp;
  const int packs = static_cast<int>(Vp / 8);
  const std::int32_t target = targets[n];
  float target_logit = 0;
  if (kForward && threadIdx.x == 0) target_logit = __bfloat162float(row[target]);
  Pack8 v[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = threadIdx.x + k * kClassifierVecThreads;
    if (p < packs) v[k] = load8_stream(row + static_cast<std::int64_t>(p) * 8);
  }
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = threadIdx.x + k * kClassifierVecThreads;
    if (p < packs)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (p * 8 + j < V) m = fmaxf(m, __bfloat162float(v[k].v[j]));
  }
  float s = 0;
  if (m != -INFINITY) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * kClassifierVecThreads;
      if (p < packs)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (p * 8 + j < V) s += __expf(__bfloat162float(v[k].v[j]) - m);
    }
  }
  // (m, s) pairs: across the warp, then every warp combines all warps' pairs (one barrier)
  const float wm = warp_max(m);
  s = warp_sum(m == -INFINITY ? 0.0f : s * __expf(m - wm));
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    smax[warp] = wm;
    ssum[warp] = s;
  }
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  const float pm = lane < warps ? smax[lane] : -INFINITY;
  const float bm = warp_max(pm);
  const float bs = warp_sum(lane < warps && pm != -INFINITY ? ssum[lane] * __expf(pm - bm) : 0.0f);
  if (kForward && threadIdx.x == 0) losses[n] = bm + logf(bs) - target_logit;
  if constexpr (kBackward) {
    const float inv = 1.0f / bs, sc = *scale;
    bf16* drow = dlogits + n * Vp;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = threadIdx.x + k * kClassifierVecThreads;
      if (p < packs) {
        Pack8 out;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int i = p * 8 + j;
          float g = 0;
          if (i < V)
            g = (__expf(__bfloat162float(v[k].v[j]) - bm) * inv - (i == target ? 1.0f : 0.0f)) * sc;
          out.v[j] = __float2bfloat16(g);
        }
        store8(drow + static_cast<std::int64_t>(p) * 8, out);
      }
    }
  }
}

// Cross-entropy with the rows staged through shared memory: a persistent grid of one block per
// multiprocessor walks its rows (blockIdx.x, + gridDim.x, ...); cp.async copies the next two rows
// into two shared-memory stages while the block computes the current one from registers, so
// that a multiprocessor always has up to two rows (~200 KB at Vp = 50304) of loads in flight
// while it does the exponentials and writes dlogits. (The row-per-block kernel above has its
// loads, its reduction and its writes one after the other, with nothing in flight between.)
// Each thread copies and reads only its own packs (p = threadIdx.x + k * kThreads), so a
// thread's cp.async.wait_group is all it needs before reading; a stage is refilled only after
// the block's reduction barrier, by which every thread has read it. Padding columns (>= V) are
// set to -inf in registers: they drop out of the max and the sum, and exp2(-inf) = 0 gives them
// a zero gradient. kHalfExp keeps exp(x - thread max) as fp16 in place of the logits (one
// exponential per element instead of two; the gradient then carries fp16 rounding as well).
constexpr float kLog2e = 1.4426950408889634f;
constexpr std::uint32_t kNegInfBf16x2 = 0xFF80FF80u;

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// every committed group but the newest is complete (and visible to this thread)
__device__ __forceinline__ void cp_async_wait_all_but_newest() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
__device__ __forceinline__ float bf16_lo(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(std::uint32_t w) {
  return __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  std::uint32_t w;
  memcpy(&w, &b, sizeof w);
  return w;
}

template <bool kForward, bool kBackward, int kThreads, int kPacks, bool kHalfExp>
__global__ void __launch_bounds__(kThreads, 1)
    crossentropy_staged_kernel(float* losses, bf16* dlogits, const bf16* logits,
                               const std::int32_t* targets, const float* scale, std::int64_t N,
                               int V, int packs) {
  constexpr int kWarps = kThreads / kWarp;
  static_assert(kWarps <= kWarp, "the block reduction reads one (max, sum) pair per lane");
  extern __shared__ int4 stage[];  // 2 stages of `packs` 16-byte packs
  __shared__ float smax[2][kWarps], ssum[2][kWarps];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const std::int64_t Vp = static_cast<std::int64_t>(packs) * 8;
  const std::int64_t stride = gridDim.x;
  const float sc = kBackward ? *scale : 0.0f;
  // copies row r (if any) into stage `buf`; always commits a group, so that "all but the newest
  // group" is always the row about to be computed
  auto issue = [&](std::int64_t r, int buf) {
    if (r < N) {
      const int4* src = reinterpret_cast<const int4*>(logits + r * Vp);
      int4* dst = stage + buf * packs;
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int p = tid + k * kThreads;
        if (p < packs) cp_async16(dst + p, src + p);
      }
    }
    cp_async_commit();
  };
  std::int64_t r = blockIdx.x;
  issue(r, 0);
  issue(r + stride, 1);
  std::int32_t target = r < N ? targets[r] : 0;
  for (int it = 0; r < N; ++it, r += stride) {
    const int buf = it & 1;
    const std::int64_t next = r + stride;
    const std::int32_t next_target = next < N ? targets[next] : 0;
    cp_async_wait_all_but_newest();
    std::uint32_t w[kPacks][4];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = tid + k * kThreads;
      if (p < packs) {
        const int4 q = stage[buf * packs + p];
        w[k][0] = static_cast<std::uint32_t>(q.x), w[k][1] = static_cast<std::uint32_t>(q.y);
        w[k][2] = static_cast<std::uint32_t>(q.z), w[k][3] = static_cast<std::uint32_t>(q.w);
        if ((p + 1) * 8 > V) {  // the pack holding column V: padding to -inf
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if (p * 8 + 2 * c >= V) w[k][c] = (w[k][c] & 0xFFFF0000u) | 0xFF80u;
            if (p * 8 + 2 * c + 1 >= V) w[k][c] = (w[k][c] & 0xFFFFu) | 0xFF800000u;
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) w[k][c] = kNegInfBf16x2;
      }
    }
    // the thread's max (packed bf16 max: exact) and the target's logit (from its owner)
    __nv_bfloat162 m2;
    {
      const std::uint32_t ninf = kNegInfBf16x2;
      memcpy(&m2, &ninf, sizeof m2);
    }
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        __nv_bfloat162 b;
        memcpy(&b, &w[k][c], sizeof b);
        m2 = __hmax2(m2, b);
      }
    const float mt = fmaxf(__low2float(m2), __high2float(m2));
    const bool valid_target = target >= 0 && target < V;
    const int target_pack = valid_target ? target / 8 : -1, target_lane = target % 8;
    float target_logit = 0;
    bool owner = false;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (tid + k * kThreads == target_pack) {
        owner = true;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (2 * c == target_lane) target_logit = bf16_lo(w[k][c]);
          if (2 * c + 1 == target_lane) target_logit = bf16_hi(w[k][c]);
        }
      }
    // sum of exp(x - mt) (mt = -inf: every value is -inf, exp2(-inf) = 0 with mtl = 0)
    const float mtl = mt == -INFINITY ? 0.0f : mt * kLog2e;
    float s = 0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float e0 = exp2_approx(fmaf(bf16_lo(w[k][c]), kLog2e, -mtl));
        const float e1 = exp2_approx(fmaf(bf16_hi(w[k][c]), kLog2e, -mtl));
        s += e0 + e1;
        if constexpr (kHalfExp) {
          const __half2 h = __floats2half2_rn(e0, e1);
          memcpy(&w[k][c], &h, sizeof h);
        }
      }
    // (max, sum) pairs across the warp, then every warp combines all warps' pairs
    const float wm = warp_max(mt);
    const float ws = warp_sum(mt == -INFINITY ? 0.0f : s * exp2_approx((mt - wm) * kLog2e));
    if (lane == 0) {
      smax[buf][warp] = wm;
      ssum[buf][warp] = ws;
    }
    __syncthreads();
    // every thread has read its packs of this stage: refill it with the row after next
    issue(r + 2 * stride, buf);
    const float pm = lane < kWarps ? smax[buf][lane] : -INFINITY;
    const float bm = warp_max(pm);
    const float bs = warp_sum(lane < kWarps && pm != -INFINITY
                                  ? ssum[buf][lane] * exp2_approx((pm - bm) * kLog2e)
                                  : 0.0f);
    if constexpr (kForward) {
      if (owner) losses[r] = bm + logf(bs) - target_logit;
      if (!valid_target && tid == 0) losses[r] = NAN;  // a target outside [0, V)
    }
    if constexpr (kBackward) {
      int4* dst = reinterpret_cast<int4*>(dlogits + r * Vp);
      const float k_exp = sc / bs, bml = bm * kLog2e;
      const float k_half = mt == -INFINITY ? 0.0f : exp2_approx((mt - bm) * kLog2e) * (sc / bs);
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int p = tid + k * kThreads;
        if (p < packs) {
          float g[8];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            if constexpr (kHalfExp) {
              __half2 h;
              memcpy(&h, &w[k][c], sizeof h);
              const float2 e = __half22float2(h);
              g[2 * c] = e.x * k_half;
              g[2 * c + 1] = e.y * k_half;
            } else {
              g[2 * c] = exp2_approx(fmaf(bf16_lo(w[k][c]), kLog2e, -bml)) * k_exp;
              g[2 * c + 1] = exp2_approx(fmaf(bf16_hi(w[k][c]), kLog2e, -bml)) * k_exp;
            }
          }
          if (p == target_pack) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
              if (j == target_lane) g[j] -= sc;
          }
          int4 out;
          out.x = static_cast<int>(pack_bf16x2(g[0], g[1]));
          out.y = static_cast<int>(pack_bf16x2(g[2], g[3]));
          out.z = static_cast<int>(pack_bf16x2(g[4], g[5]));
          out.w = static_cast<int>(pack_bf16x2(g[6], g[7]));
          __stcs(dst + p, out);
        }
      }
    }
    target = next_target;
  }
  cp_async_wait_all();
}

// AdamW over 4 elements per thread (16-byte fp32 accesses, 8-byte bf16 store); n4 = n / 4 packs
// here, the n % 4 tail elements by the first threads with the scalar formula (adamw_one).
// Thread i of a tensor's launch: pack i (i < n4) and tail element n4 * 4 + i (i < tail).
__device__ __forceinline__ void adamw_packs(std::int64_t i, float* param, bf16* param_bf16,
                                            float* m, float* v, const float* grad, std::int64_t n4,
                                            std::int64_t tail, const float* sc,
                                            const float* grad_norm, bool decayed) {
  if (i >= n4 && i >= tail) return;
  const float b1 = sc[kBeta1], b2 = sc[kBeta2], step = sc[kStep], lr = sc[kLearningRate];
  const float eps = sc[kEpsilon];
  const float clip = sc[kGradClip], norm = *grad_norm;
  const float clip_scale = clip > 0 && norm > clip ? clip / norm : 1.0f;
  const float c1 = 1.0f - powf(b1, step), c2 = 1.0f - powf(b2, step);
  const float wd = decayed ? sc[kWeightDecay] : 0.0f;
  if (i < n4) {
    const float4 g4 = __ldcs(reinterpret_cast<const float4*>(grad) + i);
    float4 p4 = __ldcs(reinterpret_cast<const float4*>(param) + i);
    float4 m4 = __ldcs(reinterpret_cast<const float4*>(m) + i);
    float4 v4 = __ldcs(reinterpret_cast<const float4*>(v) + i);
    adamw_one(p4.x, m4.x, v4.x, g4.x * clip_scale, b1, b2, c1, c2, lr, eps, wd);
    adamw_one(p4.y, m4.y, v4.y, g4.y * clip_scale, b1, b2, c1, c2, lr, eps, wd);
    adamw_one(p4.z, m4.z, v4.z, g4.z * clip_scale, b1, b2, c1, c2, lr, eps, wd);
    adamw_one(p4.w, m4.w, v4.w, g4.w * clip_scale, b1, b2, c1, c2, lr, eps, wd);
    __stcs(reinterpret_cast<float4*>(param) + i, p4);
    __stcs(reinterpret_cast<float4*>(m) + i, m4);
    __stcs(reinterpret_cast<float4*>(v) + i, v4);
    if (param_bf16 != nullptr) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(p4.x, p4.y), hi = __floats2bfloat162_rn(p4.z, p4.w);
      uint2 packed;
      memcpy(&packed.x, &lo, 4);
      memcpy(&packed.y, &hi, 4);
      reinterpret_cast<uint2*>(param_bf16)[i] = packed;
    }
  }
  if (i < tail) {
    const std::int64_t j = n4 * 4 + i;
    float p = param[j], mi = m[j], vi = v[j];
    adamw_one(p, mi, vi, grad[j] * clip_scale, b1, b2, c1, c2, lr, eps, wd);
    param[j] = p;
    m[j] = mi;
    v[j] = vi;
    if (param_bf16 != nullptr) param_bf16[j] = __float2bfloat16(p);
  }
}
__global__ void adamw_vec_kernel(float* param, bf16* param_bf16, float* m, float* v,
                                 const float* grad, std::int64_t n, const float* sc,
                                 const float* grad_norm, bool decayed) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t n4 = n / 4;
  adamw_packs(i, param, param_bf16, m, v, grad, n4, n - n4 * 4, sc, grad_norm, decayed);
}

// ---- multi-tensor optimizer (one launch over a table of tensors) ---------------------------
// The entry whose block range holds `block` (entries sorted by block_begin; entries with no
// blocks share their successor's begin and are passed over).
__device__ __forceinline__ int multi_tensor_entry(const MultiTensorEntry* e, int count,
                                                  std::int64_t block) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (e[mid].block_begin <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}
__global__ void adamw_multi_kernel(const MultiTensorEntry* entries, int count, const float* sc,
                                   const float* grad_norm) {
  const MultiTensorEntry& e = entries[multi_tensor_entry(entries, count, blockIdx.x)];
  const std::int64_t i =
      (blockIdx.x - e.block_begin) * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  adamw_packs(i, e.param, e.param_bf16, e.m, e.v, e.grad, e.n4, e.tail, sc, grad_norm,
              e.decayed != 0);
}

// Global norm in a fixed order: block b of a FIXED grid (kNormPartials blocks, whatever the
// device) sums chunks b, b + grid, ... of the table (each chunk kNormPacksPerThread packs per
// thread), reduces in a fixed tree and writes partials[b]; one block then sums the partials in
// a fixed tree. No atomics: the same gradients give the same bits on every run and every rank.
constexpr int kNormThreads = 256;
constexpr int kNormPacksPerThread = 8;
__device__ __forceinline__ float block_sum_fixed(float acc) {
  __shared__ float part[32];
  acc = warp_sum(acc);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  acc = 0;
  if (warp == 0) {
    acc = lane < static_cast<int>(blockDim.x / kWarp) ? part[lane] : 0.0f;
    acc = warp_sum(acc);
  }
  return acc;  // valid in thread 0
}
__global__ void sum_of_squares_multi_kernel(float* partials, const MultiTensorEntry* entries,
                                            int count, std::int64_t chunks) {
  float acc = 0;
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const MultiTensorEntry& e = entries[multi_tensor_entry(entries, count, c)];
    const std::int64_t base = (c - e.block_begin) * kNormThreads * kNormPacksPerThread;
    const float4* g4 = reinterpret_cast<const float4*>(e.grad);
#pragma unroll
    for (int u = 0; u < kNormPacksPerThread; ++u) {
      const std::int64_t i = base + u * kNormThreads + threadIdx.x;
      if (i < e.n4) {
        const float4 x = g4[i];
        acc += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
      }
      if (i < e.tail) {
        const float x = e.grad[e.n4 * 4 + i];
        acc += x * x;
      }
    }
  }
  acc = block_sum_fixed(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}
__global__ void norm_from_partials_kernel(float* norm, const float* partials, int count) {
  float acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum_fixed(acc);
  if (threadIdx.x == 0) *norm = sqrtf(acc);
}

// Sum of squares: float4 grid-stride loads (the n % 4 tail by thread 0), a block reduction, one
// atomicAdd per block.
__global__ void sum_of_squares_vec_kernel(float* out, const float* g, std::int64_t n) {
  __shared__ float part[32];
  const std::int64_t n4 = n / 4;
  float acc = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(g)[i];
    acc += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (std::int64_t i = n4 * 4; i < n; ++i) acc += g[i] * g[i];
  acc = warp_sum(acc);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < static_cast<int>(blockDim.x / kWarp) ? part[lane] : 0.0f;
    acc = warp_sum(acc);
    if (lane == 0) atomicAdd(out, acc);
  }
}

// fp32 -> bf16, 4 per thread.
__global__ void to_bf16_vec_kernel(bf16* out, const float* in, std::int64_t n4) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n4) return;
  const float4 v = reinterpret_cast<const float4*>(in)[i];
  __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 packed;
  memcpy(&packed.x, &lo, 4);
  memcpy(&packed.y, &hi, 4);
  reinterpret_cast<uint2*>(out)[i] = packed;
}

// Encoder forward: one thread per 16-byte pack of the output.
__global__ void encoder_forward_vec_kernel(bf16* out, const std::int32_t* tokens, const bf16* wte,
                                           const bf16* wpe, std::int64_t BT, std::int64_t T,
                                           std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t packs = C / 8;
  if (i >= BT * packs) return;
  const std::int64_t row = i / packs, c = (i % packs) * 8, t = row % T;
  const Pack8 e = load8(wte + static_cast<std::int64_t>(tokens[row]) * C + c);
  Pack8 o = e;
  if (wpe != nullptr) {
    const Pack8 pe = load8(wpe + t * C + c);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      o.v[j] = __float2bfloat16(__bfloat162float(e.v[j]) + __bfloat162float(pe.v[j]));
  }
  store8(out + row * C + c, o);
}

// Encoder backward: one thread per (t, 16-byte pack of channels) walks the B rows of that t:
// 16-byte fp32 atomics into the token's dwte row, and the dwpe sum (this thread's alone) in
// registers, added once without atomics.
__global__ void encoder_backward_vec_kernel(float* dwte, float* dwpe, const bf16* dout,
                                            const std::int32_t* tokens, std::int64_t B,
                                            std::int64_t T, std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t packs = C / 8;
  if (i >= T * packs) return;
  const std::int64_t t = i / packs, c = (i % packs) * 8;
  float pos[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t row = b * T + t;
    const Pack8 d = load8_stream(dout + row * C + c);
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      f[j] = __bfloat162float(d.v[j]);
      pos[j] += f[j];
    }
    float* wrow = dwte + static_cast<std::int64_t>(tokens[row]) * C + c;
    atomicAdd(reinterpret_cast<float4*>(wrow), make_float4(f[0], f[1], f[2], f[3]));
    atomicAdd(reinterpret_cast<float4*>(wrow) + 1, make_float4(f[4], f[5], f[6], f[7]));
  }
  if (dwpe != nullptr) {
    float4* prow = reinterpret_cast<float4*>(dwpe + t * C + c);
    float4 lo = prow[0], hi = prow[1];
    lo.x += pos[0], lo.y += pos[1], lo.z += pos[2], lo.w += pos[3];
    hi.x += pos[4], hi.y += pos[5], hi.z += pos[6], hi.w += pos[7];
    prow[0] = lo;
    prow[1] = hi;
  }
}

// Bias gradient, 16-byte loads: block (32, 8); thread x owns the 8 columns of pack
// blockIdx.x * 32 + x, thread y the rows y, y + 8, ... of the block's row range; the 8 row
// groups are summed in shared memory and each column gets one atomicAdd per block.
__global__ void bias_backward_vec_kernel(float* dbias, const bf16* dy, std::int64_t N,
                                         std::int64_t OC, std::int64_t rows_per_block) {
  __shared__ float part[8][kWarp * 8 + 4];
  const std::int64_t packs = OC / 8;
  const std::int64_t p = blockIdx.x * static_cast<std::int64_t>(kWarp) + threadIdx.x;
  const std::int64_t r0 = blockIdx.y * rows_per_block;
  const std::int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (p < packs) {
    std::int64_t r = r0 + threadIdx.y;
    // two loads in flight per iteration
    for (; r + 8 < r1; r += 16) {
      const Pack8 d0 = load8(dy + r * OC + p * 8), d1 = load8(dy + (r + 8) * OC + p * 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += __bfloat162float(d0.v[j]) + __bfloat162float(d1.v[j]);
    }
    if (r < r1) {
      const Pack8 d0 = load8(dy + r * OC + p * 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += __bfloat162float(d0.v[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) part[threadIdx.y][threadIdx.x * 8 + j] = acc[j];
  __syncthreads();
  // 256 threads sum the 256 columns of this block over the 8 row groups
  const int t = threadIdx.y * kWarp + threadIdx.x;
  const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(kWarp) * 8 + t;
  if (col < OC) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += part[k][t];
    atomicAdd(&dbias[col], sum);
  }
}

// residual backward, 16-byte packs: da += dy, db += dy (da != db, checked by the host).
__global__ void residual_backward_vec_kernel(bf16* da, bf16* db, const bf16* dy, std::int64_t n8) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n8) return;
  const Pack8 d = load8_stream(dy + i * 8);
  Pack8 a = load8(da + i * 8), b = load8(db + i * 8);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float f = __bfloat162float(d.v[j]);
    a.v[j] = __float2bfloat16(__bfloat162float(a.v[j]) + f);
    b.v[j] = __float2bfloat16(__bfloat162float(b.v[j]) + f);
  }
  store8(da + i * 8, a);
  store8(db + i * 8, b);
}

}  // namespace

namespace {

bool aligned16_all(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (!aligned16(p)) return false;
  return true;
}

// The multiprocessor count of the current device (a host-side query: capturable).
int multiprocessors() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms <= 0)
    return 132;
  return sms;
}

// Calls launch.template operator()<kPacks>() with the smallest kPacks (16-byte packs per lane)
// with kPacks * 32 * 8 >= C (C % 8 == 0, C <= 1600).
template <class Launch>
cudaError_t dispatch_packs(std::int64_t C, Launch&& launch) {
  const std::int64_t per_lane = (C / 8 + kWarp - 1) / kWarp;
  switch (per_lane) {
    case 1:
      return launch.template operator()<1>();
    case 2:
      return launch.template operator()<2>();
    case 3:
      return launch.template operator()<3>();
    case 4:
      return launch.template operator()<4>();
    case 5:
      return launch.template operator()<5>();
    case 6:
      return launch.template operator()<6>();
    case 7:
      return launch.template operator()<7>();  // GPT-2 1558M: C = 1600
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

void encoder_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe,
                     std::int64_t B, std::int64_t T, std::int64_t C, cudaStream_t stream) {
  if (C % 8 == 0 && aligned16_all({out, wte, wpe})) {
    encoder_forward_vec_kernel<<<blocks_for(B * T * (C / 8), 256), 256, 0, stream>>>(
        out, tokens, wte, wpe, B * T, T, C);
    return;
  }
  encoder_forward_kernel<<<blocks_for(B * T * C, 256), 256, 0, stream>>>(out, tokens, wte, wpe,
                                                                         B * T, T, C);
}
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const std::int32_t* tokens,
                      std::int64_t B, std::int64_t T, std::int64_t C, cudaStream_t stream) {
  if (C % 8 == 0 && aligned16_all({dwte, dwpe, dout})) {
    encoder_backward_vec_kernel<<<blocks_for(T * (C / 8), 128), 128, 0, stream>>>(dwte, dwpe, dout,
                                                                                  tokens, B, T, C);
    return;
  }
  encoder_backward_kernel<<<blocks_for(B * T * C, 256), 256, 0, stream>>>(dwte, dwpe, dout, tokens,
                                                                          B * T, T, C);
}

cudaError_t layernorm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* w,
                              const bf16* b, std::int64_t N, std::int64_t C, cudaStream_t stream) {
  if (C > kMaxLayerNormChannels) return cudaErrorInvalidValue;
  if (C % 8 == 0 && aligned16_all({y, x, w, b}))
    return dispatch_packs(C, [&]<int kPacks>() {
      layernorm_forward_vec_kernel<false, kPacks><<<blocks_for(N, 8), 256, 0, stream>>>(
          nullptr, y, mean, rstd, x, nullptr, w, b, N, static_cast<int>(C));
      return cudaSuccess;
    });
  return dispatch_per_lane(C, [&]<int kPerLane>() {
    layernorm_forward_kernel<false, kPerLane><<<blocks_for(N, 8), 256, 0, stream>>>(
        nullptr, y, mean, rstd, x, nullptr, w, b, N, static_cast<int>(C));
    return cudaSuccess;
  });
}
cudaError_t residual_layernorm_forward(bf16* s, bf16* y, float* mean, float* rstd, const bf16* a,
                                       const bf16* b1, const bf16* w, const bf16* b, std::int64_t N,
                                       std::int64_t C, cudaStream_t stream) {
  if (C > kMaxLayerNormChannels) return cudaErrorInvalidValue;
  if (C % 8 == 0 && aligned16_all({s, y, a, b1, w, b}))
    return dispatch_packs(C, [&]<int kPacks>() {
      layernorm_forward_vec_kernel<true, kPacks><<<blocks_for(N, 8), 256, 0, stream>>>(
          s, y, mean, rstd, a, b1, w, b, N, static_cast<int>(C));
      return cudaSuccess;
    });
  return dispatch_per_lane(C, [&]<int kPerLane>() {
    layernorm_forward_kernel<true, kPerLane><<<blocks_for(N, 8), 256, 0, stream>>>(
        s, y, mean, rstd, a, b1, w, b, N, static_cast<int>(C));
    return cudaSuccess;
  });
}
cudaError_t layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dy, const bf16* x,
                               const bf16* w, const float* mean, const float* rstd, std::int64_t N,
                               std::int64_t C, cudaStream_t stream) {
  if (C > kMaxLayerNormChannels) return cudaErrorInvalidValue;
  if (C % 8 == 0 && aligned16_all({dx, dw, db, dy, x, w})) {
    // as many blocks as fit on the GPU at once (each flushes its dw/db partials once)
    const int sms = multiprocessors();
    return dispatch_packs(C, [&]<int kPacks>() {
      constexpr std::size_t smem = layernorm_backward_smem_bytes<kPacks>();
      if constexpr (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(layernorm_backward_vec_kernel<kPacks>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        if (e != cudaSuccess) return e;
      }
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &per_sm, layernorm_backward_vec_kernel<kPacks>, kLayerNormBackwardThreads, smem) !=
              cudaSuccess ||
          per_sm < 1)
        per_sm = 1;
      const unsigned blocks = std::min<unsigned>(blocks_for(N, kLayerNormBackwardThreads / kWarp),
                                                 static_cast<unsigned>(sms * per_sm));
      layernorm_backward_vec_kernel<kPacks><<<blocks, kLayerNormBackwardThreads, smem, stream>>>(
          dx, dw, db, dy, x, w, mean, rstd, N, static_cast<int>(C));
      return cudaSuccess;
    });
  }
  const unsigned blocks = std::min<unsigned>(blocks_for(N, 8), 132u * 2u);
  return dispatch_per_lane(C, [&]<int kPerLane>() {
    layernorm_backward_kernel<kPerLane><<<blocks, 256, 2 * C * sizeof(float), stream>>>(
        dx, dw, db, dy, x, w, mean, rstd, N, static_cast<int>(C));
    return cudaSuccess;
  });
}

void gelu_forward(bf16* y, const bf16* x, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(y) && aligned16(x)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 in = load8_stream(x + i * 8);
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k) out.v[k] = __float2bfloat16(gelu_fast(__bfloat162float(in.v[k])));
      store8(y + i * 8, out);
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  gelu_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, x, n);
}
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 xi = load8_stream(x + i * 8);
      const Pack8 di = load8_stream(dy + i * 8);
      Pack8 acc = load8(dx + i * 8);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc.v[k] =
            __float2bfloat16(__bfloat162float(acc.v[k]) +
                             __bfloat162float(di.v[k]) * gelu_grad_fast(__bfloat162float(xi.v[k])));
      store8(dx + i * 8, acc);
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  gelu_backward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dx, dy, x, n);
}
void residual_forward(bf16* y, const bf16* a, const bf16* b, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(y) && aligned16(a) && aligned16(b)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 ai = load8(a + i * 8);
      const Pack8 bi = load8(b + i * 8);
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        out.v[k] = __float2bfloat16(__bfloat162float(ai.v[k]) + __bfloat162float(bi.v[k]));
      store8(y + i * 8, out);
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  residual_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, a, b, n);
}
void residual_backward(bf16* da, bf16* db, const bf16* dy, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && da != db && aligned16_all({da, db, dy})) {
    residual_backward_vec_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(da, db, dy, n / 8);
    return;
  }
  residual_backward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(da, db, dy, n);
}

namespace {
// The row-per-block classifier: the vectorised kernel (one read of each row into registers) when
// Vp is whole 16-byte packs, the rows are aligned and a row fits in 7 packs per thread
// (Vp <= 57344); else the two-pass kernel.
template <bool kForward, bool kBackward>
void crossentropy_row_per_block(float* losses, bf16* dlogits, const bf16* logits,
                                const std::int32_t* targets, const float* scale, std::int64_t N,
                                std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  const std::int64_t packs = Vp / 8;
  const std::int64_t per_thread = (packs + kClassifierVecThreads - 1) / kClassifierVecThreads;
  const bool vec =
      Vp % 8 == 0 && aligned16(logits) && (!kBackward || aligned16(dlogits)) && per_thread <= 7;
  const unsigned grid = static_cast<unsigned>(N);
  if (vec && per_thread <= 1)
    crossentropy_vec_kernel<kForward, kBackward, 1><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else if (vec && per_thread <= 2)
    crossentropy_vec_kernel<kForward, kBackward, 2><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else if (vec && per_thread <= 4)
    crossentropy_vec_kernel<kForward, kBackward, 4><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else if (vec)
    crossentropy_vec_kernel<kForward, kBackward, 7><<<grid, kClassifierVecThreads, 0, stream>>>(
        losses, dlogits, logits, targets, scale, V, Vp);
  else
    crossentropy_kernel<kForward, kBackward>
        <<<grid, kClassifierThreads, 0, stream>>>(losses, dlogits, logits, targets, scale, V, Vp);
}

// The staged kernel when the row fits (kPacks * kThreads packs, two stages of it in the opt-in
// shared memory of a block) and everything is 16-byte aligned; false (nothing launched) if not.
template <bool kForward, bool kBackward, int kThreads, int kPacks, bool kHalfExp>
bool crossentropy_staged(float* losses, bf16* dlogits, const bf16* logits,
                         const std::int32_t* targets, const float* scale, std::int64_t N,
                         std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  const std::int64_t packs = Vp / 8;
  if (Vp % 8 != 0 || !aligned16(logits) || (kBackward && !aligned16(dlogits)) ||
      packs > static_cast<std::int64_t>(kThreads) * kPacks)
    return false;
  const std::size_t stage_bytes = 2 * static_cast<std::size_t>(packs) * 16;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    return false;
  constexpr std::size_t kStaticBytes = 2 * 2 * (kThreads / kWarp) * sizeof(float);
  if (stage_bytes + kStaticBytes > static_cast<std::size_t>(optin)) return false;
  auto* kernel = crossentropy_staged_kernel<kForward, kBackward, kThreads, kPacks, kHalfExp>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(stage_bytes)) != cudaSuccess) {
    (void)cudaGetLastError();  // not fatal: the row-per-block kernel runs instead
    return false;
  }
  const unsigned grid =
      static_cast<unsigned>(std::min<std::int64_t>(N, multiprocessors()));  // one block per SM
  kernel<<<grid, kThreads, stage_bytes, stream>>>(losses, dlogits, logits, targets, scale, N,
                                                  static_cast<int>(V), static_cast<int>(packs));
  return true;
}

template <bool kForward, bool kBackward>
ClassifierKernel crossentropy_dispatch(ClassifierKernel kernel, float* losses, bf16* dlogits,
                                       const bf16* logits, const std::int32_t* targets,
                                       const float* scale, std::int64_t N, std::int64_t V,
                                       std::int64_t Vp, cudaStream_t stream) {
  if (N <= 0) return kernel;
  if (kernel == ClassifierKernel::automatic) kernel = ClassifierKernel::staged_1024;
  bool launched = false;
  switch (kernel) {
    case ClassifierKernel::staged_1024:
      launched = crossentropy_staged<kForward, kBackward, 1024, 7, false>(
          losses, dlogits, logits, targets, scale, N, V, Vp, stream);
      break;
    case ClassifierKernel::staged_512:
      launched = crossentropy_staged<kForward, kBackward, 512, 13, false>(
          losses, dlogits, logits, targets, scale, N, V, Vp, stream);
      break;
    case ClassifierKernel::staged_1024_half_exp:
      launched = crossentropy_staged<kForward, kBackward, 1024, 7, true>(
          losses, dlogits, logits, targets, scale, N, V, Vp, stream);
      break;
    default:
      break;
  }
  if (launched) return kernel;
  crossentropy_row_per_block<kForward, kBackward>(losses, dlogits, logits, targets, scale, N, V, Vp,
                                                  stream);
  return ClassifierKernel::row_per_block;
}
}  // namespace

const char* classifier_kernel_name(ClassifierKernel kernel) {
  switch (kernel) {
    case ClassifierKernel::automatic:
      return "automatic";
    case ClassifierKernel::row_per_block:
      return "row_per_block";
    case ClassifierKernel::staged_1024:
      return "staged_1024";
    case ClassifierKernel::staged_512:
      return "staged_512";
    case ClassifierKernel::staged_1024_half_exp:
      return "staged_1024_half_exp";
  }
  return "?";
}

ClassifierKernel crossentropy_with(ClassifierKernel kernel, float* losses, bf16* dlogits,
                                   const bf16* logits, const std::int32_t* targets,
                                   const float* scale, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, cudaStream_t stream) {
  if (losses != nullptr && dlogits != nullptr)
    return crossentropy_dispatch<true, true>(kernel, losses, dlogits, logits, targets, scale, N, V,
                                             Vp, stream);
  if (losses != nullptr)
    return crossentropy_dispatch<true, false>(kernel, losses, dlogits, logits, targets, scale, N, V,
                                              Vp, stream);
  if (dlogits != nullptr)
    return crossentropy_dispatch<false, true>(kernel, losses, dlogits, logits, targets, scale, N, V,
                                              Vp, stream);
  return kernel;
}

void crossentropy_forward(float* losses, const bf16* logits, const std::int32_t* targets,
                          std::int64_t N, std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  crossentropy_with(ClassifierKernel::automatic, losses, nullptr, logits, targets, nullptr, N, V,
                    Vp, stream);
}
void crossentropy_backward(bf16* dlogits, const bf16* logits, const std::int32_t* targets,
                           const float* scale, std::int64_t N, std::int64_t V, std::int64_t Vp,
                           cudaStream_t stream) {
  crossentropy_with(ClassifierKernel::automatic, nullptr, dlogits, logits, targets, scale, N, V, Vp,
                    stream);
}
void crossentropy_forward_backward(float* losses, bf16* dlogits, const bf16* logits,
                                   const std::int32_t* targets, const float* scale, std::int64_t N,
                                   std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  crossentropy_with(ClassifierKernel::automatic, losses, dlogits, logits, targets, scale, N, V, Vp,
                    stream);
}

void sum_of_squares(float* sum_sq, const float* g, std::int64_t n, cudaStream_t stream) {
  if (aligned16(g)) {
    const unsigned blocks =
        std::min<unsigned>(blocks_for(n / 4, 256), static_cast<unsigned>(multiprocessors() * 8));
    sum_of_squares_vec_kernel<<<blocks, 256, 0, stream>>>(sum_sq, g, n);
    return;
  }
  const unsigned blocks = std::min<unsigned>(blocks_for(n, 256), 132u * 8u);
  sum_of_squares_kernel<<<blocks, 256, 0, stream>>>(sum_sq, g, n);
}
void sqrt_in_place(float* x, cudaStream_t stream) { sqrt_kernel<<<1, 1, 0, stream>>>(x); }

void adamw_update(float* param, bf16* param_bf16, float* m, float* v, const float* grad,
                  std::int64_t n, const float* scalars, const float* grad_norm, bool decayed,
                  cudaStream_t stream) {
  // the bf16 copy is written 8 bytes at a time
  if (aligned16_all({param, m, v, grad}) &&
      (reinterpret_cast<std::uintptr_t>(param_bf16) & 7u) == 0) {
    const std::int64_t threads = std::max<std::int64_t>(n / 4, n % 4);
    adamw_vec_kernel<<<blocks_for(threads, 256), 256, 0, stream>>>(param, param_bf16, m, v, grad, n,
                                                                   scalars, grad_norm, decayed);
    return;
  }
  adamw_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(param, param_bf16, m, v, grad, n, scalars,
                                                       grad_norm, decayed);
}

std::int64_t layout_multi_tensor(std::vector<MultiTensorEntry>& entries, MultiTensorUse use) {
  const std::int64_t per_block =
      use == MultiTensorUse::adamw ? 256
                                   : static_cast<std::int64_t>(kNormThreads) * kNormPacksPerThread;
  std::int64_t blocks = 0;
  for (auto& e : entries) {
    bool vec = aligned16(e.grad);
    if (use == MultiTensorUse::adamw)
      vec = vec && aligned16_all({e.param, e.m, e.v}) &&
            (reinterpret_cast<std::uintptr_t>(e.param_bf16) & 7u) == 0;
    e.n4 = vec ? e.n / 4 : 0;
    e.tail = e.n - e.n4 * 4;
    e.block_begin = blocks;
    const std::int64_t work = std::max(e.n4, e.tail);
    blocks += (work + per_block - 1) / per_block;
  }
  return blocks;
}

void adamw_update_multi(const MultiTensorEntry* entries, int count, std::int64_t blocks,
                        const float* scalars, const float* grad_norm, cudaStream_t stream) {
  if (count == 0 || blocks == 0) return;
  adamw_multi_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(entries, count, scalars,
                                                                        grad_norm);
}

void global_norm_multi(float* norm, float* partials, const MultiTensorEntry* entries, int count,
                       std::int64_t chunks, cudaStream_t stream) {
  sum_of_squares_multi_kernel<<<kNormPartials, kNormThreads, 0, stream>>>(partials, entries, count,
                                                                          chunks);
  norm_from_partials_kernel<<<1, 1024, 0, stream>>>(norm, partials, kNormPartials);
}

void to_bf16(bf16* out, const float* in, std::int64_t n, cudaStream_t stream) {
  if (n % 4 == 0 && aligned16(in) && (reinterpret_cast<std::uintptr_t>(out) & 7u) == 0) {
    to_bf16_vec_kernel<<<blocks_for(n / 4, 256), 256, 0, stream>>>(out, in, n / 4);
    return;
  }
  to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, in, n);
}

void bias_backward(float* dbias, const bf16* dy, std::int64_t N, std::int64_t OC,
                   cudaStream_t stream) {
  if (OC % 8 == 0 && aligned16(dy)) {
    // about 4 blocks per multiprocessor in all, each over a range of rows
    const std::int64_t col_blocks = (OC / 8 + kWarp - 1) / kWarp;
    const std::int64_t target_row_blocks =
        std::max<std::int64_t>(1, (4 * multiprocessors() + col_blocks - 1) / col_blocks);
    const std::int64_t rows_per_block =
        std::max<std::int64_t>(16, (N + target_row_blocks - 1) / target_row_blocks);
    const dim3 grid(static_cast<unsigned>(col_blocks), blocks_for(N, rows_per_block));
    bias_backward_vec_kernel<<<grid, dim3(kWarp, 8), 0, stream>>>(dbias, dy, N, OC, rows_per_block);
    return;
  }
  constexpr std::int64_t kRowsPerBlock = 256;
  const dim3 grid(blocks_for(OC, kWarp), blocks_for(N, kRowsPerBlock));
  bias_backward_kernel<<<grid, dim3(kWarp, 8), 0, stream>>>(dbias, dy, N, OC, kRowsPerBlock);
}

void bias_grad_add(float* dbias, const float* part, std::int64_t OC, cudaStream_t stream) {
  if (OC <= 0) return;
  bias_grad_add_kernel<<<blocks_for(OC, 256), 256, 0, stream>>>(dbias, part, OC);
}

}  // namespace topolaunch::kernels::cuda
