// The CUDA executor: the plan's op list over one device arena. See cuda_backend.hpp.
#include "cuda_backend.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

#include "adamw.cuh"
#include "attention.cuh"
#include "attention_cudnn.cuh"
#include "classifier.cuh"
#include "encoder.cuh"
#include "fp8.cuh"
#include "gelu.cuh"
#include "kernel_primitives.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "residual.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"
#include "topolaunch/kernels/rng.hpp"

namespace topolaunch::kernels::cuda {

namespace {

Error cuda_error(const std::string& what, cudaError_t e) {
  return make_error("cuda backend: " + what + ": " + cudaGetErrorString(e), 1);
}

#define TL_CUDA_TRY(call, what)                             \
  do {                                                      \
    const cudaError_t err_ = (call);                        \
    if (err_ != cudaSuccess) return cuda_error(what, err_); \
  } while (0)

#define TL_STATUS_TRY(expr) TL_STATUS_TRY_IMPL(expr)
#define TL_ERROR_TRY(expr)                \
  do {                                    \
    auto status_ = (expr);                \
    if (!status_) return status_.error(); \
  } while (0)
#define TL_STATUS_TRY_IMPL(expr)  \
  do {                            \
    auto status_ = (expr);        \
    if (!status_) return status_; \
  } while (0)

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Which dtype each operand of each op must have for the kernels of kernels/cuda (b = bf16,
// f = fp32, i = i32, '-' = not checked). Optional trailing operands may be absent.
struct Signature {
  const char* inputs;
  const char* outputs;
};
Signature signature(OpKind kind) {
  switch (kind) {
    case OpKind::encoder_forward:
      return {"ibb", "b"};
    case OpKind::encoder_backward:
      return {"bi", "ff"};
    case OpKind::layernorm_forward:
      return {"bbb", "bff"};
    case OpKind::layernorm_backward:
      return {"bbbff", "bff"};
    case OpKind::residual_layernorm_forward:
      return {"bbbb", "bbff"};
    case OpKind::matmul_forward:
      return {"bbb", "b"};
    case OpKind::matmul_backward:
      return {"bbb", "bff"};
    case OpKind::attention_forward:
      return {"b", "bf"};
    case OpKind::attention_backward:
      return {"bbbf", "b"};
    case OpKind::gelu_forward:
    case OpKind::gelu_backward:
    case OpKind::residual_forward:
    case OpKind::residual_backward:
      return {"bb", "bb"};
    case OpKind::crossentropy_forward:
      return {"bi", "f"};
    case OpKind::crossentropy_backward:
      return {"bif", "b"};
    case OpKind::zero:
      return {"", ""};
    case OpKind::global_norm:
      return {"", "f"};
    case OpKind::adamw:
      return {"fff", "bfff"};
    case OpKind::all_reduce:
      return {"", ""};
    case OpKind::rmsnorm_forward:
      return {"bb", "bf"};
    case OpKind::rmsnorm_backward:
      return {"bbbf", "bf"};
    case OpKind::residual_rmsnorm_forward:
      return {"bbb", "bbf"};
    case OpKind::rope_forward:
    case OpKind::rope_backward:
      return {"b", "b"};
    case OpKind::swiglu_forward:
      return {"b", "b"};
    case OpKind::swiglu_backward:
      return {"bb", "b"};
    case OpKind::reduce_scatter:
      return {"f", "ff"};
    case OpKind::all_gather:
      return {"b", "b"};
    case OpKind::sharded_global_norm:
      return {"", "f"};
    case OpKind::sharded_adamw:
      return {"fff", "bfff"};
    case OpKind::classifier_forward:
      return {"bbi", "f"};
    case OpKind::classifier_backward:
      return {"bbif", "bff"};
  }
  return {"", ""};
}

char dtype_letter(DType d) {
  switch (d) {
    case DType::bf16:
      return 'b';
    case DType::f32:
      return 'f';
    case DType::i32:
      return 'i';
    case DType::f64:
      return 'd';
  }
  return '?';
}

// Deterministic values in [-scale, scale) for the attention timing's operands (cuDNN and our
// kernels timed on the same non-degenerate data).
__global__ void fill_bf16_kernel(bf16* p, std::int64_t n, std::uint32_t seed, float scale) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  p[i] = __float2bfloat16((static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f) * 2 * scale);
}

}  // namespace

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::auto_select:
      return "auto";
    case AttentionImpl::own:
      return "own";
    case AttentionImpl::cudnn:
      return "cudnn";
  }
  return "?";
}

CudaExecutor::CudaExecutor(const Plan& plan, const CudaExecutorOptions& options,
                           GpuCommunicator* comm)
    : plan_(plan), options_(options), comm_(comm) {}

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::create(const Plan& plan,
                                                           const CudaExecutorOptions& options,
                                                           GpuCommunicator* communicator) {
  const Graph& g = plan.graph;
  // Every op's operands must have the dtypes the kernels take (a graph built with
  // Precision::cuda_bf16()).
  for (const Op& op : g.ops) {
    const Signature sig = signature(op.kind);
    auto check = [&](const std::vector<TensorId>& ids, const char* letters,
                     const char* side) -> Status {
      for (std::size_t k = 0; k < ids.size() && letters[k] != '\0'; ++k) {
        const Tensor& t = g[ids[k]];
        if (dtype_letter(t.dtype) != letters[k])
          return make_error("cuda backend: op '" + op.name + "' (" + std::string(op_name(op.kind)) +
                            ") " + side + " " + std::to_string(k) + " '" + t.name + "' is " +
                            std::string(dtype_name(t.dtype)) +
                            ", the CUDA kernels take another type; build the graph with "
                            "Precision::cuda_bf16() (train.precision = \"bf16\")");
      }
      return ok_status();
    };
    TL_ERROR_TRY(check(op.inputs, sig.inputs, "input"));
    TL_ERROR_TRY(check(op.outputs, sig.outputs, "output"));
    if ((op.kind == OpKind::adamw || op.kind == OpKind::sharded_adamw) && op.outputs.size() < 4)
      return make_error("cuda backend: op '" + op.name +
                        "' has no fp32 master copy (parameters must be bf16, optimizer fp32)");
    if (op.kind == OpKind::global_norm || op.kind == OpKind::all_reduce ||
        op.kind == OpKind::sharded_global_norm) {
      for (auto t : op.inputs)
        if (g[t].dtype != DType::f32)
          return make_error("cuda backend: gradient '" + g[t].name + "' is " +
                            std::string(dtype_name(g[t].dtype)) +
                            ", the CUDA backend needs fp32 parameter gradients");
    }
    if (op.kind == OpKind::attention_forward || op.kind == OpKind::attention_backward) {
      const AttentionShape a =
          attention_shape(g, op, op.inputs[op.kind == OpKind::attention_forward ? 0 : 1]);
      const auto& s = g[op.inputs[op.kind == OpKind::attention_forward ? 0 : 1]].shape;
      const std::int64_t C = a.C;
      if (!attention_supported(C, op.num_heads))
        return make_error("cuda backend: attention with C = " + std::to_string(C) + " and " +
                          std::to_string(op.num_heads) +
                          " heads is not supported by kernels/cuda/attention (head size " +
                          std::to_string(C / op.num_heads) + ")");
      if (op.kind == OpKind::attention_backward) {
        const std::size_t need = attention_backward_workspace_bytes(s[0], s[1], C, op.num_heads);
        if (op.workspace == kNoTensor || g[op.workspace].bytes() < need)
          return make_error(
              "cuda backend: op '" + op.name + "': attention backward needs " +
              std::to_string(need) + " bytes of workspace, the plan gives " +
              std::to_string(op.workspace == kNoTensor ? 0 : g[op.workspace].bytes()));
      }
    }
  }
  if (g.scalars == kNoTensor || g[g.scalars].dtype != DType::f32)
    return make_error("cuda backend: the graph's scalars must be fp32");
  std::unique_ptr<CudaExecutor> ex(new CudaExecutor(plan, options, communicator));
  TL_ERROR_TRY(ex->init());
  return Result<std::unique_ptr<CudaExecutor>>(std::move(ex));
}

Status CudaExecutor::init() {
  const Graph& g = plan_.graph;
  TL_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  if (options_.comm_stream_high_priority) {
    int least = 0, greatest = 0;
    TL_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priority range");
    TL_CUDA_TRY(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest),
                "comm stream");
  } else {
    TL_CUDA_TRY(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "comm stream");
  }
  const std::size_t bytes = std::max<std::size_t>(plan_.memory.arena_bytes, 256);
  void* arena = nullptr;
  TL_CUDA_TRY(cudaMalloc(&arena, bytes),
              "cudaMalloc of the " + format_bytes(bytes) + " arena (plan.memory.arena_bytes)");
  arena_ = static_cast<std::byte*>(arena);
  TL_CUDA_TRY(cudaMemsetAsync(arena_, 0, bytes, stream_), "arena memset");
  if (plan_.memory.host_bytes > 0) {
    // Kernels read and write it in place over the host link (zero-copy), in the step's graph.
    const std::size_t host = plan_.memory.host_bytes;
    TL_CUDA_TRY(cudaHostAlloc(&host_state_, host, cudaHostAllocMapped | cudaHostAllocPortable),
                "cudaHostAlloc of the " + format_bytes(host) +
                    " of offloaded optimizer state (plan.memory.host_bytes)");
    std::memset(host_state_, 0, host);
    void* mapped = nullptr;
    TL_CUDA_TRY(cudaHostGetDevicePointer(&mapped, host_state_, 0),
                "the device's pointer to the offloaded optimizer state");
    host_state_device_ = static_cast<std::byte*>(mapped);
  }
  // The attention choice may time both implementations on the arena's attention tensors: before
  // anything lives there, and the arena is zeroed again after it.
  TL_STATUS_TRY(choose_attention());
  TL_CUDA_TRY(cudaMemsetAsync(arena_, 0, bytes, stream_), "arena memset");
  matmul_ = std::make_unique<Matmul>();
  if (!matmul_->error().empty()) return make_error("cuda backend: " + matmul_->error(), 1);
  TL_STATUS_TRY(init_fp8());

  const std::size_t n_tokens = static_cast<std::size_t>(g[g.tokens].elements());
  for (auto& s : staging_) {
    void* p = nullptr;
    TL_CUDA_TRY(cudaMallocHost(&p, 2 * n_tokens * sizeof(std::int32_t)), "pinned staging");
    s.tokens = static_cast<std::int32_t*>(p);
    TL_CUDA_TRY(cudaMallocHost(&p, kNumScalars * sizeof(float)), "pinned staging");
    s.scalars = static_cast<float*>(p);
    TL_CUDA_TRY(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "event");
  }
  pending_batch_.assign(2 * n_tokens, 0);

  first_optimizer_op_ = g.ops.size();
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].phase == Phase::optimizer) {
      first_optimizer_op_ = i;
      break;
    }
  // (a sharded plan's parameter gathers among the forward ops belong to the forward)
  first_backward_op_ = first_optimizer_op_;
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].phase != Phase::forward && g.ops[i].phase != Phase::communication) {
      first_backward_op_ = i;
      break;
    }
  classifier_backward_.resize(g.ops.size());
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    classifier_backward_[i] = classifier_backward_of(g, i);
  fused_with_next_.assign(g.ops.size(), 0);
  if (options_.fuse_classifier) {
    for (std::size_t i = 0; i + 1 < g.ops.size(); ++i) {
      const Op& f = g.ops[i];
      const Op& b = g.ops[i + 1];
      if (f.kind == OpKind::crossentropy_forward && b.kind == OpKind::crossentropy_backward &&
          f.inputs[0] == b.inputs[0] && f.inputs[1] == b.inputs[1] && f.vocab == b.vocab)
        fused_with_next_[i] = 1;
    }
  }
  // A zero whose tensor is next touched by a gelu_backward writing it (not reading it): skip the
  // memset and let the gelu_backward overwrite instead of accumulate.
  skip_zero_.assign(g.ops.size(), 0);
  overwrite_.assign(g.ops.size(), 0);
  if (options_.overwrite_first_gradient) {
    for (std::size_t k = 0; k < g.ops.size(); ++k) {
      const Op& z = g.ops[k];
      if (z.kind != OpKind::zero || z.outputs.size() != 1 || z.phase == Phase::optimizer) continue;
      const TensorId t = z.outputs[0];
      for (std::size_t j = k + 1; j < g.ops.size(); ++j) {
        const Op& o = g.ops[j];
        const bool reads =
            std::find(o.inputs.begin(), o.inputs.end(), t) != o.inputs.end() || o.workspace == t;
        const bool writes = std::find(o.outputs.begin(), o.outputs.end(), t) != o.outputs.end();
        if (!reads && !writes) continue;
        const bool gelu = o.kind == OpKind::gelu_backward && o.outputs.size() == 1;
        // matmul_backward's dx (outputs[0]) with beta 0; its dw/db accumulate as before
        const bool matmul =
            (o.kind == OpKind::matmul_backward || o.kind == OpKind::classifier_backward) &&
            o.outputs[0] == t && std::count(o.outputs.begin(), o.outputs.end(), t) == 1;
        // cuDNN's attention backward overwrites dqkv (chosen only where it is the first writer)
        const bool attention = o.kind == OpKind::attention_backward && cudnn_backward_[j] != 0;
        if ((gelu || matmul || attention) && writes && !reads && o.phase == z.phase) {
          skip_zero_[k] = 1;
          overwrite_[j] = 1;
        }
        break;
      }
    }
  }
  // Zero ops: merge the ranges of tensors that touch or are separated only by alignment padding
  // that no tensor of the plan occupies (offsets are reused across lifetimes, so any tensor
  // overlapping a gap keeps the ranges apart).
  zero_ranges_.assign(g.ops.size(), {});
  {
    std::vector<std::pair<std::size_t, std::size_t>> occupied;  // every tensor's [begin, end)
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
      const std::size_t off = plan_.memory.offsets[t];
      if (off != kNoOffset && g.tensors[t].bytes() > 0)
        occupied.emplace_back(off, off + g.tensors[t].bytes());
    }
    auto gap_free = [&](std::size_t begin, std::size_t end) {
      if (begin == end) return true;
      for (const auto& [b, e] : occupied)
        if (b < end && e > begin) return false;
      return true;
    };
    for (std::size_t k = 0; k < g.ops.size(); ++k) {
      const Op& z = g.ops[k];
      if (z.kind != OpKind::zero) continue;
      std::vector<std::pair<std::size_t, std::size_t>> r;
      for (auto t : z.outputs) {
        const std::size_t off = plan_.memory.offsets[static_cast<std::size_t>(t)];
        if (off != kNoOffset && g[t].bytes() > 0) r.emplace_back(off, off + g[t].bytes());
      }
      std::sort(r.begin(), r.end());
      auto& merged = zero_ranges_[k];
      for (const auto& x : r) {
        if (!merged.empty() && x.first >= merged.back().second &&
            x.first - merged.back().second < 4096 && gap_free(merged.back().second, x.first)) {
          merged.back().second = std::max(merged.back().second, x.second);
          continue;
        }
        if (!merged.empty() && x.first < merged.back().second) {  // overlapping: one range
          merged.back().second = std::max(merged.back().second, x.second);
          continue;
        }
        merged.push_back(x);
      }
    }
  }
  master_of_.assign(g.tensors.size(), kNoTensor);
  for (const Op& op : g.ops)
    if (op.kind == OpKind::adamw && op.outputs.size() >= 4)
      master_of_[static_cast<std::size_t>(op.outputs[0])] = op.outputs[3];
  for (std::size_t k = 0; k < plan_.comm.buckets.size(); ++k)
    for (std::size_t m = 0; m < plan_.comm.buckets[k].members.size(); ++m)
      member_of_[plan_.comm.buckets[k].members[m].param] = {static_cast<int>(k), m};
  transient_gradients_ =
      plan_.comm.shard == ShardMode::gradients || plan_.comm.shard == ShardMode::parameters;
  gather_ready_.assign(g.ops.size(), nullptr);
  gather_done_.assign(g.ops.size(), nullptr);
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].kind != OpKind::all_gather || g.ops[i].phase == Phase::optimizer) continue;
    TL_CUDA_TRY(cudaEventCreateWithFlags(&gather_ready_[i], cudaEventDisableTiming), "event");
    TL_CUDA_TRY(cudaEventCreateWithFlags(&gather_done_[i], cudaEventDisableTiming), "event");
  }
  fuse_gelu_pairs();
  fuse_bias_gradients();
  TL_STATUS_TRY(build_multi_tensor_tables());
  const std::size_t n_buckets = plan_.comm.buckets.size();
  bucket_ready_.assign(n_buckets, nullptr);
  bucket_done_.assign(n_buckets, nullptr);
  for (std::size_t b = 0; b < n_buckets; ++b) {
    TL_CUDA_TRY(cudaEventCreateWithFlags(&bucket_ready_[b], cudaEventDisableTiming), "event");
    TL_CUDA_TRY(cudaEventCreateWithFlags(&bucket_done_[b], cudaEventDisableTiming), "event");
  }
  if (options_.profile_ops && options_.mode == ExecutionMode::op_by_op) {
    op_start_.assign(g.ops.size(), nullptr);
    op_end_.assign(g.ops.size(), nullptr);
    op_recorded_.assign(g.ops.size(), 0);
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      TL_CUDA_TRY(cudaEventCreate(&op_start_[i]), "profile event");
      TL_CUDA_TRY(cudaEventCreate(&op_end_[i]), "profile event");
    }
  }
  AdamWSettings defaults;
  write_scalars(defaults, 1);
  host_scalars_[kLossScale] =
      1.0f / static_cast<float>(g[g.tokens].elements() > 0 ? g[g.tokens].elements() : 1);
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "arena memset");
  return ok_status();
}

