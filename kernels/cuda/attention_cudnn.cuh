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
// The graphs are built through cuDNN's backend API (cudnnBackendCreateDescriptor / SetAttribute /
// Finalize in libcudnn itself, no frontend headers): the operation graphs that cuDNN's flash
// attention engines accept (matmul, scale, causal mask, softmax with its statistics, matmul; and
// the backward's recomputation), once per shape in create(). forward()/backward() build only a
// variant pack and enqueue (safe inside a CUDA Graph capture). Built when meson finds libcudnn 9
// (TOPOLAUNCH_WITH_CUDNN); otherwise create() says so. No exception leaves here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "topolaunch/common/result.hpp"

namespace topolaunch::kernels::cuda {

// Whether this build has the cuDNN implementation (meson found libcudnn 9 and cudnn.h).
bool cudnn_attention_built();

// Builds every tensor and operation descriptor of both graphs for (B,T,C,NH) and finalizes them,
// without a handle or a GPU (what can be checked on a build host): the first cuDNN refusal, with
// cuDNN's own message, or ok. The operation graphs themselves, the engines and the plans need a
// device (create()).
Status check_cudnn_attention_descriptors(std::int64_t B, std::int64_t T, std::int64_t C,
                                         std::int64_t NH);

class CudnnAttention {
 public:
  // A cuDNN handle and the forward + backward execution plans for (B,T,C,NH) on the current
  // device; an error (one line) when this build has no cuDNN, the library is missing or no engine
  // takes the graph.
  static Result<std::unique_ptr<CudnnAttention>> create(std::int64_t B, std::int64_t T,
                                                        std::int64_t C, std::int64_t NH);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Device workspace both calls need (the larger of the two): the engines' own workspace plus,
  // for the backward, its fp32 dQ accumulator and row sums (fused_attention_accumulator_bytes()
  // of plan.hpp, which the planner reserves); the caller owns it, 256-byte aligned.
  std::size_t workspace_bytes() const;
  // The engines' own part of workspace_bytes() (forward, backward).
  std::size_t forward_engine_workspace_bytes() const;
  std::size_t backward_engine_workspace_bytes() const;
  // "cuDNN 9.14.0, backend API, engines 8 (fwd) 9 (bwd)": the selected configurations' engines
  std::string version() const;

  // The engine configurations that finalized for each graph: cuDNN's heuristic list in its order
  // (at most 8), then other knob settings of the first one's engine (at most 16). The first is
  // selected at creation, as cuDNN's frontend would; the executor times them and selects the
  // fastest (workspace_bytes() and the *_engine_workspace_bytes() follow the selection). Not to
  // be changed while a captured graph holds the old plan.
  int candidates(bool backward) const;
  int selected(bool backward) const;
  std::int64_t candidate_engine(bool backward, int i) const;  // cuDNN's global engine index
  // "heuristics A #1", "engine 2 knobs 17=1,24=0" (cuDNN's knob type numbers)
  std::string candidate_description(bool backward, int i) const;
  void select(bool backward, int i);  // i clamped to the candidates

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
