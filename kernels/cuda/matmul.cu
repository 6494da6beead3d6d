// The matmul ops of matmul.cuh: the cuBLASLt GEMMs (Matmul) and the bias-gradient kernels; the
// CUDA twin of kernels/cpu/matmul.hpp.
#include "matmul.cuh"

#include <algorithm>

#include "kernel_primitives.cuh"

namespace topolaunch::kernels::cuda {

struct Matmul::Gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  GemmTuning info;
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
    return;
  }
  if (cudaMalloc(&bias_scratch_, 2 * kMaxFusedBiasOC * sizeof(float)) != cudaSuccess) {
    error_ = "cudaMalloc of the cuBLASLt bias-gradient scratch failed";
    bias_scratch_ = nullptr;
  }
}

Matmul::~Matmul() {
  cache_.clear();
  if (bias_scratch_ != nullptr) cudaFree(bias_scratch_);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

#define TL_LT_CHECK(call)                                 \
  do {                                                    \
    const cublasStatus_t status_ = (call);                \
    if (status_ != CUBLAS_STATUS_SUCCESS) return status_; \
  } while (0)

namespace {

// Copy of a device buffer that puts it back when destroyed (beta-1 GEMMs timed in place).
class SavedBuffer {
 public:
  SavedBuffer(void* p, std::size_t bytes, cudaStream_t stream)
      : p_(p), bytes_(bytes), stream_(stream) {
    if (cudaMalloc(&copy_, bytes) != cudaSuccess) {
      copy_ = nullptr;
      cudaGetLastError();  // clear the allocation failure: tuning is skipped, nothing else
      return;
    }
    if (cudaMemcpyAsync(copy_, p_, bytes_, cudaMemcpyDeviceToDevice, stream_) != cudaSuccess) {
      cudaFree(copy_);
      copy_ = nullptr;
    }
  }
  ~SavedBuffer() {
    if (copy_ == nullptr) return;
    cudaMemcpyAsync(p_, copy_, bytes_, cudaMemcpyDeviceToDevice, stream_);
    cudaStreamSynchronize(stream_);
    cudaFree(copy_);
  }
  SavedBuffer(const SavedBuffer&) = delete;
  SavedBuffer& operator=(const SavedBuffer&) = delete;
  bool ok() const { return copy_ != nullptr; }

 private:
  void* p_;
  std::size_t bytes_;
  cudaStream_t stream_;
  void* copy_ = nullptr;
};

std::size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

}  // namespace

Matmul::Key Matmul::key_of(const Call& c) {
  return Key{c.trans_a,
             c.trans_b,
             c.m,
             c.n,
             c.k,
             c.lda,
             c.ldb,
             c.ldd,
             static_cast<int>(c.d_type),
             c.bias != nullptr,
             static_cast<int>(c.epilogue),
             c.beta,
             static_cast<int>(c.a_type),
             static_cast<int>(c.b_type),
             c.fast_accum};
}

bool Matmul::capturing(cudaStream_t stream) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return true;  // cannot tell: behave as under capture (no synchronisation)
  }
  return status != cudaStreamCaptureStatusNone;
}

template <class Fn>
float Matmul::time_median_ms(Fn&& fn, cudaStream_t stream) {
  return median_event_ms([&] { return fn() == CUBLAS_STATUS_SUCCESS; }, stream, kTuneReps);
}

cublasStatus_t Matmul::run(Gemm& g, const Call& c, const cublasLtMatmulAlgo_t& algo,
                           cudaStream_t stream) {
  if (c.aux != nullptr)
    TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &c.aux, sizeof c.aux));
  if (c.bias != nullptr)
    TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias,
                                               sizeof c.bias));
  if (c.a_scale != nullptr)
    TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                               &c.a_scale, sizeof c.a_scale));
  if (c.b_scale != nullptr)
    TL_LT_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                               &c.b_scale, sizeof c.b_scale));
  const float alpha = 1.0f;
  return cublasLtMatmul(handle_, g.desc, &alpha, c.a, g.a, c.b, g.b, &c.beta, c.d, g.d, c.d, g.d,
                        &algo, workspace_, workspace_bytes_, stream);
}

