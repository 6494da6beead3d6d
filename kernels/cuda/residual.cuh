// The residual add on the GPU: the CUDA twin of kernels/cpu/residual.hpp (residual.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

// y = a + b.
void residual_forward(__nv_bfloat16* y, const __nv_bfloat16* a, const __nv_bfloat16* b,
                      std::int64_t n, cudaStream_t stream);
// da += dy; db += dy (the gradient fans out to both branches).
void residual_backward(__nv_bfloat16* da, __nv_bfloat16* db, const __nv_bfloat16* dy,
                       std::int64_t n, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
