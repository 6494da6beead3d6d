// The encoder (token + position embedding) of encoder.cuh; the twin of kernels/cpu/encoder.hpp.
#include "encoder.cuh"

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {
namespace {

// out = wte[token] + wpe[t]: one thread per element (C % 8 != 0 or an unaligned pointer).
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

// The same, one thread per 16-byte pack of the output.
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

// dwte[token] += dout, dwpe[t] += dout: one thread per element, fp32 atomics for both.
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

// The same, one thread per (t, 16-byte pack of channels) walks the B rows of that t:
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

}  // namespace topolaunch::kernels::cuda
