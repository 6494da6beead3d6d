// CUDA twins of the CPU reference kernels (kernels/cpu/*.hpp): same names, same operand order and
// the same accumulate-into-gradient convention, for sm_90. Precision: activations and their
// gradients bf16, parameters read as a bf16 copy, parameter gradients, LayerNorm statistics, losses
// and optimizer state fp32 (fp32 master weights). Every kernel runs on the given stream and never
// synchronises with the host, so a whole step can be captured as one CUDA Graph; per-step scalars
// (loss scale, learning rate, step, clip) are read from device memory for the same reason.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace topolaunch::kernels::cuda {

using bf16 = __nv_bfloat16;

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; wpe may be null.
void encoder_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe,
                     std::int64_t B, std::int64_t T, std::int64_t C, cudaStream_t stream);
// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t] (fp32 atomics: order not fixed).
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const std::int32_t* tokens,
                      std::int64_t B, std::int64_t T, std::int64_t C, cudaStream_t stream);

// y (N,C) = layernorm(x) * w + b; mean, rstd (N) saved for the backward. eps 1e-5.
// The LayerNorm kernels hold a row in registers: C <= 1600, else cudaErrorInvalidValue.
cudaError_t layernorm_forward(bf16* y, float* mean, float* rstd, const bf16* x, const bf16* w,
                              const bf16* b, std::int64_t N, std::int64_t C, cudaStream_t stream);
// s = a + b1; y = layernorm(s) (one pass over memory).
cudaError_t residual_layernorm_forward(bf16* s, bf16* y, float* mean, float* rstd, const bf16* a,
                                       const bf16* b1, const bf16* w, const bf16* b, std::int64_t N,
                                       std::int64_t C, cudaStream_t stream);
// dx += ...; dw += sum_n dy*norm; db += sum_n dy.
cudaError_t layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dy, const bf16* x,
                               const bf16* w, const float* mean, const float* rstd, std::int64_t N,
                               std::int64_t C, cudaStream_t stream);

// GELU, tanh approximation. The backward accumulates: dx += dy * gelu'(x).
void gelu_forward(bf16* y, const bf16* x, std::int64_t n, cudaStream_t stream);
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, std::int64_t n, cudaStream_t stream);

void residual_forward(bf16* y, const bf16* a, const bf16* b, std::int64_t n, cudaStream_t stream);
void residual_backward(bf16* da, bf16* db, const bf16* dy, std::int64_t n, cudaStream_t stream);

// Softmax + cross-entropy over the first V of Vp logits. Rows go through the staged kernel
// (a persistent block per multiprocessor, the next rows copied into shared memory while the
// current one is computed) when Vp % 8 == 0, the pointers are 16-byte aligned and two rows fit in
// a block's shared memory (Vp <= ~57K on Hopper); else one block per row.
void crossentropy_forward(float* losses, const bf16* logits, const std::int32_t* targets,
                          std::int64_t N, std::int64_t V, std::int64_t Vp, cudaStream_t stream);
// dlogits = (softmax - onehot) * (*scale); dlogits may equal logits; padding columns get 0.
void crossentropy_backward(bf16* dlogits, const bf16* logits, const std::int32_t* targets,
                           const float* scale, std::int64_t N, std::int64_t V, std::int64_t Vp,
                           cudaStream_t stream);
// The fused classifier: losses and dlogits in one read of the logits (the probabilities are never
// written), dlogits may equal logits. Same results as the two kernels above.
void crossentropy_forward_backward(float* losses, bf16* dlogits, const bf16* logits,
                                   const std::int32_t* targets, const float* scale, std::int64_t N,
                                   std::int64_t V, std::int64_t Vp, cudaStream_t stream);
