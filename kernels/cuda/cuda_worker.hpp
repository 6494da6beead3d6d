// The bf16 training loop of topolaunch-worker on one GPU: the worker's plan run by the
// CudaExecutor (whole step as a CUDA Graph), the same data order, schedule and log lines as the
// CPU loop (worker.cpp). worker_main.cpp hands it to run_worker when built with -Dcuda=enabled.
#pragma once

#include <iosfwd>

#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/job.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace topolaunch::kernels::cuda {

// Exit status as run_worker's: 0 done, 1 runtime failure (CUDA, NCCL, a peer rank that died or
// stopped past the 2-minute deadline), 2 bad input (config, checkpoint of another model, torn or
// corrupt checkpoint), 75 SIGUSR1 / 143 SIGTERM: every rank finished the same step, rank 0 wrote
// the checkpoint (the CPU worker's file: checkpoint.hpp), so a requeued job resumes from it.
// With WORLD_SIZE > 1, rank 0 logs each logged step's gradient all-reduce (bytes, ms, exposed ms)
// against the plan and [budget] comm_per_step / comm_exposed_per_step.
int train_on_gpu(const WorkerConfig& config, const Plan& plan, const Dataset& data,
                 std::ostream& out, std::ostream& err);

}  // namespace topolaunch::kernels::cuda
