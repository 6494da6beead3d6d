// RMSNorm and the fused residual-add + RMSNorm of rmsnorm.cuh; the CUDA twin of
// kernels/cpu/rmsnorm.hpp. One warp per row: lane l takes channels l, l+32, ... (8 at a time in
// 16-byte packs when C % 8 == 0 and the pointers are aligned).
#include "rmsnorm.cuh"

#include <algorithm>

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

constexpr float kRmsNormEpsilon = 1e-5f;
constexpr int kRowsPerBlock = 8;                      // warps
constexpr std::int64_t kMaxBackwardChannels = 12288;  // dw of a block in 48 KiB of shared memory

template <bool kResidual, bool kVec>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    rmsnorm_forward_kernel(bf16* s, bf16* y, float* rstd, const bf16* a, const bf16* b,
                           const bf16* w, std::int64_t N, int C) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t row =
      blockIdx.x * static_cast<std::int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  if (row >= N) return;
  const bf16* ar = a + row * C;
  float ss = 0;
  if constexpr (kVec) {
    for (int p = lane; p < C / 8; p += kWarp) {
      Pack8 v = load8(ar + p * 8);
      if constexpr (kResidual) {
        const Pack8 u = load8(b + row * C + p * 8);
#pragma unroll
        for (int k = 0; k < 8; ++k)
          v.v[k] = __float2bfloat16(__bfloat162float(v.v[k]) + __bfloat162float(u.v[k]));
        store8(s + row * C + p * 8, v);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) ss += __bfloat162float(v.v[k]) * __bfloat162float(v.v[k]);
    }
  } else {
    for (int c = lane; c < C; c += kWarp) {
      float v = __bfloat162float(ar[c]);
      if constexpr (kResidual) {
        const bf16 sv = __float2bfloat16(v + __bfloat162float(b[row * C + c]));
        s[row * C + c] = sv;
        v = __bfloat162float(sv);
      }
      ss += v * v;
    }
  }
  const float r = rsqrtf(warp_sum(ss) / static_cast<float>(C) + kRmsNormEpsilon);
  const bf16* xr = kResidual ? s + row * C : ar;  // the sum as stored
  bf16* yr = y + row * C;
  if constexpr (kVec) {
    for (int p = lane; p < C / 8; p += kWarp) {
      const Pack8 v = load8(xr + p * 8), wv = load8(w + p * 8);
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k)
        out.v[k] = __float2bfloat16(__bfloat162float(v.v[k]) * r * __bfloat162float(wv.v[k]));
      store8(yr + p * 8, out);
    }
  } else {
    for (int c = lane; c < C; c += kWarp)
      yr[c] = __float2bfloat16(__bfloat162float(xr[c]) * r * __bfloat162float(w[c]));
  }
  if (lane == 0) rstd[row] = r;
}

// Block: 8 warps over a grid-stride loop of rows (warp per row); dw summed per block in shared
// memory, then one atomicAdd per channel per block.
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    rmsnorm_backward_kernel(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                            const float* rstd, std::int64_t N, int C) {
  extern __shared__ float sdw[];
  for (int c = threadIdx.x; c < C; c += blockDim.x) sdw[c] = 0;
  __syncthreads();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kRowsPerBlock) + warp; row < N;
       row += static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock) {
    const bf16* dyr = dy + row * C;
    const bf16* xr = x + row * C;
    const float r = rstd[row];
    float dot = 0;
    for (int c = lane; c < C; c += kWarp)
      dot += __bfloat162float(w[c]) * __bfloat162float(dyr[c]) * __bfloat162float(xr[c]);
    const float k = warp_sum(dot) / static_cast<float>(C) * r * r;
    bf16* dxr = dx + row * C;
    for (int c = lane; c < C; c += kWarp) {
      const float d = __bfloat162float(dyr[c]), xv = __bfloat162float(xr[c]);
      const float g = (__bfloat162float(w[c]) * d - xv * k) * r;
      dxr[c] = __float2bfloat16(__bfloat162float(dxr[c]) + g);
      atomicAdd(&sdw[c], d * xv * r);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dw[c], sdw[c]);
}

}  // namespace

cudaError_t rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* w, std::int64_t N,
                            std::int64_t C, cudaStream_t stream) {
  if (N <= 0 || C <= 0 || C > (std::int64_t{1} << 30)) return cudaErrorInvalidValue;
  const unsigned blocks = blocks_for(N, kRowsPerBlock);
  if (C % 8 == 0 && aligned16_all({y, x, w}))
    rmsnorm_forward_kernel<false, true><<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
        nullptr, y, rstd, x, nullptr, w, N, static_cast<int>(C));
  else
    rmsnorm_forward_kernel<false, false><<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
        nullptr, y, rstd, x, nullptr, w, N, static_cast<int>(C));
  return cudaGetLastError();
}

cudaError_t residual_rmsnorm_forward(bf16* s, bf16* y, float* rstd, const bf16* a, const bf16* b,
                                     const bf16* w, std::int64_t N, std::int64_t C,
                                     cudaStream_t stream) {
  if (N <= 0 || C <= 0 || C > (std::int64_t{1} << 30)) return cudaErrorInvalidValue;
  const unsigned blocks = blocks_for(N, kRowsPerBlock);
  if (C % 8 == 0 && aligned16_all({s, y, a, b, w}))
    rmsnorm_forward_kernel<true, true>
        <<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(s, y, rstd, a, b, w, N, static_cast<int>(C));
  else
    rmsnorm_forward_kernel<true, false>
        <<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(s, y, rstd, a, b, w, N, static_cast<int>(C));
  return cudaGetLastError();
}

cudaError_t rmsnorm_backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                             const float* rstd, std::int64_t N, std::int64_t C,
                             cudaStream_t stream) {
  if (N <= 0 || C <= 0 || C > kMaxBackwardChannels) return cudaErrorInvalidValue;
  // Enough blocks to fill the device, each taking a share of the rows (fewer dw atomics).
  const std::int64_t want = 4 * static_cast<std::int64_t>(multiprocessors());
  const unsigned blocks =
      static_cast<unsigned>(std::min<std::int64_t>(want, (N + kRowsPerBlock - 1) / kRowsPerBlock));
  rmsnorm_backward_kernel<<<blocks, kRowsPerBlock * kWarp,
                            static_cast<std::size_t>(C) * sizeof(float), stream>>>(
      dx, dw, dy, x, w, rstd, N, static_cast<int>(C));
  return cudaGetLastError();
}

}  // namespace topolaunch::kernels::cuda
