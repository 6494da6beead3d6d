// GEMMs of the matmul ops through cuBLASLt: bf16 inputs, fp32 accumulation, the forward bias
// fused as an epilogue. Descriptors, layouts and the chosen algorithm are built once per shape
// and cached (llm.c rebuilds them on every call); the workspace is allocated once, so the calls
// can be captured in a CUDA Graph.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace topolaunch::kernels::cuda {

class Matmul {
 public:
  // Creates the cuBLASLt handle and a 32 MiB workspace (Hopper kernels want it).
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Empty when construction worked, else what failed.
  const std::string& error() const { return error_; }

  // y (N,OC) = x (N,C) @ w(OC,C)^T + bias; bias may be null.
  cublasStatus_t matmul_forward(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                const __nv_bfloat16* bias, std::int64_t N, std::int64_t C,
                                std::int64_t OC, cudaStream_t stream);
  // dx (bf16) += dy @ w; dw (fp32) += dy^T @ x; dbias (fp32) += column sums of dy (when not
  // null). dx may be null (the first layer's input needs no gradient). overwrite_dx: dx = dy @ w
  // (beta 0: dx is not read, so it needs no zeroing; same bits as += into zeros).
  cublasStatus_t matmul_backward(__nv_bfloat16* dx, float* dw, float* dbias,
                                 const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                 const __nv_bfloat16* w, std::int64_t N, std::int64_t C,
                                 std::int64_t OC, cudaStream_t stream, bool overwrite_dx = false);

  // GELU fused into the GEMM's epilogue (CUBLASLT_EPILOGUE_GELU_AUX[_BIAS], tanh GELU):
  // pre (N,OC) = x @ w^T + bias (the GELU input, kept for the backward), y (N,OC) = gelu(pre);
  // bias may be null. OC % 8 == 0 (cuBLASLt's rule for the auxiliary matrix).
  cublasStatus_t matmul_forward_gelu(__nv_bfloat16* y, __nv_bfloat16* pre, const __nv_bfloat16* x,
                                     const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                     std::int64_t N, std::int64_t C, std::int64_t OC,
                                     cudaStream_t stream);
  // The backward of y = gelu(pre) @ w^T + bias with GELU's derivative fused into the dx GEMM
  // (CUBLASLT_EPILOGUE_DGELU): dpre (N,C) = (dy @ w) * gelu'(pre), OVERWRITTEN (not +=, unlike
  // matmul_backward's dx); dw (fp32) += dy^T @ gelu(pre) where x = gelu(pre) is passed in;
  // dbias += column sums of dy (when not null). C % 8 == 0.
  cublasStatus_t matmul_backward_dgelu(__nv_bfloat16* dpre, float* dw, float* dbias,
                                       const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                       const __nv_bfloat16* pre, const __nv_bfloat16* w,
                                       std::int64_t N, std::int64_t C, std::int64_t OC,
                                       cudaStream_t stream);

 private:
  struct Gemm;  // one cached descriptor set
  // D (m,n, column-major) = alpha op(A) op(B) + beta C; C and D are the same buffer.
  // aux (bf16, leading dimension ldd): the GELU input written (GELU_AUX) or read (DGELU).
  cublasStatus_t gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      const void* a, std::int64_t lda, const void* b, std::int64_t ldb, void* d,
                      std::int64_t ldd, cudaDataType_t d_type, float beta, const void* bias,
                      cudaStream_t stream,
                      cublasLtEpilogue_t gelu_epilogue = CUBLASLT_EPILOGUE_DEFAULT,
                      const void* aux = nullptr);

  using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t, int, bool, int>;
  std::map<Key, std::unique_ptr<Gemm>> cache_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = std::size_t{32} << 20;
  std::string error_;
};

}  // namespace topolaunch::kernels::cuda
