// Private to the launcher: one attempt of a Slurm step, merged from the reports its agents wrote
// (<job_dir>/attempt-N/node-<i>.json), and the exit status an attempt's outcome stands for.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topolaunch/launcher/report.hpp"

namespace topolaunch::launcher {

struct MergedAttempt {
  AttemptReport attempt;  // every agent's ranks, by rank, and the latest all_started_s
  // The earliest of the failed agents' first failures, a rank that exited kPeerFailed (a
  // consequence: its peer died) only when no other agent failed otherwise.
  std::optional<RootCause> root_cause;
  bool root_cause_is_consequence = false;  // root_cause is such a kPeerFailed rank
  std::vector<int> silent_agents;          // the agents (node-<i>.json) that left no report
  // "requeue" or "stopped": Slurm signalled an agent itself ("requeue" when any agent requeued)
  std::string agent_outcome;
  int preflight_exit = 0;     // an agent's [rdma] preflight stopped the job: 2 bad input, 1 fabric
};

// agent_reports: in node order, nullopt where a node left none (or none that parses). Sets what
// belongs to the job in `report`: agent_wireup (while it is empty), and preflight (node 0's line
// in attempt 0; the failed stage's line when a preflight stopped the job).
MergedAttempt merge_agent_reports(int attempt,
                                  const std::vector<std::optional<JobReport>>& agent_reports,
                                  JobReport& report);

// The outcome of a step's attempt: `requested`, what `run` itself was asked by a signal ("",
// "requeue", "stopped"); else "requeue" when an agent's ranks stopped for one (that agent exited
// 0, so srun's status cannot show it); else "succeeded" when srun exited 0; else "failed" when an
// agent reported a failure; else the outcome of an agent Slurm stopped; else "failed".
std::string step_outcome(const std::string& requested, bool srun_ok, const MergedAttempt& step);

// The root cause of a failed step in which some agents left no report while others did, and
// what the others report is at most a consequence (a peer died, the step's teardown): those
// agents ended without a word, and their ranks with them. `waited` (srun was stopped after the
// others had reported: it still waited for those agents' tasks) says their node is lost, with
// its slurmd and slurmstepd (phase "node-lost"); else the agent died and srun saw it (killed,
// phase "agent-lost"). The cause names the nodes whose ranks no report has, from the step's
// rank map (rankmap_json, <job_dir>/rankmap.json; "" when there is none: then the agents are
// named); srun_end says how srun ended. nullopt when the step is not such a case.
std::optional<RootCause> silent_agents_cause(const MergedAttempt& step, std::size_t agents,
                                             const std::string& rankmap_json,
                                             const std::string& srun_end, bool waited);

// The exit status of `topolaunch run` for an attempt's outcome: 0 succeeded, 3 requeue, 128+N
// stopped by signal N (SIGTERM when unknown), 1 failed.
int exit_code_of(const std::string& outcome, int stop_signal);

// The exit status of `topolaunch agent`, as srun sees it: exit_code_of, except 0 for a requeue.
// srun --kill-on-bad-exit cancels the step at the first agent that exits non-zero, and the
// other nodes' ranks were still checkpointing (one in four runs of the slurm suite lost a node's
// checkpoint that way); the agent's report holds the requeue, `run` exits 3 for it.
int agent_exit_status(const std::string& outcome, int stop_signal);

}  // namespace topolaunch::launcher
