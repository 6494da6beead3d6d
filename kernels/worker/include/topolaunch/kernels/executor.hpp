// The executor interface of the worker's one training loop (worker.cpp): what the loop asks of a
// backend. The CPU executor (cpu_executor.cpp, over CpuExecutor<float>) and the CUDA executor
// (worker/cuda/cuda_executor.cpp, over cuda::CudaExecutor and NCCL) implement it.
//
// Per optimizer step the loop calls, in this order and the same calls on every rank:
//   begin_step; per micro-step load_batch, run_micro_step (and mean_loss when it needs the loss);
//   finish_step; stop_after; on a logged step sum_over_ranks (the loss), last_grad_norm and
//   step_communication; at a checkpoint synchronize, checkpoint_reader (rank 0), sum_over_ranks.
// The hooks with a default (runs_ahead, begin_step, stop_after, step_communication) are what only
// the GPU does differently: its host enqueues steps ahead of the device (a CUDA Graph replay per
// step), reads the ranks' stop flag one step late so as not to wait on the device, and measures
// each step's gradient all-reduces.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "topolaunch/common/result.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/optimizer.hpp"
#include "topolaunch/kernels/plan.hpp"
#include "topolaunch/kernels/step_communication.hpp"
#include "topolaunch/kernels/step_trace.hpp"

namespace topolaunch::kernels {

// What the banner line after the data's description says about the run.
struct RunShape {
  std::string model_kind;  // "gpt2", "mlp"
  std::int64_t vocab = 0;  // in use: [model] vocab_size, else the data's
  std::int64_t batch = 0, seq_len = 0;
  int grad_accum = 1;
};

class TrainingExecutor {
 public:
  virtual ~TrainingExecutor() = default;

  virtual const Plan& plan() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The "model ..." line of the banner (one line, with its newline).
  virtual std::string banner(const RunShape& shape) const = 0;
  // What "done: N steps" adds about where they ran ("" or " on 2 GPU(s)").
  virtual std::string where_it_ran() const { return ""; }

  // GPT-2 init from the seed (every backend draws the same values).
  virtual Status init_parameters(std::uint64_t seed) = 0;
  // The scale of the summed per-token loss gradients (1 / tokens of a step over all ranks).
  virtual void set_loss_scale(double scale) = 0;

  // Load a batch: the tokens and targets (batch x seq_len each) of the next micro-step.
  virtual Status load_batch(std::span<const std::int32_t> tokens,
                            std::span<const std::int32_t> targets) = 0;
  // Run a step: forward and backward of the batch loaded last (micro-step `micro` of `accum`;
  // the gradient all-reduce on the last), then finish_step for the optimizer. An executor may
  // run the optimizer already with the last micro-step (the CUDA executor's whole-step graph when
  // accum is 1); finish_step then has nothing left to do.
  virtual Status run_micro_step(int micro, int accum, const AdamWSettings& adamw,
                                std::int64_t step) = 0;
  virtual Status finish_step(const AdamWSettings& adamw, std::int64_t step) = 0;
  // Mean per-token loss of the last micro-step's forward; the step's global gradient norm.
  virtual Result<double> mean_loss() = 0;
  virtual Result<double> last_grad_norm() = 0;
  // Optimizer steps skipped so far for non-finite gradients (inf or nan global norm): their
  // parameters and moments stay as they were; AdamW's step counts only the steps applied.
  virtual Result<std::int64_t> skipped_steps() = 0;
  // Validation: the mean per-token loss of a batch (batch x seq_len tokens and targets) through
  // the forward alone; no gradient, no optimizer state changes. Between optimizer steps only.
  virtual Result<double> evaluate_loss(std::span<const std::int32_t> tokens,
                                       std::span<const std::int32_t> targets) {
    (void)tokens;
    (void)targets;
    return make_error("this executor has no forward-only pass (train.val_every)", 2);
  }

  // Reduce scalars across ranks: in-place sum, every rank gets the same values. Collective: every
  // rank makes the same calls. `what` names the sum in an error ("checkpoint barrier").
  virtual Status sum_over_ranks(std::span<double> values, const std::string& what) = 0;
  // Every issued step complete (before a checkpoint is written, at the end).
  virtual Status synchronize() = 0;

