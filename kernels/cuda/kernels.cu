// The CUDA kernels of cuda_kernels.cuh. Memory-bound kernels: one warp per row for the row-wise
// ops (C = 768 is 24 values per lane, held in registers between the passes), 16-byte vector
// accesses for the elementwise ops when sizes allow, fp32 arithmetic throughout.
#include "cuda_kernels.cuh"

#include <algorithm>
#include <cmath>

#include "topolaunch/kernels/graph.hpp"

namespace topolaunch::kernels::cuda {
namespace {

constexpr float kLayerNormEpsilon = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr int kWarp = 32;

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
  const float g = grad[i] * clip_scale;
  const float mi = b1 * m[i] + (1.0f - b1) * g;
  const float vi = b2 * v[i] + (1.0f - b2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float p = param[i];
  const float np = p - sc[kLearningRate] * ((mi / c1) / (sqrtf(vi / c2) + sc[kEpsilon]) + wd * p);
  param[i] = np;
  if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16(np);
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

}  // namespace

void encoder_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe,
                     std::int64_t B, std::int64_t T, std::int64_t C, cudaStream_t stream) {
  encoder_forward_kernel<<<blocks_for(B * T * C, 256), 256, 0, stream>>>(out, tokens, wte, wpe,
                                                                         B * T, T, C);
}
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const std::int32_t* tokens,
                      std::int64_t B, std::int64_t T, std::int64_t C, cudaStream_t stream) {
  encoder_backward_kernel<<<blocks_for(B * T * C, 256), 256, 0, stream>>>(dwte, dwpe, dout, tokens,
                                                                          B * T, T, C);
}

cudaError_t layernorm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* w,
                              const bf16* b, std::int64_t N, std::int64_t C, cudaStream_t stream) {
  return dispatch_per_lane(C, [&]<int kPerLane>() {
    layernorm_forward_kernel<false, kPerLane><<<blocks_for(N, 8), 256, 0, stream>>>(
        nullptr, y, mean, rstd, x, nullptr, w, b, N, static_cast<int>(C));
    return cudaSuccess;
  });
}
cudaError_t residual_layernorm_forward(bf16* s, bf16* y, float* mean, float* rstd, const bf16* a,
                                       const bf16* b1, const bf16* w, const bf16* b, std::int64_t N,
                                       std::int64_t C, cudaStream_t stream) {
  return dispatch_per_lane(C, [&]<int kPerLane>() {
    layernorm_forward_kernel<true, kPerLane><<<blocks_for(N, 8), 256, 0, stream>>>(
        s, y, mean, rstd, a, b1, w, b, N, static_cast<int>(C));
    return cudaSuccess;
  });
}
cudaError_t layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dy, const bf16* x,
                               const bf16* w, const float* mean, const float* rstd, std::int64_t N,
                               std::int64_t C, cudaStream_t stream) {
  // two blocks per SM. Measured on H200 at N=16384, C=768: 0.19 ms with 2 blocks per SM,
  // 0.22 ms with 8 (more blocks cost more dw/db flushes than the occupancy gains); both far
  // from the ~25 us that the bytes moved would allow: the next thing to fix here.
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
      const Pack8 in = reinterpret_cast<const Pack8*>(x)[i];
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k) out.v[k] = __float2bfloat16(gelu(__bfloat162float(in.v[k])));
      reinterpret_cast<Pack8*>(y)[i] = out;
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  gelu_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, x, n);
}
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 xi = reinterpret_cast<const Pack8*>(x)[i];
      const Pack8 di = reinterpret_cast<const Pack8*>(dy)[i];
      Pack8 acc = reinterpret_cast<Pack8*>(dx)[i];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc.v[k] =
            __float2bfloat16(__bfloat162float(acc.v[k]) +
                             __bfloat162float(di.v[k]) * gelu_grad(__bfloat162float(xi.v[k])));
      reinterpret_cast<Pack8*>(dx)[i] = acc;
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  gelu_backward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dx, dy, x, n);
}
void residual_forward(bf16* y, const bf16* a, const bf16* b, std::int64_t n, cudaStream_t stream) {
  if (n % 8 == 0 && aligned16(y) && aligned16(a) && aligned16(b)) {
    auto fn = [=] __device__(std::int64_t i) {
      const Pack8 ai = reinterpret_cast<const Pack8*>(a)[i];
      const Pack8 bi = reinterpret_cast<const Pack8*>(b)[i];
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        out.v[k] = __float2bfloat16(__bfloat162float(ai.v[k]) + __bfloat162float(bi.v[k]));
      reinterpret_cast<Pack8*>(y)[i] = out;
    };
    elementwise8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream>>>(n / 8, fn);
    return;
  }
  residual_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, a, b, n);
}
void residual_backward(bf16* da, bf16* db, const bf16* dy, std::int64_t n, cudaStream_t stream) {
  residual_backward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(da, db, dy, n);
}

void crossentropy_forward(float* losses, const bf16* logits, const std::int32_t* targets,
                          std::int64_t N, std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  crossentropy_kernel<true, false><<<static_cast<unsigned>(N), kClassifierThreads, 0, stream>>>(
      losses, nullptr, logits, targets, nullptr, V, Vp);
}
void crossentropy_backward(bf16* dlogits, const bf16* logits, const std::int32_t* targets,
                           const float* scale, std::int64_t N, std::int64_t V, std::int64_t Vp,
                           cudaStream_t stream) {
  crossentropy_kernel<false, true><<<static_cast<unsigned>(N), kClassifierThreads, 0, stream>>>(
      nullptr, dlogits, logits, targets, scale, V, Vp);
}
void crossentropy_forward_backward(float* losses, bf16* dlogits, const bf16* logits,
                                   const std::int32_t* targets, const float* scale, std::int64_t N,
                                   std::int64_t V, std::int64_t Vp, cudaStream_t stream) {
  crossentropy_kernel<true, true><<<static_cast<unsigned>(N), kClassifierThreads, 0, stream>>>(
      losses, dlogits, logits, targets, scale, V, Vp);
}

void sum_of_squares(float* sum_sq, const float* g, std::int64_t n, cudaStream_t stream) {
  const unsigned blocks = std::min<unsigned>(blocks_for(n, 256), 132u * 8u);
  sum_of_squares_kernel<<<blocks, 256, 0, stream>>>(sum_sq, g, n);
}
void sqrt_in_place(float* x, cudaStream_t stream) { sqrt_kernel<<<1, 1, 0, stream>>>(x); }

void adamw_update(float* param, bf16* param_bf16, float* m, float* v, const float* grad,
                  std::int64_t n, const float* scalars, const float* grad_norm, bool decayed,
                  cudaStream_t stream) {
  adamw_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(param, param_bf16, m, v, grad, n, scalars,
                                                       grad_norm, decayed);
}

void to_bf16(bf16* out, const float* in, std::int64_t n, cudaStream_t stream) {
  to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, in, n);
}

void bias_backward(float* dbias, const bf16* dy, std::int64_t N, std::int64_t OC,
                   cudaStream_t stream) {
  constexpr std::int64_t kRowsPerBlock = 256;
  const dim3 grid(blocks_for(OC, kWarp), blocks_for(N, kRowsPerBlock));
  bias_backward_kernel<<<grid, dim3(kWarp, 8), 0, stream>>>(dbias, dy, N, OC, kRowsPerBlock);
}

}  // namespace topolaunch::kernels::cuda