// attention = own | cudnn | auto (see AttentionChoice). Runs once, in init(), outside any capture:
// builds cuDNN's graphs for the plan's attention shape, allocates their workspace, and for auto
// times both implementations on the arena's attention tensors (nothing lives there yet).
Status CudaExecutor::choose_attention() {
  const Graph& g = plan_.graph;
  AttentionChoice& ch = attention_choice_;
  ch = AttentionChoice{};
  cudnn_backward_.assign(g.ops.size(), 0);
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>> shapes;
  bool grouped = false;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::attention_backward) ++ch.own_backward_ops;
    if (op.kind != OpKind::attention_forward && op.kind != OpKind::attention_backward) continue;
    const AttentionShape a =
        attention_shape(g, op, op.inputs[op.kind == OpKind::attention_forward ? 0 : 1]);
    shapes.emplace(a.B, a.T, a.C, a.NH);
    grouped = grouped || a.NKV != a.NH;
  }
  const AttentionImpl want = options_.attention;
  if (shapes.empty()) {
    ch.reason = "the plan has no attention";
    return ok_status();
  }
  if (want == AttentionImpl::own) {
    ch.reason = "attention = own";
    return ok_status();
  }
  auto unavailable = [&](const std::string& why) -> Status {
    cudnn_attention_.reset();
    if (cudnn_workspace_ != nullptr) cudaFree(cudnn_workspace_);
    cudnn_workspace_ = nullptr;
    cudnn_workspace_alloc_bytes_ = 0;
    cudnn_workspace_of_.clear();
    ch.cudnn_workspace_bytes = 0;
    ch.cudnn_workspace_planned = false;
    if (want == AttentionImpl::cudnn)
      return make_error("cuda backend: attention = cudnn: " + why, 2);
    ch.reason = "auto: own, cudnn unavailable: " + why;
    return ok_status();
  };
  if (grouped)
    return unavailable(
        "the plan's attention is grouped-query (n_kv_head < n_head); cuDNN attention here is set "
        "up for multi-head attention's (B,T,3C) layout");
  if (!cudnn_attention_built())
    return unavailable(
        "this build has no cuDNN attention (meson found no libcudnn 9 with cudnn.h; install the "
        "cuDNN 9 development package and reconfigure, or use attention = own)");
  if (shapes.size() != 1)
    return unavailable("the plan's attention ops have " + std::to_string(shapes.size()) +
                       " shapes; cuDNN attention is set up for one");
  const auto [B, T, C, NH] = *shapes.begin();
  // what cuDNN takes on the device: its workspace and its own allocations (handle, plans)
  auto device_used = [] {
    std::size_t free_bytes = 0, total_bytes = 0;
    return cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess ? total_bytes - free_bytes
                                                                    : std::size_t{0};
  };
  const std::size_t used_before = device_used();
  auto created = CudnnAttention::create(B, T, C, NH);
  if (!created) return unavailable(created.error().message);
  cudnn_attention_ = std::move(*created);
  ch.cudnn_version = cudnn_attention_->version();
  ch.cudnn_workspace_bytes = cudnn_attention_->workspace_bytes();
  // Each attention op runs cuDNN in its own planned workspace when that is large enough (the
  // planner's fused_attention_workspace); any other shares one separate allocation.
  cudnn_workspace_of_.assign(g.ops.size(), nullptr);
  std::vector<std::size_t> needs_separate;
  for (std::size_t j = 0; j < g.ops.size(); ++j) {
    const Op& o = g.ops[j];
    if (o.kind != OpKind::attention_forward && o.kind != OpKind::attention_backward) continue;
    const std::size_t need = o.kind == OpKind::attention_forward
                                 ? cudnn_attention_->forward_engine_workspace_bytes()
                                 : ch.cudnn_workspace_bytes;
    void* planned = device_pointer(o.workspace);
    if (planned != nullptr && g[o.workspace].bytes() >= need)
      cudnn_workspace_of_[j] = planned;
    else if (need > 0)
      needs_separate.push_back(j);
  }
  ch.cudnn_workspace_planned = needs_separate.empty();
  if (!needs_separate.empty()) {
    if (cudaMalloc(&cudnn_workspace_, ch.cudnn_workspace_bytes) != cudaSuccess) {
      cudaGetLastError();
      cudnn_workspace_ = nullptr;
      return unavailable("cudaMalloc of its " + format_bytes(ch.cudnn_workspace_bytes) +
                         " workspace failed");
    }
    cudnn_workspace_alloc_bytes_ = ch.cudnn_workspace_bytes;
    for (auto j : needs_separate) cudnn_workspace_of_[j] = cudnn_workspace_;
  }
  // cuDNN's backward overwrites dqkv: it runs only where the latest earlier op touching dqkv is
  // the plan's zero of it (then overwriting = accumulating into zeros; init() skips that zero).
  std::vector<std::uint8_t> eligible(g.ops.size(), 0);
  int n_eligible = 0;
  for (std::size_t j = 0; j < g.ops.size(); ++j) {
    const Op& o = g.ops[j];
    if (o.kind != OpKind::attention_backward || o.outputs.size() != 1) continue;
    const TensorId t = o.outputs[0];
    if (std::find(o.inputs.begin(), o.inputs.end(), t) != o.inputs.end() || o.workspace == t)
      continue;
    for (std::size_t k = j; k-- > 0;) {
      const Op& p = g.ops[k];
      const bool touches = std::find(p.inputs.begin(), p.inputs.end(), t) != p.inputs.end() ||
                           std::find(p.outputs.begin(), p.outputs.end(), t) != p.outputs.end() ||
                           p.workspace == t;
      if (!touches) continue;
      if (p.kind == OpKind::zero && p.phase == o.phase) {
        eligible[j] = 1;
        ++n_eligible;
      }
      break;
    }
  }
  auto use_cudnn = [&] {
    ch.chosen = AttentionImpl::cudnn;
    cudnn_backward_ = eligible;
    ch.cudnn_backward_ops = n_eligible;
    ch.own_backward_ops -= n_eligible;
  };
  if (want == AttentionImpl::cudnn) {
    use_cudnn();
    ch.reason = "attention = cudnn";
    return ok_status();
  }
  // auto: forward and backward of each, same operands, medians
  auto own_f = time_attention(false, false), own_b = time_attention(false, true);
  if (!own_f || !own_b)
    return !own_f ? Status(own_f.error()) : Status(own_b.error());  // our kernels must work
  ch.own_fwd_ms = *own_f;
  ch.own_bwd_ms = *own_b;
  auto cud_f = time_attention(true, false);
  if (!cud_f) return unavailable(cud_f.error().message);
  auto cud_b = time_attention(true, true);
  if (!cud_b) return unavailable(cud_b.error().message);
  ch.cudnn_fwd_ms = *cud_f;
  ch.cudnn_bwd_ms = *cud_b;
  TL_STATUS_TRY(select_cudnn_candidates());
  // A memory budget is planned for the arena, which holds cuDNN's workspace when the planner gave
  // the attention ops room for it; what cuDNN takes beside (its handle and plans, a separate
  // workspace) sits outside, beside cuBLASLt's workspace, so under a budget auto takes cuDNN only
  // when all of it still fits. Measured after cuDNN ran (it allocates some of its memory on first
  // use): with a separate workspace, GPT-2 124M B=64 under 16 GiB used 16.02 GiB with cuDNN
  // (15.78 arena), 15.81 with ours.
  if (plan_.memory_budget_bytes > 0) {
    const std::size_t after = device_used();
    const std::size_t cudnn_bytes =
        std::max(cudnn_workspace_alloc_bytes_, after > used_before ? after - used_before : 0);
    const std::size_t total = plan_.memory.arena_bytes + memory().workspace_bytes + cudnn_bytes;
    if (total > plan_.memory_budget_bytes) {
      const double keep_fwd = ch.cudnn_fwd_ms, keep_bwd = ch.cudnn_bwd_ms;
      TL_STATUS_TRY(unavailable("its " + format_bytes(cudnn_bytes) +
                                " of device memory (workspace and its own) would take the "
                                "arena + cuBLASLt workspace + it to " +
                                format_bytes(total) + ", over the memory budget of " +
                                format_bytes(plan_.memory_budget_bytes)));
      ch.cudnn_fwd_ms = keep_fwd;
      ch.cudnn_bwd_ms = keep_bwd;
      return ok_status();
    }
  }
  const double own_ms = ch.own_fwd_ms + ch.own_bwd_ms;
  const double cudnn_ms = ch.cudnn_fwd_ms + (n_eligible > 0 ? ch.cudnn_bwd_ms : ch.own_bwd_ms);
  char line[160];
  std::snprintf(line, sizeof line, "%.4f ms fwd+bwd vs %s %.4f ms", std::min(own_ms, cudnn_ms),
                cudnn_ms < own_ms ? "own" : "cudnn", std::max(own_ms, cudnn_ms));
  if (cudnn_ms < own_ms) {
    use_cudnn();
    ch.reason = std::string("auto: cudnn faster, ") + line;
    return ok_status();
  }
  const double keep_fwd = ch.cudnn_fwd_ms, keep_bwd = ch.cudnn_bwd_ms;
  TL_STATUS_TRY(unavailable("not faster"));  // frees cuDNN's graphs and workspace
  ch.cudnn_fwd_ms = keep_fwd;
  ch.cudnn_bwd_ms = keep_bwd;
  ch.reason = std::string("auto: own faster, ") + line;
  return ok_status();
}

