// The timeline of the traced steps of one rank ([observe] trace_steps) and what an executor
// reports of a step's time: the plain data the training loop and the executors share
// (executor.hpp). The loop's side, which times and writes them, is step_observer.hpp.
//
// A traced step's spans lie on three tracks: the host (data input, checkpoint writes, waits),
// the compute stream (each op or fused group of the plan) and the communication stream (each
// gradient bucket's all-reduce). Times are the wall clock (CLOCK_REALTIME, microseconds since the
// epoch) so that `topolaunch` can merge the ranks of several nodes into one trace; a GPU's spans
// come from CUDA events, placed on the host's clock at the step's end (cuda_executor.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace topolaunch::kernels {

enum class TraceTrack : int { host = 0, compute = 1, communication = 2 };

struct TraceSpan {
  std::string name;
  std::string category;  // "forward", "backward", "optimizer", "all-reduce", "data", "wait", ...
  TraceTrack track = TraceTrack::host;
  double start_us = 0, duration_us = 0;
  std::int64_t step = 0;
  int op = -1;      // index into the plan's op list (compute and communication tracks)
  int bucket = -1;  // the plan's gradient bucket (communication track)
  std::size_t bytes = 0;
};

// The instant every rank left one collective (the clock-sync all-reduces at a traced step's end):
// the same moment on every rank's clock, up to the collective's own jitter, so that the merge can
// align the clocks of different nodes.
struct ClockSyncPoint {
  std::int64_t step = 0;
  int index = 0;  // of the sync all-reduces of that step
  double t_us = 0;
};

// What a rank's trace file says about itself besides its spans (otherData of the trace JSON).
struct TraceMetadata {
  int rank = 0, world_size = 1;
  std::string node;     // the host name
  std::string backend;  // "cpu" or "cuda"
  std::size_t plan_ops = 0, plan_buckets = 0;
  // The tracing cost: each traced step's wall time against the median of the untraced steps just
  // before it, and the time spent making this file (after the last traced step, outside any step).
  std::vector<std::int64_t> steps;
  std::vector<double> traced_step_ms, untraced_reference_ms;
  double record_ns_per_span = 0;  // the clock reads and the append of one span, measured here
  double render_ms = 0;           // formatting this JSON (the write itself is in the rank's log)
};

// Spans of one rank's traced steps.
class StepTrace {
 public:
  explicit StepTrace(std::vector<std::int64_t> steps);  // ascending

  const std::vector<std::int64_t>& steps() const { return steps_; }
  bool traces(std::int64_t step) const;
  bool empty() const { return steps_.empty(); }
  std::int64_t last_step() const { return steps_.empty() ? 0 : steps_.back(); }

  // The wall clock, microseconds since the epoch.
  static double now_us();

  void add(TraceSpan span) { spans_.push_back(std::move(span)); }
  void add_clock_sync(const ClockSyncPoint& point) { sync_points_.push_back(point); }
  const std::vector<TraceSpan>& spans() const { return spans_; }
  const std::vector<ClockSyncPoint>& sync_points() const { return sync_points_; }

  // Chrome trace-event JSON (the JSON object format: traceEvents, displayTimeUnit, otherData),
  // one process (pid = rank) with a thread per track; opens in Perfetto and chrome://tracing.
  std::string to_json(const TraceMetadata& meta) const;

 private:
  std::vector<std::int64_t> steps_;
  std::vector<TraceSpan> spans_;
  std::vector<ClockSyncPoint> sync_points_;
};

// What an executor measured of the steps since its previous answer: the device's compute and the
// gradient all-reduces (their own time, and the part of it the step waited for).
struct StepTimeSplit {
  double compute_ms = 0;
  double comm_exposed_ms = 0;
  double comm_busy_ms = 0;
  std::size_t comm_bytes = 0;  // payload all-reduced (the buckets' sizes)
  std::size_t comm_calls = 0;
};

// Memory an executor allocated, for the report's planned vs measured by role: the arena holds
// every planned role at its planned offset; workspaces beside it are measured.
struct AllocatedMemory {
  std::size_t arena_bytes = 0;
  std::size_t outside_arena_bytes = 0;  // e.g. cuBLASLt's workspace, a separate cuDNN workspace
  std::size_t device_used_bytes = 0;    // the device's whole use now (0: not known)
  std::size_t device_total_bytes = 0;
  std::string device_name;  // "NVIDIA H200" ("" on the CPU)
};

}  // namespace topolaunch::kernels
