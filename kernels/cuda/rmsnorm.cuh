// RMSNorm (eps 1e-5) and the fused residual-add + RMSNorm on the GPU: the CUDA twin of
// kernels/cpu/rmsnorm.hpp (rmsnorm.cu). One warp per row, any C (the row is read twice, from L1/L2
// the second time); the backward's dw is summed per block in shared memory: C <= 12288.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

// y (N,C) = x * rstd * w; rstd (N) saved for the backward.
cudaError_t rmsnorm_forward(__nv_bfloat16* y, float* rstd, const __nv_bfloat16* x,
                            const __nv_bfloat16* w, std::int64_t N, std::int64_t C,
                            cudaStream_t stream);
// s = a + b; y = rmsnorm(s) of s as stored in bf16 (what the backward reads back).
cudaError_t residual_rmsnorm_forward(__nv_bfloat16* s, __nv_bfloat16* y, float* rstd,
                                     const __nv_bfloat16* a, const __nv_bfloat16* b,
                                     const __nv_bfloat16* w, std::int64_t N, std::int64_t C,
                                     cudaStream_t stream);
// dx += rstd * (w dy - x rstd^2 mean(w dy x)); dw += sum_n dy x rstd.
cudaError_t rmsnorm_backward(__nv_bfloat16* dx, float* dw, const __nv_bfloat16* dy,
                             const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                             std::int64_t N, std::int64_t C, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