// cuDNN ranks its engine configurations by heuristics and its frontend runs the first; on a given
// shape another can be faster. Each other candidate whose workspace fits where the first's does
// (the planned attention workspaces, or the separate allocation) is timed on the same operands,
// and the fastest kept when it beats the first by kCandidateMinGain (timings jitter by ~1%).
Status CudaExecutor::select_cudnn_candidates() {
  constexpr double kCandidateMinGain = 0.98;
  const Graph& g = plan_.graph;
  AttentionChoice& ch = attention_choice_;
  auto fits = [&] {
    for (std::size_t j = 0; j < g.ops.size(); ++j) {
      const Op& o = g.ops[j];
      if (o.kind != OpKind::attention_forward && o.kind != OpKind::attention_backward) continue;
      const std::size_t need = o.kind == OpKind::attention_forward
                                   ? cudnn_attention_->forward_engine_workspace_bytes()
                                   : cudnn_attention_->workspace_bytes();
      const void* at = cudnn_workspace_of_[j];
      std::size_t have = 0;
      if (at != nullptr && at == cudnn_workspace_)
        have = cudnn_workspace_alloc_bytes_;
      else if (at != nullptr)
        have = g[o.workspace].bytes();
      if (need > have) return false;
    }
    return true;
  };
  for (const bool backward : {false, true}) {
    const int n = cudnn_attention_->candidates(backward);
    std::vector<double>& ms = backward ? ch.cudnn_bwd_candidates_ms : ch.cudnn_fwd_candidates_ms;
    double& chosen_ms = backward ? ch.cudnn_bwd_ms : ch.cudnn_fwd_ms;
    ms.assign(static_cast<std::size_t>(std::max(n, 0)), -1.0);
    if (n <= 0) continue;
    ms[0] = chosen_ms;
    int best = 0;
    for (int i = 1; i < n; ++i) {
      cudnn_attention_->select(backward, i);
      if (!fits()) continue;
      auto t = time_attention(true, backward);
      if (!t) {
        cudaGetLastError();  // a candidate that fails to run is not taken
        continue;
      }
      ms[static_cast<std::size_t>(i)] = *t;
      if (*t < ms[static_cast<std::size_t>(best)] * kCandidateMinGain) best = i;
    }
    cudnn_attention_->select(backward, best);
    (backward ? ch.cudnn_bwd_candidate : ch.cudnn_fwd_candidate) = best;
    (backward ? ch.cudnn_bwd_config : ch.cudnn_fwd_config) =
        cudnn_attention_->candidate_description(backward, best);
    chosen_ms = ms[static_cast<std::size_t>(best)];
  }
  ch.cudnn_version = cudnn_attention_->version();
  ch.cudnn_workspace_bytes = cudnn_attention_->workspace_bytes();
  return ok_status();
}

// Median ms of one attention forward or backward (ours or cuDNN's) on the operands of the plan's
// first attention backward (forward: qkv -> y, lse; backward: dy, qkv, y, lse -> dqkv).
Result<double> CudaExecutor::time_attention(bool cudnn, bool backward) {
  const Graph& g = plan_.graph;
  std::size_t at = g.ops.size();
  for (std::size_t i = 0; i < g.ops.size() && at == g.ops.size(); ++i)
    if (g.ops[i].kind == OpKind::attention_backward) at = i;
  TensorId qkv_t = kNoTensor, y_t = kNoTensor, lse_t = kNoTensor, dy_t = kNoTensor,
           dqkv_t = kNoTensor;
  void* ws = nullptr;
  if (at < g.ops.size()) {
    const Op& o = g.ops[at];
    dy_t = o.inputs[0];
    qkv_t = o.inputs[1];
    y_t = o.inputs[2];
    lse_t = o.inputs[3];
    dqkv_t = o.outputs[0];
    ws = device_pointer(o.workspace);
  } else {
    if (backward) return 0.0;  // no backward in the plan
    for (const Op& o : g.ops)
      if (o.kind == OpKind::attention_forward) {
        qkv_t = o.inputs[0];
        y_t = o.outputs[0];
        lse_t = o.outputs[1];
        at = static_cast<std::size_t>(&o - g.ops.data());
        break;
      }
  }
  auto* qkv = static_cast<bf16*>(device_pointer(qkv_t));
  auto* y = static_cast<bf16*>(device_pointer(y_t));
  auto* lse = static_cast<float*>(device_pointer(lse_t));
  auto* dy = static_cast<bf16*>(device_pointer(dy_t));
  auto* dqkv = static_cast<bf16*>(device_pointer(dqkv_t));
  if (qkv == nullptr || y == nullptr || lse == nullptr ||
      (backward && (dy == nullptr || dqkv == nullptr)))
    return make_error("cuda backend: attention timing: an attention tensor has no arena offset", 1);
  const AttentionShape shape = attention_shape(g, g.ops[at], qkv_t);
  const std::int64_t Bn = shape.B, Tn = shape.T, Cn = shape.C, heads = shape.NH;
  auto fill = [&](bf16* p, TensorId t, std::uint32_t seed, float scale) {
    const std::int64_t n = g[t].elements();
    fill_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream_>>>(p, n, seed,
                                                                                  scale);
  };
  fill(qkv, qkv_t, 1, 2.0f);
  if (dy != nullptr) fill(dy, dy_t, 2, 1.0f);
  auto run = [&](bool bwd) -> Status {
    if (cudnn) {
      if (!bwd) return cudnn_attention_->forward(y, lse, qkv, cudnn_workspace_of_[at], stream_);
      return cudnn_attention_->backward(dqkv, dy, qkv, y, lse, cudnn_workspace_of_[at], stream_);
    }
    const cudaError_t e =
        bwd ? attention_backward(dqkv, ws, dy, qkv, y, lse, Bn, Tn, Cn, heads, stream_, shape.NKV)
            : attention_forward(y, lse, qkv, Bn, Tn, Cn, heads, stream_, shape.NKV);
    if (e != cudaSuccess) return cuda_error("attention timing", e);
    return ok_status();
  };
  // y and lse from the same implementation's forward before its backward is timed
  TL_ERROR_TRY(run(false));
  cudaEvent_t a = nullptr, b = nullptr;
  TL_CUDA_TRY(cudaEventCreate(&a), "attention timing event");
  if (cudaEventCreate(&b) != cudaSuccess) {
    cudaEventDestroy(a);
    return make_error("cuda backend: attention timing event", 1);
  }
  constexpr int kWarmup = 2, kReps = 7;
  std::vector<double> ms;
  std::string failed;  // the first failure's message
  for (int i = 0; i < kWarmup + kReps; ++i) {
    if (i >= kWarmup) cudaEventRecord(a, stream_);
    if (const Status r = run(backward); !r) {
      failed = r.error().message;
      break;
    }
    if (i >= kWarmup) {
      cudaEventRecord(b, stream_);
      cudaEventSynchronize(b);
      float f = 0;
      cudaEventElapsedTime(&f, a, b);
      ms.push_back(f);
    }
  }
  const cudaError_t e = cudaStreamSynchronize(stream_);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!failed.empty()) return make_error(failed, 1);
  if (e != cudaSuccess) return cuda_error("attention timing", e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The global norm of every global_norm op is a fixed-order multi-tensor reduction (ranks that hold
// the same all-reduced gradients get the same norm and clip factor bit for bit). The adamw ops
// fold into one multi-tensor launch at the first of them when nothing between the first and the
// last touches an optimizer tensor (moving each update up to the first is then invisible).
Status CudaExecutor::build_multi_tensor_tables() {
  const Graph& g = plan_.graph;
  auto F = [&](TensorId t) { return static_cast<float*>(device_pointer(t)); };
  std::vector<std::vector<MultiTensorEntry>> tables(g.ops.size());
  op_tables_.assign(g.ops.size(), MultiTable{});
  adamw_folded_.assign(g.ops.size(), 0);
  std::vector<std::size_t> adamw_ops;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind == OpKind::global_norm || op.kind == OpKind::sharded_global_norm) {
      for (auto t : op.inputs) {
        MultiTensorEntry e;
        e.grad = F(t);
        e.n = g[t].elements();
        if (e.n > 0 && e.grad != nullptr) tables[i].push_back(e);
      }
      if (tables[i].empty()) tables[i].push_back(MultiTensorEntry{});  // norm of nothing: 0
    }
    if (op.kind == OpKind::adamw) adamw_ops.push_back(i);
    if (op.kind == OpKind::sharded_adamw) {
      // {grad shard, norm, scalars} -> {param shard bf16, m, v, master}: one entry per member's
      // part within this rank's segment (its own weight decay).
      const Bucket& b = plan_.comm.buckets[static_cast<std::size_t>(op.bucket)];
      for (const BucketMember& m : b.members) {
        const ShardSlice sl = shard_slice(b, m, plan_.comm.rank);
        if (sl.count == 0) continue;
        MultiTensorEntry e;
        e.param = F(op.outputs[3]) + sl.shard_offset;
        e.param_bf16 = static_cast<bf16*>(device_pointer(op.outputs[0])) + sl.shard_offset;
        e.m = F(op.outputs[1]) + sl.shard_offset;
        e.v = F(op.outputs[2]) + sl.shard_offset;
        e.grad = F(op.inputs[0]) + sl.shard_offset;
        e.n = sl.count;
        e.decayed = m.decayed ? 1 : 0;
        tables[i].push_back(e);
      }
    }
  }
  if (options_.multi_tensor_adamw && !adamw_ops.empty()) {
    first_adamw_op_ = adamw_ops.front();
    last_adamw_op_ = adamw_ops.back();
    std::vector<std::uint8_t> touched(g.tensors.size(), 0);
    for (auto i : adamw_ops) {
      for (auto t : g.ops[i].inputs) touched[static_cast<std::size_t>(t)] = 1;
      for (auto t : g.ops[i].outputs) touched[static_cast<std::size_t>(t)] = 1;
    }
    bool foldable = true;
    const TensorId norm0 = g.ops[first_adamw_op_].inputs[1];
    const TensorId scalars0 = g.ops[first_adamw_op_].inputs[2];
    for (std::size_t j = first_adamw_op_; j <= last_adamw_op_ && foldable; ++j) {
      const Op& o = g.ops[j];
      if (o.kind == OpKind::adamw) {
        foldable = o.inputs[1] == norm0 && o.inputs[2] == scalars0;
        continue;
      }
      auto hit = [&](TensorId t) { return t != kNoTensor && touched[static_cast<std::size_t>(t)]; };
      for (auto t : o.inputs) foldable = foldable && !hit(t);
      for (auto t : o.outputs) foldable = foldable && !hit(t);
      foldable = foldable && !hit(o.workspace);
    }
    if (foldable) {
      for (auto i : adamw_ops) {
        const Op& op = g.ops[i];  // {grad, norm, scalars} -> {param bf16, m, v, master}
        MultiTensorEntry e;
        e.param = F(op.outputs[3]);
        e.param_bf16 = static_cast<bf16*>(device_pointer(op.outputs[0]));
        e.m = F(op.outputs[1]);
        e.v = F(op.outputs[2]);
        e.grad = F(op.inputs[0]);
        e.n = g[op.inputs[0]].elements();
        e.decayed = g[op.outputs[0]].decayed ? 1 : 0;
        if (e.n > 0) tables[first_adamw_op_].push_back(e);
        if (i != first_adamw_op_) adamw_folded_[i] = 1;
      }
    }
  }
  std::size_t total = 0;
  for (const auto& t : tables) total += t.size();
  const std::size_t bytes = total * sizeof(MultiTensorEntry) + (kNormPartials + 1) * sizeof(float);
  TL_CUDA_TRY(cudaMalloc(&tables_, bytes), "cudaMalloc of the optimizer tables");
  auto* entries = static_cast<MultiTensorEntry*>(tables_);
  norm_partials_ = reinterpret_cast<float*>(entries + total);
  skipped_steps_ = norm_partials_ + kNormPartials;
  TL_CUDA_TRY(cudaMemset(skipped_steps_, 0, sizeof(float)), "skipped-step counter");
  std::size_t at = 0;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    if (tables[i].empty()) continue;
    const bool adamw = g.ops[i].kind == OpKind::adamw || g.ops[i].kind == OpKind::sharded_adamw;
    const MultiTensorUse use = adamw ? MultiTensorUse::adamw : MultiTensorUse::global_norm;
    MultiTable& mt = op_tables_[i];
    mt.blocks = layout_multi_tensor(tables[i], use);
    mt.count = static_cast<int>(tables[i].size());
    mt.entries = entries + at;
    TL_CUDA_TRY(cudaMemcpy(entries + at, tables[i].data(),
                           tables[i].size() * sizeof(MultiTensorEntry), cudaMemcpyHostToDevice),
                "copy of the optimizer tables");
    at += tables[i].size();
  }
  return ok_status();
}

