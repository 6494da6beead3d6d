// The CPU backend: one arena, the plan's op list, the reference kernels.
#include "topolaunch/kernels/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "adamw.hpp"
#include "attention.hpp"
#include "classifier.hpp"
#include "encoder.hpp"
#include "gelu.hpp"
#include "layernorm.hpp"
#include "matmul.hpp"
#include "residual.hpp"
#include "rmsnorm.hpp"
#include "rope.hpp"
#include "swiglu.hpp"
#include "topolaunch/kernels/rng.hpp"

namespace topolaunch::kernels {

namespace {
template <class F>
constexpr DType kFloatType = std::is_same_v<F, double> ? DType::f64 : DType::f32;
}

template <class F>
CpuExecutor<F>::CpuExecutor(const Plan& plan) : plan_(plan) {
  for (const auto& t : plan_.graph.tensors) {
    if (t.dtype != DType::i32 && t.dtype != kFloatType<F>)
      throw std::invalid_argument("cpu backend: tensor " + t.name + " is " +
                                  std::string(dtype_name(t.dtype)) + ", this executor runs " +
                                  std::string(dtype_name(kFloatType<F>)));
  }
  // An offloaded optimizer state follows the arena (MemoryPlan::host_bytes): here both are host
  // memory, one allocation.
  const std::size_t bytes =
      std::max<std::size_t>(plan_.memory.arena_bytes + plan_.memory.host_bytes, 256);
  arena_ = static_cast<std::byte*>(::operator new (bytes, std::align_val_t{256}));
  std::memset(arena_, 0, bytes);
  first_optimizer_op_ = plan_.graph.ops.size();
  for (std::size_t i = 0; i < plan_.graph.ops.size(); ++i) {
    if (plan_.graph.ops[i].phase == Phase::optimizer) {
      first_optimizer_op_ = i;
      break;
    }
  }
  classifier_backward_.resize(plan_.graph.ops.size());
  for (std::size_t i = 0; i < plan_.graph.ops.size(); ++i)
    classifier_backward_[i] = classifier_backward_of(plan_.graph, i);
}

template <class F>
CpuExecutor<F>::~CpuExecutor() {
  ::operator delete (arena_, std::align_val_t{256});
}

template <class F>
F* CpuExecutor<F>::data(TensorId t) {
  if (t == kNoTensor) return nullptr;
  const std::size_t off = plan_.memory.offsets[static_cast<std::size_t>(t)];
  if (off == kNoOffset) return nullptr;
  return reinterpret_cast<F*>(arena_ + off);
}

template <class F>
std::int32_t* CpuExecutor<F>::ints(TensorId t) {
  return reinterpret_cast<std::int32_t*>(arena_ +
                                         plan_.memory.offsets[static_cast<std::size_t>(t)]);
}

template <class F>
std::span<F> CpuExecutor<F>::values(TensorId t) {
  return {data(t), static_cast<std::size_t>(plan_.graph[t].elements())};
}

template <class F>
void CpuExecutor<F>::set_loss_scale(double scale) {
  data(plan_.graph.scalars)[kLossScale] = static_cast<F>(scale);
}

template <class F>
double CpuExecutor<F>::mean_loss() {
  double s = 0;
  for (F v : values(plan_.graph.losses)) s += static_cast<double>(v);
  return s / static_cast<double>(plan_.graph[plan_.graph.losses].elements());
}

template <class F>
double CpuExecutor<F>::last_grad_norm() {
  return static_cast<double>(data(plan_.graph.grad_norm)[0]);
}

template <class F>
void CpuExecutor<F>::guard_optimizer_step(F norm) {
  if (!std::isfinite(static_cast<double>(norm))) ++skipped_steps_;
  data(plan_.graph.scalars)[kStep] -= static_cast<F>(skipped_steps_);
}

template <class F>
void CpuExecutor<F>::run_op(const Op& op, Communicator* comm, bool last, Status& status) {
  const Graph& g = plan_.graph;
  auto d = [&](TensorId t) { return data(t); };
  auto shape = [&](TensorId t) -> const std::vector<std::int64_t>& { return g[t].shape; };
  auto el = [&](TensorId t) { return g[t].elements(); };
  auto opt = [&](const std::vector<TensorId>& v, std::size_t i) {
    return i < v.size() ? data(v[i]) : nullptr;
  };
  switch (op.kind) {
    case OpKind::encoder_forward: {
      const auto& s = shape(op.outputs[0]);
      cpu::encoder_forward(d(op.outputs[0]), ints(op.inputs[0]), d(op.inputs[1]), opt(op.inputs, 2),
                           s[0], s[1], s[2]);
      break;
    }
    case OpKind::encoder_backward: {
      const auto& s = shape(op.inputs[0]);
      cpu::encoder_backward(d(op.outputs[0]), opt(op.outputs, 1), d(op.inputs[0]),
                            ints(op.inputs[1]), s[0], s[1], s[2]);
      break;
    }
    case OpKind::layernorm_forward: {
      const std::int64_t C = shape(op.inputs[1])[0], N = el(op.inputs[0]) / C;
      cpu::layernorm_forward(d(op.outputs[0]), d(op.outputs[1]), d(op.outputs[2]), d(op.inputs[0]),
                             d(op.inputs[1]), d(op.inputs[2]), N, C);
      break;
    }
    case OpKind::residual_layernorm_forward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      cpu::residual_layernorm_forward(d(op.outputs[0]), d(op.outputs[1]), d(op.outputs[2]),
                                      d(op.outputs[3]), d(op.inputs[0]), d(op.inputs[1]),
                                      d(op.inputs[2]), d(op.inputs[3]), N, C);
      break;
    }
    case OpKind::layernorm_backward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      cpu::layernorm_backward(d(op.outputs[0]), d(op.outputs[1]), d(op.outputs[2]), d(op.inputs[0]),
                              d(op.inputs[1]), d(op.inputs[2]), d(op.inputs[3]), d(op.inputs[4]), N,
                              C);
      break;
    }
    case OpKind::matmul_forward: {
      const auto& w = shape(op.inputs[1]);
      const std::int64_t OC = w[0], C = w[1], N = el(op.inputs[0]) / C;
      cpu::matmul_forward(d(op.outputs[0]), d(op.inputs[0]), d(op.inputs[1]), opt(op.inputs, 2), N,
                          C, OC);
      break;
    }
    case OpKind::matmul_backward: {
      const auto& w = shape(op.inputs[2]);
      const std::int64_t OC = w[0], C = w[1], N = el(op.inputs[1]) / C;
      cpu::matmul_backward(d(op.outputs[0]), d(op.outputs[1]), opt(op.outputs, 2), d(op.inputs[0]),
                           d(op.inputs[1]), d(op.inputs[2]), N, C, OC);
      break;
    }
    case OpKind::attention_forward: {
      const AttentionShape a = attention_shape(g, op, op.inputs[0]);
      cpu::attention_forward(d(op.outputs[0]), d(op.outputs[1]), d(op.workspace), d(op.inputs[0]),
                             a.B, a.T, a.C, a.NH, a.NKV);
      break;
    }
    case OpKind::attention_backward: {
      const AttentionShape a = attention_shape(g, op, op.inputs[1]);
      cpu::attention_backward(d(op.outputs[0]), d(op.workspace), d(op.inputs[0]), d(op.inputs[1]),
                              d(op.inputs[2]), d(op.inputs[3]), a.B, a.T, a.C, a.NH, a.NKV);
      break;
    }
    case OpKind::rmsnorm_forward: {
      const std::int64_t C = shape(op.inputs[1])[0], N = el(op.inputs[0]) / C;
      cpu::rmsnorm_forward(d(op.outputs[0]), d(op.outputs[1]), d(op.inputs[0]), d(op.inputs[1]), N,
                           C);
      break;
    }
    case OpKind::residual_rmsnorm_forward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      cpu::residual_rmsnorm_forward(d(op.outputs[0]), d(op.outputs[1]), d(op.outputs[2]),
                                    d(op.inputs[0]), d(op.inputs[1]), d(op.inputs[2]), N, C);
      break;
    }
    case OpKind::rmsnorm_backward: {
      const std::int64_t C = shape(op.inputs[2])[0], N = el(op.inputs[0]) / C;
      cpu::rmsnorm_backward(d(op.outputs[0]), d(op.outputs[1]), d(op.inputs[0]), d(op.inputs[1]),
                            d(op.inputs[2]), d(op.inputs[3]), N, C);
      break;
    }
    case OpKind::rope_forward: {
      const AttentionShape a = attention_shape(g, op, op.inputs[0]);
      cpu::rope_forward(d(op.outputs[0]), d(op.inputs[0]), a.B, a.T, a.C, a.NH, a.NKV,
                        op.rope_theta);
      break;
    }
    case OpKind::rope_backward: {
      const AttentionShape a = attention_shape(g, op, op.inputs[0]);
      cpu::rope_backward(d(op.outputs[0]), d(op.inputs[0]), a.B, a.T, a.C, a.NH, a.NKV,
                         op.rope_theta);
      break;
    }
    case OpKind::swiglu_forward: {
      const std::int64_t H = shape(op.outputs[0]).back(), N = el(op.outputs[0]) / H;
      cpu::swiglu_forward(d(op.outputs[0]), d(op.inputs[0]), N, H);
      break;
    }
    case OpKind::swiglu_backward: {
      const std::int64_t H = shape(op.inputs[0]).back(), N = el(op.inputs[0]) / H;
      cpu::swiglu_backward(d(op.outputs[0]), d(op.inputs[0]), d(op.inputs[1]), N, H);
      break;
    }
    case OpKind::gelu_forward:
      cpu::gelu_forward(d(op.outputs[0]), d(op.inputs[0]), el(op.inputs[0]));
      break;
    case OpKind::gelu_backward:
      cpu::gelu_backward(d(op.outputs[0]), d(op.inputs[0]), d(op.inputs[1]), el(op.inputs[0]));
      break;
    case OpKind::residual_forward:
      cpu::residual_forward(d(op.outputs[0]), d(op.inputs[0]), d(op.inputs[1]), el(op.inputs[0]));
      break;
    case OpKind::residual_backward:
      cpu::residual_backward(d(op.outputs[0]), d(op.outputs[1]), d(op.inputs[0]), el(op.inputs[0]));
      break;
    case OpKind::crossentropy_forward: {
      const std::int64_t Vp = shape(op.inputs[0]).back(), N = el(op.inputs[0]) / Vp;
      cpu::crossentropy_forward(d(op.outputs[0]), d(op.inputs[0]), ints(op.inputs[1]), N, op.vocab,
                                Vp);
      break;
    }
    case OpKind::crossentropy_backward: {
      const std::int64_t Vp = shape(op.inputs[0]).back(), N = el(op.inputs[0]) / Vp;
      cpu::crossentropy_backward(d(op.outputs[0]), d(op.inputs[0]), ints(op.inputs[1]),
                                 d(op.inputs[2])[kLossScale], N, op.vocab, Vp);
      break;
    }
    case OpKind::classifier_forward:
    case OpKind::classifier_backward: {
      // Chunk by chunk, in row order: the same sums in the same order as the unchunked ops.
      const std::int64_t Vp = shape(op.inputs[1])[0], C = shape(op.inputs[1])[1];
      const std::int64_t N = el(op.inputs[0]) / C, rows = op.chunk_rows;
      const bool backward = op.kind == OpKind::classifier_backward;
      F* losses = d(backward ? op.outputs[2] : op.outputs[0]);
      F* logits = d(op.workspace);
      for (std::int64_t r0 = 0; r0 < N; r0 += rows) {
        const std::int64_t n = std::min(rows, N - r0);
        const F* x = d(op.inputs[0]) + r0 * C;
        const std::int32_t* targets = ints(op.inputs[2]) + r0;
        cpu::matmul_forward(logits, x, d(op.inputs[1]), static_cast<const F*>(nullptr), n, C, Vp);
        cpu::crossentropy_forward(losses + r0, logits, targets, n, op.vocab, Vp);
        if (!backward) continue;
        cpu::crossentropy_backward(logits, logits, targets, d(op.inputs[3])[kLossScale], n,
                                   op.vocab, Vp);
        cpu::matmul_backward(d(op.outputs[0]) + r0 * C, d(op.outputs[1]), static_cast<F*>(nullptr),
                             logits, x, d(op.inputs[1]), n, C, Vp);
      }
      break;
    }
    case OpKind::zero:
      for (auto t : op.outputs) std::memset(static_cast<void*>(d(t)), 0, g[t].bytes());
      break;
    case OpKind::global_norm: {
      // Each input in op.segments parts, summed part by part: a data-parallel plan's buckets in
      // the ranks' segments, the order sharded_global_norm sums in.
      double s = 0;
      for (auto t : op.inputs) {
        const std::size_t n = static_cast<std::size_t>(el(t));
        for (int k = 0; k < op.segments; ++k) {
          const std::size_t b = segment_begin(n, op.segments, k),
                            e = segment_begin(n, op.segments, k + 1);
          s += cpu::sum_of_squares(d(t) + b, static_cast<std::int64_t>(e - b));
        }
      }
      d(op.outputs[0])[0] = static_cast<F>(std::sqrt(s));
      guard_optimizer_step(d(op.outputs[0])[0]);
      break;
    }
    case OpKind::sharded_global_norm: {
      // This rank's segment of each bucket; every rank's partial sums, gathered, summed in
      // (bucket, rank) order.
      const int world = plan_.comm.world_size, rank = plan_.comm.rank;
      const std::size_t nb = op.inputs.size();
      std::vector<double> partial(nb * static_cast<std::size_t>(world), 0.0);
      for (std::size_t k = 0; k < nb; ++k)
        partial[static_cast<std::size_t>(rank) * nb + k] =
            cpu::sum_of_squares(d(op.inputs[k]), el(op.inputs[k]));
      if (comm != nullptr && world > 1)
        if (auto st = comm->all_gather(std::span<double>(partial)); !st) status = st;
      double s = 0;
      for (std::size_t k = 0; k < nb; ++k)
        for (int r = 0; r < world; ++r) s += partial[static_cast<std::size_t>(r) * nb + k];
      d(op.outputs[0])[0] = static_cast<F>(std::sqrt(s));
      guard_optimizer_step(d(op.outputs[0])[0]);
      break;
    }
    case OpKind::adamw:
    case OpKind::sharded_adamw: {
      const F* sc = d(op.inputs[2]);
      const double norm = static_cast<double>(d(op.inputs[1])[0]);
      if (!std::isfinite(norm)) break;  // non-finite gradients: the step is skipped
      const double clip = static_cast<double>(sc[kGradClip]);
      cpu::AdamWScalars s{static_cast<double>(sc[kLearningRate]),
                          static_cast<double>(sc[kBeta1]),
                          static_cast<double>(sc[kBeta2]),
                          static_cast<double>(sc[kEpsilon]),
                          static_cast<double>(sc[kWeightDecay]),
                          static_cast<double>(sc[kStep]),
                          clip > 0 && norm > clip ? clip / norm : 1.0};
      if (op.kind == OpKind::adamw) {
        cpu::adamw_update(d(op.outputs[0]), d(op.outputs[1]), d(op.outputs[2]), d(op.inputs[0]),
                          el(op.inputs[0]), s, g[op.outputs[0]].decayed);
        break;
      }
      // Each member's elements within this rank's segment, with the member's weight decay.
      const Bucket& b = bucket(op);
      for (const BucketMember& m : b.members) {
        const ShardSlice sl = shard_slice(b, m, plan_.comm.rank);
        if (sl.count == 0) continue;
        const std::int64_t o = sl.shard_offset;
        cpu::adamw_update(d(op.outputs[0]) + o, d(op.outputs[1]) + o, d(op.outputs[2]) + o,
                          d(op.inputs[0]) + o, sl.count, s, m.decayed);
      }
      break;
    }
    case OpKind::all_reduce: {
      if (!last || comm == nullptr || comm->world_size() == 1) break;
      const auto& b = bucket(op);
      std::span<F> range(reinterpret_cast<F*>(arena_ + b.offset), b.bytes / sizeof(F));
      if (auto s = comm->all_reduce_sum(range); !s) status = s;
      break;
    }
    case OpKind::reduce_scatter: {
      const bool accumulate = op.outputs.size() == 2;  // ZeRO-2/3: into the gradient shard
      if (!accumulate && !last) break;                 // ZeRO-1: the accumulation's last only
      const Bucket& b = bucket(op);
      std::span<F> buffer(d(op.inputs[0]), static_cast<std::size_t>(b.elements));
      if (comm != nullptr && comm->world_size() > 1)
        if (auto st = comm->reduce_scatter_sum(buffer); !st) {
          status = st;
          break;
        }
      if (accumulate) {
        const F* segment = buffer.data() + plan_.comm.rank * b.segment_elements;
        F* shard = d(op.outputs[1]);
        for (std::int64_t i = 0; i < b.segment_elements; ++i) shard[i] += segment[i];
      }
      break;
    }
    case OpKind::all_gather: {
      const Bucket& b = bucket(op);
      F* buffer = d(op.outputs[0]);
      F* own = buffer + plan_.comm.rank * b.segment_elements;
      const F* shard = d(op.inputs[0]);
      if (shard != own)
        std::memcpy(static_cast<void*>(own), shard,
                    static_cast<std::size_t>(b.segment_elements) * sizeof(F));
      if (comm != nullptr && comm->world_size() > 1)
        if (auto st = comm->all_gather(std::span<F>(buffer, static_cast<std::size_t>(b.elements)));
            !st)
          status = st;
      break;
    }
  }
}

