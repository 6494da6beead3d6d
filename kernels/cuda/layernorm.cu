// LayerNorm and the fused residual-add + LayerNorm of layernorm.cuh; the CUDA twin of
// kernels/cpu/layernorm.hpp. One warp per row (C = 768 is 24 values per lane, held in registers
// between the passes); 16-byte packs when C % 8 == 0 and the pointers are aligned, else one value
// per lane and step.
#include "layernorm.cuh"

#include <algorithm>

#include "kernel_primitives.cuh"
#include "matmul.cuh"  // bias_backward: dx_sum where the packed kernel cannot run

namespace topolaunch::kernels::cuda {
namespace {

constexpr float kLayerNormEpsilon = 1e-5f;
constexpr std::int64_t kMaxLayerNormChannels = 1600;  // GPT-2 1558M

// LayerNorm forward (kResidual: of s = a + b1, which it also writes), one warp per row, lane l
// holds channels l, l+32, ...: kPerLane values in registers between the passes (the host picks
// the smallest instantiation with kPerLane * 32 >= C; C up to kMaxLayerNormChannels).
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

// The same with 16-byte packs: lane l holds packs l, l+32, ... of the row.
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

// LayerNorm backward, lane l holding channels l, l+32, ... of a row. Block: 8 warps, a
// grid-stride loop over rows (warp per row). Each lane accumulates dw/db of its channels in
// registers over all its rows; then one shared-memory add per channel per warp and one global
// atomicAdd per channel per block.
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

// The same with 16-byte packs, one warp per row (grid-stride over rows): loads of dy, x, w and
// the dx being accumulated, all issued before the row's reductions. A lane always holds the same
// channels, so it sums their dw/db (and with kSum the written dx's) over all its rows in its
// warp's own shared-memory areas (not in registers: that would halve the warps per SM), laid out
// [pack-of-lane k][half h][lane] in float4s so that a warp's 16-byte accesses hit distinct banks.
// At the end the block adds its warps' areas and then dw/db(/dx_sum) with 16-byte fp32 atomics
// (sm_90), one per 4 channels per block. Up to 4 packs (C <= 1024) the registers are capped for
// two blocks per SM: uncapped, C = 1024 took 178 registers and one block (8 warps) per SM.
constexpr int kLayerNormBackwardThreads = 256;
template <int kPacks, bool kSum>
constexpr std::size_t layernorm_backward_smem_bytes() {
  return std::size_t{kLayerNormBackwardThreads / kWarp} * (kSum ? 3 : 2) * kPacks * 2 * kWarp *
         sizeof(float4);
}
template <int kPacks, bool kSum>
__global__ void __launch_bounds__(kLayerNormBackwardThreads, kPacks <= 4 ? 2 : 1)
    layernorm_backward_vec_kernel(bf16* dx, float* dw, float* db, float* dx_sum, const bf16* dy,
                                  const bf16* x, const bf16* w, const float* mean,
                                  const float* rstd, std::int64_t N, int C) {
  extern __shared__ float4 shared4[];
  constexpr int kArea = 2 * kPacks * kWarp;  // float4s of one of dw/db/dx_sum for one warp
  constexpr int kAreas = kSum ? 3 : 2;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  float4* accw = shared4 + warp * kAreas * kArea;  // this warp's dw area, its db area, [dx_sum]
  float4* accb = accw + kArea;
  float4* accs = accb + kArea;
  for (int q = lane; q < kAreas * kArea; q += kWarp) accw[q] = make_float4(0, 0, 0, 0);
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
        if constexpr (kSum) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int q = (k * 2 + h) * kWarp + lane;
            float4 cs = accs[q];
            cs.x += __bfloat162float(out.v[4 * h]), cs.y += __bfloat162float(out.v[4 * h + 1]);
            cs.z += __bfloat162float(out.v[4 * h + 2]), cs.w += __bfloat162float(out.v[4 * h + 3]);
            accs[q] = cs;
          }
        }
      }
    }
  }
  __syncthreads();
  // float4 q of an area holds channels ((q / 64) * 32 + q % 32) * 8 + ((q / 32) % 2) * 4 .. +3
  for (int q = threadIdx.x; q < kAreas * kArea; q += blockDim.x) {
    const int qa = q % kArea;  // q / kArea: 0 dw, 1 db, 2 dx_sum
    const int pack = (qa / (2 * kWarp)) * kWarp + qa % kWarp;
    if (pack >= packs) continue;
    float4 sum = make_float4(0, 0, 0, 0);
    for (int v = 0; v < warps; ++v) {
      const float4 t = shared4[v * kAreas * kArea + q];
      sum.x += t.x, sum.y += t.y, sum.z += t.z, sum.w += t.w;
    }
    float* const area[3] = {dw, db, dx_sum};
    float* dst = area[q / kArea] + pack * 8 + ((qa / kWarp) % 2) * 4;
    atomicAdd(reinterpret_cast<float4*>(dst), sum);  // C % 8 == 0, dw/db 16-byte aligned
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

// Both forwards (kResidual: s = a + b1 is written and normalised; without it s and b1 are null,
// and null passes the alignment check).
template <bool kResidual>
cudaError_t launch_layernorm_forward(bf16* s, bf16* y, float* mean, float* rstd, const bf16* a,
                                     const bf16* b1, const bf16* w, const bf16* b, std::int64_t N,
                                     std::int64_t C, cudaStream_t stream) {
  if (C > kMaxLayerNormChannels) return cudaErrorInvalidValue;
  if (C % 8 == 0 && aligned16_all({s, y, a, b1, w, b}))
    return dispatch_packs(C, [&]<int kPacks>() {
      layernorm_forward_vec_kernel<kResidual, kPacks><<<blocks_for(N, 8), 256, 0, stream>>>(
          s, y, mean, rstd, a, b1, w, b, N, static_cast<int>(C));
      return cudaSuccess;
    });
  return dispatch_per_lane(C, [&]<int kPerLane>() {
    layernorm_forward_kernel<kResidual, kPerLane><<<blocks_for(N, 8), 256, 0, stream>>>(
        s, y, mean, rstd, a, b1, w, b, N, static_cast<int>(C));
    return cudaSuccess;
  });
}

}  // namespace