  // Save/restore state through checkpoint.hpp's backend-neutral view of plan().graph, the same
  // file for every backend (so either resumes the other's): the reader copies each entry's fp32
  // values out (rank 0, between steps, after synchronize); the writer stores them back.
  virtual ReadCheckpointTensor checkpoint_reader() = 0;
  virtual WriteCheckpointTensor checkpoint_writer() = 0;
  // A sharded plan (plan().comm.shard != none): every rank writes its own parts of the one file
  // (write_checkpoint_parts) through this reader of checkpoint_parts' values.
  virtual ReadCheckpointPart checkpoint_part_reader() {
    return [](const CheckpointPart&, std::span<float>) -> Status {
      return make_error("this executor does not hold sharded state", 1);
    };
  }

  // --- hooks (the defaults are the CPU's) ---

  // The host runs ahead of the device: an unlogged step is only enqueued, so the loop times a
  // logged step as the mean over the steps since the previous logged one.
  virtual bool runs_ahead() const { return false; }
  // Before each step's first micro-step.
  virtual void begin_step() {}
  // Whether every rank stops after `step` (collective, called after every step); `signalled`:
  // this rank got SIGUSR1 or SIGTERM. The default sums the flags at once; an executor may answer
  // with the flags of an earlier step as long as every rank gets the same answer after the same
  // step.
  virtual Result<bool> stop_after(std::int64_t step, bool signalled) {
    (void)step;
    double flag[1] = {signalled ? 1.0 : 0.0};
    if (auto s = sum_over_ranks(flag, "stop-flag all-reduce"); !s) return s.error();
    return flag[0] > 0;
  }
  // The last step's gradient all-reduces as measured (after the step's sums): none when the
  // executor does not measure them.
  virtual Result<std::optional<CommStepFigures>> step_communication() {
    return std::optional<CommStepFigures>();
  }

  // --- what [observe] records (step_trace.hpp, step_observer.hpp); the defaults record nothing ---

  // "cpu" or "cuda": the trace's and the report's name for the backend.
  virtual std::string backend_name() const { return "cpu"; }
  // Record the ops of the coming step into `trace` (a step of observe.trace_steps: its ops on the
  // compute track, its bucket all-reduces on the communication track), or stop recording (null).
  // Called before the step's first micro-step; a step that is not traced does no tracing work.
  virtual void trace_ops(StepTrace* trace) { (void)trace; }
  // After a traced step: every span of its ops is in the trace (the GPU waits for the step here
  // and reads its events).
  virtual Status finish_trace() { return ok_status(); }
  // Compute and gradient communication of the steps since the previous call (on logged steps).
  virtual Result<StepTimeSplit> step_time_split() { return StepTimeSplit{}; }
  // What the executor allocated (the arena, and what lies beside it).
  virtual AllocatedMemory allocated_memory() const {
    AllocatedMemory m;
    m.arena_bytes = plan().memory.arena_bytes;
    return m;
  }
};

// What a backend's executor is made from: the job file, the worker's place in the job, the plan
// compiled for that backend's precision. `out` takes what the executor says while it starts (the
// CUDA executor's binding line).
struct ExecutorSetup {
  const jobspec::JobConfig& config;
  const jobspec::WorkerPlace& place;
  const Plan& plan;
  std::ostream& out;
};
using ExecutorFactory = Result<std::unique_ptr<TrainingExecutor>> (*)(const ExecutorSetup& setup);

// train.precision = "fp32": the CPU backend, with the host communicator of communicator_for_worker.
Result<std::unique_ptr<TrainingExecutor>> create_cpu_executor(const ExecutorSetup& setup);

// train.precision = "bf16": the CUDA backend's factory when this program was linked with it
// (-Dcuda=enabled: defined in worker/cuda/cuda_executor.cpp), else null (defined in
// no_cuda_executor.cpp). The build picks the file; no source asks which.
ExecutorFactory linked_cuda_executor();

}  // namespace topolaunch::kernels
