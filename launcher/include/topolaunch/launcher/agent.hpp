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
// [job].heartbeat_timeout, or goes over [budget].memory (RSS from /proc) fails the attempt: every
// worker group gets SIGTERM, then SIGKILL after min(stop_grace, 2s); then the job restarts up to
// [job].restarts times (TORCHELASTIC_RESTART_COUNT counts). SIGINT/SIGTERM/SIGHUP are forwarded,
// with SIGKILL after stop_grace; SIGUSR1 is forwarded and the agent waits up to stop_grace for the
// workers to exit.
#pragma once

#include <string>
#include <vector>

namespace topolaunch::launcher {

struct RunOptions {
  std::string config_path;
  std::string topology_path;                  // hwloc XML / NodeTopology JSON instead of live
  std::vector<std::string> command_override;  // replaces [worker].command when not empty
  std::string job_dir_override;
  bool quiet = false;       // no merged worker output on the terminal (logs still written)
  bool print_json = false;  // print the JSON report instead of the human summary
  bool local = false;       // inside a multi-node allocation, still run only on this node
};

// Inside a Slurm allocation of several nodes, `run` hosts two TCP stores (agents', workers') on
// this node and starts one agent per node with
//   srun --ntasks-per-node=1 --kill-on-bad-exit=1 topolaunch agent CONFIG --attempt N ...
// passing the stores' addresses and the per-job secret in the environment
// (TOPOLAUNCH_AGENT_STORE, TOPOLAUNCH_WORKER_STORE, TOPOLAUNCH_STORE_SECRET,
// TOPOLAUNCH_MASTER_PORT). Agents exchange NodeTopology JSON through their store, all compute
// the same rank map, run one attempt of their node's ranks and write
// <job_dir>/attempt-N/node-<id>.json; `run` merges those into the report and restarts the step.
struct AgentOptions {
  RunOptions run;  // config, topology (may contain %n for the Slurm node name), job dir, command
  std::string run_id;
  int attempt = 0;
};
int run_agent(const AgentOptions& options);

// Prints one-line errors, the merged worker output and the summary; returns the exit status.
int run_job(const RunOptions& options);

}  // namespace topolaunch::launcher