CudaExecutor::~CudaExecutor() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (comm_stream_ != nullptr) cudaStreamSynchronize(comm_stream_);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (auto e : op_start_)
    if (e != nullptr) cudaEventDestroy(e);
  for (auto e : op_end_)
    if (e != nullptr) cudaEventDestroy(e);
  for (auto e : bucket_ready_)
    if (e != nullptr) cudaEventDestroy(e);
  for (auto e : bucket_done_)
    if (e != nullptr) cudaEventDestroy(e);
  for (auto* list : {&trace_start_, &trace_end_, &trace_bucket_start_, &trace_bucket_end_})
    for (auto e : *list)
      if (e != nullptr) cudaEventDestroy(e);
  if (trace_base_ != nullptr) cudaEventDestroy(trace_base_);
  for (auto* list : {&gather_ready_, &gather_done_})
    for (auto e : *list)
      if (e != nullptr) cudaEventDestroy(e);
  for (auto& s : staging_) {
    if (s.copied != nullptr) cudaEventDestroy(s.copied);
    if (s.tokens != nullptr) cudaFreeHost(s.tokens);
    if (s.scalars != nullptr) cudaFreeHost(s.scalars);
  }
  matmul_.reset();
  cudnn_attention_.reset();
  if (cudnn_workspace_ != nullptr) cudaFree(cudnn_workspace_);
  if (tables_ != nullptr) cudaFree(tables_);
  if (fp8_memory_ != nullptr) cudaFree(fp8_memory_);
  if (arena_ != nullptr) cudaFree(arena_);
  if (host_state_ != nullptr) cudaFreeHost(host_state_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void* CudaExecutor::device_pointer(TensorId t) const {
  if (t == kNoTensor) return nullptr;
  const std::size_t off = plan_.memory.offsets[static_cast<std::size_t>(t)];
  if (off == kNoOffset) return nullptr;
  if (off >= plan_.memory.arena_bytes && host_state_device_ != nullptr)
    return host_state_device_ + (off - plan_.memory.arena_bytes);
  return arena_ + off;
}

Status CudaExecutor::set_parameter(TensorId p, std::span<const float> values) {
  const Graph& g = plan_.graph;
  const Tensor& t = g[p];
  if (t.role != Role::parameter || static_cast<std::int64_t>(values.size()) != t.elements())
    return make_error("cuda backend: set_parameter: '" + t.name + "' takes " +
                      std::to_string(t.elements()) + " values, got " +
                      std::to_string(values.size()));
  // The master copy may be offloaded host memory: the copy is the host's, after the stream's
  // kernels.
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  if (plan_.comm.shard != ShardMode::none) {
    // This rank's part into the master shard, rounded into the working copy's shard (ZeRO-3) or
    // the whole working copy (ZeRO-1/2: every rank holds the parameters, the view of the bucket).
    auto it = member_of_.find(p);
    if (it == member_of_.end())
      return make_error("cuda backend: set_parameter: '" + t.name + "' is in no bucket");
    const Bucket& b = plan_.comm.buckets[static_cast<std::size_t>(it->second.first)];
    const ShardSlice sl = shard_slice(b, b.members[it->second.second], plan_.comm.rank);
    float* master = static_cast<float*>(device_pointer(b.master_shard));
    bf16* shard = static_cast<bf16*>(device_pointer(b.param_shard));
    if (master == nullptr || shard == nullptr)
      return make_error("cuda backend: set_parameter: bucket of '" + t.name + "' has no shards");
    if (sl.count > 0) {
      TL_CUDA_TRY(cudaMemcpyAsync(master + sl.shard_offset, values.data() + sl.member_begin,
                                  static_cast<std::size_t>(sl.count) * sizeof(float),
                                  cudaMemcpyDefault, stream_),
                  "copy of parameter " + t.name);
      to_bf16(shard + sl.shard_offset, master + sl.shard_offset, sl.count, stream_);
    }
    if (plan_.comm.shard != ShardMode::parameters) {
      std::vector<std::uint16_t> bits(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        const __nv_bfloat16 h = __float2bfloat16(values[i]);
        std::memcpy(&bits[i], &h, 2);
      }
      TL_CUDA_TRY(cudaMemcpyAsync(device_pointer(p), bits.data(), bits.size() * 2,
                                  cudaMemcpyDefault, stream_),
                  "copy of parameter " + t.name);
    }
    TL_CUDA_TRY(cudaStreamSynchronize(stream_), "copy of parameter " + t.name);
    return ok_status();
  }
  const TensorId master = master_of_[static_cast<std::size_t>(p)];
  void* dst = device_pointer(p);
  if (dst == nullptr) return ok_status();  // no op touches it
  if (master != kNoTensor && device_pointer(master) != nullptr) {
    float* m = static_cast<float*>(device_pointer(master));
    TL_CUDA_TRY(cudaMemcpyAsync(m, values.data(), values.size() * sizeof(float), cudaMemcpyDefault,
                                stream_),
                "copy of parameter " + t.name);
    to_bf16(static_cast<bf16*>(dst), m, t.elements(), stream_);
  } else {
    std::vector<std::uint16_t> b(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const __nv_bfloat16 h = __float2bfloat16(values[i]);
      std::memcpy(&b[i], &h, 2);
    }
    TL_CUDA_TRY(cudaMemcpyAsync(dst, b.data(), b.size() * 2, cudaMemcpyDefault, stream_),
                "copy of parameter " + t.name);
  }
  // The host buffers are the caller's: finish the copies before returning.
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "copy of parameter " + t.name);
  return ok_status();
}

Status CudaExecutor::init_parameters(std::uint64_t seed) {
  // Same values and order as CpuExecutor<float>::init_parameters.
  const Graph& g = plan_.graph;
  NormalRng rng(seed);
  std::vector<float> v;
  for (auto p : g.params) {
    const Tensor& t = g[p];
    v.assign(static_cast<std::size_t>(t.elements()), static_cast<float>(t.init_value));
    if (t.init_std > 0)
      for (auto& x : v) x = static_cast<float>(t.init_std * rng.normal());
    TL_STATUS_TRY(set_parameter(p, v));
  }
  return ok_status();
}

Result<std::vector<float>> CudaExecutor::values(TensorId t) {
  const Tensor& tensor = plan_.graph[t];
  const void* src = device_pointer(t);
  if (src == nullptr) return make_error("cuda backend: tensor '" + tensor.name + "' has no offset");
  const std::size_t n = static_cast<std::size_t>(tensor.elements());
  std::vector<float> out(n);
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  if (tensor.dtype == DType::f32) {
    TL_CUDA_TRY(cudaMemcpy(out.data(), src, n * sizeof(float), cudaMemcpyDefault),
                "copy of " + tensor.name);
  } else if (tensor.dtype == DType::bf16) {
    std::vector<std::uint16_t> b(n);
    TL_CUDA_TRY(cudaMemcpy(b.data(), src, n * 2, cudaMemcpyDefault), "copy of " + tensor.name);
    for (std::size_t i = 0; i < n; ++i) out[i] = bf16_to_float(b[i]);
  } else {
    return make_error("cuda backend: tensor '" + tensor.name + "' is not a float tensor");
  }
  return out;
}

// fuse_gelu: find the (GEMM op, gelu op) pairs that one epilogue GEMM can run.
//   forward:  i = matmul_forward writing P, j = the next op touching P = gelu_forward(P) -> H;
//             at i: P and H = gelu(P) from one GEMM (GELU_AUX_BIAS).
//   backward: i = matmul_backward writing its dx = dH with beta 0 (overwrite_), j = the next op
//             touching dH = gelu_backward(dH, P) -> dP, also overwriting; dH read by nothing else;
//             at i: dP = (dy @ w) * gelu'(P) (DGELU), dH is never materialised.
// The fused op writes j's output earlier than the plan scheduled it, so that output's arena range
// must not hold any other liveness-planned tensor in use between i and j (the planner reuses
// offsets across lifetimes), and j's inputs must already hold their values at i.
void CudaExecutor::fuse_gelu_pairs() {
  const Graph& g = plan_.graph;
  const std::size_t n_ops = g.ops.size(), n_tensors = g.tensors.size();
  gelu_partner_.assign(n_ops, kNoPartner);
  gelu_fused_into_.assign(n_ops, kNoPartner);
  if (!options_.fuse_gelu) return;
  // first and last op touching each tensor; zero ops skipped by overwrite_first_gradient do not
  // count (they do not run)
  std::vector<std::size_t> first(n_tensors, kNoPartner), last(n_tensors, 0);
  auto touches = [&](std::size_t k, auto&& visit) {
    const Op& o = g.ops[k];
    if (o.kind == OpKind::zero && skip_zero_[k]) return;
    for (auto t : o.inputs) visit(t, false);
    for (auto t : o.outputs) visit(t, true);
    if (o.workspace != kNoTensor) visit(o.workspace, true);
    for (auto t : o.keep_alive) visit(t, false);
  };
  for (std::size_t k = 0; k < n_ops; ++k)
    touches(k, [&](TensorId t, bool) {
      const auto u = static_cast<std::size_t>(t);
      if (first[u] == kNoPartner) first[u] = k;
      last[u] = k;
    });
  auto planned = [&](std::size_t u) {
    const Role r = g.tensors[u].role;
    return r == Role::activation || r == Role::input || r == Role::workspace;
  };
  // Does writing t at op i (instead of j) clobber another tensor live somewhere in [i, j]?
  auto clashes = [&](TensorId t, std::size_t i, std::size_t j, TensorId exempt, TensorId exempt2) {
    const std::size_t off = plan_.memory.offsets[static_cast<std::size_t>(t)];
    if (off == kNoOffset) return true;
    const std::size_t end = off + g[t].bytes();
    for (std::size_t u = 0; u < n_tensors; ++u) {
      const auto id = static_cast<TensorId>(u);
      if (id == t || id == exempt || id == exempt2) continue;
      const std::size_t uo = plan_.memory.offsets[u];
      if (uo == kNoOffset || g.tensors[u].bytes() == 0) continue;
      if (uo >= end || uo + g.tensors[u].bytes() <= off) continue;  // disjoint ranges
      if (!planned(u)) return true;
      if (first[u] != kNoPartner && first[u] <= j && last[u] >= i) return true;
    }
    return false;
  };
  // the next op after i that touches t (reads or writes), or n_ops
  auto next_touch = [&](TensorId t, std::size_t i) {
    for (std::size_t k = i + 1; k < n_ops; ++k) {
      bool hit = false;
      touches(k, [&](TensorId x, bool) { hit = hit || x == t; });
      if (hit) return k;
    }
    return n_ops;
  };
  auto written_between = [&](TensorId t, std::size_t i, std::size_t j) {
    for (std::size_t k = i + 1; k < j; ++k) {
      bool hit = false;
      touches(k, [&](TensorId x, bool out) { hit = hit || (out && x == t); });
      if (hit) return true;
    }
    return false;
  };
  for (std::size_t i = 0; i < n_ops; ++i) {
    const Op& a = g.ops[i];
    if (a.kind == OpKind::matmul_forward && a.outputs.size() == 1) {
      const TensorId pre = a.outputs[0];
      const std::size_t j = next_touch(pre, i);
      if (j == n_ops) continue;
      const Op& b = g.ops[j];
      if (b.kind != OpKind::gelu_forward || b.inputs.size() != 1 || b.inputs[0] != pre ||
          b.outputs.size() != 1 || b.phase != a.phase || gelu_fused_into_[j] != kNoPartner)
        continue;
      const TensorId h = b.outputs[0];
      if (g[h].dtype != DType::bf16 || g[pre].dtype != DType::bf16 || g[h].shape.empty() ||
          g[h].shape.back() % 8 != 0 || next_touch(h, i) != j ||
          clashes(h, i, j, kNoTensor, kNoTensor))
        continue;
      gelu_partner_[i] = j;
      gelu_fused_into_[j] = i;
    } else if (a.kind == OpKind::matmul_backward && overwrite_[i] && a.outputs.size() >= 2) {
      const TensorId dh = a.outputs[0];
      const std::size_t j = next_touch(dh, i);
      if (j == n_ops) continue;
      const Op& b = g.ops[j];
      if (b.kind != OpKind::gelu_backward || !overwrite_[j] || b.inputs.size() != 2 ||
          b.inputs[0] != dh || b.outputs.size() != 1 || b.phase != a.phase ||
          gelu_fused_into_[j] != kNoPartner || last[static_cast<std::size_t>(dh)] != j)
        continue;
      const TensorId pre = b.inputs[1], dpre = b.outputs[0];
      // the GEMM's input x (the GELU output) is read before dpre is written
      // (matmul_backward_dgelu), so dpre may reuse x's memory when x dies at i
      const TensorId x = a.inputs[1];
      const TensorId x_dead = last[static_cast<std::size_t>(x)] == i ? x : kNoTensor;
      if (g[dpre].dtype != DType::bf16 || g[pre].dtype != DType::bf16 || g[dpre].shape.empty() ||
          g[dpre].shape.back() % 8 != 0 || next_touch(dpre, i) != j || written_between(pre, i, j) ||
          clashes(dpre, i, j, dh, x_dead))
        continue;
      gelu_partner_[i] = j;
      gelu_fused_into_[j] = i;
    }
  }
}

// A matmul_backward's bias gradient is the column sums of its dy. Where dy's last writer before
// it is a layernorm_backward writing it as its dx (the residual stream's gradient, for GPT-2's
// attention and MLP projections), that kernel takes the sums as it writes dx and the
// matmul_backward skips its own pass over dy (bias_taken_; fuse_bias_gradients). Only for a
// gradient whose memory lives the whole step (Role::gradient, itself or the bucket buffer it is a
// view of) and that no op between the two writes or zeroes: it is zero from the step's start, so
// the earlier accumulation lands as the matmul_backward's own would. (Under ZeRO-2/3 a bucket's
// gradients are transient, zeroed at their first declared writer: those keep their pass.)
void CudaExecutor::fuse_bias_gradients() {
  const Graph& g = plan_.graph;
  layernorm_dx_sum_.assign(g.ops.size(), kNoTensor);
  bias_taken_.assign(g.ops.size(), 0);
  if (!options_.fuse_bias_gradients) return;
  for (std::size_t m = 0; m < g.ops.size(); ++m) {
    const Op& mb = g.ops[m];
    if (mb.kind != OpKind::matmul_backward || mb.outputs.size() < 3 || mb.outputs[2] == kNoTensor ||
        mb.phase != Phase::backward)
      continue;
    const TensorId dy = mb.inputs[0], dbias = mb.outputs[2];
    std::size_t k = m;
    while (k-- > 0) {
      const Op& o = g.ops[k];
      if (std::find(o.outputs.begin(), o.outputs.end(), dy) != o.outputs.end() || o.workspace == dy)
        break;
    }
    if (k >= m) continue;  // no writer before it
    const Op& w = g.ops[k];
    const TensorId storage = g[dbias].view_of != kNoTensor ? g[dbias].view_of : dbias;
    if (w.kind != OpKind::layernorm_backward || w.phase != mb.phase || w.outputs[0] != dy ||
        std::count(w.outputs.begin(), w.outputs.end(), dy) != 1 ||
        layernorm_dx_sum_[k] != kNoTensor || g[dbias].elements() != g[w.inputs[2]].elements() ||
        g[storage].role != Role::gradient)
      continue;
    bool written_between = false;
    for (std::size_t j = k + 1; j < m && !written_between; ++j)
      for (TensorId t : g.ops[j].outputs)
        written_between = written_between || t == dbias || t == storage;
    if (written_between) continue;
    layernorm_dx_sum_[k] = dbias;
    bias_taken_[m] = 1;
  }
}

