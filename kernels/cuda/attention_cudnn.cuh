// Causal multi-head self-attention through cuDNN's fused flash attention (SDPA), the second
// implementation beside our own kernels (attention.cuh); the executor times both on the plan's
// shape and keeps the faster (CudaExecutorOptions::attention).
//
// The operand contract is attention.cuh's: qkv (B,T,3C) bf16 with q, k, v at channel offsets
// 0, C, 2C and head h in channels [h*hs, (h+1)*hs); y (B,T,C) bf16; lse (B,NH,T) fp32, the natural
// log of the sum over keys of exp(scaled score) (cuDNN's "Stats" output: the same quantity, so a
// forward of one implementation feeds a backward of the other); scale 1/sqrt(hs); causal.
// ONE difference: backward() OVERWRITES dqkv (cuDNN writes dQ, dK, dV), where our
// attention_backward accumulates; the executor uses it only where the attention backward is the
// first writer of dqkv after the plan's zero.
//
// The cuDNN graphs (forward with Stats, backward) are built once per shape in create(): nothing is
// built, planned or allocated in forward()/backward(), which only enqueue (safe inside a CUDA
// Graph capture). Built only when meson's cudnn_frontend_dir names the cuDNN frontend headers
// (TOPOLAUNCH_WITH_CUDNN); otherwise create() says how to enable it. No exception leaves here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "topolaunch/common/result.hpp"

namespace topolaunch::kernels::cuda {

// Whether this build has the cuDNN implementation (meson -Dcudnn_frontend_dir=...).
bool cudnn_attention_built();

class CudnnAttention {
 public:
  // A cuDNN handle and the forward + backward graphs for (B,T,C,NH) on the current device; an
  // error (one line) when this build has no cuDNN, the library is missing or refuses the shape.
  static Result<std::unique_ptr<CudnnAttention>> create(std::int64_t B, std::int64_t T,
                                                        std::int64_t C, std::int64_t NH);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Device workspace both calls need (the larger of the two graphs'); the caller owns it.
  std::size_t workspace_bytes() const;
  // "cuDNN 9.14.0, frontend 1.23.0"
  std::string version() const;

  // y, lse from qkv (the shape given to create()).
  Status forward(__nv_bfloat16* y, float* lse, const __nv_bfloat16* qkv, void* workspace,
                 cudaStream_t stream) const;
  // dqkv = the gradient (OVERWRITTEN, see above) from dy, qkv, y and lse.
  Status backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dy, const __nv_bfloat16* qkv,
                  const __nv_bfloat16* y, const float* lse, void* workspace,
                  cudaStream_t stream) const;

 private:
  struct Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace topolaunch::kernels::cuda
