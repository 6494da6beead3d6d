// cuDNN's fused causal attention behind attention.cuh's operand contract, through cuDNN's backend
// API. See attention_cudnn.cuh.
//
// cuDNN has no single "causal SDPA" operation before 9.21 (its SDPA_FWD descriptor takes no causal
// mask there); its flash-attention engines instead recognise an operation graph of primitive
// operations. The graphs below are those patterns, written out with the backend's descriptors:
//   forward:  S = Q @ K^T; S *= scale; S = row >= col ? S : -inf; M = max_k S; E = exp(S - M);
//             Z = sum_k E; Stats = M + log Z; P = E / Z (bf16); O = P @ V
//   backward: D = sum_d dO*O; S = Q @ K^T * scale [padding mask]; P = exp(causal(S - Stats));
//             dV = P^T @ dO; dS = (dO @ V^T - D) * P * scale; dK = dS^T @ Q; dQ = dS @ K (fp32
//             accumulator in the workspace, then bf16)
// Operation for operation, tensor for tensor (dimensions, strides, types, virtual or by value, and
// how they connect), these are the graphs cuDNN's frontend 1.23 builds for a causal SDPA with
// Stats and its backward at cuDNN 9.14-9.20 (compared by logging both sides' backend calls).
// The padding mask (sequence lengths all T) is there only where T is no multiple of 128 and cuDNN
// is 9.15 or older: those need it for such T in the backward. Its lengths live on the device,
// written once, so that nothing is copied from the host at execute time (capturable).
#include "attention_cudnn.cuh"

#include "topolaunch/kernels/plan.hpp"  // fused_attention_accumulator_bytes

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#if defined(TOPOLAUNCH_WITH_CUDNN)
#include <cudnn.h>
#endif

namespace topolaunch::kernels::cuda {

#if !defined(TOPOLAUNCH_WITH_CUDNN)

bool cudnn_attention_built() { return false; }

struct CudnnAttention::Impl {};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

namespace {
Error not_built() {
  return make_error(
      "cudnn attention: this build has no cuDNN attention (meson found no libcudnn 9 with "
      "cudnn.h; install the cuDNN 9 development package, reconfigure, or use attention = own)",
      1);
}
}  // namespace

Status check_cudnn_attention_descriptors(std::int64_t, std::int64_t, std::int64_t, std::int64_t) {
  return not_built();
}
Result<std::unique_ptr<CudnnAttention>> CudnnAttention::create(std::int64_t, std::int64_t,
                                                               std::int64_t, std::int64_t) {
  return not_built();
}
std::size_t CudnnAttention::workspace_bytes() const { return 0; }
std::size_t CudnnAttention::forward_engine_workspace_bytes() const { return 0; }
std::size_t CudnnAttention::backward_engine_workspace_bytes() const { return 0; }
int CudnnAttention::candidates(bool) const { return 0; }
int CudnnAttention::selected(bool) const { return 0; }
std::int64_t CudnnAttention::candidate_engine(bool, int) const { return -1; }
std::string CudnnAttention::candidate_description(bool, int) const { return ""; }
void CudnnAttention::select(bool, int) {}
std::string CudnnAttention::version() const { return "not built"; }
Status CudnnAttention::forward(__nv_bfloat16*, float*, const __nv_bfloat16*, void*,
                               cudaStream_t) const {
  return not_built();
}
Status CudnnAttention::backward(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                const __nv_bfloat16*, const float*, void*, cudaStream_t) const {
  return not_built();
}

#else

namespace {

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

// One line: cuDNN's status name and, when it has one, its own explanation of the last failure.
std::string cudnn_message(cudnnStatus_t st) {
  std::string s = cudnnGetErrorString(st);
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string d = detail;
  for (auto& c : d)
    if (c == '\n' || c == '\r') c = ' ';
  while (!d.empty() && d.back() == ' ') d.pop_back();
  if (!d.empty()) s += " (" + d + ")";
  return s;
}

// Owner of one backend descriptor.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    status_ = cudnnBackendCreateDescriptor(type, &d_);
    if (status_ != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(Descriptor&& o) noexcept : d_(o.d_), status_(o.status_) { o.d_ = nullptr; }
  Descriptor& operator=(Descriptor&& o) noexcept {
    if (this != &o) {
      if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
      d_ = o.d_;
      status_ = o.status_;
      o.d_ = nullptr;
    }
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnStatus_t status() const { return status_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
};

using Dims = std::vector<std::int64_t>;

// A tensor of a GraphBuilder (an index into its descriptors; -1: not created).
struct Tensor {
  int index = -1;
};

// The descriptors of one operation graph, built call by call; the first failure is kept (with
// the step that failed) and every later call does nothing, so a graph is written straight through
// and checked once at the end.
class GraphBuilder {
 public:
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  Tensor tensor(const char* name, std::int64_t uid, const Dims& dims, const Dims& strides,
                cudnnDataType_t type, bool is_virtual, bool by_value = false) {
    Tensor t;
    if (!ok()) return t;
    Descriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const std::string what = std::string("tensor ") + name;
    if (!check(d.status(), what)) return t;
    const std::int64_t alignment = 16;
    const bool v = is_virtual, bv = by_value;
    if (!set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what) ||
        !set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64,
             static_cast<std::int64_t>(dims.size()), dims.data(), what) ||
        !set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
             static_cast<std::int64_t>(strides.size()), strides.data(), what) ||
        !set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what) ||
        !set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what) ||
        !set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, what) ||
        (bv && !set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, what)) ||
        !check(cudnnBackendFinalize(d.get()), what + " finalize"))
      return t;
    t.index = static_cast<int>(tensors_.size());
    tensors_.push_back(std::move(d));
    return t;
  }

  // y = mode(x[, b[, t]]); axis for GEN_INDEX.
  void pointwise(const char* name, cudnnPointwiseMode_t mode, cudnnDataType_t compute, Tensor x,
                 Tensor y, Tensor b = {}, Tensor t = {}, std::int64_t axis = -1) {
    if (!ok()) return;
    const std::string what = std::string("pointwise ") + name;
    Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    if (!check(pw.status(), what) ||
        !set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what) ||
        !set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, what) ||
        (mode == CUDNN_POINTWISE_GEN_INDEX &&
         !set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what)) ||
        !check(cudnnBackendFinalize(pw.get()), what + " descriptor finalize"))
      return;
    Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    cudnnBackendDescriptor_t pwd = pw.get();
    const float one = 1.0f;
    if (!check(op.status(), what) || !valid(x, what) || !valid(y, what) ||
        !set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
             &pwd, what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, what) ||
        (b.index >= 0 && !set_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, what)) ||
        (t.index >= 0 && !set_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, what)) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, what) ||
        !set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what) ||
        !set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what) ||
        !check(cudnnBackendFinalize(op.get()), what + " finalize"))
      return;
    aux_.push_back(std::move(pw));
    ops_.push_back(std::move(op));
  }

  // c = a @ b over the last two dimensions (fp32 accumulation); the overrides (sequence lengths,
  // [B,1,1,1] int32) bound M, N, K where a padding mask is in use.
  void matmul(const char* name, Tensor a, Tensor b, Tensor c, Tensor m_override = {},
              Tensor n_override = {}, Tensor k_override = {}) {
    if (!ok()) return;
    const std::string what = std::string("matmul ") + name;
    Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    if (!check(mm.status(), what) ||
        !set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what) ||
        !check(cudnnBackendFinalize(mm.get()), what + " descriptor finalize"))
      return;
    Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    cudnnBackendDescriptor_t mmd = mm.get();
    if (!check(op.status(), what) || !valid(a, what) || !valid(b, what) || !valid(c, what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, what) ||
        !set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mmd, what) ||
        (m_override.index >= 0 &&
         !set_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override, what)) ||
        (n_override.index >= 0 &&
         !set_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override, what)) ||
        (k_override.index >= 0 &&
         !set_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override, what)) ||
        !check(cudnnBackendFinalize(op.get()), what + " finalize"))
      return;
    aux_.push_back(std::move(mm));
    ops_.push_back(std::move(op));
  }

  // y = reduce(x) over the dimensions where y has extent 1 (fp32).
  void reduction(const char* name, cudnnReduceTensorOp_t mode, Tensor x, Tensor y) {
    if (!ok()) return;
    const std::string what = std::string("reduction ") + name;
    Descriptor rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    // not deterministic (cuDNN's default, said explicitly from 9.11 on as its frontend does)
    [[maybe_unused]] const bool deterministic = false;
    if (!check(rd.status(), what) ||
        !set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what) ||
        !set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
             what) ||
