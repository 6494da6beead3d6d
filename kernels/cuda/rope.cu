// Rotary embeddings of rope.cuh; the CUDA twin of kernels/cpu/rope.hpp. One thread per channel
// pair of the q and k heads and per v pair; the angle t * theta^(-2i/hs) and its cos/sin in
// double (as the CPU twin), the rotation in fp32.
#include "rope.cuh"

#include <cmath>

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

// direction +1: rotate; -1: the transpose (the backward), accumulating into out.
template <bool kAccumulate>
__global__ void rope_kernel(bf16* out, const bf16* in, std::int64_t rows, int T, int C, int hs,
                            int NH, int NKV, double log2_theta, float sign) {
  const int KC = hs * NKV, W = C + 2 * KC, half = hs / 2;
  const std::int64_t pairs_per_row = static_cast<std::int64_t>(W / 2);
  const std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= rows * pairs_per_row) return;
  const std::int64_t row = idx / pairs_per_row;
  const int pair = static_cast<int>(idx % pairs_per_row);
  const std::int64_t at = row * W + 2 * pair;
  const float x0 = __bfloat162float(in[at]), x1 = __bfloat162float(in[at + 1]);
  float y0 = x0, y1 = x1;
  if (2 * pair < C + KC) {  // a q or k head: rotate (v pairs pass through)
    const int i = pair % half;
    const int t = static_cast<int>(row % T);
    const double angle = static_cast<double>(t) * exp2(-2.0 * i / hs * log2_theta);
    double s, c;
    sincos(angle, &s, &c);
    const float cf = static_cast<float>(c), sf = sign * static_cast<float>(s);
    y0 = x0 * cf - x1 * sf;
    y1 = x0 * sf + x1 * cf;
  }
  if constexpr (kAccumulate) {
    y0 += __bfloat162float(out[at]);
    y1 += __bfloat162float(out[at + 1]);
  }
  out[at] = __float2bfloat16(y0);
  out[at + 1] = __float2bfloat16(y1);
}

bool shape_ok(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV) {
  return B > 0 && T > 0 && NH > 0 && NKV > 0 && C % NH == 0 && (C / NH) % 2 == 0 && NH % NKV == 0 &&
         T < (std::int64_t{1} << 30) && C + 2 * (C / NH * NKV) < (1 << 30);
}

}  // namespace

cudaError_t rope_forward(bf16* out, const bf16* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                         std::int64_t NH, std::int64_t NKV, double theta, cudaStream_t stream) {
  if (!shape_ok(B, T, C, NH, NKV) || theta <= 1.0) return cudaErrorInvalidValue;
  const std::int64_t W = C + 2 * (C / NH * NKV), n = B * T * (W / 2);
  rope_kernel<false><<<blocks_for(n, 256), 256, 0, stream>>>(
      out, qkv, B * T, static_cast<int>(T), static_cast<int>(C), static_cast<int>(C / NH),
      static_cast<int>(NH), static_cast<int>(NKV), std::log2(theta), 1.0f);
  return cudaGetLastError();
}

cudaError_t rope_backward(bf16* dqkv, const bf16* dout, std::int64_t B, std::int64_t T,
                          std::int64_t C, std::int64_t NH, std::int64_t NKV, double theta,
                          cudaStream_t stream) {
  if (!shape_ok(B, T, C, NH, NKV) || theta <= 1.0) return cudaErrorInvalidValue;
  const std::int64_t W = C + 2 * (C / NH * NKV), n = B * T * (W / 2);
  rope_kernel<true><<<blocks_for(n, 256), 256, 0, stream>>>(
      dqkv, dout, B * T, static_cast<int>(T), static_cast<int>(C), static_cast<int>(C / NH),
      static_cast<int>(NH), static_cast<int>(NKV), std::log2(theta), -1.0f);
  return cudaGetLastError();
}

}  // namespace topolaunch::kernels::cuda
