// The training loop's record of its steps: the step-time split, the traced steps' timeline and the
// figures the agent reads; see step_observer.hpp.
#include "topolaunch/kernels/step_observer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"

namespace topolaunch::kernels {

namespace {

using Clock = StepObserver::Clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string fmt(const char* f, auto... args) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

const char* part_category(StepPart part) {
  switch (part) {
    case StepPart::data:
      return "data";
    case StepPart::checkpoint:
      return "checkpoint";
    case StepPart::idle:
      return "wait";
    case StepPart::trace:
      return "trace";
    case StepPart::validation:
      return "validation";
  }
  return "?";
}

// How many clock-sync all-reduces follow a traced step: the merge takes the median offset of each
// node. Ranks of one node share its clock, and one point per step shows the collective's jitter;
// across nodes three make the median robust to a rank descheduled as it leaves one. (Each costs
// a collective's round trip on the traced step: on the CPU example, milliseconds.)
int clock_syncs() {
  const auto nodes = env_int(jobspec::env::kGroupWorldSize, 1, 1, 1 << 20);
  return nodes && *nodes > 1 ? 3 : 1;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

// What one span costs to record: two wall-clock reads, the span built and appended.
double measure_record_ns() {
  constexpr int kSpans = 2000;
  StepTrace scratch({});
  const auto t0 = Clock::now();
  for (int i = 0; i < kSpans; ++i) {
    const double start = StepTrace::now_us();
    scratch.add(TraceSpan{"h.0.attention_forward", "forward", TraceTrack::compute, start,
                          StepTrace::now_us() - start, 1, i, -1, 0});
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kSpans;
}

}  // namespace

StepObserver::StepObserver(const jobspec::ObserveSection& observe, TrainingExecutor& executor,
                           std::ostream& out)
    : ex_(executor), out_(out), trace_(observe.trace_steps), clock_syncs_(clock_syncs()) {
  const int rank = ex_.rank();
  trace_path_ =
      env_value(jobspec::env::kTraceFile).value_or("trace-rank-" + std::to_string(rank) + ".json");
  metrics_path_ = env_value(jobspec::env::kStepMetricsFile).value_or("");
  meta_.rank = rank;
  meta_.world_size = ex_.world_size();
  meta_.node = host_name();
  meta_.backend = ex_.backend_name();
  meta_.plan_ops = ex_.plan().graph.ops.size();
  meta_.plan_buckets = ex_.plan().comm.buckets.size();
}

Status StepObserver::start(std::int64_t tokens_per_step, double flops_per_step) {
  tokens_per_step_ = static_cast<double>(tokens_per_step);
  interval_start_ = Clock::now();
  started_ = true;
  if (metrics_path_.empty()) return ok_status();
  metrics_.open(metrics_path_, std::ios::app);
  if (!metrics_)
    return make_error(fmt("%s: cannot write the step figures (%s)", metrics_path_.c_str(),
                          jobspec::env::kStepMetricsFile),
                      1);
  const Plan& p = ex_.plan();
  const MemoryPlan& m = p.memory;
  const AllocatedMemory a = ex_.allocated_memory();
  metrics_ << fmt(
      "{\"plan\":{\"backend\":\"%s\",\"rank\":%d,\"world_size\":%d,\"tokens_per_step\":%lld,"
      "\"flops_per_step\":%.6g,\"grad_accum\":%d,",
      ex_.backend_name().c_str(), ex_.rank(), ex_.world_size(),
      static_cast<long long>(tokens_per_step), flops_per_step, p.comm.grad_accum);
  metrics_ << fmt(
      "\"memory\":{\"parameters\":%zu,\"gradients\":%zu,\"optimizer_state\":%zu,"
      "\"communication\":%zu,\"activations\":%zu,\"workspaces\":%zu,\"inputs\":%zu,"
      "\"planned_region\":%zu,\"arena\":%zu},",
      m.parameter_bytes, m.gradient_bytes, m.optimizer_bytes, m.comm_bytes, m.activation_peak_bytes,
      m.workspace_peak_bytes, m.input_bytes, m.planned_bytes, m.arena_bytes);
  metrics_ << fmt(
      "\"allocated\":{\"arena\":%zu,\"outside_arena\":%zu,\"device_used\":%zu,"
      "\"device_total\":%zu,\"device\":\"%s\"},",
      a.arena_bytes, a.outside_arena_bytes, a.device_used_bytes, a.device_total_bytes,
      a.device_name.c_str());
  metrics_ << fmt("\"comm\":{\"buckets\":%zu,\"bytes_per_step\":%zu,\"comm_ms\":%.4f,\"exposed_"
                  "ms\":%.4f}}}\n",
                  p.comm.buckets.size(), p.comm.bytes_per_step, p.comm.comm_ms, p.comm.exposed_ms)
           << std::flush;
  return ok_status();
}

bool StepObserver::begin_step(std::int64_t step) {
  step_start_ = Clock::now();
  if (!trace_.traces(step)) return false;
  traced_step_ = step;
  step_start_us_ = StepTrace::now_us();
  ex_.trace_ops(&trace_);
  return true;
}

void StepObserver::add(StepPart part, const char* what, Clock::time_point start, double start_us) {
  const auto now = Clock::now();
  parts_ms_[static_cast<std::size_t>(part)] +=
      std::chrono::duration<double, std::milli>(now - start).count();
  if (traced_step_ == 0) return;
  const double end_us = StepTrace::now_us();
  trace_.add(TraceSpan{what, part_category(part), TraceTrack::host, start_us, end_us - start_us,
                       traced_step_, -1, -1, 0});
}

Status StepObserver::end_step(std::int64_t step, bool logged, double loss, std::int64_t tokens) {
  if (traced_step_ != 0) {
    {
      auto t = time(StepPart::trace, "trace: the executor's spans");
      if (auto s = ex_.finish_trace(); !s) return s;
    }
    ex_.trace_ops(nullptr);
    const double step_ms = ms_since(step_start_);
    trace_.add(TraceSpan{"step " + std::to_string(step), "step", TraceTrack::host, step_start_us_,
                         StepTrace::now_us() - step_start_us_, step, -1, -1, 0});
    // a vector, not a copy of the array: g++ 12 at -O3 with the sanitizers sees std::sort of a
    // std::array prefix reading past it (-Warray-bounds, a false positive, an error here)
    const std::size_t n = std::min(recent_count_, recent_ms_.size());
    std::vector<double> recent(recent_ms_.begin(),
                               recent_ms_.begin() + static_cast<std::ptrdiff_t>(n));
    double reference = 0;
    if (n > 0) {
      std::sort(recent.begin(), recent.end());
      reference = n % 2 ? recent[n / 2] : (recent[n / 2 - 1] + recent[n / 2]) / 2;
    }
    meta_.steps.push_back(step);
    meta_.traced_step_ms.push_back(step_ms);
    meta_.untraced_reference_ms.push_back(reference);
    if (ex_.world_size() > 1) {
      auto t = time(StepPart::trace, "trace: clock sync");
      for (int k = 0; k < clock_syncs_; ++k) {
        double zero[1] = {0};
        if (auto s = ex_.sum_over_ranks(zero, "trace clock sync"); !s) return s;
        trace_.add_clock_sync({step, k, StepTrace::now_us()});
      }
    }
    traced_step_ = 0;
    if (step == trace_.last_step()) {
      auto t = time(StepPart::trace, "trace: write");
      if (auto s = write_trace(); !s) return s;
    }
  } else {
    recent_ms_[recent_count_++ % recent_ms_.size()] = ms_since(step_start_);
  }
  ++interval_steps_;
  if (logged) return write_line(step, interval_steps_, loss, tokens);
  return ok_status();
}

Status StepObserver::finish(std::int64_t step) {
  if (!trace_written_ && !trace_.spans().empty())
    if (auto s = write_trace(); !s) return s;
  if (!metrics_.is_open()) return ok_status();
  return write_line(step, interval_steps_, std::nan(""),
                    static_cast<std::int64_t>(tokens_per_step_));
}

Status StepObserver::write_line(std::int64_t step, std::int64_t steps, double loss,
                                std::int64_t tokens) {
  const double wall = ms_since(interval_start_);
  auto split = ex_.step_time_split();
  if (!split) return split.error();
  interval_start_ = Clock::now();
  std::array<double, kStepParts> parts = parts_ms_;
  parts_ms_ = {};
  interval_steps_ = 0;
  if (!metrics_.is_open()) return ok_status();
  auto part = [&](StepPart p) { return parts[static_cast<std::size_t>(p)]; };
  double data = part(StepPart::data), checkpoint = part(StepPart::checkpoint),
         idle = part(StepPart::idle);
  const double trace = part(StepPart::trace), validation = part(StepPart::validation);
  if (ex_.runs_ahead()) {
    // The host only enqueues: its data input and checkpoint writes cost the step only where the
    // device waited for them, so the device's idle time is given to them first, the rest is idle.
    const double device_idle =
        std::max(0.0, wall - split->compute_ms - split->comm_exposed_ms - trace - validation);
    data = std::min(data, device_idle);
    checkpoint = std::min(checkpoint, device_idle - data);
    idle = device_idle - data - checkpoint;
  }
  const double now_s = StepTrace::now_us() / 1e6;
  metrics_ << fmt(
      "{\"step\":%lld,\"steps\":%lld,\"t_unix\":%.3f,\"wall_ms\":%.4f,\"tokens\":%lld,"
      "\"compute_ms\":%.4f,\"comm_exposed_ms\":%.4f,\"data_ms\":%.4f,\"checkpoint_ms\":%.4f,"
      "\"idle_ms\":%.4f,\"trace_ms\":%.4f,\"validation_ms\":%.4f,\"comm_busy_ms\":%.4f,"
      "\"comm_bytes\":%zu,\"comm_calls\":%zu",
      static_cast<long long>(step), static_cast<long long>(steps), now_s, wall,
      static_cast<long long>(steps * tokens), split->compute_ms, split->comm_exposed_ms, data,
      checkpoint, idle, trace, validation, split->comm_busy_ms, split->comm_bytes,
      split->comm_calls);
  if (std::isfinite(loss)) metrics_ << fmt(",\"loss\":%.9g", loss);
  if (skipped_steps_ > 0)
    metrics_ << fmt(",\"skipped_steps\":%lld", static_cast<long long>(skipped_steps_));
  metrics_ << "}\n" << std::flush;
  return ok_status();
}

Status StepObserver::write_trace() {
  trace_written_ = true;
  meta_.record_ns_per_span = measure_record_ns();
  const auto t0 = Clock::now();
  const std::string json = trace_.to_json(meta_);
  meta_.render_ms = ms_since(t0);
  const std::string text = trace_.to_json(meta_);
  std::ofstream f(trace_path_, std::ios::trunc);
  f << text;
  f.close();
  if (!f)
    return make_error(
        fmt("%s: cannot write the step trace (%s)", trace_path_.c_str(), jobspec::env::kTraceFile),
        1);
  std::string figures;
  for (std::size_t i = 0; i < meta_.steps.size(); ++i) {
    const double ref = meta_.untraced_reference_ms[i], ms = meta_.traced_step_ms[i];
    figures +=
        fmt("%sstep %lld %.2f ms", i ? ", " : "", static_cast<long long>(meta_.steps[i]), ms);
    if (ref > 0)
      figures += fmt(" (%+.1f%% against %.2f ms untraced)", 100.0 * (ms - ref) / ref, ref);
  }
  out_ << fmt("trace: rank %d wrote %zu spans of %zu step(s) to %s in %.1f ms; %s; %.0f ns per "
              "span recorded\n",
              ex_.rank(), trace_.spans().size(), meta_.steps.size(), trace_path_.c_str(),
              ms_since(t0), figures.c_str(), meta_.record_ns_per_span)
       << std::flush;
  return ok_status();
}

}  // namespace topolaunch::kernels
