// Token + position embedding on the GPU: the CUDA twin of kernels/cpu/encoder.hpp (encoder.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; wpe may be null.
void encoder_forward(__nv_bfloat16* out, const std::int32_t* tokens, const __nv_bfloat16* wte,
                     const __nv_bfloat16* wpe, std::int64_t B, std::int64_t T, std::int64_t C,
                     cudaStream_t stream);
// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t] (fp32 atomics: order not fixed).
void encoder_backward(float* dwte, float* dwpe, const __nv_bfloat16* dout,
                      const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::int64_t C,
                      cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