void Matmul::tune(Gemm& g, const Call& c, const cublasLtMatmulHeuristicResult_t* results, int count,
                  cudaStream_t stream) {
  // beta 1 reads D: keep it and put it back after the timed runs
  std::unique_ptr<SavedBuffer> saved;
  if (c.beta != 0.0f) {
    saved = std::make_unique<SavedBuffer>(
        c.d, static_cast<std::size_t>(c.ldd) * c.n * element_bytes(c.d_type), stream);
    if (!saved->ok()) return;  // no memory for the copy: heuristic's first, untuned
  }
  int best = -1;
  float best_ms = 0, first_ms = 0;
  int timed = 0;
  for (int i = 0; i < count; ++i) {
    const auto& r = results[i];
    if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > workspace_bytes_) continue;
    const float ms = time_median_ms([&] { return run(g, c, r.algo, stream); }, stream);
    if (ms < 0) continue;
    ++timed;
    if (i == 0) first_ms = ms;
    if (best < 0 || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  if (best < 0) return;
  // ties (within timing noise) go to the heuristic's first
  if (first_ms > 0 && best != 0 && best_ms > first_ms * (1.0f - kTuneMinGain)) {
    best = 0;
    best_ms = first_ms;
  }
  g.algo = results[best].algo;
  g.info.tuned = true;
  g.info.timed = timed;
  g.info.chosen_index = best;
  g.info.heuristic_ms = first_ms;
  g.info.chosen_ms = best_ms;
}

Matmul::Gemm* Matmul::lookup(const Call& c, cudaStream_t stream, cublasStatus_t* status) {
  *status = CUBLAS_STATUS_SUCCESS;
  const Key key = key_of(c);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.get();
  auto fail = [&](cublasStatus_t s) -> Gemm* {
    *status = s;
    return nullptr;
  };
#define TL_LT_TRY(call)                               \
  do {                                                \
    const cublasStatus_t s_ = (call);                 \
    if (s_ != CUBLAS_STATUS_SUCCESS) return fail(s_); \
  } while (0)
  auto g = std::make_unique<Gemm>();
  TL_LT_TRY(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtEpilogue_t epilogue = c.epilogue;
  const bool with_gelu =
      c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || c.epilogue == CUBLASLT_EPILOGUE_DGELU;
  if (c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX && c.bias != nullptr)
    epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (c.epilogue == CUBLASLT_EPILOGUE_DEFAULT && c.bias != nullptr)
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                             sizeof epilogue));
  if (with_gelu) {
    // the aux matrix (GELU input) is shaped like D
    const std::int64_t aux_ld = c.ldd;
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                             sizeof aux_ld));
    const cudaDataType_t aux_type = CUDA_R_16BF;
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                             &aux_type, sizeof aux_type));
    // the heuristic may look at the pointer's alignment: give it the real one
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                             &c.aux, sizeof c.aux));
  }
  if (c.bias != nullptr) {
    // forward bias: bf16; bias gradient (BGRADB): written in D's type (fp32 for dW)
    const cudaDataType_t bias_type =
        c.epilogue == CUBLASLT_EPILOGUE_BGRADB ? c.d_type : CUDA_R_16BF;
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                             &bias_type, sizeof bias_type));
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias,
                                             sizeof c.bias));
  }
  if (c.a_scale != nullptr)
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                             &c.a_scale, sizeof c.a_scale));
  if (c.b_scale != nullptr)
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                             &c.b_scale, sizeof c.b_scale));
  if (c.a_type != CUDA_R_16BF || c.b_type != CUDA_R_16BF) {
    const std::int8_t fast = c.fast_accum ? 1 : 0;
    TL_LT_TRY(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                             sizeof fast));
  }
  // column-major layouts of the stored matrices (before op())
  TL_LT_TRY(cublasLtMatrixLayoutCreate(&g->a, c.a_type, c.trans_a ? c.k : c.m,
                                       c.trans_a ? c.m : c.k, c.lda));
  TL_LT_TRY(cublasLtMatrixLayoutCreate(&g->b, c.b_type, c.trans_b ? c.n : c.k,
                                       c.trans_b ? c.k : c.n, c.ldb));
  TL_LT_TRY(cublasLtMatrixLayoutCreate(&g->d, c.d_type, c.m, c.n, c.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  TL_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes_, sizeof workspace_bytes_);
  const bool tune_now = autotune_ && !capturing(stream);
  // a plain array: nvcc 13.0's front end fails (internal error) on a std::vector of these
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(handle_, g->desc, g->a, g->b, g->d, g->d, pref,
                                     tune_now ? kTuneCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS) return fail(hs);
  if (found == 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED);
#undef TL_LT_TRY
  g->algo = results[0].algo;
  g->info.trans_a = c.trans_a;
  g->info.trans_b = c.trans_b;
  g->info.m = c.m;
  g->info.n = c.n;
  g->info.k = c.k;
  g->info.d_type = static_cast<int>(c.d_type);
  g->info.epilogue = static_cast<int>(epilogue);
  g->info.beta = c.beta;
  g->info.candidates = found;
  if (tune_now) tune(*g, c, results, found, stream);
  return cache_.emplace(key, std::move(g)).first->second.get();
}

