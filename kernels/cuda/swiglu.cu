// SwiGLU of swiglu.cuh; the CUDA twin of kernels/cpu/swiglu.hpp. One thread per 8 channels in
// 16-byte packs when H % 8 == 0 and the pointers are aligned, else one per channel.
#include "swiglu.cuh"

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

// sigmoid(g) = 1 / (1 + e^-g), with e^-g clamped so that it cannot overflow.
__device__ __forceinline__ float sigmoid(float g) {
  return 1.0f / (1.0f + __expf(fminf(-g, 80.0f)));
}

__global__ void swiglu_forward_kernel(bf16* h, const bf16* gu, std::int64_t N, std::int64_t H) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N * H) return;
  const std::int64_t n = i / H, c = i % H;
  const float g = __bfloat162float(gu[n * 2 * H + c]), u = __bfloat162float(gu[n * 2 * H + H + c]);
  h[i] = __float2bfloat16(g * sigmoid(g) * u);
}

__global__ void swiglu_backward_kernel(bf16* dgu, const bf16* dh, const bf16* gu, std::int64_t N,
                                       std::int64_t H) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N * H) return;
  const std::int64_t n = i / H, c = i % H, gi = n * 2 * H + c, ui = gi + H;
  const float g = __bfloat162float(gu[gi]), u = __bfloat162float(gu[ui]);
  const float d = __bfloat162float(dh[i]), s = sigmoid(g);
  dgu[gi] = __float2bfloat16(__bfloat162float(dgu[gi]) + d * u * s * (1.0f + g * (1.0f - s)));
  dgu[ui] = __float2bfloat16(__bfloat162float(dgu[ui]) + d * g * s);
}

}  // namespace

cudaError_t swiglu_forward(bf16* h, const bf16* gu, std::int64_t N, std::int64_t H,
                           cudaStream_t stream) {
  if (N <= 0 || H <= 0) return cudaErrorInvalidValue;
  if (H % 8 == 0 && aligned16_all({h, gu})) {
    const std::int64_t per_row = H / 8;
    auto fn = [=] __device__(std::int64_t p) {
      const std::int64_t n = p / per_row, c = (p % per_row) * 8;
      const Pack8 g = load8(gu + n * 2 * H + c), u = load8(gu + n * 2 * H + H + c);
      Pack8 out;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float gv = __bfloat162float(g.v[k]);
        out.v[k] = __float2bfloat16(gv * sigmoid(gv) * __bfloat162float(u.v[k]));
      }
      store8(h + n * H + c, out);
    };
    elementwise8_kernel<<<blocks_for(N * per_row, 256), 256, 0, stream>>>(N * per_row, fn);
    return cudaGetLastError();
  }
  swiglu_forward_kernel<<<blocks_for(N * H, 256), 256, 0, stream>>>(h, gu, N, H);
  return cudaGetLastError();
}

cudaError_t swiglu_backward(bf16* dgu, const bf16* dh, const bf16* gu, std::int64_t N,
                            std::int64_t H, cudaStream_t stream) {
  if (N <= 0 || H <= 0) return cudaErrorInvalidValue;
  if (H % 8 == 0 && aligned16_all({dgu, dh, gu})) {
    const std::int64_t per_row = H / 8;
    auto fn = [=] __device__(std::int64_t p) {
      const std::int64_t n = p / per_row, c = (p % per_row) * 8;
      const std::int64_t gi = n * 2 * H + c, ui = gi + H;
      const Pack8 g = load8(gu + gi), u = load8(gu + ui), d = load8(dh + n * H + c);
      Pack8 dg = load8(dgu + gi), du = load8(dgu + ui);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float gv = __bfloat162float(g.v[k]), uv = __bfloat162float(u.v[k]),
                    dv = __bfloat162float(d.v[k]), s = sigmoid(gv);
        dg.v[k] =
            __float2bfloat16(__bfloat162float(dg.v[k]) + dv * uv * s * (1.0f + gv * (1.0f - s)));
        du.v[k] = __float2bfloat16(__bfloat162float(du.v[k]) + dv * gv * s);
      }
      store8(dgu + gi, dg);
      store8(dgu + ui, du);
    };
    elementwise8_kernel<<<blocks_for(N * per_row, 256), 256, 0, stream>>>(N * per_row, fn);
    return cudaGetLastError();
  }
  swiglu_backward_kernel<<<blocks_for(N * H, 256), 256, 0, stream>>>(dgu, dh, gu, N, H);
  return cudaGetLastError();
}

}  // namespace topolaunch::kernels::cuda