cudaError_t layernorm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* w,
                              const bf16* b, std::int64_t N, std::int64_t C, cudaStream_t stream) {
  return launch_layernorm_forward<false>(nullptr, y, mean, rstd, x, nullptr, w, b, N, C, stream);
}
cudaError_t residual_layernorm_forward(bf16* s, bf16* y, float* mean, float* rstd, const bf16* a,
                                       const bf16* b1, const bf16* w, const bf16* b, std::int64_t N,
                                       std::int64_t C, cudaStream_t stream) {
  return launch_layernorm_forward<true>(s, y, mean, rstd, a, b1, w, b, N, C, stream);
}
namespace {

template <int kPacks, bool kSum>
cudaError_t launch_layernorm_backward_vec(bf16* dx, float* dw, float* db, float* dx_sum,
                                          const bf16* dy, const bf16* x, const bf16* w,
                                          const float* mean, const float* rstd, std::int64_t N,
                                          std::int64_t C, cudaStream_t stream) {
  constexpr std::size_t smem = layernorm_backward_smem_bytes<kPacks, kSum>();
  auto* kernel = layernorm_backward_vec_kernel<kPacks, kSum>;
  if constexpr (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  // as many blocks as fit on the GPU at once (each flushes its partial sums once)
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kLayerNormBackwardThreads,
                                                    smem) != cudaSuccess ||
      per_sm < 1)
    per_sm = 1;
  const unsigned blocks = std::min<unsigned>(blocks_for(N, kLayerNormBackwardThreads / kWarp),
                                             static_cast<unsigned>(multiprocessors() * per_sm));
  kernel<<<blocks, kLayerNormBackwardThreads, smem, stream>>>(dx, dw, db, dx_sum, dy, x, w, mean,
                                                              rstd, N, static_cast<int>(C));
  return cudaSuccess;
}

}  // namespace

cudaError_t layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dy, const bf16* x,
                               const bf16* w, const float* mean, const float* rstd, std::int64_t N,
                               std::int64_t C, cudaStream_t stream, float* dx_sum) {
  if (C > kMaxLayerNormChannels) return cudaErrorInvalidValue;
  if (C % 8 == 0 && aligned16_all({dx, dw, db, dx_sum, dy, x, w}))
    return dispatch_packs(C, [&]<int kPacks>() {
      return dx_sum != nullptr ? launch_layernorm_backward_vec<kPacks, true>(
                                     dx, dw, db, dx_sum, dy, x, w, mean, rstd, N, C, stream)
                               : launch_layernorm_backward_vec<kPacks, false>(
                                     dx, dw, db, nullptr, dy, x, w, mean, rstd, N, C, stream);
    });
  const unsigned blocks = std::min<unsigned>(blocks_for(N, 8), 132u * 2u);
  const cudaError_t e = dispatch_per_lane(C, [&]<int kPerLane>() {
    layernorm_backward_kernel<kPerLane><<<blocks, 256, 2 * C * sizeof(float), stream>>>(
        dx, dw, db, dy, x, w, mean, rstd, N, static_cast<int>(C));
    return cudaSuccess;
  });
  // the unaligned case: dx's column sums in a second pass
  if (e == cudaSuccess && dx_sum != nullptr) bias_backward(dx_sum, dx, N, C, stream);
  return e;
}

}  // namespace topolaunch::kernels::cuda
