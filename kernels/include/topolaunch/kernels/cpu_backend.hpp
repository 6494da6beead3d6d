// The CPU backend: allocates the plan's arena once and runs the plan's op list with the reference
// kernels of kernels/cpu/. F = float for training, double for finite-difference gradient checks
// (the graph must then be built with f64 precision).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "topolaunch/kernels/communicator.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace topolaunch::kernels {

struct AdamWSettings {
  double learning_rate = 1e-3, beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // <= 0: no clipping
};

template <class F>
class CpuExecutor {
 public:
  explicit CpuExecutor(const Plan& plan);  // allocates and zeroes the arena
  ~CpuExecutor();
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  const Plan& plan() const { return plan_; }
  F* data(TensorId t);
  std::int32_t* ints(TensorId t);
  std::span<F> values(TensorId t);
  std::span<std::byte> arena() { return {arena_, plan_.memory.arena_bytes}; }

  // Forward + backward (+ recompute); the bucket all-reduces run only when `communicator` is given
  // (the last micro-step of an accumulation).
  Status run_forward_backward(Communicator* communicator);
  // Forward only (loss of the current tokens/targets, no gradients).
  void run_forward();
  // Global norm, AdamW, zero grads; `step` is the 1-based optimizer step.
  void run_optimizer(const AdamWSettings& settings, std::int64_t step);
  void set_loss_scale(double scale);
  double mean_loss();  // mean of the per-token losses of the last forward
  double last_grad_norm();

  // GPT-2 init: matrices N(0, 0.02) (residual projections 0.02/sqrt(2L)), biases 0, LN weights 1.
  void init_parameters(std::uint64_t seed);

 private:
  void run_op(const Op& op, Communicator* communicator, Status& status);
  Plan plan_;
  std::byte* arena_ = nullptr;
  std::size_t first_optimizer_op_ = 0;
};

extern template class CpuExecutor<float>;
extern template class CpuExecutor<double>;

}  // namespace topolaunch::kernels