template <class F>
void CpuExecutor<F>::run_ops(std::size_t begin, std::size_t end, Communicator* comm,
                             bool last_micro_step, Status& status) {
  for (std::size_t i = begin; i < end && status.ok(); ++i) {
    if (classifier_backward_[i] < end) continue;  // its backward writes the losses
    if (observer_ != nullptr) observer_->op_begin(i);
    run_op(plan_.graph.ops[i], comm, last_micro_step, status);
    if (observer_ != nullptr) observer_->op_end(i);
  }
}

template <class F>
Status CpuExecutor<F>::run_forward_backward(Communicator* comm, bool last_micro_step) {
  Status status = ok_status();
  run_ops(0, first_optimizer_op_, comm, last_micro_step, status);
  return status;
}

template <class F>
Status CpuExecutor<F>::run_forward(Communicator* comm) {
  // The forward ops and the parameter gathers among them, up to the backward's first op.
  Status status = ok_status();
  for (const auto& op : plan_.graph.ops) {
    if (op.phase != Phase::forward && op.phase != Phase::communication) break;
    if (op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter) break;
    run_op(op, comm, false, status);
    if (!status) break;
  }
  return status;
}

template <class F>
Status CpuExecutor<F>::run_optimizer(const AdamWSettings& s, std::int64_t step,
                                     Communicator* comm) {
  F* sc = data(plan_.graph.scalars);
  sc[kLearningRate] = static_cast<F>(s.learning_rate);
  sc[kBeta1] = static_cast<F>(s.beta1);
  sc[kBeta2] = static_cast<F>(s.beta2);
  sc[kEpsilon] = static_cast<F>(s.epsilon);
  sc[kWeightDecay] = static_cast<F>(s.weight_decay);
  sc[kStep] = static_cast<F>(step);
  sc[kGradClip] = static_cast<F>(s.grad_clip);
  Status status = ok_status();
  run_ops(first_optimizer_op_, plan_.graph.ops.size(), comm, true, status);
  return status;
}

