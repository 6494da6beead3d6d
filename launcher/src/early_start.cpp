// The map an early start begins from and its check against the whole map; see early_start.hpp.
#include "early_start.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "topolaunch/launcher/worker_env.hpp"
#include "topolaunch/topology/switch_tree.hpp"

namespace topolaunch::launcher {

Result<std::vector<std::string>> step_node_names(const Environment& env, int nodes,
                                                 const std::string& node_name) {
  const char* variable = "SLURM_STEP_NODELIST";
  auto found = env.find(variable);
  if (found == env.end() || found->second.empty()) {
    variable = "SLURM_JOB_NODELIST";
    found = env.find(variable);
  }
  if (found == env.end() || found->second.empty())
    return make_error("SLURM_STEP_NODELIST is not set: the step's nodes are unknown");
  auto names = topology::expand_hostlist(found->second);
  if (!names) return make_error(fmt::format("{}: {}", variable, names.error().message));
  if (static_cast<int>(names->size()) != nodes) {
    return make_error(fmt::format("{}=\"{}\" names {} nodes, the step has {}", variable,
                                  found->second, names->size(), nodes));
  }
  if (std::find(names->begin(), names->end(), node_name) == names->end()) {
    return make_error(
        fmt::format("{}=\"{}\" does not name this node {}", variable, found->second, node_name));
  }
  return names;
}

std::vector<topology::NodeInput> nodes_like(const topology::NodeInput& mine,
                                            const std::vector<std::string>& step_nodes) {
  std::vector<topology::NodeInput> out;
  out.reserve(step_nodes.size());
  for (const std::string& name : step_nodes) {
    topology::NodeInput node = mine;  // the topology is shared, not copied
    node.name = name;
    out.push_back(std::move(node));
  }
  return out;
}

namespace {

int node_index(const topology::RankMap& map, const std::string& name) {
  for (std::size_t i = 0; i < map.nodes.size(); ++i) {
    if (map.nodes[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

std::string early_start_difference(const topology::RankMap& started, const topology::RankMap& full,
                                   const std::string& node_name, const jobspec::JobConfig& config) {
  if (full.world_size != started.world_size)
    return fmt::format("world size {}, not {}", full.world_size, started.world_size);
  if (full.nodes.size() != started.nodes.size())
    return fmt::format("{} nodes, not {}", full.nodes.size(), started.nodes.size());
  const int f = node_index(full, node_name), s = node_index(started, node_name);
  if (f < 0) return fmt::format("node {} is not in it", node_name);
  if (f != s) return fmt::format("node index {}, not {}", f, s);
  const topology::RankMapNode& full_node = full.nodes[static_cast<std::size_t>(f)];
  const topology::RankMapNode& started_node = started.nodes[static_cast<std::size_t>(s)];
  if (full_node.rank_ids.size() != started_node.rank_ids.size())
    return fmt::format("{} ranks on this node, not {}", full_node.rank_ids.size(),
                       started_node.rank_ids.size());
  // Only what the map decides: the facts (store, files, attempt) are the same either way.
  const JobFacts facts;
  for (std::size_t local = 0; local < full_node.rank_ids.size(); ++local) {
    const int full_rank = full_node.rank_ids[local], started_rank = started_node.rank_ids[local];
    if (full_rank != started_rank)
      return fmt::format("local rank {} is rank {}, not {}", local, full_rank, started_rank);
    const auto& a = full.ranks.at(static_cast<std::size_t>(full_rank));
    const auto& b = started.ranks.at(static_cast<std::size_t>(started_rank));
    const std::string which = fmt::format("local rank {} (rank {})", local, full_rank);
    if (a.local_rank != b.local_rank)
      return fmt::format("{}: local rank {}, not {}", which, a.local_rank, b.local_rank);
    if (a.cpus != b.cpus)
      return fmt::format("{}: cpus {}, not {}", which, a.cpus.to_list(), b.cpus.to_list());
    if (a.numa != b.numa) return fmt::format("{}: NUMA node {}, not {}", which, a.numa, b.numa);
    const Environment want = worker_environment({}, config, full, full_rank, facts);
    const Environment got = worker_environment({}, config, started, started_rank, facts);
    for (const auto& [name, value] : want) {
      auto it = got.find(name);
      if (it == got.end()) return fmt::format("{}: {}=\"{}\", unset", which, name, value);
      if (it->second != value)
        return fmt::format("{}: {}=\"{}\", not \"{}\"", which, name, value, it->second);
    }
    for (const auto& [name, value] : got) {
      if (!want.contains(name)) return fmt::format("{}: {} unset, not \"{}\"", which, name, value);
    }
  }
  return "";
}

}  // namespace topolaunch::launcher
