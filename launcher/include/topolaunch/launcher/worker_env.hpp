// The environment of one worker: a pure function of the rank map entry and the job's facts, so it
// is unit-tested without starting anything. Names follow torchrun (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_*), then the map's own (CUDA_VISIBLE_DEVICES, NCCL_IB_HCA, UCX_NET_DEVICES, ...),
// then TOPOLAUNCH_*:
//   TOPOLAUNCH_RANK, TOPOLAUNCH_WORLD_SIZE, TOPOLAUNCH_LOCAL_RANK, TOPOLAUNCH_NODE_RANK,
//   TOPOLAUNCH_WIREUP=tcp, TOPOLAUNCH_STORE_ADDR (host:port), TOPOLAUNCH_STORE_SECRET,
//   TOPOLAUNCH_RANKMAP_FILE, TOPOLAUNCH_CONFIG, TOPOLAUNCH_JOB_DIR, TOPOLAUNCH_CHECKPOINT_DIR,
//   TOPOLAUNCH_HEARTBEAT_FILE, TOPOLAUNCH_ATTEMPT, TOPOLAUNCH_RUN_ID, TOPOLAUNCH_CPUS,
//   TOPOLAUNCH_NUMA_NODE, TOPOLAUNCH_MEMORY_BUDGET_BYTES, TOPOLAUNCH_GPU_MEMORY_BUDGET_BYTES,
//   TOPOLAUNCH_COMM_BUDGET_BYTES, TOPOLAUNCH_COMM_EXPOSED_BUDGET_US (budgets only when set).
// Precedence: inherited < [worker].env < the map's env < the names above (which always win).
#pragma once

#include <map>
#include <string>

#include "topolaunch/launcher/job_config.hpp"
#include "topolaunch/topology/rankmap.hpp"

namespace topolaunch::launcher {

using Environment = std::map<std::string, std::string>;

struct JobFacts {
  std::string run_id;
  int attempt = 0;          // = TORCHELASTIC_RESTART_COUNT
  std::string master_addr;  // for the workers' own TCPStore (torch), node 0's address
  int master_port = 0;
  std::string store_address;  // our TCP store, host:port
  std::string store_secret;
  std::string rankmap_file;
  std::string config_file;     // absolute
  std::string job_dir;         // absolute
  std::string checkpoint_dir;  // absolute
  std::string heartbeat_file;  // of this rank
};

Environment worker_environment(const Environment& inherited, const JobConfig& config,
                               const topology::RankMap& map, int rank, const JobFacts& facts);

}  // namespace topolaunch::launcher
