// Private to the launcher: `run` inside a multi-node Slurm allocation (see agent.hpp): the
// stores on this node, one agent per node through srun, the agents' reports merged into the
// job's, and restarts of the step.
#pragma once

#include "job.hpp"

namespace topolaunch::launcher {

// Runs the job on `nodes` nodes of the allocation; signal_fd: a SignalScope's. Returns the exit
// status of `topolaunch run` and writes <job_dir>/report.json.
int run_slurm(Job& job, int nodes, int signal_fd);

}  // namespace topolaunch::launcher
