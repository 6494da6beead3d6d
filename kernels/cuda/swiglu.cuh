// SwiGLU on the GPU: h = silu(g) * u over rows of gu = [g | u] (N, 2H), bf16. The CUDA twin of
// kernels/cpu/swiglu.hpp (swiglu.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

cudaError_t swiglu_forward(__nv_bfloat16* h, const __nv_bfloat16* gu, std::int64_t N,
                           std::int64_t H, cudaStream_t stream);
// dgu += d(h)/d(gu) . dh.
cudaError_t swiglu_backward(__nv_bfloat16* dgu, const __nv_bfloat16* dh, const __nv_bfloat16* gu,
                            std::int64_t N, std::int64_t H, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
