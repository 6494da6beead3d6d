// The RDMA preflight as `topolaunch preflight` and the `[rdma] preflight` stage of `topolaunch
// run` both do it: from the job's [rdma] table to rdma::plan_preflight + rdma::run_preflight.
// Private to the launcher.
#pragma once

#include <string>

#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/launcher/agent.hpp"
#include "topolaunch/rdma/preflight.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::launcher {

rdma::PreflightLevel preflight_level_of(jobspec::PreflightMode mode);

// The rdma module's plan input for this node from the job's [rdma] table.
rdma::PreflightPlanInput preflight_plan_input(const jobspec::RdmaSection& rdma,
                                              rdma::PreflightLevel level, const std::string& node,
                                              const std::string& transport = "verbs",
                                              const std::string& sysfs_root = "/sys");

// The PreflightStage of `run` (agent.hpp): the preflight of this node at the config's level. A
// node without RDMA NICs and a config that names none: nothing to check, ok. Collective over
// `store` (every agent calls it); null: a directory store in `scratch_dir`, this node alone.
PreflightStageOutcome run_preflight_stage(const jobspec::JobConfig& config, const std::string& node,
                                          wireup::KvStore* store, const std::string& scratch_dir);

}  // namespace topolaunch::launcher
