// The global gradient norm (for clipping) and AdamW on the GPU, on fp32 master weights with a bf16
// working copy: the CUDA twin of kernels/cpu/adamw.hpp (adamw.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace topolaunch::kernels::cuda {

// *sum_sq += sum g^2 (fp32 atomics; zero it first). sqrt_in_place turns it into the norm.
void sum_of_squares(float* sum_sq, const float* g, std::int64_t n, cudaStream_t stream);
void sqrt_in_place(float* x, cudaStream_t stream);

// AdamW on the fp32 master `param`; writes the bf16 working copy when param_bf16 is not null.
// scalars: the graph's ScalarSlot layout (learning rate, betas, eps, weight decay, step, clip);
// grad_norm: the global norm (clip scale = clip / norm when clip > 0 and norm > clip).
void adamw_update(float* param, __nv_bfloat16* param_bf16, float* m, float* v, const float* grad,
                  std::int64_t n, const float* scalars, const float* grad_norm, bool decayed,
                  cudaStream_t stream);

// ---- multi-tensor optimizer: one launch over a device table of tensors ---------------------
// One tensor of the table. The caller fills param/param_bf16/m/v/grad/n/decayed (param_bf16 may
// be null; for the global norm only grad and n matter); layout_multi_tensor fills the rest.
struct MultiTensorEntry {
  float* param = nullptr;
  __nv_bfloat16* param_bf16 = nullptr;
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
// After the step's global norm, before AdamW: a non-finite *norm adds 1 to *skipped (AdamW then
// leaves every parameter and moment as it was: the step is skipped), and scalars[kStep] -= *skipped
// (bias correction counts the steps applied).
void optimizer_step_guard(float* scalars, const float* norm, float* skipped, cudaStream_t stream);
void global_norm_multi(float* norm, float* partials, const MultiTensorEntry* entries, int count,
                       std::int64_t chunks, cudaStream_t stream);

// The same sum of squares without the square root (*sum_sq overwritten): a sharded plan's
// partial sum, added over the ranks before sqrt_in_place.
void sum_of_squares_multi(float* sum_sq, float* partials, const MultiTensorEntry* entries,
                          int count, std::int64_t chunks, cudaStream_t stream);
// dst[0..n) += src[0..n) (fp32): a reduce-scattered segment into the gradient shard (ZeRO-2/3).
void add_in_place(float* dst, const float* src, std::int64_t n, cudaStream_t stream);

// fp32 -> bf16 copy: the parameters' working copy after init or load (AdamW writes it after each
// update).
void to_bf16(__nv_bfloat16* out, const float* in, std::int64_t n, cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
