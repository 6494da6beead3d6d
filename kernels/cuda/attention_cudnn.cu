// cuDNN's fused causal attention behind attention.cuh's operand contract. See attention_cudnn.cuh.
#include "attention_cudnn.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>  // the frontend uses std::strlen without including it
#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(TOPOLAUNCH_WITH_CUDNN)
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace topolaunch::kernels::cuda {

#if !defined(TOPOLAUNCH_WITH_CUDNN)

bool cudnn_attention_built() { return false; }

struct CudnnAttention::Impl {};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

Result<std::unique_ptr<CudnnAttention>> CudnnAttention::create(std::int64_t, std::int64_t,
                                                               std::int64_t, std::int64_t) {
  return make_error(
      "cudnn attention: this build has no cuDNN attention; configure with "
      "-Dcudnn_frontend_dir=<cudnn-frontend>/include (meson option cudnn_frontend_dir) or use "
      "attention = own",
      1);
}
std::size_t CudnnAttention::workspace_bytes() const { return 0; }
std::string CudnnAttention::version() const { return "not built"; }
Status CudnnAttention::forward(__nv_bfloat16*, float*, const __nv_bfloat16*, void*,
                               cudaStream_t) const {
  return make_error("cudnn attention: not built", 1);
}
Status CudnnAttention::backward(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                const __nv_bfloat16*, const float*, void*, cudaStream_t) const {
  return make_error("cudnn attention: not built", 1);
}

#else

namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the two graphs (the variant packs name operands by uid).
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
  kSeqLenQ,
  kSeqLenKV,
};

