// GELU, tanh approximation, on the GPU: the CUDA twin of kernels/cpu/gelu.hpp (gelu.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

// y = gelu(x).
void gelu_forward(__nv_bfloat16* y, const __nv_bfloat16* x, std::int64_t n, cudaStream_t stream);
// The backward accumulates: dx += dy * gelu'(x).
void gelu_backward(__nv_bfloat16* dx, const __nv_bfloat16* dy, const __nv_bfloat16* x,
                   std::int64_t n, cudaStream_t stream);
// dx = dy * gelu'(x), OVERWRITING dx: the backward for a gradient whose first contribution this
// is (the executor then skips the plan's zero: one write instead of a memset and a
// read-modify-write). gelu' in the tanh form, as gelu_backward's scalar kernel.
void gelu_backward_overwrite(__nv_bfloat16* dx, const __nv_bfloat16* dy, const __nv_bfloat16* x,
                             std::int64_t n, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
