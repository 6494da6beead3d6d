// What the training loop records about its steps ([observe]; docs/observe.md), in one object:
//  - every step's time split into compute, exposed communication (both the executor's,
//    step_time_split), data input, checkpoint I/O, idle (the loop's waits: the stop flag, the
//    loss all-reduce, logging), tracing and validation, with a few steady-clock reads per step;
//  - on the steps of observe.trace_steps only, their timeline (step_trace.hpp): the loop's host
//    spans, the executor's op and all-reduce spans, and clock-sync all-reduces after the step, all
//    written to TOPOLAUNCH_TRACE_FILE after the last traced step. Any other step touches nothing
//    of the trace: `time()` checks one flag;
//  - on logged steps, one JSON line of the interval's figures to TOPOLAUNCH_STEP_METRICS_FILE
//    (after a first line with the plan's figures), which the agent reads for report.json and its
//    Prometheus endpoint.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/kernels/executor.hpp"
#include "topolaunch/kernels/step_trace.hpp"

namespace topolaunch::kernels {

// The loop's own parts of a step (compute and communication are the executor's).
enum class StepPart : int { data, checkpoint, idle, trace, validation };
inline constexpr int kStepParts = 5;

class StepObserver {
 public:
  using Clock = std::chrono::steady_clock;

  // The files: the agent's TOPOLAUNCH_TRACE_FILE and TOPOLAUNCH_STEP_METRICS_FILE; without them
  // (a worker started by hand) the trace goes to trace-rank-<R>.json here and no figures are
  // written.
  StepObserver(const jobspec::ObserveSection& observe, TrainingExecutor& executor,
               std::ostream& out);
  StepObserver(const StepObserver&) = delete;
  StepObserver& operator=(const StepObserver&) = delete;

  // The first line of the figures: the plan (memory by role, FLOPs and tokens per step, the
  // communication plan) and what the executor allocated. `tokens_per_step`: this rank's.
  Status start(std::int64_t tokens_per_step, double flops_per_step);

  // Before a step's first micro-step. True when the step is traced (the executor records its ops
  // from here).
  bool begin_step(std::int64_t step);
  bool tracing() const { return traced_step_ != 0; }

  // A part of the current step from now until stop() or the end of the returned object's scope;
  // on a traced step also a span named `what` on the host track.
  class Timed {
   public:
    Timed(StepObserver& o, StepPart part, const char* what)
        : o_(o), part_(part), what_(what), start_(Clock::now()) {
      if (o_.tracing()) start_us_ = StepTrace::now_us();
    }
    ~Timed() { stop(); }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;
    void stop() {
      if (what_ == nullptr) return;
      o_.add(part_, what_, start_, start_us_);
      what_ = nullptr;
    }

   private:
    StepObserver& o_;
    StepPart part_;
    const char* what_;
    Clock::time_point start_;
    double start_us_ = 0;
  };
  [[nodiscard]] Timed time(StepPart part, const char* what) { return Timed(*this, part, what); }

  // At the end of step `step`, after its checkpoint. A traced step: the executor's spans are
  // collected, the clocks synchronised (collective: every rank traces the same steps), and after
  // the last traced step the trace file written. A logged step: one line of figures, `loss` the
  // ranks' mean, `tokens` this rank's tokens of each step.
  Status end_step(std::int64_t step, bool logged, double loss, std::int64_t tokens);

  // After the loop or at a stop: the last line (the final checkpoint's time), and the trace file
  // when traced steps ran and it is not written yet.
  Status finish(std::int64_t step);

  // The optimizer steps skipped so far (non-finite gradients): the lines from now on carry it.
  void set_skipped_steps(std::int64_t n) { skipped_steps_ = n; }

 private:
  void add(StepPart part, const char* what, Clock::time_point start, double start_us);
  Status write_line(std::int64_t step, std::int64_t steps, double loss, std::int64_t tokens);
  Status write_trace();

  TrainingExecutor& ex_;
  std::ostream& out_;
  StepTrace trace_;
  std::string trace_path_;
  bool trace_written_ = false;
  std::ofstream metrics_;
  std::int64_t skipped_steps_ = 0;
  std::string metrics_path_;
  TraceMetadata meta_;
  int clock_syncs_;  // all-reduces after each traced step

  std::int64_t traced_step_ = 0;  // the step being traced, 0: none
  Clock::time_point step_start_;
  double step_start_us_ = 0;
  // Untraced steps' wall times just before each traced one: the reference of its overhead.
  std::array<double, 8> recent_ms_{};
  std::size_t recent_count_ = 0;

  // The interval since the last line.
  Clock::time_point interval_start_;
  bool started_ = false;
  std::int64_t interval_steps_ = 0;
  std::array<double, kStepParts> parts_ms_{};
  double tokens_per_step_ = 0;
};

}  // namespace topolaunch::kernels