template <class F>
void CpuExecutor<F>::set_parameter(TensorId p, std::span<const F> v) {
  const CommPlan& c = plan_.comm;
  if (c.shard != ShardMode::parameters) {
    std::copy(v.begin(), v.end(), values(p).begin());
    return;
  }
  for (const Bucket& b : c.buckets)
    for (const BucketMember& m : b.members) {
      if (m.param != p) continue;
      const ShardSlice sl = shard_slice(b, m, c.rank);
      std::copy_n(v.begin() + sl.member_begin, sl.count, data(b.param_shard) + sl.shard_offset);
      return;
    }
}

template <class F>
void CpuExecutor<F>::init_parameters(std::uint64_t seed) {
  const Graph& g = plan_.graph;
  NormalRng rng(seed);
  std::vector<F> v;
  for (auto p : g.params) {
    const Tensor& t = g[p];
    v.assign(static_cast<std::size_t>(t.elements()), static_cast<F>(t.init_value));
    if (t.init_std > 0)
      for (auto& x : v) x = static_cast<F>(t.init_std * rng.normal());
    set_parameter(p, v);  // every rank draws every value: the same stream whatever the sharding
  }
}

template class CpuExecutor<float>;
template class CpuExecutor<double>;

}  // namespace topolaunch::kernels