Status CudaExecutor::set_values(TensorId t, std::span<const float> values) {
  const Tensor& tensor = plan_.graph[t];
  if (tensor.dtype != DType::f32 || static_cast<std::int64_t>(values.size()) != tensor.elements())
    return make_error("cuda backend: set_values: '" + tensor.name + "' takes " +
                      std::to_string(tensor.elements()) + " fp32 values, got " +
                      std::to_string(values.size()) +
                      (tensor.dtype == DType::f32 ? "" : " (it is not an fp32 tensor)"));
  void* dst = device_pointer(t);
  if (dst == nullptr) return make_error("cuda backend: tensor '" + tensor.name + "' has no offset");
  // An offloaded tensor is host memory: the copy is the host's, after the stream's kernels.
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  TL_CUDA_TRY(cudaMemcpyAsync(dst, values.data(), values.size() * sizeof(float), cudaMemcpyDefault,
                              stream_),
              "copy of " + tensor.name);
  // the host buffer is the caller's: finish the copy before returning
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "copy of " + tensor.name);
  return ok_status();
}

Status CudaExecutor::read_values(TensorId t, std::size_t offset, std::span<float> out) {
  const Tensor& tensor = plan_.graph[t];
  const void* src = device_pointer(t);
  if (tensor.dtype != DType::f32 || src == nullptr ||
      offset + out.size() > static_cast<std::size_t>(tensor.elements()))
    return make_error("cuda backend: read_values: '" + tensor.name +
                      "' is not an fp32 tensor of the arena holding that range");
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  TL_CUDA_TRY(cudaMemcpy(out.data(), static_cast<const float*>(src) + offset,
                         out.size() * sizeof(float), cudaMemcpyDefault),
              "copy of " + tensor.name);
  return ok_status();
}

Status CudaExecutor::write_values(TensorId t, std::size_t offset, std::span<const float> values) {
  const Tensor& tensor = plan_.graph[t];
  void* dst = device_pointer(t);
  if (tensor.dtype != DType::f32 || dst == nullptr ||
      offset + values.size() > static_cast<std::size_t>(tensor.elements()))
    return make_error("cuda backend: write_values: '" + tensor.name +
                      "' is not an fp32 tensor of the arena holding that range");
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");  // as in set_values
  TL_CUDA_TRY(cudaMemcpyAsync(static_cast<float*>(dst) + offset, values.data(),
                              values.size() * sizeof(float), cudaMemcpyDefault, stream_),
              "copy of " + tensor.name);
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "copy of " + tensor.name);
  return ok_status();
}

Result<std::vector<float>> CudaExecutor::parameter(TensorId p) {
  const TensorId master = master_of_[static_cast<std::size_t>(p)];
  return values(master != kNoTensor ? master : p);
}

Status CudaExecutor::set_batch(std::span<const std::int32_t> tokens,
                               std::span<const std::int32_t> targets) {
  const std::size_t n = pending_batch_.size() / 2;
  if (tokens.size() != n || targets.size() != n)
    return make_error("cuda backend: set_batch takes " + std::to_string(n) +
                      " tokens and targets (B*T), got " + std::to_string(tokens.size()) + " and " +
                      std::to_string(targets.size()));
  std::copy(tokens.begin(), tokens.end(), pending_batch_.begin());
  std::copy(targets.begin(), targets.end(),
            pending_batch_.begin() + static_cast<std::ptrdiff_t>(n));
  batch_pending_ = true;
  return ok_status();
}

void CudaExecutor::set_loss_scale(double scale) {
  host_scalars_[kLossScale] = static_cast<float>(scale);
}

void CudaExecutor::write_scalars(const AdamWSettings& s, std::int64_t step) {
  host_scalars_[kLearningRate] = static_cast<float>(s.learning_rate);
  host_scalars_[kBeta1] = static_cast<float>(s.beta1);
  host_scalars_[kBeta2] = static_cast<float>(s.beta2);
  host_scalars_[kEpsilon] = static_cast<float>(s.epsilon);
  host_scalars_[kWeightDecay] = static_cast<float>(s.weight_decay);
  host_scalars_[kStep] = static_cast<float>(step);
  host_scalars_[kGradClip] = static_cast<float>(s.grad_clip);
}

// Copies the pending batch and the scalars into the arena through the next pinned slot, on the
// compute stream, before the launch that reads them.
Status CudaExecutor::upload_pending() {
  const Graph& g = plan_.graph;
  Staging& s = staging_[staging_slot_];
  staging_slot_ = (staging_slot_ + 1) % 2;
  TL_CUDA_TRY(cudaEventSynchronize(s.copied), "staging");  // its previous copy is done
  std::memcpy(s.scalars, host_scalars_, sizeof host_scalars_);
  TL_CUDA_TRY(cudaMemcpyAsync(device_pointer(g.scalars), s.scalars, sizeof host_scalars_,
                              cudaMemcpyHostToDevice, stream_),
              "scalars upload");
  if (batch_pending_) {
    const std::size_t n = pending_batch_.size() / 2;
    std::memcpy(s.tokens, pending_batch_.data(), pending_batch_.size() * sizeof(std::int32_t));
    TL_CUDA_TRY(cudaMemcpyAsync(device_pointer(g.tokens), s.tokens, n * sizeof(std::int32_t),
                                cudaMemcpyHostToDevice, stream_),
                "tokens upload");
    TL_CUDA_TRY(cudaMemcpyAsync(device_pointer(g.targets), s.tokens + n, n * sizeof(std::int32_t),
                                cudaMemcpyHostToDevice, stream_),
                "targets upload");
    batch_pending_ = false;
  }
  TL_CUDA_TRY(cudaEventRecord(s.copied, stream_), "staging event");
  return ok_status();
}

Status CudaExecutor::train_step(const AdamWSettings& settings, std::int64_t step) {
  write_scalars(settings, step);
  TL_STATUS_TRY(upload_pending());
  return run_range(0, plan_.graph.ops.size(), true);
}

Status CudaExecutor::run_forward_backward(bool communicate) {
  TL_STATUS_TRY(upload_pending());
  return run_range(0, first_optimizer_op_, communicate);
}

Status CudaExecutor::run_forward() {
  TL_STATUS_TRY(upload_pending());
  return run_range(0, first_backward_op_, false);
}

Status CudaExecutor::run_optimizer(const AdamWSettings& settings, std::int64_t step) {
  write_scalars(settings, step);
  TL_STATUS_TRY(upload_pending());
  return run_range(first_optimizer_op_, plan_.graph.ops.size(), false);
}

Status CudaExecutor::run_range(std::size_t begin, std::size_t end, bool communicate) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = launch_range(begin, end, communicate);
  last_launch_host_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

Status CudaExecutor::launch_range(std::size_t begin, std::size_t end, bool communicate) {
  const bool comm_active = communicate && comm_ != nullptr && comm_->world_size() > 1;
  if (options_.mode == ExecutionMode::op_by_op) return enqueue_range(begin, end, comm_active);
  const RangeKey key{begin, end, comm_active, tracing_};
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    TL_CUDA_TRY(cudaGraphLaunch(it->second, stream_), "graph launch");
    if (tracing_) {  // the replay records the events its capture recorded
      const auto& [ops, buckets] = traced_in_[key];
      for (std::size_t i : ops) trace_recorded_[i] = 1;
      for (std::size_t b : buckets) trace_bucket_recorded_[b] = 1;
    }
    return ok_status();
  }
  // First call of this range: run it eagerly (warms cuBLASLt's cache, kernel attributes), then
  // capture it for the next calls. A traced variant of a range already warm is captured at once,
  // so that a traced step replays a graph like the steps around it.
  const bool warm = tracing_ && eager_runs_[RangeKey{begin, end, comm_active, false}] > 0;
  if (eager_runs_[key]++ == 0 && !warm) return enqueue_range(begin, end, comm_active);
  cudaGraph_t graph = nullptr;
  TL_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
  Status enq = enqueue_range(begin, end, comm_active);
  const cudaError_t ec = cudaStreamEndCapture(stream_, &graph);
  if (!enq) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enq;
  }
  TL_CUDA_TRY(ec, "end capture");
  if (tracing_) traced_in_[key] = {range_traced_ops_, range_traced_buckets_};
  cudaGraphExec_t exec = nullptr;
  // captured kernels keep their stream's priority only when the graph is told to use it
  const cudaError_t ei = cudaGraphInstantiate(
      &exec, graph,
      options_.comm_stream_high_priority ? cudaGraphInstantiateFlagUseNodePriority : 0);
  std::size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphDestroy(graph);
  TL_CUDA_TRY(ei, "graph instantiate");
  graphs_.emplace(key, exec);
  if (begin == 0 && end == plan_.graph.ops.size() && !tracing_) graph_nodes_ = nodes;
  TL_CUDA_TRY(cudaGraphLaunch(exec, stream_), "graph launch");
  return ok_status();
}

Status CudaExecutor::enqueue_range(std::size_t begin, std::size_t end, bool communicate) {
  issued_buckets_.clear();
  range_begin_ = begin;
  range_end_ = end;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TL_CUDA_TRY(cudaStreamIsCapturing(stream_, &capture), "capture status");
  capturing_ = capture == cudaStreamCaptureStatusActive;
  range_traced_ops_.clear();
  range_traced_buckets_.clear();
  bool joined = false;
  for (std::size_t i = begin; i < end; ++i) {
    if (i > begin && fused_with_next_[i - 1]) continue;  // ran with its crossentropy_forward
    if (classifier_backward_[i] < end) continue;         // its backward writes the losses
    if (gelu_fused_into_[i] != kNoPartner && gelu_fused_into_[i] >= begin)
      continue;  // ran in its GEMM's epilogue
    const bool profile = !op_start_.empty();
    if (profile) TL_CUDA_TRY(cudaEventRecord(op_start_[i], stream_), "profile event");
    if (tracing_) TL_CUDA_TRY(record_trace_event(trace_start_[i], stream_), "trace event");
    TL_STATUS_TRY(enqueue_op(i, communicate, fused_with_next_[i] && i + 1 < end, joined));
    if (profile) {
      TL_CUDA_TRY(cudaEventRecord(op_end_[i], stream_), "profile event");
      op_recorded_[i] = 1;
    }
    if (tracing_) {
      TL_CUDA_TRY(record_trace_event(trace_end_[i], stream_), "trace event");
      trace_recorded_[i] = 1;
      range_traced_ops_.push_back(i);
    }
  }
  return join_communication();
}

// The optimizer (and the end of any range) waits for every bucket's all-reduce or reduce-scatter,
// and for a gather no op of the range read.
Status CudaExecutor::join_communication() {
  for (auto b : issued_buckets_)
    TL_CUDA_TRY(cudaStreamWaitEvent(stream_, bucket_done_[b], 0), "wait for all-reduce");
  issued_buckets_.clear();
  for (const auto& [tensor, done] : pending_gathers_)
    TL_CUDA_TRY(cudaStreamWaitEvent(stream_, done, 0), "wait for a gather");
  pending_gathers_.clear();
  return ok_status();
}

