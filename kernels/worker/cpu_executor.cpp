// The CPU backend as the training loop's executor (executor.hpp): CpuExecutor<float> over the
// plan's arena, its gradient buckets and the loop's sums through the host communicator of the
// worker (TCP ring or UCX, host_communicators.hpp). Every step completes on return, so the
// hooks keep their defaults. [observe]: its compute and bucket all-reduces are timed with the
// steady clock (the all-reduces run inside the backward and the step waits for each: all of
// their time is exposed), and a traced step's ops are timed one by one on the wall clock.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/kernels/executor.hpp"
#include "topolaunch/kernels/host_communicators.hpp"

namespace topolaunch::kernels {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The step's collectives of gradients and parameters (a bucket's all-reduce, or a sharded plan's
// reduce-scatters and all-gathers), timed: what the step spent in communication. The collectives
// of doubles (a sharded norm's partial sums) pass untimed.
class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  Status all_reduce_sum(std::span<float> data) override {
    return timed(data, [&] { return inner_.all_reduce_sum(data); });
  }
  Status reduce_scatter_sum(std::span<float> data) override {
    return timed(data, [&] { return inner_.reduce_scatter_sum(data); });
  }
  Status all_gather(std::span<float> data) override {
    return timed(data, [&] { return inner_.all_gather(data); });
  }
  Status all_reduce_sum(std::span<double> data) override { return inner_.all_reduce_sum(data); }
  Status reduce_scatter_sum(std::span<double> data) override {
    return inner_.reduce_scatter_sum(data);
  }
  Status all_gather(std::span<double> data) override { return inner_.all_gather(data); }
  Status barrier() override { return inner_.barrier(); }

  double ms = 0;
  std::size_t bytes = 0, calls = 0;

 private:
  template <class Collective>
  Status timed(std::span<float> data, Collective&& collective) {
    const auto t0 = Clock::now();
    Status s = collective();
    ms += ms_since(t0);
    bytes += data.size_bytes();
    ++calls;
    return s;
  }
  Communicator& inner_;
};

// A traced step's ops on the wall clock: the all-reduces on the communication track, every other
// op on the compute track (the CPU runs them one after the other on the same threads).
class OpTracer final : public OpObserver {
 public:
  explicit OpTracer(const Plan& plan) : plan_(plan) {}
  void start(StepTrace* trace, std::int64_t step) {
    trace_ = trace;
    step_ = step;
  }
  void op_begin(std::size_t) override { start_us_ = StepTrace::now_us(); }
  void op_end(std::size_t index) override {
    const double end_us = StepTrace::now_us();
    const Op& op = plan_.graph.ops[index];
    TraceSpan span;
    span.name = op.name.empty() ? std::string(op_name(op.kind)) : op.name;
    span.start_us = start_us_;
    span.duration_us = end_us - start_us_;
    span.step = step_;
    span.op = static_cast<int>(index);
    if (op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter ||
        op.kind == OpKind::all_gather) {
      const Bucket& b = plan_.comm.buckets[static_cast<std::size_t>(op.bucket)];
      span.category = op.kind == OpKind::all_reduce       ? "all-reduce"
                      : op.kind == OpKind::reduce_scatter ? "reduce-scatter"
                                                          : "all-gather";
      span.track = TraceTrack::communication;
      span.bucket = op.bucket;
      span.bytes = b.bytes;
    } else {
      span.category = std::string(phase_name(op.phase));
      span.track = TraceTrack::compute;
    }
    trace_->add(std::move(span));
  }

 private:
  const Plan& plan_;
  StepTrace* trace_ = nullptr;
  std::int64_t step_ = 0;
  double start_us_ = 0;
};

class CpuTrainingExecutor final : public TrainingExecutor {
 public:
  CpuTrainingExecutor(const Plan& plan, std::unique_ptr<Communicator> communicator)
      : executor_(plan),
        communicator_(std::move(communicator)),
        timed_(*communicator_),
        tracer_(executor_.plan()) {}

  const Plan& plan() const override { return executor_.plan(); }
  int rank() const override { return communicator_->rank(); }
  int world_size() const override { return communicator_->world_size(); }

  std::string banner(const RunShape& s) const override {
    char line[512];
    std::snprintf(
        line, sizeof line,
        "model %s: %zu parameters, vocabulary %lld (ln(vocab) = %.4f); %d rank(s) x batch %lld x "
        "seq %lld x accum %d; arena %s%s%s\n",
        s.model_kind.c_str(), plan().graph.parameter_count(), static_cast<long long>(s.vocab),
        std::log(static_cast<double>(s.vocab)), world_size(), static_cast<long long>(s.batch),
        static_cast<long long>(s.seq_len), s.grad_accum,
        format_bytes(plan().memory.arena_bytes).c_str(),
        plan().comm.shard == ShardMode::none ? "" : "; shard ",
        plan().comm.shard == ShardMode::none
            ? ""
            : std::string(shard_mode_name(plan().comm.shard)).c_str());
    return line;
  }

