// The matmul ops on the GPU, the CUDA twin of kernels/cpu/matmul.hpp (matmul.cu): GEMMs through
// cuBLASLt (bf16 inputs, fp32 accumulation, the forward bias fused as an epilogue) and the
// bias-gradient kernels. The GEMMs' descriptors, layouts and chosen algorithm are built once per
// shape and cached (llm.c rebuilds them on every call); the workspace is allocated once, so the
// calls can be captured in a CUDA Graph.
//
// Algorithm choice by measurement (autotune, on by default): at the first use of a GEMM key
// (shape, layout, epilogue) on a stream that is not capturing, up to kTuneCandidates of
// cuBLASLt's heuristic results are each run on the call's real operands (one warm-up, then the
// median of kTuneReps timed calls) and the fastest is kept; the heuristic's first stays unless
// another is at least kTuneMinGain faster. Results are unchanged: beta-0 calls are timed in place
// (the real call runs after and overwrites D), for beta-1 calls D is copied to a temporary device
// buffer first and copied back before the real call (the buffer is freed at once: steady-state
// memory does not grow). A key first used while the stream is capturing takes the heuristic's
// first (no synchronisation inside a capture). Timings differ between runs, so the chosen
// algorithm (and with it the last bits of a result) can differ between runs; within one Matmul a
// key's choice never changes.
//
// Bias gradient: dbias = column sums of dy is either a separate pass over dy (bias_backward) or
// fused into the weight-gradient GEMM (CUBLASLT_EPILOGUE_BGRADB on dW' = X' dY'^T reduces dY' over
// k = N), written to a small fp32 scratch and added into dbias (dbias accumulates; cuBLASLt
// overwrites). FusedBiasGrad::measured (default) times both at the first eager use of a shape and
// keeps the faster.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace topolaunch::kernels::cuda {

// dbias (OC) += sum over the N rows of dy (N,OC): the separate bias-gradient pass.
void bias_backward(float* dbias, const __nv_bfloat16* dy, std::int64_t N, std::int64_t OC,
                   cudaStream_t stream);
// dbias (OC) += part (OC): the fused bias gradient (cuBLASLt's BGRADB writes part) accumulated.
void bias_grad_add(float* dbias, const float* part, std::int64_t OC, cudaStream_t stream);

// How the bias gradient of matmul_backward* is computed.
enum class FusedBiasGrad : std::uint8_t {
  measured,  // the faster of fused and separate, timed at the first eager use of a shape
             // (separate when autotune is off or the first use is captured)
  always,    // fused whenever cuBLASLt has an algorithm for it, else separate
  never,     // always the separate pass (bias_backward)
};

// What autotune chose for one GEMM key (tuning_report()).
struct GemmTuning {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  int d_type = 0;    // cudaDataType_t of D
  int epilogue = 0;  // cublasLtEpilogue_t
  float beta = 0;
  int candidates = 0;      // heuristic results returned
  int timed = 0;           // candidates that ran (fit the workspace, no error)
  int chosen_index = 0;    // index into the heuristic's list (0: its first)
  bool tuned = false;      // false: heuristic's first without timing (capture, autotune off)
  float heuristic_ms = 0;  // median of the heuristic's first (0 when not tuned)
  float chosen_ms = 0;     // median of the chosen one
};

// The bias-gradient decision for one weight-gradient shape (bias_report()).
struct BiasGradChoice {
  std::int64_t N = 0, C = 0, OC = 0;
  bool fused = false;
  bool fused_supported = false;  // cuBLASLt returned an algorithm for BGRADB
  bool measured = false;
  float separate_ms = 0;  // tuned dW GEMM + bias_backward pass
  float fused_ms = 0;     // tuned BGRADB GEMM + the add into dbias
};

class Matmul {
 public:
  static constexpr int kTuneCandidates = 12;
  static constexpr int kTuneReps = 3;
  static constexpr float kTuneMinGain = 0.01f;  // 1%: below that, timing noise
  // The fused bias gradient's scratch (fp32, allocated once): OC up to this.
  static constexpr std::int64_t kMaxFusedBiasOC = 65536;

