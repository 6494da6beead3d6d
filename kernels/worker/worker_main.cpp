// topolaunch-worker: the built-in training worker. Thin shell over run_worker (worker.hpp).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include <string>
#include <vector>
#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"

#include "topolaunch/kernels/commands.hpp"
#include "topolaunch/kernels/executor.hpp"
#include "topolaunch/kernels/worker.hpp"

namespace {

constexpr const char* kUsage =
    "usage: topolaunch-worker [--plan-only] [--ops] [--set table.key=value]... [job.toml]\n"
    "       topolaunch-worker data prepare ... | sample CHECKPOINT ... | export CHECKPOINT ...\n"
    "  data prepare: a tokenizer and token files from a corpus; sample: text from a checkpoint;\n"
    "  export: a checkpoint as safetensors for Hugging Face / PyTorch (each with -h: its usage)\n"
    "  job.toml defaults to $TOPOLAUNCH_CONFIG. Trains [model] on [data] as [train] and\n"
    "  [budget] say (the whole file is checked, as `topolaunch check` does).\n"
    "  --plan-only  print the compiled plan (ops with --ops, arena layout, recompute, buckets,\n"
    "               budget vs planned) and exit without allocating the arena\n"
    "  --set        override a config value, e.g. --set train.steps=10\n"
    "  data parallel: WORLD_SIZE, RANK, LOCAL_RANK (or TOPOLAUNCH_*), MASTER_ADDR, MASTER_PORT\n"
    "               (ring on MASTER_PORT+1+rank); a malformed one is refused (exit 2)\n"
    "  checkpoints: TOPOLAUNCH_CHECKPOINT_DIR or train.checkpoint_dir\n"
    "exit status: 0 done, 1 runtime failure, 2 bad input, 4 a peer rank failed (the cause is\n"
    "             that rank), 75 checkpointed on SIGUSR1 (requeue), 143 checkpointed on SIGTERM\n";

}  // namespace

int main(int argc, char** argv) {
  // libgomp reads OMP_WAIT_POLICY when it is loaded, before main. Its default (spin) makes every
  // parallel region crawl when ranks share cores (several workers per node, or a busy CI box:
  // measured 25x slower steps), so default to passive waiting by re-executing once with it set.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "passive", 1);
    ::execv("/proc/self/exe", argv);  // on failure, carry on with the spinning default
  }
  namespace k = topolaunch::kernels;
  // The commands beside training: data prepare, sample, export.
  if (argc >= 2) {
    const std::string command = argv[1];
    const bool prepare = command == "data" && argc >= 3 && std::strcmp(argv[2], "prepare") == 0;
    if (prepare || command == "sample" || command == "export") {
      std::vector<std::string> args(argv + (prepare ? 3 : 2), argv + argc);
      const char* usage = prepare               ? k::kDataPrepareUsage
                          : command == "sample" ? k::kSampleUsage
                                                : k::kExportUsage;
      for (const auto& a : args)
        if (a == "-h" || a == "--help") {
          std::cout << usage;
          return 0;
        }
      if (prepare) return k::run_data_prepare(args, std::cout, std::cerr);
      if (command == "sample")
        return k::run_sample(args, k::linked_cuda_decoder(), std::cout, std::cerr);
      return k::run_export(args, std::cout, std::cerr);
    }
    if (command == "data") {
      std::cerr << "topolaunch-worker: data: unknown command (data prepare)\n" << kUsage;
      return topolaunch::jobspec::exit_status::kBadInput;
    }
  }
  topolaunch::kernels::WorkerOptions o;
  // train.precision = "bf16": the CUDA executor when the build linked it (-Dcuda=enabled)
  o.bf16_executor = topolaunch::kernels::linked_cuda_executor();
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
      return topolaunch::jobspec::exit_status::kBadInput;
    } else if (o.config_path.empty()) {
      o.config_path = a;
    } else {
      std::cerr << "topolaunch-worker: more than one job file (" << o.config_path << ", " << a
                << ")\n";
      return topolaunch::jobspec::exit_status::kBadInput;
    }
  }
  if (o.config_path.empty())
    o.config_path = topolaunch::env_value(topolaunch::jobspec::env::kConfig).value_or("");
  return topolaunch::kernels::run_worker(o, std::cout, std::cerr);
}