#if CUDNN_VERSION >= 91100
        (cudnnGetVersion() >= 91100 && !set(rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC,
                                            CUDNN_TYPE_BOOLEAN, 1, &deterministic, what)) ||
#endif
        !check(cudnnBackendFinalize(rd.get()), what + " descriptor finalize"))
      return;
    Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    cudnnBackendDescriptor_t rdd = rd.get();
    if (!check(op.status(), what) || !valid(x, what) || !valid(y, what) ||
        !set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rdd,
             what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, what) ||
        !check(cudnnBackendFinalize(op.get()), what + " finalize"))
      return;
    aux_.push_back(std::move(rd));
    ops_.push_back(std::move(op));
  }

  // y: the same elements as x seen through other dimensions and strides (a transpose here).
  void reshape(const char* name, Tensor x, Tensor y) {
    if (!ok()) return;
    const std::string what = std::string("reshape ") + name;
    Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    if (!check(op.status(), what) || !valid(x, what) || !valid(y, what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, what) ||
        !set_tensor(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, what) ||
        !check(cudnnBackendFinalize(op.get()), what + " finalize"))
      return;
    ops_.push_back(std::move(op));
  }

  // The operation graph on `handle` (finalized), or null with error() set. Without a handle
  // (nullptr) cuDNN still checks that the operations connect into one graph.
  Descriptor operation_graph(cudnnHandle_t handle) {
    Descriptor g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    if (!ok()) return Descriptor();
    const std::string what = "operation graph";
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const auto& o : ops_) ops.push_back(o.get());
    if (!check(g.status(), what) ||
        !set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<std::int64_t>(ops.size()), ops.data(), what) ||
        (handle != nullptr &&
         !set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, what)) ||
        !check(cudnnBackendFinalize(g.get()), what + " finalize"))
      return Descriptor();
    return g;
  }

  // Records a failure found outside the builder's own calls.
  void fail(const std::string& message) {
    if (ok()) error_ = message;
  }

 private:
  bool check(cudnnStatus_t st, const std::string& what) {
    if (st == CUDNN_STATUS_SUCCESS) return true;
    fail(what + ": " + cudnn_message(st));
    return false;
  }
  bool set(const Descriptor& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           std::int64_t count, const void* value, const std::string& what) {
    return check(cudnnBackendSetAttribute(d.get(), name, type, count, value),
                 what + " attribute " + std::to_string(static_cast<int>(name)));
  }
  bool set_tensor(const Descriptor& op, cudnnBackendAttributeName_t name, Tensor t,
                  const std::string& what) {
    cudnnBackendDescriptor_t d = tensors_[static_cast<std::size_t>(t.index)].get();
    return set(op, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d, what);
  }
  bool valid(Tensor t, const std::string& what) {
    if (t.index >= 0) return true;
    fail(what + ": an operand was not created");
    return false;
  }

  std::vector<Descriptor> tensors_, aux_, ops_;
  std::string error_;
};

