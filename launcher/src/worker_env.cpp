// Worker environment: torchrun's names, the map's, then ours. See worker_env.hpp.
#include "topolaunch/launcher/worker_env.hpp"

#include <fmt/format.h>

namespace topolaunch::launcher {

Environment worker_environment(const Environment& inherited, const JobConfig& config,
                               const topology::RankMap& map, int rank, const JobFacts& facts) {
  const topology::RankAssignment& me = map.ranks.at(static_cast<std::size_t>(rank));
  const topology::RankMapNode& node = map.nodes.at(static_cast<std::size_t>(me.node));
  Environment env = inherited;
  for (const auto& [name, value] : config.worker.env) env[name] = value;
  for (const auto& [name, value] : me.env) env[name] = value;
  // torchrun sets OMP_NUM_THREADS=1; we know the rank's cores, so use them (unless set above).
  if (!env.contains("OMP_NUM_THREADS") && me.cores > 0) {
    env["OMP_NUM_THREADS"] = std::to_string(me.cores);
  }

  auto set = [&env](const char* name, const auto& value) { env[name] = fmt::format("{}", value); };
  set("RANK", me.rank);
  set("LOCAL_RANK", me.local_rank);
  set("WORLD_SIZE", map.world_size);
  set("LOCAL_WORLD_SIZE", node.ranks);
  set("GROUP_RANK", me.node);
  set("GROUP_WORLD_SIZE", map.nodes.size());
  set("ROLE_RANK", me.rank);
  set("ROLE_NAME", "default");
  set("ROLE_WORLD_SIZE", map.world_size);
  set("MASTER_ADDR", facts.master_addr);
  set("MASTER_PORT", facts.master_port);
  set("TORCHELASTIC_RESTART_COUNT", facts.attempt);
  set("TORCHELASTIC_MAX_RESTARTS", config.job.restarts);
  set("TORCHELASTIC_RUN_ID", facts.run_id);

  set("TOPOLAUNCH_RANK", me.rank);
  set("TOPOLAUNCH_WORLD_SIZE", map.world_size);
  set("TOPOLAUNCH_LOCAL_RANK", me.local_rank);
  set("TOPOLAUNCH_NODE_RANK", me.node);
  set("TOPOLAUNCH_WIREUP", "tcp");
  set("TOPOLAUNCH_STORE_ADDR", facts.store_address);
  set("TOPOLAUNCH_STORE_SECRET", facts.store_secret);
  set("TOPOLAUNCH_RANKMAP_FILE", facts.rankmap_file);
  set("TOPOLAUNCH_CONFIG", facts.config_file);
  set("TOPOLAUNCH_JOB_DIR", facts.job_dir);
  set("TOPOLAUNCH_CHECKPOINT_DIR", facts.checkpoint_dir);
  set("TOPOLAUNCH_HEARTBEAT_FILE", facts.heartbeat_file);
  set("TOPOLAUNCH_ATTEMPT", facts.attempt);
  set("TOPOLAUNCH_RUN_ID", facts.run_id);
  set("TOPOLAUNCH_CPUS", me.cpus.to_list());
  set("TOPOLAUNCH_NUMA_NODE", me.numa);
  const BudgetSection& b = config.budget;
  if (b.memory_bytes_per_rank) set("TOPOLAUNCH_MEMORY_BUDGET_BYTES", b.memory_bytes_per_rank);
  if (b.gpu_memory_bytes_per_rank) {
    set("TOPOLAUNCH_GPU_MEMORY_BUDGET_BYTES", b.gpu_memory_bytes_per_rank);
  }
  if (b.comm_bytes_per_step) set("TOPOLAUNCH_COMM_BUDGET_BYTES", b.comm_bytes_per_step);
  if (b.comm_exposed_time_per_step.count()) {
    set("TOPOLAUNCH_COMM_EXPOSED_BUDGET_US", b.comm_exposed_time_per_step.count());
  }
  return env;
}

}  // namespace topolaunch::launcher
