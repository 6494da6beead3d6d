// Worker environment: torchrun's names, the map's, then ours. See worker_env.hpp.
#include "topolaunch/launcher/worker_env.hpp"

#include <fmt/format.h>

#include "topolaunch/jobspec/worker_contract.hpp"

namespace topolaunch::launcher {

Environment worker_environment(const Environment& inherited, const jobspec::JobConfig& config,
                               const topology::RankMap& map, int rank, const JobFacts& facts) {
  namespace env_name = jobspec::env;
  const topology::RankAssignment& me = map.ranks.at(static_cast<std::size_t>(rank));
  const topology::RankMapNode& node = map.nodes.at(static_cast<std::size_t>(me.node));
  Environment env = inherited;
  for (const auto& [name, value] : config.worker.env) env[name] = value;
  for (const auto& [name, value] : me.env) env[name] = value;
  // torchrun sets OMP_NUM_THREADS=1; we know the rank's cores, so use them (unless set above).
  if (!env.contains(env_name::kOmpNumThreads) && me.cores > 0) {
    env[env_name::kOmpNumThreads] = std::to_string(me.cores);
  }

  auto set = [&env](const char* name, const auto& value) { env[name] = fmt::format("{}", value); };
  auto set_unless_user = [&env](const char* name, const char* value) {
    if (!env.contains(name)) env[name] = value;
  };
  set(env_name::kRank, me.rank);
  set(env_name::kLocalRank, me.local_rank);
  set(env_name::kWorldSize, map.world_size);
  set(env_name::kLocalWorldSize, node.ranks);
  set(env_name::kGroupRank, me.node);
  set(env_name::kGroupWorldSize, map.nodes.size());
  set(env_name::kRoleRank, me.rank);
  set(env_name::kRoleName, "default");
  set(env_name::kRoleWorldSize, map.world_size);
  set(env_name::kMasterAddr, facts.master_addr);
  set(env_name::kMasterPort, facts.master_port);
  set(env_name::kRestartCount, facts.attempt);
  set(env_name::kMaxRestarts, config.job.restarts);
  set(env_name::kRunIdTorchelastic, facts.run_id);
  set(env_name::kErrorFile, facts.error_file);
  set(env_name::kUseAgentStore, "False");
  set_unless_user(env_name::kNcclAsyncErrorHandling, "1");
  set_unless_user(env_name::kTorchNcclAsyncErrorHandling, "1");
  if (inherited.contains("SLURM_JOB_ID")) {
    set(env_name::kSlurmProcid, me.rank);
    set(env_name::kSlurmLocalid, me.local_rank);
    set(env_name::kSlurmNtasks, map.world_size);
    set(env_name::kSlurmNprocs, map.world_size);
    set(env_name::kSlurmNodeid, me.node);
  }
  if (map.world_size > 1 && !facts.mpi_singleton_guard.empty()) {
    set_unless_user(env_name::kOmpiSingletonServer, ("file:" + facts.mpi_singleton_guard).c_str());
  }

  set(env_name::kTopolaunchRank, me.rank);
  set(env_name::kTopolaunchWorldSize, map.world_size);
  set(env_name::kTopolaunchLocalRank, me.local_rank);
  set(env_name::kNodeRank, me.node);
  set(env_name::kWireup, "tcp");
  set(env_name::kStoreAddr, facts.store_address);
  set(env_name::kStoreSecret, facts.store_secret);
  set(env_name::kRankmapFile, facts.rankmap_file);
  set(env_name::kConfig, facts.config_file);
  set(env_name::kJobDir, facts.job_dir);
  set(env_name::kCheckpointDir, facts.checkpoint_dir);
  set(env_name::kHeartbeatFile, facts.heartbeat_file);
  set(env_name::kAttempt, facts.attempt);
  set(env_name::kRunId, facts.run_id);
  set(env_name::kTraceFile, facts.trace_file);
  set(env_name::kStepMetricsFile, facts.step_metrics_file);
  set(env_name::kCpus, me.cpus.to_list());
  set(env_name::kNumaNode, me.numa);
  return env;
}

}  // namespace topolaunch::launcher