// Tensor uids of the two graphs: the variant packs name their operands by these. Virtual tensors
// take uids from kFirstVirtual on.
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kScale,
  kNegInf,
  kOne,
  kRowSums,  // backward: sum over the head dimension of dO*O (workspace)
  kDQAccum,  // backward: fp32 dQ (workspace)
  kSeqLenQ,
  kSeqLenKV,
  kNegInfPadding,  // the padding mask's own -inf (cuDNN's frontend gives each mask one)
  kFirstVirtual = 100,
};

struct Shape {
  std::int64_t B = 0, T = 0, C = 0, NH = 0, hs = 0;
  bool padding = false;  // the backward's padding mask (T % 128 != 0)
};

// Q, K, V of head h inside qkv (B,T,3C): dims [B,NH,T,hs], strides [T*3C, hs, 3C, 1] (the channel
// offsets 0, C, 2C are the pointers' offsets); K^T and V^T swap the last two; y, dy likewise with
// row length C.
Dims bhsd(const Shape& s) { return {s.B, s.NH, s.T, s.hs}; }
Dims bhsd_strides(const Shape& s, std::int64_t row) { return {s.T * row, s.hs, row, 1}; }
Dims bhds(const Shape& s) { return {s.B, s.NH, s.hs, s.T}; }
Dims bhds_strides(const Shape& s, std::int64_t row) { return {s.T * row, s.hs, 1, row}; }
Dims scores(const Shape& s) { return {s.B, s.NH, s.T, s.T}; }
Dims scores_strides(const Shape& s) { return {s.NH * s.T * s.T, s.T * s.T, s.T, 1}; }
Dims scores_transposed_strides(const Shape& s) { return {s.NH * s.T * s.T, s.T * s.T, 1, s.T}; }
Dims rows(const Shape& s) { return {s.B, s.NH, s.T, 1}; }
Dims rows_strides(const Shape& s) { return {s.NH * s.T, s.T, 1, 1}; }
const Dims kScalar = {1, 1, 1, 1};

using T_ = Tensor;

