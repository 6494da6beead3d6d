// Running a job: the agent that starts, binds and supervises the workers of one node, and
// `topolaunch run`, which drives it (in-process outside Slurm; one agent per node via srun
// inside an allocation).
//
// Exit status of run_job(): 0 every worker exited 0; 1 the job failed (restarts used up);
// 2 bad input (config, topology, job dir, worker program, store port), nothing was left running;
// 3 stopped for requeue (SIGUSR1 forwarded, workers checkpointed and exited; an sbatch script
// can `scontrol requeue`); 128+N stopped by signal N (SIGINT, SIGTERM, SIGHUP).
//
// Supervision, per attempt: workers are process-group leaders with PR_SET_PDEATHSIG; the agent is
// a child subreaper. A worker that exits non-zero, is killed, stops heart-beating within
// [job].heartbeat_timeout, or goes over [budget].memory (its process tree's memory from /proc) or
// [budget].gpu_memory (NVML, dlopened; see memory_watch.hpp) fails the attempt: every
// worker group gets SIGTERM, then SIGKILL after min(stop_grace, 2s); then the job restarts up to
// [job].restarts times (TORCHELASTIC_RESTART_COUNT counts). SIGINT/SIGTERM/SIGHUP are forwarded,
// with SIGKILL after stop_grace; SIGUSR1 is forwarded and the agent waits up to stop_grace for the
// workers to exit.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::launcher {

// What the [rdma] preflight stage did on this node.
struct PreflightStageOutcome {
  bool ok = true;
  int exit_code = 0;  // when !ok: 2 bad input (a NIC named that does not exist), 1 the fabric
  std::string line;   // one line: what was checked and how it went, or why nothing was
  std::string jsonl;  // the stages' JSON lines (empty when nothing ran)
};

// The [rdma] preflight stage: once per job, after the rank map, before any worker starts. The
// `topolaunch` program provides it (it links the rdma module; this library, which the SPANK
// plugin links too, does not). Collective over `store` (the agents' store under Slurm); null
// `store` = this node alone, and `scratch_dir` (an existing, empty folder) may hold a local one.
using PreflightStage =
    std::function<PreflightStageOutcome(const jobspec::JobConfig& config, const std::string& node,
                                        wireup::KvStore* store, const std::string& scratch_dir)>;

struct RunOptions {
  std::string config_path;
  std::string topology_path;                  // hwloc XML / NodeTopology JSON instead of live
  std::vector<std::string> command_override;  // replaces [worker].command when not empty
  std::string job_dir_override;
  bool quiet = false;       // no merged worker output on the terminal (logs still written)
  bool print_json = false;  // print the JSON report instead of the human summary
  bool local = false;       // inside a multi-node allocation, still run only on this node
  bool resume = false;      // a job dir that holds an earlier run: continue there (job.hpp)
  // An agent's: the digest of the config `run` read and probed (jobspec::load_job_config); the
  // same bytes here need no probe of their own.
  std::string probed_config_digest;
  PreflightStage preflight;  // empty: no [rdma] preflight stage (the report says so)
};

// Inside a Slurm allocation of several nodes, `run` hosts the workers' TCP store on this node
// (and the agents' one when they use TCP, see agent_wireup.hpp) and starts one agent per node with
//   srun --ntasks-per-node=1 --kill-on-bad-exit=1 --mpi=<pmix|pmi2|none> topolaunch agent ...
// passing the stores' addresses and the per-job secret in the environment
// (TOPOLAUNCH_AGENT_STORE, TOPOLAUNCH_WORKER_STORE, TOPOLAUNCH_STORE_SECRET,
// TOPOLAUNCH_MASTER_PORT). Agents exchange NodeTopology JSON through the [wireup].backend store,
// all compute the same rank map, run the [rdma] preflight (attempt 0), run one attempt of their
// node's ranks and write <job_dir>/attempt-N/node-<id>.json; `run` merges those into the report
// and restarts the step.
struct AgentOptions {
  RunOptions run;  // config, topology (may contain %n for the Slurm node name), job dir, command
  std::string run_id;
  int attempt = 0;
};
int run_agent(const AgentOptions& options);

// Prints one-line errors, the merged worker output and the summary; returns the exit status.
int run_job(const RunOptions& options);

}  // namespace topolaunch::launcher