std::string one_line(std::string s) {
  for (auto& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

Error fe_error(const std::string& what, fe::error_t e) {
  return make_error("cudnn attention: " + what + ": " + one_line(e.get_message()) + " (code " +
                        std::to_string(static_cast<int>(e.get_code())) + ")",
                    1);
}

// Q, K, V of head h inside qkv (B,T,3C): dims [B,NH,T,hs], strides [T*3C, hs, 3C, 1] (the channel
// offsets 0, C, 2C are the pointers' offsets); y, dy, dQ.. likewise with row length C or 3C.
std::vector<std::int64_t> dims(std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t hs) {
  return {B, NH, T, hs};
}
std::vector<std::int64_t> strides(std::int64_t T, std::int64_t row, std::int64_t hs) {
  return {T * row, hs, row, 1};
}

}  // namespace

bool cudnn_attention_built() { return true; }

struct CudnnAttention::Impl {
  std::int64_t B = 0, T = 0, C = 0, NH = 0;
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  std::int64_t fwd_ws = 0, bwd_ws = 0;
  // Sequence lengths (all T) for the backward's padding mask: cuDNN <= 9.15 needs one when T is
  // no multiple of 128, and the frontend otherwise copies such lengths from host memory at every
  // execute (not capturable into a CUDA Graph); ours live on the device, written once.
  std::int32_t* seq_lens = nullptr;  // 2*B: q then kv
  bool padding = false;
  ~Impl() {
    if (seq_lens != nullptr) cudaFree(seq_lens);
    if (handle != nullptr) cudnnDestroy(handle);
  }
};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

Result<std::unique_ptr<CudnnAttention>> CudnnAttention::create(std::int64_t B, std::int64_t T,
                                                               std::int64_t C, std::int64_t NH) {
  const std::string shape = "B=" + std::to_string(B) + " T=" + std::to_string(T) +
                            " C=" + std::to_string(C) + " NH=" + std::to_string(NH);
  if (B <= 0 || T <= 0 || NH <= 0 || C <= 0 || C % NH != 0)
    return make_error("cudnn attention: invalid shape " + shape, 1);
  const std::int64_t hs = C / NH, C3 = 3 * C;
  if (hs % 8 != 0)  // 16-byte aligned rows of each head
    return make_error("cudnn attention: head size " + std::to_string(hs) +
                          " is not a multiple of 8 (" + shape + ")",
                      1);
  try {
    auto impl = std::make_unique<Impl>();
    impl->B = B;
    impl->T = T;
    impl->C = C;
    impl->NH = NH;
    const cudnnStatus_t st = cudnnCreate(&impl->handle);
    if (st != CUDNN_STATUS_SUCCESS)
      return make_error(std::string("cudnn attention: cudnnCreate failed: ") +
                            cudnnGetErrorString(st) + " (is libcudnn installed for this GPU?)",
                        1);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const auto bf16 = fe::DataType_t::BFLOAT16;
    auto make_graph = [] {
      auto g = std::make_shared<fe::graph::Graph>();
      g->set_io_data_type(fe::DataType_t::BFLOAT16)
          .set_intermediate_data_type(fe::DataType_t::FLOAT)
          .set_compute_data_type(fe::DataType_t::FLOAT);
      return g;
    };
    auto tensor = [&](fe::graph::Graph& g, const char* name, Uid uid, std::int64_t row) {
      return g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(dims(B, T, NH, hs))
                          .set_stride(strides(T, row, hs))
                          .set_data_type(bf16));
    };
    auto stats = [&](fe::graph::Graph& g) {
      return g.tensor(fe::graph::Tensor_attributes()
                          .set_name("stats")
                          .set_uid(kStats)
                          .set_dim({B, NH, T, 1})
                          .set_stride({NH * T, T, 1, 1})
                          .set_data_type(fe::DataType_t::FLOAT));
    };

    // forward: O and Stats (training mode)
    {
      auto g = make_graph();
      auto q = tensor(*g, "q", kQ, C3), k = tensor(*g, "k", kK, C3), v = tensor(*g, "v", kV, C3);
      auto opts = fe::graph::SDPA_attributes()
                      .set_name("attention_forward")
                      .set_generate_stats(true)
                      .set_attn_scale(scale)
                      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                      .set_diagonal_band_right_bound(0);
      auto [o, lse] = g->sdpa(q, k, v, opts);
      o->set_output(true).set_uid(kO).set_dim(dims(B, T, NH, hs)).set_stride(strides(T, C, hs));
      if (!lse) return make_error("cudnn attention: the forward graph gives no Stats output", 1);
      lse->set_output(true)
          .set_uid(kStats)
          .set_dim({B, NH, T, 1})
          .set_stride({NH * T, T, 1, 1})
          .set_data_type(fe::DataType_t::FLOAT);
      if (auto e = g->build(impl->handle, {fe::HeurMode_t::A}); e.is_bad())
        return fe_error("forward graph for " + shape, e);
      if (auto e = g->get_workspace_size(impl->fwd_ws); e.is_bad())
        return fe_error("forward workspace size", e);
      impl->fwd = std::move(g);
    }
    // backward: dQ, dK, dV written into dqkv
    {
      impl->padding = T % 128 != 0;
      auto g = make_graph();
      auto q = tensor(*g, "q", kQ, C3), k = tensor(*g, "k", kK, C3), v = tensor(*g, "v", kV, C3);
      auto o = tensor(*g, "o", kO, C), dout = tensor(*g, "do", kDO, C);
      auto lse = stats(*g);
      auto opts = fe::graph::SDPA_backward_attributes()
                      .set_name("attention_backward")
                      .set_attn_scale(scale)
                      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                      .set_diagonal_band_right_bound(0);
      if (impl->padding) {
        auto lens = [&](const char* name, Uid uid) {
          return g->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_uid(uid)
                               .set_dim({B, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_data_type(fe::DataType_t::INT32));
        };
        opts.set_padding_mask(true)
            .set_seq_len_q(lens("seq_len_q", kSeqLenQ))
            .set_seq_len_kv(lens("seq_len_kv", kSeqLenKV));
      }
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, lse, opts);
      dq->set_output(true).set_uid(kDQ).set_dim(dims(B, T, NH, hs)).set_stride(strides(T, C3, hs));
      dk->set_output(true).set_uid(kDK).set_dim(dims(B, T, NH, hs)).set_stride(strides(T, C3, hs));
      dv->set_output(true).set_uid(kDV).set_dim(dims(B, T, NH, hs)).set_stride(strides(T, C3, hs));
      if (auto e = g->build(impl->handle, {fe::HeurMode_t::A}); e.is_bad())
        return fe_error("backward graph for " + shape, e);
      if (auto e = g->get_workspace_size(impl->bwd_ws); e.is_bad())
        return fe_error("backward workspace size", e);
      impl->bwd = std::move(g);
    }
    if (impl->padding) {
      std::vector<std::int32_t> lens(static_cast<std::size_t>(2 * B), static_cast<std::int32_t>(T));
      void* p = nullptr;
      if (cudaMalloc(&p, lens.size() * sizeof(std::int32_t)) != cudaSuccess ||
          cudaMemcpy(p, lens.data(), lens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice) !=
              cudaSuccess) {
        if (p != nullptr) cudaFree(p);
        return make_error("cudnn attention: allocation of the sequence lengths failed", 1);
      }
      impl->seq_lens = static_cast<std::int32_t*>(p);
    }
    return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
  } catch (const std::exception& e) {
    return make_error("cudnn attention: " + one_line(e.what()) + " (" + shape + ")", 1);
  } catch (...) {
    return make_error("cudnn attention: unknown exception while building graphs (" + shape + ")",
                      1);
  }
}