  Status init_parameters(std::uint64_t seed) override {
    executor_.init_parameters(seed);
    return ok_status();
  }
  void set_loss_scale(double scale) override { executor_.set_loss_scale(scale); }

  Status load_batch(std::span<const std::int32_t> tokens,
                    std::span<const std::int32_t> targets) override {
    const Graph& g = plan().graph;
    const std::size_t n = static_cast<std::size_t>(g[g.tokens].elements());
    if (tokens.size() != n || targets.size() != n)
      return make_error("cpu backend: a batch is " + std::to_string(n) +
                            " tokens and targets (batch x seq_len), got " +
                            std::to_string(tokens.size()) + " and " +
                            std::to_string(targets.size()),
                        1);
    std::copy(tokens.begin(), tokens.end(), executor_.ints(g.tokens));
    std::copy(targets.begin(), targets.end(), executor_.ints(g.targets));
    return ok_status();
  }
  // The bucket all-reduces run inside the backward of an accumulation's last micro-step (a
  // sharded plan's reduce-scatters and gathers as its plan says).
  Status run_micro_step(int micro, int accum, const AdamWSettings&, std::int64_t step) override {
    if (trace_ != nullptr) tracer_.start(trace_, step);
    const auto t0 = Clock::now();
    Status s = executor_.run_forward_backward(&timed_, micro == accum - 1);
    run_ms_ += ms_since(t0);
    return s;
  }
  Status finish_step(const AdamWSettings& adamw, std::int64_t step) override {
    if (trace_ != nullptr) tracer_.start(trace_, step);
    const auto t0 = Clock::now();
    Status s = executor_.run_optimizer(adamw, step, &timed_);
    run_ms_ += ms_since(t0);
    return s;
  }
  Result<double> mean_loss() override { return executor_.mean_loss(); }
  Result<double> evaluate_loss(std::span<const std::int32_t> tokens,
                               std::span<const std::int32_t> targets) override {
    if (auto s = load_batch(tokens, targets); !s) return s.error();
    if (auto s = executor_.run_forward(communicator_.get()); !s) return s.error();
    return executor_.mean_loss();
  }
  Result<double> last_grad_norm() override { return executor_.last_grad_norm(); }
  Result<std::int64_t> skipped_steps() override { return executor_.skipped_steps(); }

  Status sum_over_ranks(std::span<double> values, const std::string&) override {
    return communicator_->all_reduce_sum(values);
  }
  Status synchronize() override { return ok_status(); }

  ReadCheckpointTensor checkpoint_reader() override { return read_from_executor(executor_); }
  WriteCheckpointTensor checkpoint_writer() override { return write_to_executor(executor_); }
  ReadCheckpointPart checkpoint_part_reader() override {
    return read_part_from_executor(executor_);
  }

  std::string backend_name() const override { return "cpu"; }
  void trace_ops(StepTrace* trace) override {
    trace_ = trace;
    executor_.set_op_observer(trace != nullptr ? &tracer_ : nullptr);
  }
  Result<StepTimeSplit> step_time_split() override {
    StepTimeSplit split;
    split.comm_exposed_ms = split.comm_busy_ms = timed_.ms;
    split.compute_ms = std::max(0.0, run_ms_ - timed_.ms);
    split.comm_bytes = timed_.bytes;
    split.comm_calls = timed_.calls;
    run_ms_ = timed_.ms = 0;
    timed_.bytes = timed_.calls = 0;
    return split;
  }

 private:
  CpuExecutor<float> executor_;
  std::unique_ptr<Communicator> communicator_;
  TimedCommunicator timed_;
  OpTracer tracer_;
  StepTrace* trace_ = nullptr;
  double run_ms_ =
      0;  // forward, backward (with the all-reduces) and optimizer since the last split
};

}  // namespace

Result<std::unique_ptr<TrainingExecutor>> create_cpu_executor(const ExecutorSetup& setup) {
  auto communicator = communicator_for_worker(setup.place.rank, setup.place.world_size);
  if (!communicator) return communicator.error();
  return std::unique_ptr<TrainingExecutor>(
      std::make_unique<CpuTrainingExecutor>(setup.plan, std::move(*communicator)));
}

}  // namespace topolaunch::kernels
