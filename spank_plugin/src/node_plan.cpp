#include "node_plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "topolaunch/jobspec/worker_contract.hpp"

namespace topolaunch::spank {

using topology::CpuSet;
using topology::NodeTopology;

Result<CpuSet> pus_of_cores(const NodeTopology& topo, const CpuSet& cores) {
  std::vector<int> pus;
  for (int core : cores.ids()) {
    if (core >= static_cast<int>(topo.cores.size())) {
      return make_error(fmt::format(
          "node {}: Slurm allocated core {} but the topology has {} cores (slurm.conf and the "
          "topology disagree; check Sockets/CoresPerSocket or topology_xml)",
          topo.hostname, core, topo.cores.size()));
    }
    const auto& ids = topo.cores[static_cast<std::size_t>(core)].pus.ids();
    pus.insert(pus.end(), ids.begin(), ids.end());
  }
  return CpuSet(std::move(pus));
}

int master_port_for(std::uint32_t job_id, std::uint32_t step_id) {
  // Spread over 40000 ports so that concurrent steps on shared nodes rarely collide.
  const std::uint64_t mixed = static_cast<std::uint64_t>(job_id) * 131u + step_id;
  return 20000 + static_cast<int>(mixed % 40000u);
}

Result<NodePlan> plan_node(const StepInfo& step, std::shared_ptr<const NodeTopology> this_node,
                           const TopologyLoader& load_other, topology::MappingSpec spec) {
  if (step.step_nodes.empty()) return make_error("slurm gave no step node list");
  if (step.tasks_per_node.size() != step.step_nodes.size()) {
    return make_error(fmt::format("SLURM_STEP_TASKS_PER_NODE names {} nodes, the node list {}",
                                  step.tasks_per_node.size(), step.step_nodes.size()));
  }
  const int per_node = step.tasks_per_node.front();
  for (std::size_t i = 0; i < step.tasks_per_node.size(); ++i) {
    if (step.tasks_per_node[i] != per_node) {
      return make_error(fmt::format(
          "node {} runs {} tasks and node {} runs {}: topolaunch needs the same number of tasks "
          "on every node (use --ntasks-per-node)",
          step.step_nodes.front(), per_node, step.step_nodes[i], step.tasks_per_node[i]));
    }
  }
  if (per_node * static_cast<int>(step.step_nodes.size()) != step.world_size) {
    return make_error(fmt::format("{} nodes x {} tasks is not the step's {} tasks",
                                  step.step_nodes.size(), per_node, step.world_size));
  }
  if (step.local_tasks != per_node) {
    return make_error(fmt::format("node {} runs {} tasks, SLURM_STEP_TASKS_PER_NODE says {}",
                                  step.node_name, step.local_tasks, per_node));
  }
  if (spec.ranks_per_node != 0 && spec.ranks_per_node != per_node) {
    return make_error(
        fmt::format("job.ranks_per_node = {} but srun started {} tasks per node (use "
                    "--ntasks-per-node={} or change the job config)",
                    spec.ranks_per_node, per_node, spec.ranks_per_node));
  }
  spec.ranks_per_node = per_node;

  // This node's allocation: Slurm's GPU variables and its cores (in the topology's PU ids,
  // which is what an emulated node needs: the host's own affinity says nothing about them).
  auto allocation = topology::allocation_from_env(step.env);
  if (!allocation) return allocation.error();
  if (step.alloc_cores) {
    auto pus = pus_of_cores(*this_node, *step.alloc_cores);
    if (!pus) return pus.error();
    allocation->cpus = *pus;
  }

  std::vector<topology::NodeInput> nodes;
  bool found = false;
  for (const auto& name : step.step_nodes) {
    topology::NodeInput input;
    input.name = name;
    if (name == step.node_name) {
      input.topology = this_node;
      input.allocation = *allocation;
      found = true;
    } else {
      auto other = load_other(name);
      if (!other) return other.error();
      input.topology = *other;
      input.allocation = topology::NodeAllocation::everything();
    }
    nodes.push_back(std::move(input));
  }
  if (!found) {
    return make_error(fmt::format("node {} is not in the step's node list", step.node_name));
  }

  topology::RankMapOptions options;
  options.environment_node = step.node_name;  // the environment of this node's ranks only
  auto map = topology::compute_rank_map(nodes, spec, nullptr, options);
  if (!map) return map.error();

  NodePlan plan;
  plan.node_name = step.node_name;
  plan.notes = map->warnings;
  for (std::size_t k = 0; k < map->nodes.size(); ++k) {
    if (map->nodes[k].name == step.node_name) plan.map_node_index = static_cast<int>(k);
  }
  if (plan.map_node_index < 0) {
    return make_error(fmt::format("the rank map has no node {}", step.node_name));
  }
  const auto& mine = map->nodes[static_cast<std::size_t>(plan.map_node_index)];
  if (static_cast<int>(mine.rank_ids.size()) != step.local_tasks) {
    return make_error(fmt::format("the rank map puts {} ranks on node {}, slurm started {}",
                                  mine.rank_ids.size(), step.node_name, step.local_tasks));
  }

  // Rendezvous: the map's node 0 hosts rank 0. A value the user set wins.
  const std::string master_addr = map->nodes.front().name;
  const std::string master_port = std::to_string(master_port_for(step.job_id, step.step_id));
  auto user_value = [&](const char* name, const std::string& fallback) {
    auto it = step.env.find(name);
    return it != step.env.end() && !it->second.empty() ? it->second : fallback;
  };

  for (int local = 0; local < step.local_tasks; ++local) {
    const int global = mine.rank_ids[static_cast<std::size_t>(local)];
    if (global < 0 || global >= static_cast<int>(map->ranks.size())) {
      return make_error(fmt::format("the rank map has no rank {}", global));
    }
    TaskPlan task;
    task.local_task = local;
    task.rank = map->ranks[static_cast<std::size_t>(global)];
    // The library's environment first (it names RANK, CUDA_VISIBLE_DEVICES, NCCL_IB_HCA, ...);
    // then what only Slurm's view adds. Values the user set for the rendezvous and threads win.
    task.env = task.rank.env;
    namespace env_name = jobspec::env;
    task.env.try_emplace(env_name::kRank, std::to_string(task.rank.rank));
    task.env.try_emplace(env_name::kLocalRank, std::to_string(task.rank.local_rank));
    task.env.try_emplace(env_name::kWorldSize, std::to_string(map->world_size));
    task.env.try_emplace(env_name::kLocalWorldSize, std::to_string(per_node));
    task.env.try_emplace(env_name::kGroupRank, std::to_string(plan.map_node_index));
    task.env.try_emplace(env_name::kCpus, task.rank.cpus.to_list());
    task.env[env_name::kMasterAddr] = user_value(env_name::kMasterAddr, master_addr);
    task.env[env_name::kMasterPort] = user_value(env_name::kMasterPort, master_port);
    if (auto it = task.env.find(env_name::kOmpNumThreads); it != task.env.end()) {
      it->second = user_value(env_name::kOmpNumThreads, it->second);
    }
    task.env[env_name::kNode] = step.node_name;
    plan.tasks.push_back(std::move(task));
  }
  return plan;
}

}  // namespace topolaunch::spank
