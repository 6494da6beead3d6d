// The environment of one worker: a pure function of the rank map entry and the job's facts, so it
// is unit-tested without starting anything. The names are the worker contract's
// (jobspec/worker_contract.hpp: torchrun's, then the map's own, then TOPOLAUNCH_*).
// Precedence: inherited < [worker].env < the map's env < the contract's names set here (which
// always win). Budgets are not exported: the built-in worker reads [budget] from the job file
// (TOPOLAUNCH_CONFIG) and the agent enforces the memory budgets itself. Under Slurm (SLURM_JOB_ID
// inherited) SLURM_PROCID/LOCALID/NTASKS/NPROCS/NODEID describe the worker's rank, not the agent.
#pragma once

#include <string>

#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/topology/rankmap.hpp"

namespace topolaunch::launcher {

struct JobFacts {
  std::string run_id;
  int attempt = 0;          // = TORCHELASTIC_RESTART_COUNT
  std::string master_addr;  // for the workers' own TCPStore (torch), node 0's address
  int master_port = 0;
  std::string store_address;  // our TCP store, host:port
  std::string store_secret;
  std::string rankmap_file;
  std::string config_file;        // absolute
  std::string job_dir;            // absolute
  std::string checkpoint_dir;     // absolute
  std::string heartbeat_file;     // of this rank
  std::string error_file;         // of this rank and attempt (TORCHELASTIC_ERROR_FILE)
  std::string trace_file;         // of this rank and attempt (TOPOLAUNCH_TRACE_FILE)
  std::string step_metrics_file;  // of this rank and attempt (TOPOLAUNCH_STEP_METRICS_FILE)
  // A path that never exists, for OMPI_MCA_ess_singleton_server when WORLD_SIZE > 1 ("" = none).
  std::string mpi_singleton_guard;
};

Environment worker_environment(const Environment& inherited, const jobspec::JobConfig& config,
                               const topology::RankMap& map, int rank, const JobFacts& facts);

}  // namespace topolaunch::launcher
