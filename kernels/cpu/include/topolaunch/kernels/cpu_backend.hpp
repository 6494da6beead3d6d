// The CPU backend: allocates the plan's arena once and runs the plan's op list with the reference
// kernels of kernels/cpu/. F = float for training, double for finite-difference gradient checks
// (the graph must then be built with f64 precision).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "topolaunch/kernels/communicator.hpp"
#include "topolaunch/kernels/optimizer.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace topolaunch::kernels {

// Told of every op as the executor runs it, while one is set (the worker's traced steps).
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void op_begin(std::size_t index) = 0;  // index into plan().graph.ops
  virtual void op_end(std::size_t index) = 0;
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

  // Forward + backward (+ recompute) of a micro-step. The collectives go through `communicator`
  // (null: this rank alone); the bucket all-reduces (and ZeRO-1's reduce-scatters) run only on
  // an accumulation's last micro-step, ZeRO-2/3's reduce-scatters and gathers on every one.
  Status run_forward_backward(Communicator* communicator, bool last_micro_step = true);
  // Forward only (loss of the current tokens/targets, no gradients); a ZeRO-3 plan gathers its
  // parameters through `communicator`.
  Status run_forward(Communicator* communicator = nullptr);
  // Global norm, AdamW, zero grads; `step` is the 1-based optimizer step. A sharded plan's global
  // norm and parameter all-gathers go through `communicator`.
  Status run_optimizer(const AdamWSettings& settings, std::int64_t step,
                       Communicator* communicator = nullptr);

  // A parameter's values, whatever the plan's sharding: in a ZeRO-3 plan only this rank's part
  // is stored (and only that part of `parameter` is valid); else the whole tensor.
  void set_parameter(TensorId param, std::span<const F> values);
  void set_loss_scale(double scale);
  double mean_loss();  // mean of the per-token losses of the last forward
  double last_grad_norm();
  // Optimizer steps skipped since construction: a step whose global gradient norm is inf or nan
  // leaves the parameters and AdamW's moments as they were, and AdamW's step t (bias correction)
  // counts only the steps applied.
  std::int64_t skipped_steps() const { return skipped_steps_; }

  // Each parameter's init of the graph (Tensor::init_std, init_value; GPT-2's: matrices
  // N(0, 0.02), residual projections 0.02/sqrt(2L), biases 0, norm weights 1), drawn in g.params
  // order from one stream.
  void init_parameters(std::uint64_t seed);

  // Around every op of run_forward_backward and run_optimizer from now on; null: none (the one
  // cost left is a pointer test per op).
  void set_op_observer(OpObserver* observer) { observer_ = observer; }

 private:
  // After the global norm: counts a non-finite norm, makes scalars[kStep] the steps applied.
  void guard_optimizer_step(F norm);
  void run_op(const Op& op, Communicator* communicator, bool last_micro_step, Status& status);
  void run_ops(std::size_t begin, std::size_t end, Communicator* communicator, bool last_micro_step,
               Status& status);
  const Bucket& bucket(const Op& op) const {
    return plan_.comm.buckets[static_cast<std::size_t>(op.bucket)];
  }
  Plan plan_;
  std::byte* arena_ = nullptr;
  std::size_t first_optimizer_op_ = 0;
  // Per op: the classifier_backward of a classifier_forward (classifier_backward_of), else
  // ops.size(); a range that holds both skips the forward (the backward writes the losses).
  std::vector<std::size_t> classifier_backward_;
  OpObserver* observer_ = nullptr;
  std::int64_t skipped_steps_ = 0;
};

extern template class CpuExecutor<float>;
extern template class CpuExecutor<double>;

}  // namespace topolaunch::kernels
