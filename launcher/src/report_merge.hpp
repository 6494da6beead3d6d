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
  std::optional<RootCause> root_cause;  // the earliest of the failed agents' first failures
  std::string agent_outcome;            // "requeue" or "stopped": Slurm signalled an agent itself
  int preflight_exit = 0;  // an agent's [rdma] preflight stopped the job: 2 bad input, 1 fabric
};

// agent_reports: in node order, nullopt where a node left none (or none that parses). Sets what
// belongs to the job in `report`: agent_wireup (while it is empty), and preflight (node 0's line
// in attempt 0; the failed stage's line when a preflight stopped the job).
MergedAttempt merge_agent_reports(int attempt,
                                  const std::vector<std::optional<JobReport>>& agent_reports,
                                  JobReport& report);

// The exit status of `topolaunch run` and of an agent for an attempt's outcome: 0 succeeded,
// 3 requeue, 128+N stopped by signal N (SIGTERM when unknown), 1 failed.
int exit_code_of(const std::string& outcome, int stop_signal);

}  // namespace topolaunch::launcher
