// Where a job's time, memory and money went (report.json's "cost", the summary's cost lines):
// what each rank's step figures add up to (the worker's TOPOLAUNCH_STEP_METRICS_FILE, read by the
// agent), what each node used (its allocation, and the energy NVML and RAPL measured), and the
// job's cost attributed from both. Pure functions of plain data, unit-tested
// (tests/unit/launcher/test_cost.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topolaunch/jobspec/job_config.hpp"

namespace topolaunch::launcher {

// A rank's step figures over one attempt: the plan line, then the intervals added up.
struct StepFigures {
  bool present = false;  // the worker wrote a plan line
  std::string backend;   // "cpu", "cuda"
  std::int64_t tokens_per_step = 0;
  double flops_per_step = 0;  // model FLOPs of one optimizer step of this rank (no recompute)
  // Device memory by role as planned (parameters, gradients, optimizer_state, communication,
  // activations, workspaces, inputs, planned_region, arena) and as allocated.
  std::map<std::string, std::uint64_t> planned_bytes;
  std::uint64_t arena_bytes = 0, outside_arena_bytes = 0;
  std::uint64_t device_used_bytes = 0, device_total_bytes = 0;
  std::string device;  // "NVIDIA H200", "" on the CPU
  std::uint64_t plan_comm_bytes_per_step = 0;
  double plan_comm_ms = 0, plan_exposed_ms = 0;

  std::int64_t steps = 0, last_step = 0, tokens = 0;
  double wall_ms = 0;  // the intervals' wall time: the measured step time
  double compute_ms = 0, comm_exposed_ms = 0, data_ms = 0, checkpoint_ms = 0, idle_ms = 0,
         trace_ms = 0, validation_ms = 0;
  double comm_busy_ms = 0;
  std::uint64_t comm_bytes = 0;
  std::optional<double> last_loss;
  // Optimizer steps the worker skipped for non-finite gradients in this attempt (the last line's
  // running count).
  std::int64_t skipped_steps = 0;
  double last_t_unix = 0;
  // The last interval alone (the live metrics): its steps, wall and tokens.
  std::int64_t last_steps = 0, last_tokens = 0;
  double last_wall_ms = 0;
  double last_parts_ms[7] = {};  // in the order of kStepPartNames
};

// The parts of a step in the order of StepFigures::last_parts_ms, as report.json and the
// metrics name them.
inline constexpr int kStepPartCount = 7;
inline constexpr std::string_view kStepPartNames[kStepPartCount] = {
    "compute", "comm_exposed", "data", "checkpoint", "idle", "trace", "validation"};

// Adds one line of the step-figures file; false (figures unchanged) when it is not one.
bool add_step_figures_line(StepFigures& figures, std::string_view line);

// One node of one attempt: the allocation's share the job held and the energy it used.
struct NodeUsage {
  int attempt = 0;
  std::string node;
  int gpus = 0;   // GPUs of this node's ranks
  int cores = 0;  // CPUs of the allocation here (TOPOLAUNCH_CPUS of the ranks, together)
  double wall_s = 0;
  std::vector<double> gpu_energy_j;    // per GPU of this node's ranks (NVML); empty: not measured
  std::string gpu_energy_note;         // why not, when not
  std::optional<double> cpu_energy_j;  // the CPU packages (RAPL)
  std::string cpu_energy_note;
  // Under Slurm, the first attempt only: when this node's agent finished each step of its start
  // ("config", "topology", "exchange", ..., and "workers_started" once every worker was spawned;
  // seconds since the epoch): where a launch's time goes.
  std::vector<std::pair<std::string, double>> start_marks_unix_s;
  // The agent's CPU seconds (user + system, itself and its reaped children) at each of those
  // marks: where a launch's CPU goes when nodes share cores.
  std::vector<std::pair<std::string, double>> start_marks_cpu_s;
};

// The job's cost, attributed.
struct CostReport {
  int gpus = 0, cores = 0;  // of the allocation, over the nodes
  double wall_s = 0;
  double gpu_hours = 0, core_hours = 0;
  std::optional<double> gpu_energy_j, cpu_energy_j;  // summed where measured
  struct GpuEnergy {
    std::string node;
    int gpu = 0;  // this node's i-th GPU of the job
    double joules = 0;
  };
  std::vector<GpuEnergy> per_gpu;  // summed over attempts
  std::vector<std::string> notes;  // what was not measured and why
  // The step time over every rank and attempt, and its parts (ms).
  double step_wall_ms = 0;
  std::map<std::string, double> step_parts_ms;
  std::int64_t tokens = 0;  // over the ranks and attempts
  double tokens_per_s = 0;
  std::optional<double> tokens_per_j;
  std::optional<double> mfu;  // model FLOPs / (the measured time x the ranks' peak)
  // Optimizer steps skipped for non-finite gradients, over the attempts (every rank skips the
  // same steps: the norm is global, so an attempt counts its ranks' largest count).
  std::int64_t skipped_steps = 0;
  double peak_flops_per_rank = 0;
  std::string peak_from;  // "observe.peak_tflops_per_rank", "NVIDIA H200 datasheet (bf16)"
  double gpu_hour_price = 0, core_hour_price = 0;
  std::optional<double> cost, cost_per_million_tokens;
};

// NVIDIA's dense bf16 peak for a GPU model named like NVML and CUDA name it ("NVIDIA H200"),
// in FLOP/s; 0 when unknown.
double datasheet_peak_flops(std::string_view device);

struct RankStepFigures {
  int attempt = 0, rank = 0;
  const StepFigures* figures = nullptr;
};

// The cost of a job from its ranks' figures and its nodes' usage (every attempt's), its wall time
// and the job file's [cost] and [observe] peak.
CostReport attribute_cost(const std::vector<RankStepFigures>& ranks,
                          const std::vector<NodeUsage>& nodes, double wall_s,
                          const jobspec::JobConfig& config);

}  // namespace topolaunch::launcher
