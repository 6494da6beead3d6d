// topolaunch-worker: the built-in training worker. Thin shell over run_worker (worker.hpp).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "topolaunch/kernels/worker.hpp"
#ifdef TOPOLAUNCH_WITH_CUDA
#include "cuda_worker.hpp"
#endif

namespace {

constexpr const char* kUsage =
    "usage: topolaunch-worker [--plan-only] [--ops] [--set table.key=value]... [job.toml]\n"
    "  job.toml defaults to $TOPOLAUNCH_CONFIG. Reads [model] [data] [train] [budget].\n"
    "  --plan-only  print the compiled plan (ops with --ops, arena layout, recompute, buckets,\n"
    "               budget vs planned) and exit without allocating the arena\n"
    "  --set        override a config value, e.g. --set train.steps=10\n"
    "  data parallel: WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT (ring on MASTER_PORT+1+rank)\n"
    "  checkpoints: TOPOLAUNCH_CHECKPOINT_DIR or train.checkpoint_dir\n"
    "exit status: 0 done, 1 runtime failure, 2 bad input, 75 checkpointed on SIGUSR1 (requeue),\n"
    "             143 checkpointed on SIGTERM\n";

}  // namespace

int main(int argc, char** argv) {
  // libgomp reads OMP_WAIT_POLICY when it is loaded, before main. Its default (spin) makes every
  // parallel region crawl when ranks share cores (several workers per node, or a busy CI box:
  // measured 25x slower steps), so default to passive waiting by re-executing once with it set.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "passive", 1);
    ::execv("/proc/self/exe", argv);  // on failure, carry on with the spinning default
  }
  topolaunch::kernels::WorkerOptions o;
#ifdef TOPOLAUNCH_WITH_CUDA
  o.gpu_trainer = &topolaunch::kernels::cuda::train_on_gpu;  // train.precision = "bf16"
#endif
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--plan-only") == 0) {
      o.plan_only = true;
    } else if (std::strcmp(a, "--ops") == 0) {
      o.list_ops = true;
    } else if (std::strcmp(a, "--set") == 0 && i + 1 < argc) {
      o.overrides.emplace_back(argv[++i]);
    } else if (std::strcmp(a, "-h") == 0 || std::strcmp(a, "--help") == 0) {
      std::cout << kUsage;
      return 0;
    } else if (a[0] == '-') {
      std::cerr << "topolaunch-worker: unknown option " << a << "\n" << kUsage;
      return 2;
    } else if (o.config_path.empty()) {
      o.config_path = a;
    } else {
      std::cerr << "topolaunch-worker: more than one job file (" << o.config_path << ", " << a
                << ")\n";
      return 2;
    }
  }
  if (o.config_path.empty())
    if (const char* env = std::getenv("TOPOLAUNCH_CONFIG")) o.config_path = env;
  return topolaunch::kernels::run_worker(o, std::cout, std::cerr);
}
