// The training worker behind `topolaunch-worker`: job file -> data -> graph -> plan -> train, the
// training loop run over the executor interface of executor.hpp.
//
// It reads the job file through jobspec (the launcher's reader: every table checked, --set
// overrides applied there) and its place in the job from the environment through the worker
// contract (jobspec/worker_contract.hpp), whose exit statuses it returns:
//   0   finished train.steps
//   1   runtime failure (I/O, a peer rank died)
//   2   bad input: job file, environment, data, checkpoint (truncated, corrupt, another model),
//       budget refused
//   75  stopped by SIGUSR1: a checkpoint was written at the step boundary; requeue and resume
//   143 stopped by SIGTERM: a checkpoint was written at the step boundary
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/kernels/executor.hpp"
#include "topolaunch/kernels/graph.hpp"

namespace topolaunch::kernels {

struct WorkerOptions {
  std::string config_path;             // argv or TOPOLAUNCH_CONFIG
  std::vector<std::string> overrides;  // --set table.key=value
  bool plan_only = false;
  bool list_ops = false;
  // The executor of each train.precision: "fp32" the CPU backend's; "bf16" the CUDA backend's
  // (topolaunch-worker passes linked_cuda_executor(); null: refused, exit 2).
  ExecutorFactory fp32_executor = &create_cpu_executor;
  ExecutorFactory bf16_executor = nullptr;
};

// The one training loop, over the executor of train.precision (executor.hpp).
int run_worker(const WorkerOptions& options, std::ostream& out, std::ostream& err);

// The job file's tables as the graph builders take them; `vocab` is the vocabulary in use (the
// data's when [model] vocab_size is absent).
GptConfig gpt_config(const jobspec::ModelSpec& model, const jobspec::TrainSpec& train,
                     std::int64_t vocab);
LlamaConfig llama_config(const jobspec::ModelSpec& model, const jobspec::TrainSpec& train,
                         std::int64_t vocab);
MlpConfig mlp_config(const jobspec::ModelSpec& model, const jobspec::TrainSpec& train,
                     std::int64_t vocab);

// The learning-rate schedule of train.*: linear warm-up, then cosine decay to min_lr_fraction.
double scheduled_learning_rate(const jobspec::TrainSpec& train, std::int64_t step);
// AdamW for optimizer step `step` (1-based): train.adamw with the scheduled learning rate (a
// learning_rate of 0 stays 0).
AdamWSettings adamw_at_step(const jobspec::TrainSpec& train, std::int64_t step);

// [budget] comm_exposed_per_step in the planner's unit.
double exposed_budget_ms(const jobspec::BudgetSection& budget);

}  // namespace topolaunch::kernels
