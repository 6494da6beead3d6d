// The CPU backend: one arena, the plan's op list, the reference kernels.
#include "topolaunch/kernels/cpu_backend.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "adamw.hpp"
#include "attention.hpp"
#include "classifier.hpp"
#include "encoder.hpp"
#include "gelu.hpp"
#include "layernorm.hpp"
#include "matmul.hpp"
#include "residual.hpp"
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
  const std::size_t bytes = std::max<std::size_t>(plan_.memory.arena_bytes, 256);
  arena_ = static_cast<std::byte*>(::operator new (bytes, std::align_val_t{256}));
  std::memset(arena_, 0, bytes);
  first_optimizer_op_ = plan_.graph.ops.size();
  for (std::size_t i = 0; i < plan_.graph.ops.size(); ++i) {
    if (plan_.graph.ops[i].phase == Phase::optimizer) {
      first_optimizer_op_ = i;
      break;
    }
  }
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
void CpuExecutor<F>::run_op(const Op& op, Communicator* comm, Status& status) {
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
      const auto& s = shape(op.inputs[0]);
      cpu::attention_forward(d(op.outputs[0]), d(op.outputs[1]), d(op.workspace), d(op.inputs[0]),
                             s[0], s[1], s[2] / 3, op.num_heads);
      break;
    }
    case OpKind::attention_backward: {
      const auto& s = shape(op.inputs[1]);
      cpu::attention_backward(d(op.outputs[0]), d(op.workspace), d(op.inputs[0]), d(op.inputs[1]),
                              d(op.inputs[2]), d(op.inputs[3]), s[0], s[1], s[2] / 3, op.num_heads);
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
    case OpKind::zero:
      for (auto t : op.outputs) std::memset(static_cast<void*>(d(t)), 0, g[t].bytes());
      break;
    case OpKind::global_norm: {
      double s = 0;
      for (auto t : op.inputs) s += cpu::sum_of_squares(d(t), el(t));
      d(op.outputs[0])[0] = static_cast<F>(std::sqrt(s));
      break;
    }
    case OpKind::adamw: {
      const F* sc = d(op.inputs[2]);
      const double norm = static_cast<double>(d(op.inputs[1])[0]);
      const double clip = static_cast<double>(sc[kGradClip]);
      cpu::AdamWScalars s{static_cast<double>(sc[kLearningRate]),
                          static_cast<double>(sc[kBeta1]),
                          static_cast<double>(sc[kBeta2]),
                          static_cast<double>(sc[kEpsilon]),
                          static_cast<double>(sc[kWeightDecay]),
                          static_cast<double>(sc[kStep]),
                          clip > 0 && norm > clip ? clip / norm : 1.0};
      cpu::adamw_update(d(op.outputs[0]), d(op.outputs[1]), d(op.outputs[2]), d(op.inputs[0]),
                        el(op.inputs[0]), s, g[op.outputs[0]].decayed);
      break;
    }
    case OpKind::all_reduce: {
      if (comm == nullptr || comm->world_size() == 1) break;
      const auto& b = plan_.comm.buckets[static_cast<std::size_t>(op.bucket)];
      std::span<F> range(reinterpret_cast<F*>(arena_ + b.offset), b.bytes / sizeof(F));
      if (auto s = comm->all_reduce_sum(range); !s) status = s;
      break;
    }
  }
}

template <class F>
Status CpuExecutor<F>::run_forward_backward(Communicator* comm) {
  Status status = ok_status();
  for (std::size_t i = 0; i < first_optimizer_op_ && status.ok(); ++i)
    run_op(plan_.graph.ops[i], comm, status);
  return status;
}

template <class F>
void CpuExecutor<F>::run_forward() {
  Status status = ok_status();
  for (const auto& op : plan_.graph.ops) {
    if (op.phase != Phase::forward) break;
    run_op(op, nullptr, status);
  }
}

template <class F>
void CpuExecutor<F>::run_optimizer(const AdamWSettings& s, std::int64_t step) {
  F* sc = data(plan_.graph.scalars);
  sc[kLearningRate] = static_cast<F>(s.learning_rate);
  sc[kBeta1] = static_cast<F>(s.beta1);
  sc[kBeta2] = static_cast<F>(s.beta2);
  sc[kEpsilon] = static_cast<F>(s.epsilon);
  sc[kWeightDecay] = static_cast<F>(s.weight_decay);
  sc[kStep] = static_cast<F>(step);
  sc[kGradClip] = static_cast<F>(s.grad_clip);
  Status status = ok_status();
  for (std::size_t i = first_optimizer_op_; i < plan_.graph.ops.size(); ++i)
    run_op(plan_.graph.ops[i], nullptr, status);
}

template <class F>
void CpuExecutor<F>::init_parameters(std::uint64_t seed) {
  const Graph& g = plan_.graph;
  int layers = 0;
  for (auto p : g.params)
    if (g[p].name.ends_with("attprojw")) ++layers;
  NormalRng rng(seed);
  for (auto p : g.params) {
    const Tensor& t = g[p];
    auto v = values(p);
    if (t.shape.size() == 1) {
      const bool ln_weight =
          t.name.ends_with("ln1w") || t.name.ends_with("ln2w") || t.name.ends_with("lnfw");
      for (auto& x : v) x = ln_weight ? F(1) : F(0);
      continue;
    }
    double std = 0.02;
    if (layers > 0 && (t.name.ends_with("attprojw") || t.name.ends_with("fcprojw")))
      std /= std::sqrt(2.0 * layers);
    for (auto& x : v) x = static_cast<F>(std * rng.normal());
  }
}

template class CpuExecutor<float>;
template class CpuExecutor<double>;

}  // namespace topolaunch::kernels