  // Creates the cuBLASLt handle, a 32 MiB workspace (Hopper kernels want it) and the bias
  // gradient scratch (2 x kMaxFusedBiasOC floats).
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Empty when construction worked, else what failed.
  const std::string& error() const { return error_; }

  // Off: every key takes the heuristic's first result (the behaviour before autotune). Applies to
  // keys first used after the call.
  void set_autotune(bool on) { autotune_ = on; }
  bool autotune() const { return autotune_; }
  void set_fused_bias_grad(FusedBiasGrad mode) { fused_bias_mode_ = mode; }
  FusedBiasGrad fused_bias_grad() const { return fused_bias_mode_; }
  // What was chosen per GEMM key and per bias-gradient shape so far.
  std::vector<GemmTuning> tuning_report() const;
  std::vector<BiasGradChoice> bias_report() const;

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
  // The two halves of matmul_backward (benchmarks time them apart).
  cublasStatus_t matmul_backward_dx(__nv_bfloat16* dx, const __nv_bfloat16* dy,
                                    const __nv_bfloat16* w, std::int64_t N, std::int64_t C,
                                    std::int64_t OC, cudaStream_t stream,
                                    bool overwrite_dx = false);
  cublasStatus_t matmul_backward_dw(float* dw, float* dbias, const __nv_bfloat16* dy,
                                    const __nv_bfloat16* x, std::int64_t N, std::int64_t C,
                                    std::int64_t OC, cudaStream_t stream);

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
  // dbias += column sums of dy (when not null). C % 8 == 0. dw is computed first, so dpre may be
  // the same memory as x (x is dead after this call in a training step).
  cublasStatus_t matmul_backward_dgelu(__nv_bfloat16* dpre, float* dw, float* dbias,
                                       const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                       const __nv_bfloat16* pre, const __nv_bfloat16* w,
                                       std::int64_t N, std::int64_t C, std::int64_t OC,
                                       cudaStream_t stream);

  // The dx half of matmul_backward_dgelu: dpre (N,C) = (dy @ w) * gelu'(pre), overwritten.
  cublasStatus_t matmul_backward_dx_dgelu(__nv_bfloat16* dpre, const __nv_bfloat16* dy,
                                          const __nv_bfloat16* pre, const __nv_bfloat16* w,
                                          std::int64_t N, std::int64_t C, std::int64_t OC,
                                          cudaStream_t stream);

  // FP8 GEMMs (train.precision = "fp8"): the operands cast by fp8.cuh, each with the inverse of
  // its scale in device memory (the GEMM multiplies by both); bf16 output, fp32 accumulation.
  // cuBLASLt's FP8 kernels on sm_90 take A transposed and B not, so both layouts below are TN.
  // y (N,OC) = x8 (N,C) @ w8 (OC,C)^T + bias (x8, w8 E4M3; bias bf16, may be null); with pre not
  // null, GELU in the epilogue as matmul_forward_gelu (pre the GELU input, y its output).
  // Fast accumulation (no split accumulator), as usual for the forward.
  cublasStatus_t matmul_forward_fp8(__nv_bfloat16* y, __nv_bfloat16* pre, const void* x8,
                                    const float* x_scale_inv, const void* w8,
                                    const float* w_scale_inv, const __nv_bfloat16* bias,
                                    std::int64_t N, std::int64_t C, std::int64_t OC,
                                    cudaStream_t stream);
  // dx (N,C) (+)= dy8 (N,OC) @ w (OC,C) with wt8 = w^T (C,OC) row-major E4M3 and dy8 E5M2;
  // overwrite_dx as matmul_backward_dx. With pre not null, DGELU in the epilogue as
  // matmul_backward_dgelu: dx = (dy @ w) * gelu'(pre), overwritten.
  cublasStatus_t matmul_backward_dx_fp8(__nv_bfloat16* dx, const __nv_bfloat16* pre,
                                        const void* dy8, const float* dy_scale_inv, const void* wt8,
                                        const float* wt_scale_inv, std::int64_t N, std::int64_t C,
                                        std::int64_t OC, cudaStream_t stream, bool overwrite_dx);
  // dw (OC,C) fp32 += dy (N,OC)^T @ x (N,C) from the transposed FP8 operands xt8 = x^T (C,N)
  // E4M3 and dyt8 = dy^T (OC,N) E5M2, both row-major (the TN layout of cuBLASLt's FP8 kernels).
  // No bias gradient: FP8 kernels have no BGRADB epilogue.
  cublasStatus_t matmul_backward_dw_fp8(float* dw, const void* xt8, const float* x_scale_inv,
                                        const void* dyt8, const float* dy_scale_inv, std::int64_t N,
                                        std::int64_t C, std::int64_t OC, cudaStream_t stream);
  // Fast accumulation for the backward FP8 GEMMs (off by default: gradients keep cuBLASLt's
  // split accumulator, as the forward does not need to). Applies to keys first used after.
  void set_fp8_backward_fast_accum(bool on) { fp8_backward_fast_accum_ = on; }

