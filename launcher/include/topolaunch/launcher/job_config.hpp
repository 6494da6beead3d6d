// The job config: a TOML file read once into plain data. Every error names file:line:column and
// the dotted key, e.g.
//   job.toml:12:9: budget.memory: "16GB" is not a size (use binary units, e.g. "16GiB")
//   job.toml:3:1: job.restart: unknown key (did you mean "restarts"?)
// Tables: [job] [mapping] [budget] [rdma] [wireup] [worker], and the built-in worker's own
// tables [model] [data] [train], which are passed through untouched (the worker reads the config
// file itself, from TOPOLAUNCH_CONFIG; their TOML text is kept here too).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "topolaunch/common/isolated.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/mapping_spec.hpp"

namespace topolaunch::launcher {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// [job]
struct JobSection {
  std::string name = "job";           // [A-Za-z0-9._-]+, used in the job dir and run id
  int nodes = 0;                      // 0 = every node of the allocation (1 outside Slurm)
  int ranks_per_node = 0;             // 0 = derive from the GPUs (or 1 per core set on CPU hosts)
  int restarts = 0;                   // whole-job restarts after a failure (0..1000)
  milliseconds heartbeat_timeout{0};  // 0 = off; otherwise a worker must beat within it
  milliseconds stop_grace{10'000};    // SIGTERM/SIGUSR1 -> SIGKILL of the process groups
  std::string job_dir;                // "" = ./topolaunch-jobs/<name>-<run id>
  std::string checkpoint_dir;         // "" = <job_dir>/checkpoints
};

// [budget]: 0 means "no budget".
struct BudgetSection {
  std::uint64_t memory_bytes_per_rank = 0;      // host RSS, enforced by the agent
  std::uint64_t gpu_memory_bytes_per_rank = 0;  // planned by the worker, watched via NVML
  std::uint64_t comm_bytes_per_step = 0;
  microseconds comm_exposed_time_per_step{0};
};

enum class PreflightMode { off, quick, full };
enum class GpuDirectPolicy { automatic, require, off };  // "auto" | "require" | "off"

// [rdma]
struct RdmaSection {
  std::string nics_text;  // NCCL_IB_HCA syntax as written ("" = all compute NICs)
  topology::NicFilter nics;
  PreflightMode preflight = PreflightMode::quick;
  GpuDirectPolicy gpudirect = GpuDirectPolicy::automatic;
  double min_bandwidth_gbps = 0.0;  // preflight fails a NIC pair below this (0 = no check)
  microseconds max_latency{0};      // preflight fails a NIC pair above this (0 = no check)
  milliseconds preflight_timeout{60'000};
};

enum class WireupBackend { automatic, tcp, pmix, pmi2 };

// [wireup]
struct WireupSection {
  WireupBackend backend = WireupBackend::automatic;
  int port = 0;                   // TCP store port on node 0; 0 = any free port
  milliseconds timeout{120'000};  // how long agents/workers wait in fence/get
};

// [worker]
struct WorkerSection {
  std::vector<std::string> command{"topolaunch-worker"};  // argv; argv[0] searched in PATH
  std::map<std::string, std::string> env;                 // extra environment, per rank the same
};

struct JobConfig {
  std::string path;  // the file it came from (also TOPOLAUNCH_CONFIG)
  JobSection job;
  topology::MappingSpec mapping;
  BudgetSection budget;
  RdmaSection rdma;
  WireupSection wireup;
  WorkerSection worker;
  // The worker's own tables, re-serialised TOML text ("" when absent). Not validated here.
  std::string model_toml;
  std::string data_toml;
  std::string train_toml;
};

// Parses and validates. Errors: exit_code 2, message "<path>:<line>:<col>: <key>: <what>".
Result<JobConfig> parse_job_config(std::string_view toml_text, const std::string& path);
// The same, first run as a crash probe in an isolated child (common/isolated.hpp): a defect of the
// TOML library that the guard does not know yet becomes one error line, not a dead process.
Result<JobConfig> parse_job_config_isolated(std::string_view toml_text, const std::string& path,
                                            const IsolationLimits& limits = {});
// Reads `path` and parses it isolated.
Result<JobConfig> load_job_config(const std::string& path);

std::string_view to_string(PreflightMode mode);
std::string_view to_string(GpuDirectPolicy policy);
std::string_view to_string(WireupBackend backend);

// A short human summary of the effective config (what `topolaunch check` prints).
std::string describe(const JobConfig& config);

}  // namespace topolaunch::launcher
