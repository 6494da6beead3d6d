// FP8 operands of the GEMMs of train.precision = "fp8" (matmul.cuh's *_fp8 calls): bf16 tensors
// cast to E4M3 (activations, weights) or E5M2 (activation gradients) with a per-tensor scale from
// the amax history of the cast site (delayed scaling: the scale comes from earlier steps, so one
// pass over the tensor casts it and measures it).
//
// Each cast site (an operand of one GEMM op of the plan) keeps an Fp8Scaling in device memory: the
// amax of |x| per step in a ring of kFp8History slots indexed by the step number the kernels read
// from the arena's scalars (the host writes it before every step; all micro-batches of one
// optimizer step share it). A cast reads every slot but the current and the next one, takes
// scale = fp8 max / their max (1 while they are all 0), writes saturate(x * scale), folds |x| into
// the current slot (atomic max over the blocks) and clears the next one, which the next step
// makes current. No host synchronisation: the casts are captured with the step's CUDA Graph.
// A slot is never poisoned: a non-finite |x| (a step whose gradients overflowed, skipped by the
// optimizer) is not folded into the history.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace topolaunch::kernels::cuda {

enum class Fp8Format : std::uint8_t { e4m3, e5m2 };
const char* fp8_format_name(Fp8Format format);  // "E4M3", "E5M2"
float fp8_format_max(Fp8Format format);         // 448, 57344

constexpr int kFp8History = 16;

// 128-byte aligned, scale_inv first: cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED) a scale
// pointer that is not 16-byte aligned.
struct alignas(128) Fp8Scaling {
  float scale_inv;  // 1 / scale of the latest cast: the GEMM's A or B scale pointer
  float reserved[3];
  float amax[kFp8History];  // max |x| of the casts of step s in slot s % kFp8History
};

// out (n bytes) = fp8(x * scale) with the site's delayed scale (above); step: the arena's
// scalars[kStep]. n % 16 == 0 and 16-byte aligned pointers take the vector path.
void fp8_cast(void* out, const __nv_bfloat16* x, std::int64_t n, Fp8Format format,
              Fp8Scaling* scaling, const float* step, cudaStream_t stream);
// The same for the transpose: out (cols, rows) row-major from x (rows, cols) row-major (w^T of a
// dgrad GEMM, x^T and dy^T of a wgrad GEMM: cuBLASLt's FP8 kernels take A only transposed and B
// only as it is).
void fp8_cast_transpose(void* out, const __nv_bfloat16* x, std::int64_t rows, std::int64_t cols,
                        Fp8Format format, Fp8Scaling* scaling, const float* step,
                        cudaStream_t stream);
// Both at once from one read of x: out (rows, cols) and out_t (cols, rows), row-major, one scale
// (the operands of a backward's dgrad and wgrad GEMMs: dy and dy^T, or x and x^T).
void fp8_cast_dual(void* out, void* out_t, const __nv_bfloat16* x, std::int64_t rows,
                   std::int64_t cols, Fp8Format format, Fp8Scaling* scaling, const float* step,
                   cudaStream_t stream);
// The first cast of a site (its history is empty): max |x| goes into the previous step's slot, so
// that the cast right after scales by the tensor itself instead of by 1.
void fp8_calibrate(const __nv_bfloat16* x, std::int64_t n, Fp8Scaling* scaling, const float* step,
                   cudaStream_t stream);

}  // namespace topolaunch::kernels::cuda