std::size_t CudnnAttention::workspace_bytes() const {
  return static_cast<std::size_t>(std::max(impl_->fwd_ws, impl_->bwd_ws));
}

std::string CudnnAttention::version() const {
  const std::size_t v = cudnnGetVersion();  // 91400 = 9.14.0
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + ", frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) +
         "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

Status CudnnAttention::forward(__nv_bfloat16* y, float* lse, const __nv_bfloat16* qkv,
                               void* workspace, cudaStream_t stream) const {
  try {
    const Impl& m = *impl_;
    if (cudnnSetStream(m.handle, stream) != CUDNN_STATUS_SUCCESS)
      return make_error("cudnn attention: cudnnSetStream failed", 1);
    auto* base = const_cast<__nv_bfloat16*>(qkv);
    std::unordered_map<std::int64_t, void*> pack = {
        {kQ, base}, {kK, base + m.C}, {kV, base + 2 * m.C}, {kO, y}, {kStats, lse}};
    if (auto e = m.fwd->execute(m.handle, pack, workspace); e.is_bad())
      return fe_error("forward", e);
    return ok_status();
  } catch (const std::exception& e) {
    return make_error("cudnn attention: forward: " + one_line(e.what()), 1);
  } catch (...) {
    return make_error("cudnn attention: forward: unknown exception", 1);
  }
}

Status CudnnAttention::backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dy,
                                const __nv_bfloat16* qkv, const __nv_bfloat16* y, const float* lse,
                                void* workspace, cudaStream_t stream) const {
  try {
    const Impl& m = *impl_;
    if (cudnnSetStream(m.handle, stream) != CUDNN_STATUS_SUCCESS)
      return make_error("cudnn attention: cudnnSetStream failed", 1);
    auto* base = const_cast<__nv_bfloat16*>(qkv);
    std::unordered_map<std::int64_t, void*> pack = {{kQ, base},
                                                    {kK, base + m.C},
                                                    {kV, base + 2 * m.C},
                                                    {kO, const_cast<__nv_bfloat16*>(y)},
                                                    {kDO, const_cast<__nv_bfloat16*>(dy)},
                                                    {kStats, const_cast<float*>(lse)},
                                                    {kDQ, dqkv},
                                                    {kDK, dqkv + m.C},
                                                    {kDV, dqkv + 2 * m.C}};
    if (m.padding) {
      pack[kSeqLenQ] = m.seq_lens;
      pack[kSeqLenKV] = m.seq_lens + m.B;
    }
    if (auto e = m.bwd->execute(m.handle, pack, workspace); e.is_bad())
      return fe_error("backward", e);
    return ok_status();
  } catch (const std::exception& e) {
    return make_error("cudnn attention: backward: " + one_line(e.what()), 1);
  } catch (...) {
    return make_error("cudnn attention: backward: unknown exception", 1);
  }
}

#endif

}  // namespace topolaunch::kernels::cuda
