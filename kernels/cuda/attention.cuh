// Causal multi-head self-attention on the GPU that never materialises the (T,T) scores in memory
// (the flash-attention schedule): the forward keeps only the output and the per-row log-sum-exp,
// the backward recomputes the probabilities tile by tile. The CUDA twin of
// kernels/cpu/attention.hpp with the same operand layout: qkv is (B,T,C+2KC) with q, k, v at
// channel offsets 0, C, C+KC (KC = NKV*hs; NKV = NH: (B,T,3C)), query head h uses channels
// [h*hs, (h+1)*hs) of q and key/value head h/(NH/NKV) of k and v, scores are scaled by 1/sqrt(hs).
// NKV = 0 (the default) is NH.
// Implemented in attention.cu; attention_cudnn.cuh is the second implementation of the same
// contract (through cuDNN).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace topolaunch::kernels::cuda {

// Head sizes the kernels are built for; others get cudaErrorInvalidValue.
bool attention_supported(std::int64_t C, std::int64_t NH);

// y (B,T,C) bf16; lse (B,NH,T) fp32: natural log of the sum over keys of exp(scaled score).
cudaError_t attention_forward(__nv_bfloat16* y, float* lse, const __nv_bfloat16* qkv,
                              std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                              cudaStream_t stream, std::int64_t NKV = 0);

// Bytes of scratch the backward needs (at most B*NH*T fp32: the row sums of dy*y).
std::size_t attention_backward_workspace_bytes(std::int64_t B, std::int64_t T, std::int64_t C,
                                               std::int64_t NH);

// dqkv (B,T,C+2KC) bf16 += the gradient (the graph's accumulate convention; dqkv is zeroed by the
// plan before its first contribution). workspace: attention_backward_workspace_bytes() bytes.
cudaError_t attention_backward(__nv_bfloat16* dqkv, void* workspace, const __nv_bfloat16* dy,
                               const __nv_bfloat16* qkv, const __nv_bfloat16* y, const float* lse,
                               std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                               cudaStream_t stream, std::int64_t NKV = 0);

// The implementations behind the functions above, selectable for tests and benchmarks (the
// executor uses attention_forward/attention_backward, which take the defaults of attention.cu).
// The tensor-core kinds differ in the forward only: tensor_core = blocks of 128 queries, 8 warps
// of 16 rows; tensor_core_m64 = 64 queries, 4 warps of 16 rows; tensor_core_w32 = 128 queries,
// 4 warps of 32 rows. They share the backward. tensor_core_atomic = tensor_core's forward and FA2's
// backward schedule (dQ by fp32 atomics, B*T*C*4 more workspace bytes: see
// attention_backward_workspace_bytes_with; multi-head only: NKV != NH is cudaErrorInvalidValue).
// Pointers not 16-byte aligned take the simple path.
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
                                   std::int64_t C, std::int64_t NH, cudaStream_t stream,
                                   std::int64_t NKV = 0);
cudaError_t attention_backward_with(AttentionKernel kind, __nv_bfloat16* dqkv, void* workspace,
                                    const __nv_bfloat16* dy, const __nv_bfloat16* qkv,
                                    const __nv_bfloat16* y, const float* lse, std::int64_t B,
                                    std::int64_t T, std::int64_t C, std::int64_t NH,
                                    cudaStream_t stream, std::int64_t NKV = 0);

// Decoding with a KV cache, the twin of kernels/cpu/attention.hpp's attention_cached_forward: y
// (C) = the attention of position t's q (C) over rows 0..t of k_cache and v_cache ((rows, C) each,
// head h at [h*hs, (h+1)*hs)), one block per head, scores in shared memory (t + 1 <= 8192), fp32
// softmax. Any head size up to 256.
cudaError_t attention_cached_forward(__nv_bfloat16* y, const __nv_bfloat16* q,
                                     const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                     std::int64_t t, std::int64_t C, std::int64_t NH,
                                     cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
