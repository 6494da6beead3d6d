// Private to the launcher: one job as this process runs it (its config, rank map, paths and
// secret), everything that can be refused before a worker starts, and the few helpers that
// `run`, the standalone loop and the agent share.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/launcher/agent.hpp"
#include "topolaunch/launcher/job_config.hpp"
#include "topolaunch/launcher/memory_watch.hpp"
#include "topolaunch/launcher/report.hpp"
#include "topolaunch/launcher/worker_env.hpp"
#include "topolaunch/topology/cpuset.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::launcher {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Job {
  JobConfig config;
  RunOptions options;
  topology::RankMap map;
  std::string node_name;
  int node_index = 0;                  // this agent's node in the map
  std::string external_store_address;  // "" = host a store per attempt here
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 = a free port per attempt
  std::string run_id;
  fs::path job_dir;
  fs::path checkpoint_dir;
  fs::path rankmap_file;
  std::string secret;
  std::string program;
  std::vector<std::string> argv;
  topology::CpuSet cpus_here;
  Environment inherited;
  Clock::time_point job_start;
  bool terminal = false;
  std::shared_ptr<NvmlMemoryWatch> gpu_watch;  // null: GPU memory is not watched
};

// Reads the config, resolves the program, creates the job and checkpoint dirs, and draws the
// run id (when run_id is "": <name>-<SLURM_JOB_ID>, or <name>-<UTC time>-<random>) and the
// per-job secret.
Result<Job> prepare_job(const RunOptions& options, const std::string& run_id);

// This node's NodeInput for the rank map: options.topology_path ("%n" = node_name) or the live
// topology, and this process's allocation.
Result<topology::NodeInput> local_node_input(const RunOptions& options, const JobConfig& config,
                                             const std::string& node_name);

// Computes job.map from every node's input and finds this node in it; the map file is written
// when write_map_file (by one agent of the job).
Status set_map(Job& job, const std::vector<topology::NodeInput>& nodes, bool write_map_file);

// prepare_job, then the map of this node alone (standalone `run`, and `run --local`).
Result<Job> prepare(const RunOptions& options);

// NVML once per job; without it the job runs unwatched, and the log says so once.
void open_gpu_watch(Job& job);

// The [rdma] preflight stage of this node (attempt 0 only); store: the agents' store, null for
// this node alone.
PreflightStageOutcome preflight_stage(const Job& job, wireup::KvStore* store);
RootCause preflight_root_cause(const Job& job, int attempt, const PreflightStageOutcome& outcome);

double unix_now_s();
double seconds_between(Clock::time_point a, Clock::time_point b);
Status write_file(const fs::path& path, std::string_view text);
int free_port();
int env_int(const char* name, int fallback);
std::string env_string(const char* name);

}  // namespace topolaunch::launcher