// S = causal(S): keep S where row >= col, else -inf.
T_ causal_mask(GraphBuilder& g, std::int64_t& uid, const Shape& s, T_ score, T_ neg_inf) {
  T_ row = g.tensor("causal row", uid++, scores(s), scores_strides(s), CUDNN_DATA_INT32, true);
  T_ col = g.tensor("causal col", uid++, scores(s), scores_strides(s), CUDNN_DATA_INT32, true);
  T_ keep = g.tensor("causal keep", uid++, scores(s), scores_strides(s), CUDNN_DATA_BOOLEAN, true);
  T_ out = g.tensor("causal out", uid++, scores(s), scores_strides(s), CUDNN_DATA_FLOAT, true);
  g.pointwise("row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, score, row, {}, {}, 2);
  g.pointwise("col index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, score, col, {}, {}, 3);
  g.pointwise("row >= col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, keep, col);
  g.pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, score, out, neg_inf,
              keep);
  return out;
}

// S = (row < seq_len_q && col < seq_len_kv) ? S : -inf.
T_ padding_mask(GraphBuilder& g, std::int64_t& uid, const Shape& s, T_ score, T_ neg_inf, T_ seq_q,
                T_ seq_kv) {
  T_ row = g.tensor("padding row", uid++, scores(s), scores_strides(s), CUDNN_DATA_INT32, true);
  T_ col = g.tensor("padding col", uid++, scores(s), scores_strides(s), CUDNN_DATA_INT32, true);
  T_ row_in =
      g.tensor("padding row in", uid++, scores(s), scores_strides(s), CUDNN_DATA_BOOLEAN, true);
  T_ col_in =
      g.tensor("padding col in", uid++, scores(s), scores_strides(s), CUDNN_DATA_BOOLEAN, true);
  T_ keep = g.tensor("padding keep", uid++, scores(s), scores_strides(s), CUDNN_DATA_BOOLEAN, true);
  T_ out = g.tensor("padding out", uid++, scores(s), scores_strides(s), CUDNN_DATA_FLOAT, true);
  g.pointwise("padding row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, score, row, {}, {},
              2);
  g.pointwise("padding col index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, score, col, {}, {},
              3);
  g.pointwise("row < seq_len_q", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, row_in, seq_q);
  g.pointwise("col < seq_len_kv", CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, col_in, seq_kv);
  g.pointwise("padding and", CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_in, keep, col_in);
  g.pointwise("padding select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, score, out,
              neg_inf, keep);
  return out;
}

void build_forward(GraphBuilder& g, const Shape& s) {
  const std::int64_t C3 = 3 * s.C;
  const auto bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  std::int64_t uid = kFirstVirtual;
  T_ q = g.tensor("q", kQ, bhsd(s), bhsd_strides(s, C3), bf16, false);
  T_ kt = g.tensor("k^T", kK, bhds(s), bhds_strides(s, C3), bf16, false);
  T_ v = g.tensor("v", kV, bhsd(s), bhsd_strides(s, C3), bf16, false);
  T_ o = g.tensor("o", kO, bhsd(s), bhsd_strides(s, s.C), bf16, false);
  T_ stats = g.tensor("stats", kStats, rows(s), rows_strides(s), f32, false);
  T_ scale = g.tensor("scale", kScale, kScalar, kScalar, f32, false, true);
  T_ neg_inf = g.tensor("-inf", kNegInf, kScalar, kScalar, f32, false, true);

  T_ sc = g.tensor("s", uid++, scores(s), scores_strides(s), f32, true);
  g.matmul("q k^T", q, kt, sc);
  T_ scaled = g.tensor("s scaled", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("scale", CUDNN_POINTWISE_MUL, f32, sc, scaled, scale);
  T_ masked = causal_mask(g, uid, s, scaled, neg_inf);
  T_ mx = g.tensor("max", uid++, rows(s), rows_strides(s), f32, true);
  g.reduction("max", CUDNN_REDUCE_TENSOR_MAX, masked, mx);
  T_ centred = g.tensor("s - max", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("s - max", CUDNN_POINTWISE_SUB, f32, masked, centred, mx);
  T_ e = g.tensor("exp", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, f32, centred, e);
  T_ z = g.tensor("sum exp", uid++, rows(s), rows_strides(s), f32, true);
  g.reduction("sum exp", CUDNN_REDUCE_TENSOR_ADD, e, z);
  T_ log_z = g.tensor("log sum", uid++, rows(s), rows_strides(s), f32, true);
  g.pointwise("log", CUDNN_POINTWISE_LOG, f32, z, log_z);
  g.pointwise("stats = max + log sum", CUDNN_POINTWISE_ADD, f32, mx, stats, log_z);
  T_ p = g.tensor("p", uid++, scores(s), scores_strides(s), bf16, true);
  g.pointwise("p = exp / sum", CUDNN_POINTWISE_DIV, f32, e, p, z);
  g.matmul("p v", p, v, o);
}

void build_backward(GraphBuilder& g, const Shape& s) {
  const std::int64_t C3 = 3 * s.C;
  const auto bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  std::int64_t uid = kFirstVirtual;
  T_ q = g.tensor("q", kQ, bhsd(s), bhsd_strides(s, C3), bf16, false);
  T_ kt = g.tensor("k^T", kK, bhds(s), bhds_strides(s, C3), bf16, false);
  T_ vt = g.tensor("v^T", kV, bhds(s), bhds_strides(s, C3), bf16, false);
  T_ o = g.tensor("o", kO, bhsd(s), bhsd_strides(s, s.C), bf16, false);
  T_ d_o = g.tensor("do", kDO, bhsd(s), bhsd_strides(s, s.C), bf16, false);
  T_ stats = g.tensor("stats", kStats, rows(s), rows_strides(s), f32, false);
  T_ dq = g.tensor("dq", kDQ, bhsd(s), bhsd_strides(s, C3), bf16, false);
  T_ dk = g.tensor("dk", kDK, bhsd(s), bhsd_strides(s, C3), bf16, false);
  T_ dv = g.tensor("dv", kDV, bhsd(s), bhsd_strides(s, C3), bf16, false);
  T_ scale = g.tensor("scale", kScale, kScalar, kScalar, f32, false, true);
  T_ neg_inf = g.tensor("-inf", kNegInf, kScalar, kScalar, f32, false, true);
  T_ one = g.tensor("1", kOne, kScalar, kScalar, f32, false, true);
  T_ row_sums = g.tensor("sum do*o", kRowSums, rows(s), rows_strides(s), f32, false);
  T_ dq_accum = g.tensor("dq accumulator", kDQAccum, bhsd(s),
                         {s.NH * s.T * s.hs, s.T * s.hs, s.hs, 1}, f32, false);
  T_ seq_q, seq_kv, neg_inf_padding;
  if (s.padding) {
    neg_inf_padding =
        g.tensor("-inf (padding)", kNegInfPadding, kScalar, kScalar, f32, false, true);
    seq_q = g.tensor("seq_len_q", kSeqLenQ, {s.B, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32, false);
    seq_kv =
        g.tensor("seq_len_kv", kSeqLenKV, {s.B, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32, false);
  }

  // D = sum over the head dimension of dO * O (times 1: the dropout scale of the pattern)
  T_ do_o =
      g.tensor("do*o", uid++, bhsd(s), {s.NH * s.T * s.hs, s.T * s.hs, s.NH * s.hs, 1}, f32, true);
  g.pointwise("do*o", CUDNN_POINTWISE_MUL, f32, d_o, do_o, o);
  T_ do_o_sum = g.tensor("sum do*o virtual", uid++, rows(s), rows_strides(s), f32, true);
  g.reduction("sum do*o", CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum);
  g.pointwise("sum do*o x 1", CUDNN_POINTWISE_MUL, f32, do_o_sum, row_sums, one);

  // P = exp(causal(scale * Q K^T - Stats)), recomputed
  T_ sc = g.tensor("s", uid++, scores(s), scores_strides(s), f32, true);
  g.matmul("q k^T", q, kt, sc, seq_q, seq_kv);
  T_ scaled = g.tensor("s scaled", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("scale", CUDNN_POINTWISE_MUL, f32, sc, scaled, scale);
  if (s.padding) scaled = padding_mask(g, uid, s, scaled, neg_inf_padding, seq_q, seq_kv);
  T_ centred = g.tensor("s - stats", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("s - stats", CUDNN_POINTWISE_SUB, f32, scaled, centred, stats);
  T_ masked = causal_mask(g, uid, s, centred, neg_inf);
  T_ p = g.tensor("p", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, f32, masked, p);

  // dV = P^T dO
  T_ pt = g.tensor("p^T", uid++, scores(s), scores_transposed_strides(s), bf16, true);
  g.reshape("p^T", p, pt);
  g.matmul("p^T do", pt, d_o, dv, seq_kv, {}, seq_q);

  // dS = (dO V^T - D) * P * scale
  T_ dp = g.tensor("dp", uid++, scores(s), scores_strides(s), f32, true);
  g.matmul("do v^T", d_o, vt, dp, seq_q, seq_kv);
  T_ dp_centred = g.tensor("dp - D", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("dp - D", CUDNN_POINTWISE_SUB, f32, dp, dp_centred, row_sums);
  T_ dp_p = g.tensor("(dp - D) p", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("(dp - D) p", CUDNN_POINTWISE_MUL, f32, dp_centred, dp_p, p);
  T_ ds = g.tensor("ds", uid++, scores(s), scores_strides(s), f32, true);
  g.pointwise("ds scale", CUDNN_POINTWISE_MUL, f32, dp_p, ds, scale);

  // dK = dS^T Q
  T_ dst = g.tensor("ds^T", uid++, scores(s), scores_transposed_strides(s), bf16, true);
  g.reshape("ds^T", ds, dst);
  g.matmul("ds^T q", dst, q, dk, seq_kv, {}, seq_q);

  // dQ = dS K, accumulated in fp32, then written as bf16
  T_ k = g.tensor("k", uid++, bhsd(s), bhsd_strides(s, C3), f32, true);
  g.reshape("k", kt, k);
  g.matmul("ds k", ds, k, dq_accum, seq_q, {}, seq_kv);
  g.pointwise("dq", CUDNN_POINTWISE_IDENTITY, f32, dq_accum, dq);
}

Result<Shape> shape_of(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::string shape = "B=" + std::to_string(B) + " T=" + std::to_string(T) +
                            " C=" + std::to_string(C) + " NH=" + std::to_string(NH);
  if (B <= 0 || T <= 0 || NH <= 0 || C <= 0 || C % NH != 0)
    return make_error("cudnn attention: invalid shape " + shape, 1);
  Shape s{B, T, C, NH, C / NH, T % 128 != 0};
  if (s.hs % 8 != 0 || s.hs > 256)  // 16-byte aligned rows of each head; the engines' limit
    return make_error("cudnn attention: head size " + std::to_string(s.hs) +
                          " is not a multiple of 8 up to 256 (" + shape + ")",
                      1);
  return s;
}

// One execution plan of a finalized operation graph for one engine configuration.
struct Plan {
  Descriptor plan;
  std::int64_t workspace = 0;
  std::int64_t engine = -1;  // the engine's global index, for the version line
  std::string what;          // "heuristics A #0", "engine 2 knobs 3=1,7=0"
};

// p's execution plan for engine configuration `cfg` and its workspace size; cuDNN's status.
cudnnStatus_t finalize_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, Plan& p) {
  p.plan = Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  cudnnStatus_t st = p.plan.status();
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                  1, &handle);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p.plan.get());
  std::int64_t n = 0;
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                  CUDNN_TYPE_INT64, 1, &n, &p.workspace);
  return st;
}

// Engine configurations beyond the heuristics' list: the knob settings of engine `engine_index`
// (each knob from its minimum to its maximum by its stride, at most kMaxKnobValues values each;
// at most `room` combinations that finalize, out of at most kMaxKnobTries tried). cuDNN's
// heuristics rank only some settings of an engine; a setting they leave out can be faster on a
// given shape. Empty when the engine takes no knobs or none finalizes.
std::vector<Plan> knob_plans(cudnnHandle_t handle, const Descriptor& graph,
                             std::int64_t engine_index, std::size_t room) {
  constexpr std::int64_t kMaxKnobValues = 8;
  constexpr int kMaxKnobTries = 64;
  std::vector<Plan> out;
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t gd = graph.get();
  cudnnStatus_t st = engine.status();
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(engine.get(), CUDNN_ATTR_ENGINE_OPERATION_GRAPH,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                  &engine_index);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(engine.get());
  if (st != CUDNN_STATUS_SUCCESS) return out;
  std::vector<Descriptor> infos;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
    infos.emplace_back(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR);
    if (infos.back().status() != CUDNN_STATUS_SUCCESS) return out;
    raw.push_back(infos.back().get());
  }
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_KNOB_INFO,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, CUDNN_KNOB_TYPE_COUNTS, &count,
                               raw.data()) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return out;
  struct Knob {
    cudnnBackendKnobType_t type;
    std::vector<std::int64_t> values;
  };
  std::vector<Knob> knobs;
  for (std::int64_t i = 0; i < count; ++i) {
    Knob k{};
    std::int64_t n = 0, lo = 0, hi = 0, stride = 1;
    cudnnBackendDescriptor_t d = raw[static_cast<std::size_t>(i)];
    if (cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n,
                                 &k.type) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n,
                                 &lo) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n,
                                 &hi) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &n,
                                 &stride) != CUDNN_STATUS_SUCCESS)
      return out;
    stride = std::max<std::int64_t>(stride, 1);
    for (std::int64_t v = lo;
         v <= hi && static_cast<std::int64_t>(k.values.size()) < kMaxKnobValues; v += stride)
      k.values.push_back(v);
    if (k.values.empty()) k.values.push_back(lo);
    knobs.push_back(std::move(k));
  }
  // every combination, the first knob varying fastest, until room or the tries run out
  std::vector<std::size_t> at(knobs.size(), 0);
  for (int tries = 0; tries < kMaxKnobTries && out.size() < room; ++tries) {
    std::vector<Descriptor> choices;
    std::vector<cudnnBackendDescriptor_t> choice_raw;
    std::string what = "engine " + std::to_string(engine_index) + " knobs";
    bool ok = true;
    for (std::size_t i = 0; i < knobs.size() && ok; ++i) {
      choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      Descriptor& c = choices.back();
      const std::int64_t value = knobs[i].values[at[i]];
      ok = c.status() == CUDNN_STATUS_SUCCESS &&
           cudnnBackendSetAttribute(c.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE,
                                    1, &knobs[i].type) == CUDNN_STATUS_SUCCESS &&
           cudnnBackendSetAttribute(c.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
                                    &value) == CUDNN_STATUS_SUCCESS &&
           cudnnBackendFinalize(c.get()) == CUDNN_STATUS_SUCCESS;
      choice_raw.push_back(c.get());
      what += (i == 0 ? " " : ",") + std::to_string(static_cast<int>(knobs[i].type)) + "=" +
              std::to_string(value);
    }
    if (ok) {
      Descriptor cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      cudnnBackendDescriptor_t ed = engine.get();
      Plan p;
      if (cfg.status() == CUDNN_STATUS_SUCCESS &&
          cudnnBackendSetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ed) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendSetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   static_cast<std::int64_t>(choice_raw.size()),
                                   choice_raw.data()) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendFinalize(cfg.get()) == CUDNN_STATUS_SUCCESS &&
          finalize_plan(handle, cfg.get(), p) == CUDNN_STATUS_SUCCESS) {
        p.engine = engine_index;
        p.what = std::move(what);
        out.push_back(std::move(p));
      }
    }
    // the next combination
    std::size_t i = 0;
    while (i < knobs.size() && ++at[i] == knobs[i].values.size()) at[i++] = 0;
    if (i == knobs.size()) break;  // all tried
  }
  return out;
}