 private:
  struct Gemm;  // one cached descriptor set
  // One GEMM call: D (m,n, column-major) = alpha op(A) op(B) + beta C; C and D are the same
  // buffer. aux (bf16, leading dimension ldd): the GELU input written (GELU_AUX) or read (DGELU).
  // bias: the forward bias (BIAS, GELU_AUX) or the fp32 bias-gradient output (BGRADB).
  struct Call {
    bool trans_a = false, trans_b = false;
    std::int64_t m = 0, n = 0, k = 0;
    const void* a = nullptr;
    std::int64_t lda = 0;
    const void* b = nullptr;
    std::int64_t ldb = 0;
    void* d = nullptr;
    std::int64_t ldd = 0;
    cudaDataType_t d_type = CUDA_R_16BF;
    float beta = 0;
    const void* bias = nullptr;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;  // DEFAULT, GELU_AUX, DGELU, BGRADB
    const void* aux = nullptr;
    // FP8 operands: their types, device scales (null: none) and fast accumulation
    cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF;
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    bool fast_accum = false;
  };
  cublasStatus_t gemm(const Call& call, cudaStream_t stream);
  // The two GEMM layouts shared by the plain and the GELU-epilogue calls (bf16 D, no epilogue):
  // Y' (OC,N) = W'^T X' (+ bias), and dX' (C,N) = W' dY' (beta 0: overwrite; 1: accumulate).
  static Call forward_call(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* w,
                           const __nv_bfloat16* bias, std::int64_t N, std::int64_t C,
                           std::int64_t OC);
  static Call dx_call(__nv_bfloat16* dx, const __nv_bfloat16* dy, const __nv_bfloat16* w,
                      std::int64_t N, std::int64_t C, std::int64_t OC, float beta);
  // The cached descriptors of call's key, built (and tuned) at its first use; null and *status
  // set when cuBLASLt has no algorithm or an error.
  Gemm* lookup(const Call& call, cudaStream_t stream, cublasStatus_t* status);
  cublasStatus_t run(Gemm& g, const Call& call, const cublasLtMatmulAlgo_t& algo,
                     cudaStream_t stream);
  // Times candidates on the call's operands and keeps the fastest in g (see the file comment).
  void tune(Gemm& g, const Call& call, const cublasLtMatmulHeuristicResult_t* results, int count,
            cudaStream_t stream);
  // Median ms of kTuneReps runs of fn on stream after one warm-up; < 0 when fn failed.
  template <class Fn>
  float time_median_ms(Fn&& fn, cudaStream_t stream);
  bool capturing(cudaStream_t stream) const;
  // Decides (once per shape) whether the bias gradient of dW' (C,OC) is fused.
  bool use_fused_bias(const Call& dw_call, float* dbias, std::int64_t N, std::int64_t C,
                      std::int64_t OC, cudaStream_t stream);

  using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t, int, bool, int, float, int, int, bool>;
  static Key key_of(const Call& call);
  std::map<Key, std::unique_ptr<Gemm>> cache_;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, BiasGradChoice> bias_choice_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = std::size_t{32} << 20;
  float* bias_scratch_ = nullptr;  // 2 * kMaxFusedBiasOC: BGRADB output, timing sink
  bool autotune_ = true;
  FusedBiasGrad fused_bias_mode_ = FusedBiasGrad::measured;
  bool fp8_backward_fast_accum_ = false;
  std::string error_;
};

}  // namespace topolaunch::kernels::cuda
