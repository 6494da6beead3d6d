// Rotary position embeddings on q and k (LLaMA's interleaved pairs), v passed through: the CUDA
// twin of kernels/cpu/rope.hpp (rope.cu). qkv is (B,T,C+2KC), KC = C/NH*NKV, bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

// out = rotate(qkv) (v copied).
cudaError_t rope_forward(__nv_bfloat16* out, const __nv_bfloat16* qkv, std::int64_t B,
                         std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV,
                         double theta, cudaStream_t stream);
// dqkv += rotate^T(dout) (dv += dout's v).
cudaError_t rope_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, std::int64_t B,
                          std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV,
                          double theta, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