// Every engine configuration of the heuristics `mode` that finalizes, in the order cuDNN ranks
// them (at most kMaxCandidates), then up to kMaxKnobCandidates other knob settings of the first
// one's engine (knob_plans): the first is what cuDNN's own frontend would run; the executor may
// time the others (CudaExecutor::select_cudnn_candidates).
constexpr std::int64_t kMaxCandidates = 8;
constexpr std::size_t kMaxKnobCandidates = 16;
Result<std::vector<Plan>> make_plans(cudnnHandle_t handle, const Descriptor& graph,
                                     const std::string& what, cudnnBackendHeurMode_t mode) {
  auto fail = [&](const std::string& step, cudnnStatus_t st) -> Error {
    return make_error("cudnn attention: " + what + ": " + step + ": " + cudnn_message(st), 1);
  };
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (heur.status() != CUDNN_STATUS_SUCCESS) return fail("heuristics descriptor", heur.status());
  cudnnBackendDescriptor_t gd = graph.get();
  cudnnStatus_t st = cudnnBackendSetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
                                  &mode);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(heur.get());
  if (st != CUDNN_STATUS_SUCCESS) return fail("heuristics", st);
  std::int64_t count = 0;
  st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
  if (st != CUDNN_STATUS_SUCCESS) return fail("heuristics results", st);
  const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "A" : "fallback";
  if (count <= 0)
    return make_error("cudnn attention: " + what + ": heuristics mode " + mode_name +
                          " offers no engine for the graph",
                      1);
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (configs.back().status() != CUDNN_STATUS_SUCCESS)
      return fail("engine config descriptor", configs.back().status());
    raw.push_back(configs.back().get());
  }
  std::int64_t returned = 0;
  st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data());
  if (st != CUDNN_STATUS_SUCCESS) return fail("heuristics results", st);
  std::string last;
  std::vector<Plan> plans;
  for (std::int64_t i = 0; i < returned && static_cast<std::int64_t>(plans.size()) < kMaxCandidates;
       ++i) {
    Plan p;
    cudnnBackendDescriptor_t cfg = raw[static_cast<std::size_t>(i)];
    st = finalize_plan(handle, cfg, p);
    if (st != CUDNN_STATUS_SUCCESS) {
      last = cudnn_message(st);
      continue;
    }
    p.what = std::string("heuristics ") + mode_name + " #" + std::to_string(i);
    std::int64_t n = 0;
    // the engine's index (informational: a failure to read it is not an error)
    Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t ed = engine.get();
    if (engine.status() == CUDNN_STATUS_SUCCESS &&
        cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &n, &ed) == CUDNN_STATUS_SUCCESS)
      cudnnBackendGetAttribute(ed, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                               &p.engine);
    plans.push_back(std::move(p));
  }
  if (plans.empty())
    return make_error("cudnn attention: " + what + ": none of the " + std::to_string(returned) +
                          " engine configurations of heuristics mode " + mode_name +
                          " finalizes (last: " + last + ")",
                      1);
  // then the other knob settings of the first's engine
  if (plans.front().engine >= 0) {
    auto more = knob_plans(handle, graph, plans.front().engine, kMaxKnobCandidates);
    for (auto& p : more) plans.push_back(std::move(p));
  }
  return Result<std::vector<Plan>>(std::move(plans));
}

