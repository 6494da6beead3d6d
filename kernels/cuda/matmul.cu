#include "matmul.cuh"

#include "cuda_kernels.cuh"

namespace topolaunch::kernels::cuda {

struct Matmul::Gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool have_algo = false;
  ~Gemm() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

Matmul::Matmul() {
  if (cublasLtCreate(&handle_) != CUBLAS_STATUS_SUCCESS) {
    error_ = "cublasLtCreate failed: is a GPU visible and libcublasLt installed?";
    return;
  }
  if (cudaMalloc(&workspace_, workspace_bytes_) != cudaSuccess) {
    error_ = "cudaMalloc of the 32 MiB cuBLASLt workspace failed";
    workspace_ = nullptr;
  }
}

Matmul::~Matmul() {
  cache_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

#define TL_LT_CHECK(call)                                 \
  do {                                                    \
    const cublasStatus_t status_ = (call);                \
    if (status_ != CUBLAS_STATUS_SUCCESS) return status_; \
  } while (0)

cublasStatus_t Matmul::gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                            std::int64_t k, const void* a, std::int64_t lda, const void* b,
                            std::int64_t ldb, void* d, std::int64_t ldd, cudaDataType_t d_type,
                            float beta, const void* bias, cudaStream_t stream,
                            cublasLtEpilogue_t gelu_epilogue, const void* aux) {
  if (handle_ == nullptr || workspace_ == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool with_gelu = gelu_epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  const Key key{trans_a,
                trans_b,
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                static_cast<int>(d_type),
                bias != nullptr,
                static_cast<int>(gelu_epilogue)};
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    auto g = std::make_unique<Gemm>();
    TL_LT_CHECK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    TL_LT_CHECK(
        cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    TL_LT_CHECK(
        cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (with_gelu) {
      // GELU_AUX (+ BIAS) forward, or DGELU backward; the aux matrix is shaped like D
      cublasLtEpilogue_t epilogue = gelu_epilogue;
      if (bias != nullptr && gelu_epilogue == CUBLASLT_EPILOGUE_GELU_AUX)
        epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                 sizeof epilogue));
      const std::int64_t aux_ld = ldd;
      TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                 &aux_ld, sizeof aux_ld));
      const cudaDataType_t aux_type = CUDA_R_16BF;
      TL_LT_CHECK(cublasLtMatmulDescSetAttribute(
          g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof aux_type));
      // the heuristic may look at the pointer's alignment: give it the real one
      TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                 &aux, sizeof aux));
    }
    if (bias != nullptr && (!with_gelu || gelu_epilogue == CUBLASLT_EPILOGUE_GELU_AUX)) {
      if (!with_gelu) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &epilogue, sizeof epilogue));
      }
      const cudaDataType_t bias_type = CUDA_R_16BF;
      TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                 &bias_type, sizeof bias_type));
    }
    // column-major layouts of the stored matrices (before op())
    TL_LT_CHECK(
        cublasLtMatrixLayoutCreate(&g->a, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda));
    TL_LT_CHECK(
        cublasLtMatrixLayoutCreate(&g->b, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb));
    TL_LT_CHECK(cublasLtMatrixLayoutCreate(&g->d, d_type, m, n, ldd));
    cublasLtMatmulPreference_t pref = nullptr;
    TL_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes_, sizeof workspace_bytes_);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle_, g->desc, g->a, g->b, g->d,
                                                             g->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS) return hs;
    if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    g->algo = result.algo;
    g->have_algo = true;
    it = cache_.emplace(key, std::move(g)).first;
  }
  Gemm& g = *it->second;
  if (with_gelu)
    TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &aux, sizeof aux));
  if (bias != nullptr)
    TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof bias));
  const float alpha = 1.0f;
  return cublasLtMatmul(handle_, g.desc, &alpha, a, g.a, b, g.b, &beta, d, g.d, d, g.d, &g.algo,
                        workspace_, workspace_bytes_, stream);
}

// Row-major X (N,C) is column-major X' (C,N); W (OC,C) is W' (C,OC); Y (N,OC) is Y' (OC,N).
cublasStatus_t Matmul::matmul_forward(__nv_bfloat16* y, const __nv_bfloat16* x,
                                      const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                      std::int64_t N, std::int64_t C, std::int64_t OC,
                                      cudaStream_t stream) {
  // Y' (OC,N) = W'^T (OC,C) X' (C,N)
  return gemm(true, false, OC, N, C, w, C, x, C, y, OC, CUDA_R_16BF, 0.0f, bias, stream);
}

cublasStatus_t Matmul::matmul_backward(__nv_bfloat16* dx, float* dw, float* dbias,
                                       const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                       const __nv_bfloat16* w, std::int64_t N, std::int64_t C,
                                       std::int64_t OC, cudaStream_t stream, bool overwrite_dx) {
  // dX' (C,N) += W' (C,OC) dY' (OC,N)   (= when overwrite_dx)
  if (dx != nullptr)
    TL_LT_CHECK(gemm(false, false, C, N, OC, w, C, dy, OC, dx, C, CUDA_R_16BF,
                     overwrite_dx ? 0.0f : 1.0f, nullptr, stream));
  // dW' (C,OC) += X' (C,N) dY'^T (N,OC)
  TL_LT_CHECK(gemm(false, true, C, OC, N, x, C, dy, OC, dw, C, CUDA_R_32F, 1.0f, nullptr, stream));
  if (dbias != nullptr) bias_backward(dbias, dy, N, OC, stream);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t Matmul::matmul_forward_gelu(__nv_bfloat16* y, __nv_bfloat16* pre,
                                           const __nv_bfloat16* x, const __nv_bfloat16* w,
                                           const __nv_bfloat16* bias, std::int64_t N,
                                           std::int64_t C, std::int64_t OC, cudaStream_t stream) {
  if (OC % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  // Y' (OC,N) = gelu(W'^T X' + bias), pre-activation to pre' (OC,N)
  return gemm(true, false, OC, N, C, w, C, x, C, y, OC, CUDA_R_16BF, 0.0f, bias, stream,
              CUBLASLT_EPILOGUE_GELU_AUX, pre);
}

cublasStatus_t Matmul::matmul_backward_dgelu(__nv_bfloat16* dpre, float* dw, float* dbias,
                                             const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                             const __nv_bfloat16* pre, const __nv_bfloat16* w,
                                             std::int64_t N, std::int64_t C, std::int64_t OC,
                                             cudaStream_t stream) {
  if (C % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  // dPre' (C,N) = (W' (C,OC) dY' (OC,N)) * gelu'(pre'), overwritten
  TL_LT_CHECK(gemm(false, false, C, N, OC, w, C, dy, OC, dpre, C, CUDA_R_16BF, 0.0f, nullptr,
                   stream, CUBLASLT_EPILOGUE_DGELU, pre));
  // dW' (C,OC) += X' (C,N) dY'^T (N,OC)
  TL_LT_CHECK(gemm(false, true, C, OC, N, x, C, dy, OC, dw, C, CUDA_R_32F, 1.0f, nullptr, stream));
  if (dbias != nullptr) bias_backward(dbias, dy, N, OC, stream);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace topolaunch::kernels::cuda
