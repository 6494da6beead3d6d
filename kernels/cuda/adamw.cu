// The global gradient norm, AdamW and the fp32 -> bf16 working copy of adamw.cuh; the CUDA twin
// of kernels/cpu/adamw.hpp.
#include "adamw.cuh"

#include <algorithm>
#include <cmath>

#include "kernel_primitives.cuh"
#include "topolaunch/kernels/graph.hpp"

namespace topolaunch::kernels::cuda {
namespace {

// ---- per-tensor global norm: *out += sum g^2 ------------------------------------------------
// Grid-stride, one atomicAdd per warp (g not 16-byte aligned).
__global__ void sum_of_squares_kernel(float* out, const float* g, std::int64_t n) {
  float acc = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    acc += g[i] * g[i];
  acc = warp_sum(acc);
  if (threadIdx.x % kWarp == 0) atomicAdd(out, acc);
}

// The same with float4 grid-stride loads (the n % 4 tail by thread 0), a block reduction, one
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

__global__ void sqrt_kernel(float* x) { *x = sqrtf(*x); }

// After the global norm: a non-finite norm counts a skipped step, and AdamW's step t (bias
// correction) becomes the steps applied so far. The host writes scalars[kStep] before every
// step, so the subtraction never accumulates.
__global__ void optimizer_step_guard_kernel(float* scalars, const float* norm, float* skipped) {
  if (!isfinite(*norm)) *skipped += 1.0f;
  scalars[kStep] -= *skipped;
}

// ---- per-tensor AdamW ------------------------------------------------------------------------
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

// One element per thread (a buffer not 16-byte aligned, or the bf16 copy not 8-byte aligned).
__global__ void adamw_kernel(float* param, bf16* param_bf16, float* m, float* v, const float* grad,
                             std::int64_t n, const float* sc, const float* grad_norm,
                             bool decayed) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float b1 = sc[kBeta1], b2 = sc[kBeta2], step = sc[kStep];
  const float clip = sc[kGradClip], norm = *grad_norm;
  if (!isfinite(norm)) return;  // non-finite gradients: the step is skipped
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

// The same over 4 elements per thread (16-byte fp32 accesses, 8-byte bf16 store); n4 = n / 4
// packs here, the n % 4 tail elements by the first threads with the scalar formula (adamw_one).
// Thread i of a tensor's launch: pack i (i < n4) and tail element n4 * 4 + i (i < tail).
__device__ __forceinline__ void adamw_packs(std::int64_t i, float* param, bf16* param_bf16,
                                            float* m, float* v, const float* grad, std::int64_t n4,
                                            std::int64_t tail, const float* sc,
                                            const float* grad_norm, bool decayed) {
  if (i >= n4 && i >= tail) return;
  const float b1 = sc[kBeta1], b2 = sc[kBeta2], step = sc[kStep], lr = sc[kLearningRate];
  const float eps = sc[kEpsilon];
  const float clip = sc[kGradClip], norm = *grad_norm;
  if (!isfinite(norm)) return;  // non-finite gradients: the step is skipped
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
template <bool kSqrt>
__global__ void norm_from_partials_kernel(float* norm, const float* partials, int count) {
  float acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum_fixed(acc);
  if (threadIdx.x == 0) *norm = kSqrt ? sqrtf(acc) : acc;
}

__global__ void add_in_place_kernel(float* dst, const float* src, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

// ---- the bf16 working copy of fp32 master weights ------------------------------------------
// One element per thread.
__global__ void to_bf16_kernel(bf16* out, const float* in, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(in[i]);
}

// The same, 4 per thread.
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

}  // namespace

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

void optimizer_step_guard(float* scalars, const float* norm, float* skipped, cudaStream_t stream) {
  optimizer_step_guard_kernel<<<1, 1, 0, stream>>>(scalars, norm, skipped);
}

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
  norm_from_partials_kernel<true><<<1, 1024, 0, stream>>>(norm, partials, kNormPartials);
}

void sum_of_squares_multi(float* sum_sq, float* partials, const MultiTensorEntry* entries,
                          int count, std::int64_t chunks, cudaStream_t stream) {
  sum_of_squares_multi_kernel<<<kNormPartials, kNormThreads, 0, stream>>>(partials, entries, count,
                                                                          chunks);
  norm_from_partials_kernel<false><<<1, 1024, 0, stream>>>(sum_sq, partials, kNormPartials);
}

void add_in_place(float* dst, const float* src, std::int64_t n, cudaStream_t stream) {
  add_in_place_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dst, src, n);
}

void to_bf16(bf16* out, const float* in, std::int64_t n, cudaStream_t stream) {
  if (n % 4 == 0 && aligned16(in) && (reinterpret_cast<std::uintptr_t>(out) & 7u) == 0) {
    to_bf16_vec_kernel<<<blocks_for(n / 4, 256), 256, 0, stream>>>(out, in, n / 4);
    return;
  }
  to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, in, n);
}

}  // namespace topolaunch::kernels::cuda