cublasStatus_t Matmul::gemm(const Call& c, cudaStream_t stream) {
  if (handle_ == nullptr || workspace_ == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  Gemm* g = lookup(c, stream, &status);
  if (g == nullptr) return status;
  return run(*g, c, g->algo, stream);
}

std::vector<GemmTuning> Matmul::tuning_report() const {
  std::vector<GemmTuning> out;
  for (const auto& entry : cache_) out.push_back(entry.second->info);
  return out;
}

std::vector<BiasGradChoice> Matmul::bias_report() const {
  std::vector<BiasGradChoice> out;
  for (const auto& entry : bias_choice_) out.push_back(entry.second);
  return out;
}

bool Matmul::use_fused_bias(const Call& plain, float* dbias, std::int64_t N, std::int64_t C,
                            std::int64_t OC, cudaStream_t stream) {
  if (bias_scratch_ == nullptr || OC > kMaxFusedBiasOC) return false;
  const auto shape = std::make_tuple(N, C, OC);
  if (auto it = bias_choice_.find(shape); it != bias_choice_.end()) return it->second.fused;
  BiasGradChoice choice;
  choice.N = N;
  choice.C = C;
  choice.OC = OC;
  const bool eager = !capturing(stream);
  if (fused_bias_mode_ == FusedBiasGrad::never ||
      (fused_bias_mode_ == FusedBiasGrad::measured && (!autotune_ || !eager))) {
    bias_choice_.emplace(shape, choice);
    return false;
  }
  Call fused = plain;
  fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  fused.bias = bias_scratch_;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  Gemm* gf = lookup(fused, stream, &status);
  choice.fused_supported = gf != nullptr;
  if (gf == nullptr || fused_bias_mode_ == FusedBiasGrad::always) {
    choice.fused = gf != nullptr;
    bias_choice_.emplace(shape, choice);
    return choice.fused;
  }
  // measured: tuned plain GEMM + separate pass vs tuned BGRADB GEMM + the add, both on the real
  // operands with dW restored after; the passes write the scratch's second half, not dbias
  Gemm* gp = lookup(plain, stream, &status);
  if (gp == nullptr) {
    bias_choice_.emplace(shape, choice);
    return false;
  }
  {
    SavedBuffer saved(plain.d, static_cast<std::size_t>(plain.ldd) * plain.n * sizeof(float),
                      stream);
    if (saved.ok()) {
      float* sink = bias_scratch_ + kMaxFusedBiasOC;
      const auto* dy = static_cast<const __nv_bfloat16*>(plain.b);
      choice.separate_ms = time_median_ms(
          [&] {
            const cublasStatus_t s = run(*gp, plain, gp->algo, stream);
            if (s == CUBLAS_STATUS_SUCCESS) bias_backward(sink, dy, N, OC, stream);
            return s;
          },
          stream);
      choice.fused_ms = time_median_ms(
          [&] {
            const cublasStatus_t s = run(*gf, fused, gf->algo, stream);
            if (s == CUBLAS_STATUS_SUCCESS) bias_grad_add(sink, bias_scratch_, OC, stream);
            return s;
          },
          stream);
      choice.measured = choice.separate_ms > 0 && choice.fused_ms > 0;
      choice.fused = choice.measured && choice.fused_ms < choice.separate_ms;
    }
  }
  (void)dbias;
  bias_choice_.emplace(shape, choice);
  return choice.fused;
}

// Row-major X (N,C) is column-major X' (C,N); W (OC,C) is W' (C,OC); Y (N,OC) is Y' (OC,N).
Matmul::Call Matmul::forward_call(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                  const __nv_bfloat16* bias, std::int64_t N, std::int64_t C,
                                  std::int64_t OC) {
  // Y' (OC,N) = W'^T (OC,C) X' (C,N)
  Call c;
  c.trans_a = true;
  c.m = OC;
  c.n = N;
  c.k = C;
  c.a = w;
  c.lda = C;
  c.b = x;
  c.ldb = C;
  c.d = y;
  c.ldd = OC;
  c.d_type = CUDA_R_16BF;
  c.bias = bias;
  return c;
}

Matmul::Call Matmul::dx_call(__nv_bfloat16* dx, const __nv_bfloat16* dy, const __nv_bfloat16* w,
                             std::int64_t N, std::int64_t C, std::int64_t OC, float beta) {
  // dX' (C,N) (+)= W' (C,OC) dY' (OC,N)
  Call c;
  c.m = C;
  c.n = N;
  c.k = OC;
  c.a = w;
  c.lda = C;
  c.b = dy;
  c.ldb = OC;
  c.d = dx;
  c.ldd = C;
  c.d_type = CUDA_R_16BF;
  c.beta = beta;
  return c;
}

cublasStatus_t Matmul::matmul_forward(__nv_bfloat16* y, const __nv_bfloat16* x,
                                      const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                      std::int64_t N, std::int64_t C, std::int64_t OC,
                                      cudaStream_t stream) {
  return gemm(forward_call(y, x, w, bias, N, C, OC), stream);
}

cublasStatus_t Matmul::matmul_backward_dx(__nv_bfloat16* dx, const __nv_bfloat16* dy,
                                          const __nv_bfloat16* w, std::int64_t N, std::int64_t C,
                                          std::int64_t OC, cudaStream_t stream, bool overwrite_dx) {
  return gemm(dx_call(dx, dy, w, N, C, OC, overwrite_dx ? 0.0f : 1.0f), stream);
}

cublasStatus_t Matmul::matmul_backward_dw(float* dw, float* dbias, const __nv_bfloat16* dy,
                                          const __nv_bfloat16* x, std::int64_t N, std::int64_t C,
                                          std::int64_t OC, cudaStream_t stream) {
  // dW' (C,OC) += X' (C,N) dY'^T (N,OC); with BGRADB also the sums of dY'^T over N (= dbias)
  Call c;
  c.trans_b = true;
  c.m = C;
  c.n = OC;
  c.k = N;
  c.a = x;
  c.lda = C;
  c.b = dy;
  c.ldb = OC;
  c.d = dw;
  c.ldd = C;
  c.d_type = CUDA_R_32F;
  c.beta = 1.0f;
  if (dbias != nullptr && use_fused_bias(c, dbias, N, C, OC, stream)) {
    Call fused = c;
    fused.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    fused.bias = bias_scratch_;
    const cublasStatus_t s = gemm(fused, stream);
    if (s == CUBLAS_STATUS_SUCCESS) {
      bias_grad_add(dbias, bias_scratch_, OC, stream);
      return s;
    }
    // not expected (the choice was made on a working call); the separate path below still works
  }
  TL_LT_CHECK(gemm(c, stream));
  if (dbias != nullptr) bias_backward(dbias, dy, N, OC, stream);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t Matmul::matmul_backward(__nv_bfloat16* dx, float* dw, float* dbias,
                                       const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                       const __nv_bfloat16* w, std::int64_t N, std::int64_t C,
                                       std::int64_t OC, cudaStream_t stream, bool overwrite_dx) {
  if (dx != nullptr) TL_LT_CHECK(matmul_backward_dx(dx, dy, w, N, C, OC, stream, overwrite_dx));
  return matmul_backward_dw(dw, dbias, dy, x, N, C, OC, stream);
}

cublasStatus_t Matmul::matmul_forward_gelu(__nv_bfloat16* y, __nv_bfloat16* pre,
                                           const __nv_bfloat16* x, const __nv_bfloat16* w,
                                           const __nv_bfloat16* bias, std::int64_t N,
                                           std::int64_t C, std::int64_t OC, cudaStream_t stream) {
  if (OC % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  // Y' (OC,N) = gelu(W'^T X' + bias), pre-activation to pre' (OC,N)
  Call c = forward_call(y, x, w, bias, N, C, OC);
  c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
  c.aux = pre;
  return gemm(c, stream);
}

cublasStatus_t Matmul::matmul_backward_dgelu(__nv_bfloat16* dpre, float* dw, float* dbias,
                                             const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                             const __nv_bfloat16* pre, const __nv_bfloat16* w,
                                             std::int64_t N, std::int64_t C, std::int64_t OC,
                                             cudaStream_t stream) {
  if (C % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  // dW (and dbias) first: x is then read, so dpre may take x's memory (the executor's plan reuses
  // x's buffer, dead after this op, for dpre)
  TL_LT_CHECK(matmul_backward_dw(dw, dbias, dy, x, N, C, OC, stream));
  return matmul_backward_dx_dgelu(dpre, dy, pre, w, N, C, OC, stream);
}

cublasStatus_t Matmul::matmul_backward_dx_dgelu(__nv_bfloat16* dpre, const __nv_bfloat16* dy,
                                                const __nv_bfloat16* pre, const __nv_bfloat16* w,
                                                std::int64_t N, std::int64_t C, std::int64_t OC,
                                                cudaStream_t stream) {
  if (C % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  // dPre' (C,N) = (W' (C,OC) dY' (OC,N)) * gelu'(pre'), overwritten
  Call c = dx_call(dpre, dy, w, N, C, OC, 0.0f);
  c.epilogue = CUBLASLT_EPILOGUE_DGELU;
  c.aux = pre;
  return gemm(c, stream);
}

cublasStatus_t Matmul::matmul_forward_fp8(__nv_bfloat16* y, __nv_bfloat16* pre, const void* x8,
                                          const float* x_scale_inv, const void* w8,
                                          const float* w_scale_inv, const __nv_bfloat16* bias,
                                          std::int64_t N, std::int64_t C, std::int64_t OC,
                                          cudaStream_t stream) {
  if (pre != nullptr && OC % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  // Y' (OC,N) = W8'^T (OC,C) X8' (C,N): the bf16 forward's layout, already TN
  Call c = forward_call(y, nullptr, nullptr, bias, N, C, OC);
  c.a = w8;
  c.a_type = CUDA_R_8F_E4M3;
  c.a_scale = w_scale_inv;
  c.b = x8;
  c.b_type = CUDA_R_8F_E4M3;
  c.b_scale = x_scale_inv;
  c.fast_accum = true;
  if (pre != nullptr) {
    c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
    c.aux = pre;
  }
  return gemm(c, stream);
}

cublasStatus_t Matmul::matmul_backward_dx_fp8(__nv_bfloat16* dx, const __nv_bfloat16* pre,
                                              const void* dy8, const float* dy_scale_inv,
                                              const void* wt8, const float* wt_scale_inv,
                                              std::int64_t N, std::int64_t C, std::int64_t OC,
                                              cudaStream_t stream, bool overwrite_dx) {
  if (pre != nullptr && C % 8 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  // dX' (C,N) (+)= Wt8'^T (C,OC) dY8' (OC,N): the bf16 dx layout, but with A = Wt (C,OC)
  // row-major, which is Wt' (OC,C) column-major, taken transposed
  Call c = dx_call(dx, nullptr, nullptr, N, C, OC, pre != nullptr || overwrite_dx ? 0.0f : 1.0f);
  c.trans_a = true;
  c.a = wt8;
  c.lda = OC;
  c.a_type = CUDA_R_8F_E4M3;
  c.a_scale = wt_scale_inv;
  c.b = dy8;
  c.b_type = CUDA_R_8F_E5M2;
  c.b_scale = dy_scale_inv;
  c.fast_accum = fp8_backward_fast_accum_;
  if (pre != nullptr) {
    c.epilogue = CUBLASLT_EPILOGUE_DGELU;
    c.aux = pre;
  }
  return gemm(c, stream);
}

cublasStatus_t Matmul::matmul_backward_dw_fp8(float* dw, const void* xt8, const float* x_scale_inv,
                                              const void* dyt8, const float* dy_scale_inv,
                                              std::int64_t N, std::int64_t C, std::int64_t OC,
                                              cudaStream_t stream) {
  // dW' (C,OC) += Xt8'^T (C,N) DYt8' (N,OC): Xt8 (C,N) row-major is Xt8' (N,C) column-major,
  // taken transposed; DYt8 (OC,N) row-major is DYt8' (N,OC) column-major, taken as it is
  Call c;
  c.trans_a = true;
  c.m = C;
  c.n = OC;
  c.k = N;
  c.a = xt8;
  c.lda = N;
  c.a_type = CUDA_R_8F_E4M3;
  c.a_scale = x_scale_inv;
  c.b = dyt8;
  c.ldb = N;
  c.b_type = CUDA_R_8F_E5M2;
  c.b_scale = dy_scale_inv;
  c.d = dw;
  c.ldd = C;
  c.d_type = CUDA_R_32F;
  c.beta = 1.0f;
  c.fast_accum = fp8_backward_fast_accum_;
  return gemm(c, stream);
}

// ---- bias gradient: dbias += column sums of dy ---------------------------------------------
namespace {

// Column sums of dy (N,OC): block (32 x 8) covers 32 columns; each of the 8 row-groups strides
// over rows, partials combined in shared memory, one atomicAdd per column per block.
__global__ void bias_backward_kernel(float* dbias, const bf16* dy, std::int64_t N, std::int64_t OC,
                                     std::int64_t rows_per_block) {
  __shared__ float part[8][kWarp + 1];
  const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(kWarp) + threadIdx.x;
  const std::int64_t r0 = blockIdx.y * rows_per_block;
  const std::int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc = 0;
  if (col < OC)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += 8)
      acc += __bfloat162float(dy[r * OC + col]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float s = 0;
    for (int k = 0; k < 8; ++k) s += part[k][threadIdx.x];
    atomicAdd(&dbias[col], s);
  }
}

// The same with 16-byte loads: block (32, 8); thread x owns the 8 columns of pack
// blockIdx.x * 32 + x, thread y the rows y, y + 8, ... of the block's row range; the 8 row
// groups are summed in shared memory and each column gets one atomicAdd per block.
__global__ void bias_backward_vec_kernel(float* dbias, const bf16* dy, std::int64_t N,
                                         std::int64_t OC, std::int64_t rows_per_block) {
  __shared__ float part[8][kWarp * 8 + 4];
  const std::int64_t packs = OC / 8;
  const std::int64_t p = blockIdx.x * static_cast<std::int64_t>(kWarp) + threadIdx.x;
  const std::int64_t r0 = blockIdx.y * rows_per_block;
  const std::int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (p < packs) {
    std::int64_t r = r0 + threadIdx.y;
    // two loads in flight per iteration
    for (; r + 8 < r1; r += 16) {
      const Pack8 d0 = load8(dy + r * OC + p * 8), d1 = load8(dy + (r + 8) * OC + p * 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += __bfloat162float(d0.v[j]) + __bfloat162float(d1.v[j]);
    }
    if (r < r1) {
      const Pack8 d0 = load8(dy + r * OC + p * 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += __bfloat162float(d0.v[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) part[threadIdx.y][threadIdx.x * 8 + j] = acc[j];
  __syncthreads();
  // 256 threads sum the 256 columns of this block over the 8 row groups
  const int t = threadIdx.y * kWarp + threadIdx.x;
  const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(kWarp) * 8 + t;
  if (col < OC) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += part[k][t];
    atomicAdd(&dbias[col], sum);
  }
}

// dbias += part (the fused bias gradient, written by cuBLASLt's BGRADB epilogue).
__global__ void bias_grad_add_kernel(float* dbias, const float* part, std::int64_t OC) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < OC) dbias[i] += part[i];
}

}  // namespace

void bias_backward(float* dbias, const bf16* dy, std::int64_t N, std::int64_t OC,
                   cudaStream_t stream) {
  if (OC % 8 == 0 && aligned16(dy)) {
    // about 4 blocks per multiprocessor in all, each over a range of rows
    const std::int64_t col_blocks = (OC / 8 + kWarp - 1) / kWarp;
    const std::int64_t target_row_blocks =
        std::max<std::int64_t>(1, (4 * multiprocessors() + col_blocks - 1) / col_blocks);
    const std::int64_t rows_per_block =
        std::max<std::int64_t>(16, (N + target_row_blocks - 1) / target_row_blocks);
    const dim3 grid(static_cast<unsigned>(col_blocks), blocks_for(N, rows_per_block));
    bias_backward_vec_kernel<<<grid, dim3(kWarp, 8), 0, stream>>>(dbias, dy, N, OC, rows_per_block);
    return;
  }
  constexpr std::int64_t kRowsPerBlock = 256;
  const dim3 grid(blocks_for(OC, kWarp), blocks_for(N, kRowsPerBlock));
  bias_backward_kernel<<<grid, dim3(kWarp, 8), 0, stream>>>(dbias, dy, N, OC, kRowsPerBlock);
}

void bias_grad_add(float* dbias, const float* part, std::int64_t OC, cudaStream_t stream) {
  if (OC <= 0) return;
  bias_grad_add_kernel<<<blocks_for(OC, 256), 256, 0, stream>>>(dbias, part, OC);
}

}  // namespace topolaunch::kernels::cuda