Status execute(cudnnHandle_t handle, const Descriptor& plan, const std::int64_t* uids,
               void* const* pointers, std::int64_t count, void* workspace, const char* what) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  cudnnStatus_t st = pack.status();
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                  count, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                  CUDNN_TYPE_VOID_PTR, count, pointers);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                  CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack.get());
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(handle, plan.get(), pack.get());
  if (st != CUDNN_STATUS_SUCCESS)
    return make_error(std::string("cudnn attention: ") + what + ": " + cudnn_message(st), 1);
  return ok_status();
}

}  // namespace

bool cudnn_attention_built() { return true; }

Status check_cudnn_attention_descriptors(std::int64_t B, std::int64_t T, std::int64_t C,
                                         std::int64_t NH) {
  auto s = shape_of(B, T, C, NH);
  if (!s) return s.error();
  for (int backward = 0; backward < 2; ++backward) {
    for (int padding = 0; padding < 2; ++padding) {
      if (padding && !backward) continue;
      Shape sh = *s;
      sh.padding = padding != 0;
      GraphBuilder g;
      if (backward)
        build_backward(g, sh);
      else
        build_forward(g, sh);
      const Descriptor graph = g.operation_graph(nullptr);
      if (!g.ok())
        return make_error(std::string("cudnn attention: ") + (backward ? "backward" : "forward") +
                              (sh.padding ? " (padding mask)" : "") + " graph: " + g.error(),
                          1);
    }
  }
  return ok_status();
}