Status CudaExecutor::enqueue_op(std::size_t index, bool communicate, bool fuse, bool& joined) {
  const Graph& g = plan_.graph;
  const Op& op = g.ops[index];
  if (op.phase == Phase::optimizer && !joined) {
    TL_STATUS_TRY(join_communication());
    joined = true;
  }
  auto B = [&](TensorId t) { return static_cast<bf16*>(device_pointer(t)); };
  auto F = [&](TensorId t) { return static_cast<float*>(device_pointer(t)); };
  auto I = [&](TensorId t) { return static_cast<const std::int32_t*>(device_pointer(t)); };
  auto opt = [](const std::vector<TensorId>& v, std::size_t i) {
    return i < v.size() ? v[i] : kNoTensor;
  };
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return g[t].shape; };
  auto el = [&](TensorId t) { return g[t].elements(); };
  auto where = [&]() { return "op " + std::to_string(index) + " '" + op.name + "'"; };
  // A parameter buffer a gather on the side stream is filling: wait for it before its first reader.
  if (!pending_gathers_.empty())
    for (auto t : op.inputs) {
      const TensorId base = g[t].view_of != kNoTensor ? g[t].view_of : t;
      if (auto it = pending_gathers_.find(base); it != pending_gathers_.end()) {
        TL_CUDA_TRY(cudaStreamWaitEvent(stream_, it->second, 0), where() + ": wait for a gather");
        pending_gathers_.erase(it);
      }
    }
  cudaError_t err = cudaSuccess;
  switch (op.kind) {
    case OpKind::encoder_forward: {
      const auto& s = shape(op.outputs[0]);
      encoder_forward(B(op.outputs[0]), I(op.inputs[0]), B(op.inputs[1]), B(opt(op.inputs, 2)),
                      s[0], s[1], s[2], stream_);
      break;
    }
    case OpKind::encoder_backward: {
      const auto& s = shape(op.inputs[0]);
      encoder_backward(F(op.outputs[0]), F(opt(op.outputs, 1)), B(op.inputs[0]), I(op.inputs[1]),
                       s[0], s[1], s[2], stream_);
      break;
    }
    case OpKind::layernorm_forward: {
      const std::int64_t C = shape(op.inputs[1])[0], N = el(op.inputs[0]) / C;
      err = layernorm_forward(B(op.outputs[0]), F(op.outputs[1]), F(op.outputs[2]), B(op.inputs[0]),
                              B(op.inputs[1]), B(op.inputs[2]), N, C, stream_);
      break;
    }
    case OpKind::residual_layernorm_forward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      err = residual_layernorm_forward(B(op.outputs[0]), B(op.outputs[1]), F(op.outputs[2]),
                                       F(op.outputs[3]), B(op.inputs[0]), B(op.inputs[1]),
                                       B(op.inputs[2]), B(op.inputs[3]), N, C, stream_);
      break;
    }
    case OpKind::layernorm_backward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      err = layernorm_backward(B(op.outputs[0]), F(op.outputs[1]), F(op.outputs[2]),
                               B(op.inputs[0]), B(op.inputs[1]), B(op.inputs[2]), F(op.inputs[3]),
                               F(op.inputs[4]), N, C, stream_, F(layernorm_dx_sum_[index]));
      break;
    }
    case OpKind::matmul_forward: {
      const auto& w = shape(op.inputs[1]);
      const std::int64_t OC = w[0], C = w[1], N = el(op.inputs[0]) / C;
      const std::size_t j = gelu_partner_[index];
      if (fp8_site_[index] >= 0 && !fp8_fallback_[index]) {
        const bool gelu = j != kNoPartner && j < range_end_;
        bool done = false;
        TL_STATUS_TRY(fp8_forward(index, B(gelu ? g.ops[j].outputs[0] : op.outputs[0]),
                                  gelu ? B(op.outputs[0]) : nullptr, B(op.inputs[0]),
                                  B(op.inputs[1]), B(opt(op.inputs, 2)), N, C, OC, &done));
        if (done) break;
      }
      const cublasStatus_t st =
          j != kNoPartner && j < range_end_
              ? matmul_->matmul_forward_gelu(B(g.ops[j].outputs[0]), B(op.outputs[0]),
                                             B(op.inputs[0]), B(op.inputs[1]), B(opt(op.inputs, 2)),
                                             N, C, OC, stream_)
              : matmul_->matmul_forward(B(op.outputs[0]), B(op.inputs[0]), B(op.inputs[1]),
                                        B(opt(op.inputs, 2)), N, C, OC, stream_);
      if (st != CUBLAS_STATUS_SUCCESS)
        return make_error("cuda backend: " + where() + ": cuBLASLt status " +
                              std::to_string(static_cast<int>(st)),
                          1);
      break;
    }
    case OpKind::matmul_backward: {
      const auto& w = shape(op.inputs[2]);
      const std::int64_t OC = w[0], C = w[1], N = el(op.inputs[1]) / C;
      const std::size_t j = gelu_partner_[index];
      // the bias gradient, unless dy's writer took it (fuse_bias_gradients)
      float* const dbias = bias_taken_[index] ? nullptr : F(opt(op.outputs, 2));
      if (fp8_site_[index] >= 0 && !fp8_fallback_[index]) {
        const bool gelu = j != kNoPartner && j < range_end_;
        bool done = false;
        TL_STATUS_TRY(fp8_backward(index, B(gelu ? g.ops[j].outputs[0] : op.outputs[0]),
                                   gelu ? B(g.ops[j].inputs[1]) : nullptr, F(op.outputs[1]), dbias,
                                   B(op.inputs[0]), B(op.inputs[1]), B(op.inputs[2]), N, C, OC,
                                   overwrite_[index] != 0, &done));
        if (done) break;
      }
      const cublasStatus_t st =
          j != kNoPartner && j < range_end_
              ? matmul_->matmul_backward_dgelu(
                    B(g.ops[j].outputs[0]), F(op.outputs[1]), dbias, B(op.inputs[0]),
                    B(op.inputs[1]), B(g.ops[j].inputs[1]), B(op.inputs[2]), N, C, OC, stream_)
              : matmul_->matmul_backward(B(op.outputs[0]), F(op.outputs[1]), dbias, B(op.inputs[0]),
                                         B(op.inputs[1]), B(op.inputs[2]), N, C, OC, stream_,
                                         overwrite_[index] != 0);
      if (st != CUBLAS_STATUS_SUCCESS)
        return make_error("cuda backend: " + where() + ": cuBLASLt status " +
                              std::to_string(static_cast<int>(st)),
                          1);
      break;
    }
    case OpKind::attention_forward: {
      const auto& s = shape(op.inputs[0]);
      if (attention_choice_.chosen == AttentionImpl::cudnn) {
        if (auto st = cudnn_attention_->forward(B(op.outputs[0]), F(op.outputs[1]), B(op.inputs[0]),
                                                cudnn_workspace_of_[index], stream_);
            !st)
          return make_error("cuda backend: " + where() + ": " + st.error().message, 1);
        break;
      }
      const AttentionShape a = attention_shape(g, op, op.inputs[0]);
      err = attention_forward(B(op.outputs[0]), F(op.outputs[1]), B(op.inputs[0]), s[0], s[1], a.C,
                              op.num_heads, stream_, a.NKV);
      break;
    }
    case OpKind::attention_backward: {
      const auto& s = shape(op.inputs[1]);
      if (cudnn_backward_[index]) {  // overwrites dqkv: its first writer (the zero is skipped)
        if (auto st = cudnn_attention_->backward(B(op.outputs[0]), B(op.inputs[0]), B(op.inputs[1]),
                                                 B(op.inputs[2]), F(op.inputs[3]),
                                                 cudnn_workspace_of_[index], stream_);
            !st)
          return make_error("cuda backend: " + where() + ": " + st.error().message, 1);
        break;
      }
      const AttentionShape a = attention_shape(g, op, op.inputs[1]);
      err = attention_backward(B(op.outputs[0]), device_pointer(op.workspace), B(op.inputs[0]),
                               B(op.inputs[1]), B(op.inputs[2]), F(op.inputs[3]), s[0], s[1], a.C,
                               op.num_heads, stream_, a.NKV);
      break;
    }
    case OpKind::gelu_forward:
      gelu_forward(B(op.outputs[0]), B(op.inputs[0]), el(op.inputs[0]), stream_);
      break;
    case OpKind::gelu_backward:
      if (overwrite_[index])
        gelu_backward_overwrite(B(op.outputs[0]), B(op.inputs[0]), B(op.inputs[1]),
                                el(op.inputs[0]), stream_);
      else
        gelu_backward(B(op.outputs[0]), B(op.inputs[0]), B(op.inputs[1]), el(op.inputs[0]),
                      stream_);
      break;
    case OpKind::residual_forward:
      residual_forward(B(op.outputs[0]), B(op.inputs[0]), B(op.inputs[1]), el(op.inputs[0]),
                       stream_);
      break;
    case OpKind::residual_backward:
      residual_backward(B(op.outputs[0]), B(op.outputs[1]), B(op.inputs[0]), el(op.inputs[0]),
                        stream_);
      break;
    case OpKind::crossentropy_forward: {
      const std::int64_t Vp = shape(op.inputs[0]).back(), N = el(op.inputs[0]) / Vp;
      if (fuse) {
        const Op& b = g.ops[index + 1];
        crossentropy_forward_backward(F(op.outputs[0]), B(b.outputs[0]), B(op.inputs[0]),
                                      I(op.inputs[1]), F(b.inputs[2]) + kLossScale, N, op.vocab, Vp,
                                      stream_);
      } else {
        crossentropy_forward(F(op.outputs[0]), B(op.inputs[0]), I(op.inputs[1]), N, op.vocab, Vp,
                             stream_);
      }
      break;
    }
    case OpKind::classifier_forward:
    case OpKind::classifier_backward: {
      // Chunk by chunk: the logits of `rows` rows in the workspace, the loss (and its gradient in
      // place), then dx rows (overwritten when its zero was skipped) and dw += (fp32).
      const std::int64_t Vp = shape(op.inputs[1])[0], C = shape(op.inputs[1])[1];
      const std::int64_t N = el(op.inputs[0]) / C, rows = op.chunk_rows;
      const bool backward = op.kind == OpKind::classifier_backward;
      float* losses = F(backward ? op.outputs[2] : op.outputs[0]);
      bf16* logits = B(op.workspace);
      const bf16* w = B(op.inputs[1]);
      for (std::int64_t r0 = 0; r0 < N; r0 += rows) {
        const std::int64_t n = std::min(rows, N - r0);
        const bf16* x = B(op.inputs[0]) + r0 * C;
        const std::int32_t* targets = I(op.inputs[2]) + r0;
        cublasStatus_t st = matmul_->matmul_forward(logits, x, w, nullptr, n, C, Vp, stream_);
        if (st == CUBLAS_STATUS_SUCCESS && backward) {
          crossentropy_forward_backward(losses + r0, logits, logits, targets,
                                        F(op.inputs[3]) + kLossScale, n, op.vocab, Vp, stream_);
          st = matmul_->matmul_backward_dx(B(op.outputs[0]) + r0 * C, logits, w, n, C, Vp, stream_,
                                           overwrite_[index] != 0);
          if (st == CUBLAS_STATUS_SUCCESS)
            st = matmul_->matmul_backward_dw(F(op.outputs[1]), nullptr, logits, x, n, C, Vp,
                                             stream_);
        } else if (st == CUBLAS_STATUS_SUCCESS) {
          crossentropy_forward(losses + r0, logits, targets, n, op.vocab, Vp, stream_);
        }
        if (st != CUBLAS_STATUS_SUCCESS)
          return make_error("cuda backend: " + where() + ": cuBLASLt status " +
                                std::to_string(static_cast<int>(st)),
                            1);
      }
      break;
    }
    case OpKind::crossentropy_backward: {
      const std::int64_t Vp = shape(op.inputs[0]).back(), N = el(op.inputs[0]) / Vp;
      crossentropy_backward(B(op.outputs[0]), B(op.inputs[0]), I(op.inputs[1]),
                            F(op.inputs[2]) + kLossScale, N, op.vocab, Vp, stream_);
      break;
    }
    case OpKind::zero:
      if (skip_zero_[index]) break;  // its tensor's first writer overwrites
      for (const auto& [begin, end] : zero_ranges_[index]) {
        err = cudaMemsetAsync(arena_ + begin, 0, end - begin, stream_);
        if (err != cudaSuccess) break;
      }
      break;
    case OpKind::global_norm: {
      const MultiTable& t = op_tables_[index];
      global_norm_multi(F(op.outputs[0]), norm_partials_,
                        static_cast<const MultiTensorEntry*>(t.entries), t.count, t.blocks,
                        stream_);
      optimizer_step_guard(F(g.scalars), F(op.outputs[0]), skipped_steps_, stream_);
      break;
    }
    case OpKind::adamw: {
      // {grad, norm, scalars} -> {param (bf16 working copy), m, v, master}
      const bool whole = range_begin_ <= first_adamw_op_ && range_end_ > last_adamw_op_;
      if (whole && adamw_folded_[index]) break;  // ran in the first adamw's launch
      if (whole && op_tables_[index].count > 0) {
        const MultiTable& t = op_tables_[index];
        adamw_update_multi(static_cast<const MultiTensorEntry*>(t.entries), t.count, t.blocks,
                           F(op.inputs[2]), F(op.inputs[1]), stream_);
        break;
      }
      adamw_update(F(op.outputs[3]), B(op.outputs[0]), F(op.outputs[1]), F(op.outputs[2]),
                   F(op.inputs[0]), el(op.inputs[0]), F(op.inputs[2]), F(op.inputs[1]),
                   g[op.outputs[0]].decayed, stream_);
      break;
    }
    case OpKind::rmsnorm_forward: {
      const std::int64_t C = shape(op.inputs[1])[0], N = el(op.inputs[0]) / C;
      err = rmsnorm_forward(B(op.outputs[0]), F(op.outputs[1]), B(op.inputs[0]), B(op.inputs[1]), N,
                            C, stream_);
      break;
    }
    case OpKind::residual_rmsnorm_forward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      err = residual_rmsnorm_forward(B(op.outputs[0]), B(op.outputs[1]), F(op.outputs[2]),
                                     B(op.inputs[0]), B(op.inputs[1]), B(op.inputs[2]), N, C,
                                     stream_);
      break;
    }
    case OpKind::rmsnorm_backward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      err = rmsnorm_backward(B(op.outputs[0]), F(op.outputs[1]), B(op.inputs[0]), B(op.inputs[1]),
                             B(op.inputs[2]), F(op.inputs[3]), N, C, stream_);
      break;
    }
    case OpKind::rope_forward:
    case OpKind::rope_backward: {
      const AttentionShape a = attention_shape(g, op, op.inputs[0]);
      err = op.kind == OpKind::rope_forward
                ? rope_forward(B(op.outputs[0]), B(op.inputs[0]), a.B, a.T, a.C, a.NH, a.NKV,
                               op.rope_theta, stream_)
                : rope_backward(B(op.outputs[0]), B(op.inputs[0]), a.B, a.T, a.C, a.NH, a.NKV,
                                op.rope_theta, stream_);
      break;
    }
    case OpKind::swiglu_forward: {
      const std::int64_t H = shape(op.outputs[0]).back(), N = el(op.outputs[0]) / H;
      err = swiglu_forward(B(op.outputs[0]), B(op.inputs[0]), N, H, stream_);
      break;
    }
    case OpKind::swiglu_backward: {
      const std::int64_t H = shape(op.inputs[0]).back(), N = el(op.inputs[0]) / H;
      err = swiglu_backward(B(op.outputs[0]), B(op.inputs[0]), B(op.inputs[1]), N, H, stream_);
      break;
    }
    case OpKind::sharded_global_norm: {
      // This rank's sum of squares, summed over the ranks (fp32), then the root.
      const MultiTable& t = op_tables_[index];
      sum_of_squares_multi(F(op.outputs[0]), norm_partials_,
                           static_cast<const MultiTensorEntry*>(t.entries), t.count, t.blocks,
                           stream_);
      if (comm_ != nullptr && comm_->world_size() > 1)
        TL_CUDA_TRY(comm_->all_reduce_sum(F(op.outputs[0]), 1, stream_),
                    where() + ": sum of the ranks' squares");
      sqrt_in_place(F(op.outputs[0]), stream_);
      optimizer_step_guard(F(g.scalars), F(op.outputs[0]), skipped_steps_, stream_);
      break;
    }
    case OpKind::sharded_adamw: {
      const MultiTable& t = op_tables_[index];
      adamw_update_multi(static_cast<const MultiTensorEntry*>(t.entries), t.count, t.blocks,
                         F(op.inputs[2]), F(op.inputs[1]), stream_);
      break;
    }
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
      TL_STATUS_TRY(enqueue_collective(index, op, communicate));
      break;
    case OpKind::all_reduce: {
      if (!communicate) break;
      const auto b = static_cast<std::size_t>(op.bucket);
      const Bucket& bucket = plan_.comm.buckets[b];
      TL_CUDA_TRY(cudaEventRecord(bucket_ready_[b], stream_), where() + ": bucket ready event");
      TL_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, bucket_ready_[b], 0), where());
      if (tracing_)
        TL_CUDA_TRY(record_trace_event(trace_bucket_start_[b], comm_stream_), "trace event");
      TL_CUDA_TRY(comm_->all_reduce_sum(reinterpret_cast<float*>(arena_ + bucket.offset),
                                        bucket.bytes / sizeof(float), comm_stream_),
                  where() + ": all-reduce of bucket " + std::to_string(b));
      if (tracing_) {
        TL_CUDA_TRY(record_trace_event(trace_bucket_end_[b], comm_stream_), "trace event");
        trace_bucket_recorded_[b] = 1;
        range_traced_buckets_.push_back(b);
      }
      TL_CUDA_TRY(cudaEventRecord(bucket_done_[b], comm_stream_), where() + ": done event");
      issued_buckets_.push_back(b);
      break;
    }
  }
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess)
    return cuda_error(where() + " (" + std::string(op_name(op.kind)) + ")", err);
  return ok_status();
}

