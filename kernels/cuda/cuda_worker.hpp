// The bf16 training loop of topolaunch-worker on one GPU: the worker's plan run by the
// CudaExecutor (whole step as a CUDA Graph), the same data order, schedule and log lines as the
// CPU loop (worker.cpp). worker_main.cpp hands it to run_worker when built with -Dcuda=enabled.
#pragma once

#include <iosfwd>

#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/job.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace topolaunch::kernels::cuda {

// Exit status as run_worker's: 0 done, 1 runtime failure (CUDA), 2 bad input.
int train_on_gpu(const WorkerConfig& config, const Plan& plan, const Dataset& data,
                 std::ostream& out, std::ostream& err);

}  // namespace topolaunch::kernels::cuda
