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

#include "containment.hpp"
#include "metrics_server.hpp"
#include "topolaunch/common/env.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/launcher/agent.hpp"
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
  jobspec::JobConfig config;
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
  // The program is topolaunch-worker, which beats before its first step: its heartbeat watch is
  // armed from the start (any other program's at its first beat).
  bool builtin_worker = false;
  topology::CpuSet cpus_here;
  Environment inherited;
  Clock::time_point job_start;
  bool terminal = false;
  std::shared_ptr<NvmlMemoryWatch> gpu_watch;  // null: GPU memory is not watched
  // What holds the workers and everything they start (containment.hpp); null: nothing beyond
  // process groups (tests that run an attempt alone).
  std::shared_ptr<const Containment> containment;
  std::shared_ptr<MetricsServer> metrics;  // [observe] metrics_port; null: off
  // An agent's start, step by step: when it reached each step and the CPU it had used by then
  // (NodeUsage::start_marks_unix_s and start_marks_cpu_s); the attempt adds "workers_started".
  struct StartMark {
    std::string name;
    double unix_s = 0;
    double cpu_s = 0;
  };
  std::vector<StartMark> start_marks;
};

// The root cause's phase when an MPI program was started without an MPI launcher (its MPI_Init
// refused by the singleton guard): bad input, not restarted.
inline constexpr const char* kMpiWithoutLauncherPhase = "mpi-without-launcher";

// Reads the config, resolves the program, creates the job and checkpoint dirs, and draws the
// run id (when run_id is "": <name>-<SLURM_JOB_ID>, or <name>-<UTC time>-<random>) and the
// per-job secret. When run_id is "" (`run`, not an agent) the job dir is claimed: one that holds
// an earlier run (its report.json or an attempt-N/) is refused (exit 2) unless options.resume or
// the earlier run has the same run id (Slurm requeued this job); then the earlier run's files
// move to <job_dir>/earlier/<n>/.
Result<Job> prepare_job(const RunOptions& options, const std::string& run_id);

// The import cache for topology files (topolaunch/topology/import_cache.hpp) of the user that
// runs topolaunch: $TOPOLAUNCH_TOPOLOGY_CACHE (a directory, or "off"), else
// $XDG_CACHE_HOME/topolaunch/topology-cache, else ~/.cache/topolaunch/topology-cache.
inline constexpr const char* kTopologyCacheVariable = "TOPOLAUNCH_TOPOLOGY_CACHE";
struct TopologyCacheDir {
  std::string path;               // empty: no cache
  bool explicit_setting = false;  // named in the environment: an unusable one is said
};
TopologyCacheDir topology_cache_dir();

// A topology file (hwloc XML or topology JSON) through that cache: its import read back when
// the file's bytes were imported before (0.8 ms of CPU against 4.3 ms for a DGX XML's import);
// without a usable cache, the file loaded directly. Errors name the file, as a direct load's do.
Result<topology::NodeTopology> load_topology_file_cached(const std::string& path,
                                                         const topology::DiscoverOptions& options,
                                                         std::string_view nics_text,
                                                         const TopologyCacheDir& cache);

// This node's NodeInput for the rank map: options.topology_path ("%n" = node_name) or the live
// topology, and this process's allocation.
Result<topology::NodeInput> local_node_input(const RunOptions& options,
                                             const jobspec::JobConfig& config,
                                             const std::string& node_name);

// Computes job.map from every node's input and finds this node in it; the map file is written
// when write_map_file (by one agent of the job).
Status set_map(Job& job, const std::vector<topology::NodeInput>& nodes, bool write_map_file);

// prepare_job, then the map of this node alone (standalone `run`, and `run --local`).
Result<Job> prepare(const RunOptions& options);

// Opens job.containment (before any thread starts: it forks the watchdog) and prints its line
// when it cannot hold every process of the job; `who`: the prefix of that line.
void contain(Job& job, const std::string& who);

// NVML once per job; without it the job runs unwatched, and the log says so once.
void open_gpu_watch(Job& job);

// [observe] metrics_port: this node's endpoint, before any worker starts. A port that is not
// free is bad input naming where metrics_port was written (exit 2).
Status start_metrics_server(Job& job);

// At the job's end, before report.json is written: the cost (report.cost) and the traced steps'
// ranks merged into <job_dir>/trace.json (report.trace says where, and the clocks' skew).
void finish_observation(const Job& job, JobReport& report);

// The [rdma] preflight stage of this node (attempt 0 only); store: the agents' store, null for
// this node alone.
PreflightStageOutcome preflight_stage(const Job& job, wireup::KvStore* store);
RootCause preflight_root_cause(const Job& job, int attempt, const PreflightStageOutcome& outcome);

double unix_now_s();
// CPU seconds (user + system) this process and its reaped children have used so far.
double process_cpu_s();
double seconds_between(Clock::time_point a, Clock::time_point b);
// Writes `text` whole or not at all (a temporary file renamed over `path`); an error names the
// file and errno's text ("cannot write .../report.json: No space left on device").
Status write_file(const fs::path& path, std::string_view text);
// Writes <job_dir>/report.json; prints the report on stdout with --json, else the summary when
// summary_wanted. A report that cannot be written is said in one line, and the summary then
// says so instead of pointing to it.
void publish_report(const Job& job, const JobReport& report, bool summary_wanted);
int free_port();
// A Slurm count: `name`, else `fallback_name`, else 1; a malformed one is an error naming it.
Result<int> env_count(const char* name, const char* fallback_name);

}  // namespace topolaunch::launcher