// The sharded plans' collectives (see GpuCommunicator). A bucket's reduce-scatter runs on the side
// stream as the all-reduce does (ZeRO-1's on the last micro-step only, ZeRO-2/3's on every one,
// adding this rank's segment into the gradient shard there); a forward or backward gather runs on
// the side stream once the compute stream got to it (the buffer's memory is free then) and its
// first reader waits for it; the optimizer's gathers run on the compute stream.
Status CudaExecutor::enqueue_collective(std::size_t index, const Op& op, bool communicate) {
  const Graph& g = plan_.graph;
  const auto k = static_cast<std::size_t>(op.bucket);
  const Bucket& b = plan_.comm.buckets[k];
  const bool ranks = comm_ != nullptr && comm_->world_size() > 1;
  const std::size_t S = static_cast<std::size_t>(b.segment_elements);
  const std::size_t own = static_cast<std::size_t>(plan_.comm.rank) * S;
  const std::string where = "op " + std::to_string(index) + " '" + op.name + "'";
  if (op.kind == OpKind::reduce_scatter) {
    const bool accumulate = op.outputs.size() == 2;
    if (!accumulate && !communicate) return ok_status();  // ZeRO-1: the last micro-step's only
    float* buffer = static_cast<float*>(device_pointer(op.inputs[0]));
    // The previous bucket's transient buffer (kept alive until here by the plan) must be reduced
    // before the compute stream may reuse its memory.
    if (transient_gradients_ && !issued_buckets_.empty())
      TL_CUDA_TRY(cudaStreamWaitEvent(stream_, bucket_done_[issued_buckets_.back()], 0), where);
    TL_CUDA_TRY(cudaEventRecord(bucket_ready_[k], stream_), where + ": bucket ready event");
    TL_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, bucket_ready_[k], 0), where);
    if (ranks)
      TL_CUDA_TRY(
          comm_->reduce_scatter_sum(buffer, static_cast<std::size_t>(b.elements), comm_stream_),
          where + ": reduce-scatter of bucket " + std::to_string(k));
    if (accumulate)
      add_in_place(static_cast<float*>(device_pointer(op.outputs[1])), buffer + own,
                   static_cast<std::int64_t>(S), comm_stream_);
    TL_CUDA_TRY(cudaEventRecord(bucket_done_[k], comm_stream_), where + ": done event");
    issued_buckets_.push_back(k);
    return ok_status();
  }
  // all_gather {shard} -> {buffer}
  bf16* buffer = static_cast<bf16*>(device_pointer(op.outputs[0]));
  const bf16* shard = static_cast<const bf16*>(device_pointer(op.inputs[0]));
  if (op.phase == Phase::optimizer || gather_done_[index] == nullptr) {
    if (shard != buffer + own)
      TL_CUDA_TRY(
          cudaMemcpyAsync(buffer + own, shard, S * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_),
          where);
    if (ranks)
      TL_CUDA_TRY(
          comm_->all_gather(buffer, buffer + own, static_cast<std::size_t>(b.elements), stream_),
          where + ": all-gather of bucket " + std::to_string(k));
    return ok_status();
  }
  TL_CUDA_TRY(cudaEventRecord(gather_ready_[index], stream_), where + ": gather ready event");
  TL_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, gather_ready_[index], 0), where);
  if (ranks)
    TL_CUDA_TRY(
        comm_->all_gather(buffer, shard, static_cast<std::size_t>(b.elements), comm_stream_),
        where + ": all-gather of bucket " + std::to_string(k));
  else if (shard != buffer + own)
    TL_CUDA_TRY(cudaMemcpyAsync(buffer + own, shard, S * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                comm_stream_),
                where);
  TL_CUDA_TRY(cudaEventRecord(gather_done_[index], comm_stream_), where + ": gather done event");
  pending_gathers_[g[op.outputs[0]].view_of != kNoTensor ? g[op.outputs[0]].view_of
                                                         : op.outputs[0]] = gather_done_[index];
  return ok_status();
}

Status CudaExecutor::synchronize() {
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  return ok_status();
}

Result<double> CudaExecutor::mean_loss() {
  auto v = values(plan_.graph.losses);
  if (!v) return v.error();
  double s = 0;
  for (float x : *v) s += static_cast<double>(x);
  return s / static_cast<double>(v->size());
}

Result<std::int64_t> CudaExecutor::skipped_steps() {
  float v = 0;
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  TL_CUDA_TRY(cudaMemcpy(&v, skipped_steps_, sizeof v, cudaMemcpyDeviceToHost),
              "skipped-step counter");
  return static_cast<std::int64_t>(v);
}

Result<double> CudaExecutor::last_grad_norm() {
  auto v = values(plan_.graph.grad_norm);
  if (!v) return v.error();
  return static_cast<double>((*v)[0]);
}

Result<std::vector<double>> CudaExecutor::op_times_ms() {
  if (op_start_.empty())
    return make_error("cuda backend: op_times_ms needs profile_ops and op_by_op mode");
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  std::vector<double> ms(op_start_.size(), 0.0);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (!op_recorded_[i]) continue;
    float f = 0;
    TL_CUDA_TRY(cudaEventElapsedTime(&f, op_start_[i], op_end_[i]), "profile event");
    ms[i] = f;
  }
  return ms;
}

cudaError_t CudaExecutor::record_trace_event(cudaEvent_t event, cudaStream_t stream) const {
  return capturing_ ? cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal)
                    : cudaEventRecord(event, stream);
}

Status CudaExecutor::set_tracing(bool on) {
  if (on && trace_base_ == nullptr) {
    const std::size_t n_ops = plan_.graph.ops.size(), n_buckets = plan_.comm.buckets.size();
    trace_start_.assign(n_ops, nullptr);
    trace_end_.assign(n_ops, nullptr);
    trace_bucket_start_.assign(n_buckets, nullptr);
    trace_bucket_end_.assign(n_buckets, nullptr);
    for (auto* list : {&trace_start_, &trace_end_, &trace_bucket_start_, &trace_bucket_end_})
      for (auto& e : *list) TL_CUDA_TRY(cudaEventCreate(&e), "trace event");
    TL_CUDA_TRY(cudaEventCreate(&trace_base_), "trace event");
  }
  if (on) {
    trace_recorded_.assign(plan_.graph.ops.size(), 0);
    trace_bucket_recorded_.assign(plan_.comm.buckets.size(), 0);
    TL_CUDA_TRY(cudaEventRecord(trace_base_, stream_), "trace event");
  }
  tracing_ = on;
  return ok_status();
}

Result<CudaExecutor::TracedTimes> CudaExecutor::traced_times() {
  if (trace_base_ == nullptr) return make_error("cuda backend: traced_times without set_tracing");
  TL_CUDA_TRY(cudaStreamSynchronize(stream_), "synchronise");
  if (comm_stream_ != nullptr) TL_CUDA_TRY(cudaStreamSynchronize(comm_stream_), "synchronise");
  TracedTimes t;
  auto read = [&](const std::vector<cudaEvent_t>& starts, const std::vector<cudaEvent_t>& ends,
                  const std::vector<std::uint8_t>& recorded,
                  std::vector<std::pair<double, double>>& out) -> Status {
    out.assign(starts.size(), {-1.0, -1.0});
    for (std::size_t i = 0; i < starts.size(); ++i) {
      if (i >= recorded.size() || !recorded[i]) continue;
      float a = 0, b = 0;
      TL_CUDA_TRY(cudaEventElapsedTime(&a, trace_base_, starts[i]), "trace event");
      TL_CUDA_TRY(cudaEventElapsedTime(&b, trace_base_, ends[i]), "trace event");
      out[i] = {a, b};
      t.end_ms = std::max(t.end_ms, static_cast<double>(b));
    }
    return ok_status();
  };
  if (auto s = read(trace_start_, trace_end_, trace_recorded_, t.ops); !s) return s.error();
  if (auto s = read(trace_bucket_start_, trace_bucket_end_, trace_bucket_recorded_, t.buckets); !s)
    return s.error();
  return t;
}

CudaExecutor::OpExecution CudaExecutor::execution_of(std::size_t i) const {
  const Graph& g = plan_.graph;
  OpExecution e;
  if (i >= g.ops.size()) return e;
  const Op& op = g.ops[i];
  e.overwrites =
      overwrite_[i] != 0 || cudnn_backward_[i] != 0 || op.kind == OpKind::crossentropy_backward;
  if (op.kind == OpKind::zero && skip_zero_[i]) return e;
  if (op.kind == OpKind::all_reduce && (comm_ == nullptr || comm_->world_size() <= 1)) return e;
  if (i > 0 && fused_with_next_[i - 1]) {
    e.runs_in = i - 1;
  } else if (gelu_fused_into_[i] != kNoPartner) {
    e.runs_in = gelu_fused_into_[i];
  } else if (op.kind == OpKind::adamw && adamw_folded_[i]) {
    e.runs_in = first_adamw_op_;
  } else if (classifier_backward_[i] < g.ops.size()) {  // a training step's backward computes it
    e.runs_in = classifier_backward_[i];
  } else {
    e.runs_in = i;
  }
  return e;
}

DeviceMemory CudaExecutor::memory() const {
  DeviceMemory m;
  m.arena_bytes = plan_.memory.arena_bytes;
  m.workspace_bytes = std::size_t{32} << 20;
  m.attention_workspace_bytes = cudnn_workspace_alloc_bytes_;
  m.fp8_scratch_bytes = fp8_memory_bytes_;
  m.host_bytes = plan_.memory.host_bytes;
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    m.used_bytes = total_bytes - free_bytes;
    m.total_bytes = total_bytes;
  }
  return m;
}

// ---- fp8 --------------------------------------------------------------------------------

namespace {
std::size_t round_up_256(std::size_t n) { return (n + 255) / 256 * 256; }
// the timed runs of each variant in the FP8 choice (median)
constexpr int kFp8ChoiceReps = 5;
}  // namespace

Status CudaExecutor::init_fp8() {
  const Graph& g = plan_.graph;
  fp8_site_.assign(g.ops.size(), -1);
  fp8_fallback_.assign(g.ops.size(), 0);
  fp8_chosen_.assign(g.ops.size(), kFp8Unmeasured);
  fp8_dw_chosen_.assign(g.ops.size(), kFp8Unmeasured);
  if (!options_.fp8) return ok_status();
  int sites = 0;
  std::size_t first_max = 0, second_max = 0, input_t_max = 0;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    const bool forward = op.kind == OpKind::matmul_forward;
    if (!forward && op.kind != OpKind::matmul_backward) continue;
    const auto& w = g[op.inputs[forward ? 1 : 2]].shape;
    const std::int64_t OC = w[0], C = w[1], N = g[op.inputs[forward ? 0 : 1]].elements() / C;
    // the classifier stays bf16 (its logits feed the loss directly), and cuBLASLt's FP8 kernels
    // want every dimension a multiple of 16
    if (op.name == "lm_head" || C % 16 != 0 || OC % 16 != 0 || N % 16 != 0) {
      ++fp8_report_.bf16_ops;
      continue;
    }
    fp8_site_[i] = sites;
    sites += 3;  // x, w (forward) or dy, w^T, x^T (backward)
    first_max = std::max(first_max, static_cast<std::size_t>(N * (forward ? C : OC)));
    second_max = std::max(second_max, static_cast<std::size_t>(OC * C));
    if (!forward) input_t_max = std::max(input_t_max, static_cast<std::size_t>(N * C));
    ++fp8_report_.gemm_ops;
  }
  if (sites == 0) return ok_status();
  fp8_calibrated_.assign(static_cast<std::size_t>(sites), 0);
  fp8_operand_offset_ = round_up_256(static_cast<std::size_t>(sites) * sizeof(Fp8Scaling));
  fp8_second_offset_ = fp8_operand_offset_ + round_up_256(first_max);
  // the wgrad's transposed operands: dy^T (no larger than the first operand's buffer) and x^T
  fp8_first_t_offset_ = fp8_second_offset_ + round_up_256(second_max);
  fp8_input_t_offset_ = fp8_first_t_offset_ + round_up_256(first_max);
  fp8_memory_bytes_ = fp8_input_t_offset_ + round_up_256(input_t_max);
  TL_CUDA_TRY(cudaMalloc(&fp8_memory_, fp8_memory_bytes_),
              "cudaMalloc of the " + format_bytes(fp8_memory_bytes_) + " of fp8 operands");
  TL_CUDA_TRY(cudaMemsetAsync(fp8_memory_, 0, fp8_memory_bytes_, stream_), "fp8 memset");
  fp8_report_.scratch_bytes = fp8_memory_bytes_;
  return ok_status();
}

