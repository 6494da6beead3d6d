// LayerNorm (eps 1e-5) and the fused residual-add + LayerNorm on the GPU: the CUDA twin of
// kernels/cpu/layernorm.hpp (layernorm.cu). The kernels hold a row in registers: C <= 1600, else
// cudaErrorInvalidValue.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

// y (N,C) = layernorm(x) * w + b; mean, rstd (N) saved for the backward.
cudaError_t layernorm_forward(__nv_bfloat16* y, float* mean, float* rstd, const __nv_bfloat16* x,
                              const __nv_bfloat16* w, const __nv_bfloat16* b, std::int64_t N,
                              std::int64_t C, cudaStream_t stream);
// s = a + b1; y = layernorm(s) (one pass over memory).
cudaError_t residual_layernorm_forward(__nv_bfloat16* s, __nv_bfloat16* y, float* mean, float* rstd,
                                       const __nv_bfloat16* a, const __nv_bfloat16* b1,
                                       const __nv_bfloat16* w, const __nv_bfloat16* b,
                                       std::int64_t N, std::int64_t C, cudaStream_t stream);
// dx += ...; dw += sum_n dy*norm; db += sum_n dy. With dx_sum, also dx_sum (C) += the column
// sums of dx as written (bf16): in a transformer dx is the residual stream's gradient, whose
// column sums are the bias gradient of the projection feeding that stream (read here at no extra
// pass over dx).
cudaError_t layernorm_backward(__nv_bfloat16* dx, float* dw, float* db, const __nv_bfloat16* dy,
                               const __nv_bfloat16* x, const __nv_bfloat16* w, const float* mean,
                               const float* rstd, std::int64_t N, std::int64_t C,
                               cudaStream_t stream, float* dx_sum = nullptr);

}  // namespace topolaunch::kernels::cuda
