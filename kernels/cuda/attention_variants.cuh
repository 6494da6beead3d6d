// The implementations behind attention.cuh, selectable for the test and the benchmark (not part of
// the executor's interface: it uses attention_forward/attention_backward, which take the default).
// The tensor-core kinds differ in the forward only: tensor_core = blocks of 128 queries, 8 warps
// of 16 rows; tensor_core_m64 = 64 queries, 4 warps of 16 rows; tensor_core_w32 = 128 queries,
// 4 warps of 32 rows. They share the backward. tensor_core_atomic = tensor_core's forward and FA2's
// backward schedule (dQ by fp32 atomics, B*T*C*4 more workspace bytes: see
// attention_backward_workspace_bytes_with). Pointers not 16-byte aligned take the simple path.
#pragma once

#include "attention.cuh"

namespace topolaunch::kernels::cuda {

enum class AttentionKernel {
  simple,
  tensor_core,
  tensor_core_m64,
  tensor_core_w32,
  tensor_core_atomic
};
std::size_t attention_backward_workspace_bytes_with(AttentionKernel kind, std::int64_t B,
                                                    std::int64_t T, std::int64_t C,
                                                    std::int64_t NH);
cudaError_t attention_forward_with(AttentionKernel kind, __nv_bfloat16* y, float* lse,
                                   const __nv_bfloat16* qkv, std::int64_t B, std::int64_t T,
                                   std::int64_t C, std::int64_t NH, cudaStream_t stream);
cudaError_t attention_backward_with(AttentionKernel kind, __nv_bfloat16* dqkv, void* workspace,
                                    const __nv_bfloat16* dy, const __nv_bfloat16* qkv,
                                    const __nv_bfloat16* y, const float* lse, std::int64_t B,
                                    std::int64_t T, std::int64_t C, std::int64_t NH,
                                    cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