struct CudnnAttention::Impl {
  Shape shape;
  cudnnHandle_t handle = nullptr;
  std::vector<Plan> fwd_plans, bwd_plans;  // candidates, cuDNN's order; at least one each
  std::size_t fwd_at = 0, bwd_at = 0;      // the ones in use
  const Plan& fwd() const { return fwd_plans[fwd_at]; }
  const Plan& bwd() const { return bwd_plans[bwd_at]; }
  bool memset_dq_accum = false;  // cuDNN before 9.6 expects the accumulator zeroed
  // Sequence lengths (all T) of the padding mask, on the device: 2*B int32, q then kv.
  std::int32_t* seq_lens = nullptr;
  float scale = 1, neg_inf = -std::numeric_limits<float>::infinity(), one = 1;
  ~Impl() {
    fwd_plans.clear();  // the plans before the handle they were made with
    bwd_plans.clear();
    if (seq_lens != nullptr) cudaFree(seq_lens);
    if (handle != nullptr) cudnnDestroy(handle);
  }
  std::size_t bwd_engine_bytes() const {
    return align256(static_cast<std::size_t>(std::max<std::int64_t>(bwd().workspace, 0)));
  }
};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

Result<std::unique_ptr<CudnnAttention>> CudnnAttention::create(std::int64_t B, std::int64_t T,
                                                               std::int64_t C, std::int64_t NH) {
  auto s = shape_of(B, T, C, NH);
  if (!s) return s.error();
  const std::string shape = "B=" + std::to_string(B) + " T=" + std::to_string(T) +
                            " C=" + std::to_string(C) + " NH=" + std::to_string(NH);
  const std::size_t version = cudnnGetVersion();
  if (version < 90000)
    return make_error("cudnn attention: libcudnn " + std::to_string(version) +
                          " is older than 9.0 (the graphs here are cuDNN 9's)",
                      1);
  // cuDNN 9.10.0 and 9.10.1 give wrong attention backwards (NVIDIA's release notes)
  if (version == 91000 || version == 91001)
    return make_error(
        "cudnn attention: cuDNN 9.10.0/9.10.1 have a known attention backward bug; "
        "use 9.10.2 or newer",
        1);
  auto impl = std::make_unique<Impl>();
  impl->shape = *s;
  // the padding mask only where cuDNN needs it (T % 128 != 0 up to 9.15, as its frontend does)
  impl->shape.padding = s->padding && version <= 91500;
  impl->scale = 1.0f / std::sqrt(static_cast<float>(s->hs));
  impl->memset_dq_accum = version < 90600;
  const cudnnStatus_t st = cudnnCreate(&impl->handle);
  if (st != CUDNN_STATUS_SUCCESS)
    return make_error("cudnn attention: cudnnCreate failed: " + cudnn_message(st) +
                          " (is libcudnn installed for this GPU?)",
                      1);
  for (int backward = 0; backward < 2; ++backward) {
    GraphBuilder g;
    if (backward)
      build_backward(g, impl->shape);
    else
      build_forward(g, impl->shape);
    const std::string what = std::string(backward ? "backward" : "forward") + " for " + shape;
    Descriptor graph = g.operation_graph(impl->handle);
    if (!g.ok()) return make_error("cudnn attention: " + what + ": " + g.error(), 1);
    // mode A (what cuDNN's own frontend asks for), else the fallback list
    std::vector<Plan>& slot = backward ? impl->bwd_plans : impl->fwd_plans;
    auto plans = make_plans(impl->handle, graph, what, CUDNN_HEUR_MODE_A);
    if (plans) {
      slot = std::move(*plans);
      continue;
    }
    auto fallback = make_plans(impl->handle, graph, what, CUDNN_HEUR_MODE_FALLBACK);
    if (!fallback) return make_error(plans.error().message + "; " + fallback.error().message, 1);
    slot = std::move(*fallback);
  }
  if (impl->shape.padding) {
    std::vector<std::int32_t> lens(static_cast<std::size_t>(2 * B), static_cast<std::int32_t>(T));
    void* p = nullptr;
    if (cudaMalloc(&p, lens.size() * sizeof(std::int32_t)) != cudaSuccess ||
        cudaMemcpy(p, lens.data(), lens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice) !=
            cudaSuccess) {
      cudaGetLastError();
      if (p != nullptr) cudaFree(p);
      return make_error("cudnn attention: allocation of the sequence lengths failed", 1);
    }
    impl->seq_lens = static_cast<std::int32_t*>(p);
  }
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

std::size_t CudnnAttention::forward_engine_workspace_bytes() const {
  return static_cast<std::size_t>(std::max<std::int64_t>(impl_->fwd().workspace, 0));
}
std::size_t CudnnAttention::backward_engine_workspace_bytes() const {
  return static_cast<std::size_t>(std::max<std::int64_t>(impl_->bwd().workspace, 0));
}

int CudnnAttention::candidates(bool backward) const {
  return static_cast<int>((backward ? impl_->bwd_plans : impl_->fwd_plans).size());
}
int CudnnAttention::selected(bool backward) const {
  return static_cast<int>(backward ? impl_->bwd_at : impl_->fwd_at);
}
std::int64_t CudnnAttention::candidate_engine(bool backward, int i) const {
  return (backward ? impl_->bwd_plans : impl_->fwd_plans).at(static_cast<std::size_t>(i)).engine;
}
std::string CudnnAttention::candidate_description(bool backward, int i) const {
  return (backward ? impl_->bwd_plans : impl_->fwd_plans).at(static_cast<std::size_t>(i)).what;
}
void CudnnAttention::select(bool backward, int i) {
  const std::size_t at = static_cast<std::size_t>(std::clamp(i, 0, candidates(backward) - 1));
  (backward ? impl_->bwd_at : impl_->fwd_at) = at;
}

std::size_t CudnnAttention::workspace_bytes() const {
  const Shape& s = impl_->shape;
  return std::max(
      align256(forward_engine_workspace_bytes()),
      impl_->bwd_engine_bytes() + fused_attention_accumulator_bytes(s.B, s.T, s.C, s.NH));
}

std::string CudnnAttention::version() const {
  const std::size_t v = cudnnGetVersion();  // 91400 = 9.14.0
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + ", backend API, engines " + std::to_string(impl_->fwd().engine) +
         " (fwd) " + std::to_string(impl_->bwd().engine) + " (bwd)";
}

Status CudnnAttention::forward(__nv_bfloat16* y, float* lse, const __nv_bfloat16* qkv,
                               void* workspace, cudaStream_t stream) const {
  Impl& m = *impl_;
  if (const cudnnStatus_t st = cudnnSetStream(m.handle, stream); st != CUDNN_STATUS_SUCCESS)
    return make_error("cudnn attention: cudnnSetStream failed: " + cudnn_message(st), 1);
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  const std::int64_t uids[] = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
  void* const pointers[] = {base,     base + m.shape.C, base + 2 * m.shape.C, y, lse,
                            &m.scale, &m.neg_inf};
  return execute(m.handle, m.fwd().plan, uids, pointers, 7, workspace, "forward");
}

Status CudnnAttention::backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dy,
                                const __nv_bfloat16* qkv, const __nv_bfloat16* y, const float* lse,
                                void* workspace, cudaStream_t stream) const {
  Impl& m = *impl_;
  const Shape& s = m.shape;
  if (const cudnnStatus_t st = cudnnSetStream(m.handle, stream); st != CUDNN_STATUS_SUCCESS)
    return make_error("cudnn attention: cudnnSetStream failed: " + cudnn_message(st), 1);
  // workspace: [engine's | dQ accumulator | row sums of dO*O]
  auto* ws = static_cast<std::byte*>(workspace);
  std::byte* dq_accum = ws + m.bwd_engine_bytes();
  std::byte* row_sums =
      dq_accum + align256(static_cast<std::size_t>(s.B * s.T * s.C) * sizeof(float));
  if (m.memset_dq_accum) {
    const cudaError_t e = cudaMemsetAsync(
        dq_accum, 0, static_cast<std::size_t>(s.B * s.T * s.C) * sizeof(float), stream);
    if (e != cudaSuccess)
      return make_error(
          std::string("cudnn attention: dq accumulator memset: ") + cudaGetErrorString(e), 1);
  }
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::int64_t uids[] = {kQ,       kK,       kV,       kO,        kDO,           kStats,
                         kDQ,      kDK,      kDV,      kScale,    kNegInf,       kOne,
                         kRowSums, kDQAccum, kSeqLenQ, kSeqLenKV, kNegInfPadding};
  void* pointers[] = {base,
                      base + s.C,
                      base + 2 * s.C,
                      const_cast<__nv_bfloat16*>(y),
                      const_cast<__nv_bfloat16*>(dy),
                      const_cast<float*>(lse),
                      dqkv,
                      dqkv + s.C,
                      dqkv + 2 * s.C,
                      &m.scale,
                      &m.neg_inf,
                      &m.one,
                      row_sums,
                      dq_accum,
                      m.seq_lens,
                      s.padding ? m.seq_lens + s.B : nullptr,
                      &m.neg_inf};
  const std::int64_t count = s.padding ? 17 : 14;
  return execute(m.handle, m.bwd().plan, uids, pointers, count, ws, "backward");
}

#endif

}  // namespace topolaunch::kernels::cuda