Fp8Report CudaExecutor::fp8_report() const {
  Fp8Report r = fp8_report_;
  for (std::size_t i = 0; i < fp8_fallback_.size(); ++i) {
    if (fp8_site_[i] < 0) continue;
    if (fp8_fallback_[i]) {
      --r.gemm_ops;
      ++r.fallback_ops;
      continue;
    }
    for (const std::uint8_t c : {fp8_chosen_[i], fp8_dw_chosen_[i]}) {
      r.bf16_by_measurement += c == kBf16Chosen;
      r.fp8_gemms += c == kFp8Chosen;
    }
  }
  return r;
}

CudaExecutor::Fp8Operands CudaExecutor::fp8_operands(std::size_t index, const bf16* first,
                                                     std::int64_t first_elements, const bf16* w,
                                                     std::int64_t w_elements, const bf16* input,
                                                     std::int64_t input_elements) {
  const auto site = static_cast<std::size_t>(fp8_site_[index]);
  auto* base = static_cast<std::byte*>(fp8_memory_);
  Fp8Operands o;
  o.first = reinterpret_cast<Fp8Scaling*>(base) + site;
  o.weight = o.first + 1;
  o.input_t = o.first + 2;
  o.first_fp8 = base + fp8_operand_offset_;
  o.weight_fp8 = base + fp8_second_offset_;
  o.first_t_fp8 = base + fp8_first_t_offset_;
  o.input_t_fp8 = base + fp8_input_t_offset_;
  o.step = static_cast<const float*>(device_pointer(plan_.graph.scalars)) + kStep;
  if (!capturing_ && !fp8_calibrated_[site]) {
    fp8_calibrate(first, first_elements, o.first, o.step, stream_);
    fp8_calibrate(w, w_elements, o.weight, o.step, stream_);
    if (input != nullptr) fp8_calibrate(input, input_elements, o.input_t, o.step, stream_);
    fp8_calibrated_[site] = 1;
  }
  return o;
}

std::string CudaExecutor::fp8_op_name(std::size_t index, const char* direction) const {
  return "op " + std::to_string(index) + " '" + plan_.graph.ops[index].name + "' " + direction;
}

void CudaExecutor::fp8_refused(std::size_t index, const char* direction, int status) {
  fp8_fallback_[index] = 1;
  if (fp8_report_.first_fallback.empty())
    fp8_report_.first_fallback =
        fp8_op_name(index, direction) + ": cuBLASLt status " + std::to_string(status);
}

Status CudaExecutor::fp8_forward(std::size_t index, bf16* y, bf16* pre, const bf16* x,
                                 const bf16* w, const bf16* bias, std::int64_t N, std::int64_t C,
                                 std::int64_t OC, bool* done) {
  *done = false;
  if (fp8_chosen_[index] == kBf16Chosen) return ok_status();
  auto run_fp8 = [&] {
    const Fp8Operands o = fp8_operands(index, x, N * C, w, OC * C);
    fp8_cast(o.first_fp8, x, N * C, Fp8Format::e4m3, o.first, o.step, stream_);
    fp8_cast(o.weight_fp8, w, OC * C, Fp8Format::e4m3, o.weight, o.step, stream_);
    return matmul_->matmul_forward_fp8(y, pre, o.first_fp8, &o.first->scale_inv, o.weight_fp8,
                                       &o.weight->scale_inv, bias, N, C, OC, stream_);
  };
  if (!capturing_ && fp8_chosen_[index] == kFp8Unmeasured &&
      options_.fp8_choice == CudaExecutorOptions::Fp8Choice::measured) {
    // y is overwritten by either path: both are timed in place, the chosen one runs last
    const double fp8_ms = median_event_ms([&] { return run_fp8() == CUBLAS_STATUS_SUCCESS; },
                                          stream_, kFp8ChoiceReps);
    const double bf16_ms = median_event_ms(
        [&] {
          return (pre != nullptr
                      ? matmul_->matmul_forward_gelu(y, pre, x, w, bias, N, C, OC, stream_)
                      : matmul_->matmul_forward(y, x, w, bias, N, C, OC, stream_)) ==
                 CUBLAS_STATUS_SUCCESS;
        },
        stream_, kFp8ChoiceReps);
    if (fp8_ms >= 0 && bf16_ms >= 0 && fp8_ms > bf16_ms * (1 - CudaExecutorOptions::kFp8MinGain)) {
      fp8_chosen_[index] = kBf16Chosen;
      return ok_status();  // the caller runs the bf16 GEMM
    }
  }
  const cublasStatus_t st = run_fp8();
  if (st == CUBLAS_STATUS_SUCCESS) {
    if (fp8_chosen_[index] == kFp8Unmeasured) fp8_chosen_[index] = kFp8Chosen;
    *done = true;
    return ok_status();
  }
  if (capturing_)
    return make_error("cuda backend: " + fp8_op_name(index, "forward") +
                          ": FP8 GEMM: cuBLASLt status " + std::to_string(static_cast<int>(st)),
                      1);
  // the first (eager) use: this GEMM runs in bf16 from now on
  fp8_refused(index, "forward", static_cast<int>(st));
  return ok_status();
}

Status CudaExecutor::fp8_backward(std::size_t index, bf16* dx, const bf16* pre, float* dw,
                                  float* dbias, const bf16* dy, const bf16* x, const bf16* w,
                                  std::int64_t N, std::int64_t C, std::int64_t OC,
                                  bool overwrite_dx, bool* done) {
  *done = false;
  if (fp8_fallback_[index]) return ok_status();  // the whole op in bf16 (the caller)
  auto lt_error = [&](const char* part, cublasStatus_t st) {
    return make_error("cuda backend: " + fp8_op_name(index, "backward") + ": " + part +
                          ": cuBLASLt status " + std::to_string(static_cast<int>(st)),
                      1);
  };
  auto bf16_dx = [&](bf16* out) {
    return pre != nullptr
               ? matmul_->matmul_backward_dx_dgelu(out, dy, pre, w, N, C, OC, stream_)
               : matmul_->matmul_backward_dx(out, dy, w, N, C, OC, stream_, overwrite_dx);
  };
  // One variant of the op: dW, then dx (dpre may take x's memory), each in FP8 or bf16; dy's two
  // FP8 casts come from one read when both GEMMs take FP8.
  bool dw_done = false;  // the last run's dW went through (a refusal after it is in dx)
  auto run = [&](bool dx8, bool dw8, bf16* dx_out, float* dw_out,
                 float* dbias_out) -> cublasStatus_t {
    dw_done = false;
    dx8 = dx8 && dx_out != nullptr;
    Fp8Operands o;
    if (dx8 || dw8) {
      o = fp8_operands(index, dy, N * OC, w, OC * C, x, N * C);
      if (dx8 && dw8)
        fp8_cast_dual(o.first_fp8, o.first_t_fp8, dy, N, OC, Fp8Format::e5m2, o.first, o.step,
                      stream_);
      else if (dx8)
        fp8_cast(o.first_fp8, dy, N * OC, Fp8Format::e5m2, o.first, o.step, stream_);
      else
        fp8_cast_transpose(o.first_t_fp8, dy, N, OC, Fp8Format::e5m2, o.first, o.step, stream_);
    }
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (dw8) {
      fp8_cast_transpose(o.input_t_fp8, x, N, C, Fp8Format::e4m3, o.input_t, o.step, stream_);
      st = matmul_->matmul_backward_dw_fp8(dw_out, o.input_t_fp8, &o.input_t->scale_inv,
                                           o.first_t_fp8, &o.first->scale_inv, N, C, OC, stream_);
      if (st == CUBLAS_STATUS_SUCCESS && dbias_out != nullptr)
        bias_backward(dbias_out, dy, N, OC, stream_);  // FP8 GEMMs have no BGRADB epilogue
    } else {
      st = matmul_->matmul_backward_dw(dw_out, dbias_out, dy, x, N, C, OC, stream_);
    }
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    dw_done = true;
    if (dx_out == nullptr) return st;
    if (!dx8) return bf16_dx(dx_out);
    fp8_cast_transpose(o.weight_fp8, w, OC, C, Fp8Format::e4m3, o.weight, o.step, stream_);
    return matmul_->matmul_backward_dx_fp8(dx_out, pre, o.first_fp8, &o.first->scale_inv,
                                           o.weight_fp8, &o.weight->scale_inv, N, C, OC, stream_,
                                           overwrite_dx);
  };
  const bool has_dx = dx != nullptr;
  if (!capturing_ && fp8_dw_chosen_[index] == kFp8Unmeasured) {
    if (options_.fp8_choice == CudaExecutorOptions::Fp8Choice::measured) {
      // every variant timed whole on copies of dx, dW and dbias (they may accumulate), freed at
      // once (the steady state's memory does not grow); the fastest kept, each FP8 GEMM in it
      // charged kFp8MinGain
      const std::size_t dx_bytes = has_dx ? static_cast<std::size_t>(N * C) * sizeof(bf16) : 0;
      const std::size_t dw_bytes = static_cast<std::size_t>(OC * C) * sizeof(float);
      const std::size_t db_bytes = dbias != nullptr ? static_cast<std::size_t>(OC) * 4 : 0;
      void* copy = nullptr;
      if (cudaMalloc(&copy, dx_bytes + dw_bytes + db_bytes + 512) == cudaSuccess) {
        auto* dw_c = static_cast<float*>(copy);
        auto* db_c = dbias != nullptr ? dw_c + OC * C : nullptr;
        auto* dx_c = has_dx ? reinterpret_cast<bf16*>(static_cast<std::byte*>(copy) +
                                                      round_up_256(dw_bytes + db_bytes))
                            : nullptr;
        cudaMemcpyAsync(dw_c, dw, dw_bytes, cudaMemcpyDeviceToDevice, stream_);
        if (db_c != nullptr)
          cudaMemcpyAsync(db_c, dbias, db_bytes, cudaMemcpyDeviceToDevice, stream_);
        if (dx_c != nullptr) cudaMemcpyAsync(dx_c, dx, dx_bytes, cudaMemcpyDeviceToDevice, stream_);
        double best = -1;
        bool best_dx8 = false, best_dw8 = false;
        for (int v = 0; v < 4; ++v) {
          const bool dx8 = (v & 1) != 0, dw8 = (v & 2) != 0;
          if (dx8 && !has_dx) continue;
          const double ms = median_event_ms(
              [&] { return run(dx8, dw8, dx_c, dw_c, db_c) == CUBLAS_STATUS_SUCCESS; }, stream_,
              kFp8ChoiceReps);
          if (ms < 0) continue;
          const double charged = ms * (1 + CudaExecutorOptions::kFp8MinGain * (dx8 + dw8));
          if (best < 0 || charged < best) {
            best = charged;
            best_dx8 = dx8;
            best_dw8 = dw8;
          }
        }
        cudaStreamSynchronize(stream_);
        cudaFree(copy);
        if (best >= 0) {
          fp8_chosen_[index] = !has_dx ? kFp8Unmeasured : best_dx8 ? kFp8Chosen : kBf16Chosen;
          fp8_dw_chosen_[index] = best_dw8 ? kFp8Chosen : kBf16Chosen;
        }
      } else {
        cudaGetLastError();
      }
    }
    if (fp8_dw_chosen_[index] == kFp8Unmeasured) {  // always, or not measured: FP8 as configured
      fp8_chosen_[index] = has_dx ? kFp8Chosen : kFp8Unmeasured;
      fp8_dw_chosen_[index] = kFp8Chosen;
    }
  }
  const bool dx8 = fp8_chosen_[index] == kFp8Chosen, dw8 = fp8_dw_chosen_[index] == kFp8Chosen;
  const cublasStatus_t st = run(dx8, dw8, dx, dw, dbias);
  if (st == CUBLAS_STATUS_SUCCESS) {
    *done = true;
    return ok_status();
  }
  if (capturing_) return lt_error(dx8 || dw8 ? "FP8 GEMM" : "bf16 GEMM", st);
  // the first (eager) use: cuBLASLt refused an FP8 GEMM; the whole op runs in bf16 from now on.
  // A refused GEMM writes nothing: refused in dW, the caller runs the whole op; in dx (dW done),
  // only dx runs here in bf16.
  fp8_refused(index, "backward", static_cast<int>(st));
  fp8_chosen_[index] = fp8_dw_chosen_[index] = kFp8Unmeasured;
  if (!dw_done) return ok_status();
  if (const cublasStatus_t bst = bf16_dx(dx); bst != CUBLAS_STATUS_SUCCESS)
    return lt_error("bf16 GEMM", bst);
  *done = true;
  return ok_status();
}

}  // namespace topolaunch::kernels::cuda
