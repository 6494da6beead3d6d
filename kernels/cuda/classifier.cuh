// Softmax + cross-entropy over the first V of Vp logits on the GPU: the CUDA twin of
// kernels/cpu/classifier.hpp (classifier.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

// Rows go through the staged kernel (a persistent block per multiprocessor, the next rows copied
// into shared memory while the current one is computed) when Vp % 8 == 0, the pointers are
// 16-byte aligned and two rows fit in a block's shared memory (Vp <= ~57K on Hopper); else one
// block per row.
void crossentropy_forward(float* losses, const __nv_bfloat16* logits, const std::int32_t* targets,
                          std::int64_t N, std::int64_t V, std::int64_t Vp, cudaStream_t stream);
// dlogits = (softmax - onehot) * (*scale); dlogits may equal logits; padding columns get 0.
void crossentropy_backward(__nv_bfloat16* dlogits, const __nv_bfloat16* logits,
                           const std::int32_t* targets, const float* scale, std::int64_t N,
                           std::int64_t V, std::int64_t Vp, cudaStream_t stream);
// The fused classifier: losses and dlogits in one read of the logits (the probabilities are never
// written), dlogits may equal logits. Same results as the two kernels above.
void crossentropy_forward_backward(float* losses, __nv_bfloat16* dlogits,
                                   const __nv_bfloat16* logits, const std::int32_t* targets,
                                   const float* scale, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, cudaStream_t stream);

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
ClassifierKernel crossentropy_with(ClassifierKernel kernel, float* losses, __nv_bfloat16* dlogits,
                                   const __nv_bfloat16* logits, const std::int32_t* targets,
                                   const float* scale, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