// The classifier kernels, for tests and benchmarks: automatic is what the functions above run;
// row_per_block is the earlier kernel (one block of 1024 threads per row, the row in registers);
// staged_* is the staged kernel with 1024 or 512 threads per block; staged_1024_half_exp keeps
// exp(x - max) as fp16 between its passes (one exponential per element instead of two, the
// gradient within an fp16 rounding of the others'). A staged kernel that cannot take the shape
// falls back to row_per_block. losses == nullptr: no losses; dlogits == nullptr: no gradient
// (scale is then unused). Returns the kernel that ran.
enum class ClassifierKernel {
  automatic,
  row_per_block,
  staged_1024,
  staged_512,
  staged_1024_half_exp
};
const char* classifier_kernel_name(ClassifierKernel kernel);  // "staged_1024", ...
ClassifierKernel crossentropy_with(ClassifierKernel kernel, float* losses, bf16* dlogits,
                                   const bf16* logits, const std::int32_t* targets,
                                   const float* scale, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, cudaStream_t stream);

// *sum_sq += sum g^2 (fp32 atomics; zero it first). sqrt_in_place turns it into the norm.
void sum_of_squares(float* sum_sq, const float* g, std::int64_t n, cudaStream_t stream);
void sqrt_in_place(float* x, cudaStream_t stream);

// AdamW on the fp32 master `param`; writes the bf16 working copy when param_bf16 is not null.
// scalars: the graph's ScalarSlot layout (learning rate, betas, eps, weight decay, step, clip);
// grad_norm: the global norm (clip scale = clip / norm when clip > 0 and norm > clip).
void adamw_update(float* param, bf16* param_bf16, float* m, float* v, const float* grad,
                  std::int64_t n, const float* scalars, const float* grad_norm, bool decayed,
                  cudaStream_t stream);

// ---- multi-tensor optimizer: one launch over a device table of tensors ---------------------
// One tensor of the table. The caller fills param/param_bf16/m/v/grad/n/decayed (param_bf16 may
// be null; for the global norm only grad and n matter); layout_multi_tensor fills the rest.
struct MultiTensorEntry {
  float* param = nullptr;
  bf16* param_bf16 = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* grad = nullptr;
  std::int64_t n = 0;
  std::int64_t n4 = 0;    // float4 packs (0 when a buffer is not 16-byte aligned: scalar path)
  std::int64_t tail = 0;  // elements after the packs, one per thread
  std::int64_t block_begin = 0;  // first block (AdamW) or chunk (norm) of this tensor
  std::int32_t decayed = 0;
};
enum class MultiTensorUse : std::uint8_t { adamw, global_norm };
// Fills n4, tail and block_begin; returns the launch's blocks (AdamW) or chunks (norm). The
// table is then copied to the device once (the arena's addresses do not change).
std::int64_t layout_multi_tensor(std::vector<MultiTensorEntry>& entries, MultiTensorUse use);
// AdamW over every tensor of the table in one launch; bit-identical to adamw_update per tensor.
void adamw_update_multi(const MultiTensorEntry* entries, int count, std::int64_t blocks,
                        const float* scalars, const float* grad_norm, cudaStream_t stream);
// *norm = sqrt(sum of g^2 over the table's gradients), in a fixed order (no atomics): the same
// gradients give the same bits on every run, every device and every rank. partials: a device
// buffer of kNormPartials floats. Overwrites *norm (no zeroing needed).
constexpr int kNormPartials = 1024;
void global_norm_multi(float* norm, float* partials, const MultiTensorEntry* entries, int count,
                       std::int64_t chunks, cudaStream_t stream);

// fp32 -> bf16 copy (parameters' working copy after init or load).
void to_bf16(bf16* out, const float* in, std::int64_t n, cudaStream_t stream);

// dbias (OC) += sum over the N rows of dy (N,OC).
void bias_backward(float* dbias, const bf16* dy, std::int64_t N, std::int64_t OC,
                   cudaStream_t stream);
// dbias (OC) += part (OC): the fused bias gradient (cuBLASLt's BGRADB writes part) accumulated.
void bias_grad_add(float* dbias, const float* part, std::int64_t OC, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
