// The training worker behind `topolaunch-worker`: config -> data -> graph -> plan -> train.
//
// Exit status (the launcher's requeue logic depends on these):
//   0   finished train.steps
//   1   runtime failure (I/O, a peer rank died)
//   2   bad input: config, data, checkpoint (truncated, corrupt, another model), budget refused
//   75  stopped by SIGUSR1: a checkpoint was written at the step boundary; requeue and resume
//   143 stopped by SIGTERM: a checkpoint was written at the step boundary
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace topolaunch::kernels {

inline constexpr int kExitRequeue = 75;  // EX_TEMPFAIL
inline constexpr int kExitTerminated = 143;

struct WorkerConfig;
struct TrainSpec;
struct Plan;
struct Dataset;

// The training loop of another backend (the CUDA one, kernels/cuda/cuda_worker.hpp), handed in by
// the executable when it is built with it, so this library needs no CUDA. Returns the exit status.
using GpuTrainer = int (*)(const WorkerConfig& config, const Plan& plan, const Dataset& data,
                           std::ostream& out, std::ostream& err);

struct WorkerOptions {
  std::string config_path;             // argv or TOPOLAUNCH_CONFIG
  std::vector<std::string> overrides;  // --set table.key=value
  bool plan_only = false;
  bool list_ops = false;
  GpuTrainer gpu_trainer = nullptr;  // runs train.precision = "bf16"; null: refused (exit 2)
};

int run_worker(const WorkerOptions& options, std::ostream& out, std::ostream& err);

// The learning-rate schedule of train.*: linear warm-up, then cosine decay to min_lr_fraction.
double scheduled_learning_rate(const TrainSpec& train, std::int64_t step);

}  // namespace topolaunch::kernels
