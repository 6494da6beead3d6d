#include <nlohmann/json.hpp>

#include "topolaunch/topology/rankmap.hpp"

namespace topolaunch::topology {

namespace {

const char* policy_name(MappingPolicy policy) {
  switch (policy) {
    case MappingPolicy::automatic:
      return "auto";
    case MappingPolicy::block:
      return "block";
    case MappingPolicy::cyclic:
      return "cyclic";
    case MappingPolicy::explicit_table:
      return "explicit";
  }
  return "auto";
}

}  // namespace

std::string to_json(const RankMap& map, bool pretty) {
  using json = nlohmann::ordered_json;
  json j;
  j["label"] = map.label;
  j["policy"] = policy_name(map.policy);
  j["world_size"] = map.world_size;
  j["tensor"] = map.tensor;
  j["pipeline"] = map.pipeline;
  j["data"] = map.data;
  j["switch_tree_order"] = map.switch_tree_order;
  json nodes = json::array();
  for (const RankMapNode& node : map.nodes) {
    nodes.push_back(json{{"name", node.name},
                         {"ranks", node.ranks},
                         {"rank_ids", node.rank_ids},
                         {"allowed_gpus", node.allowed_gpus}});
  }
  j["nodes"] = std::move(nodes);
  json ranks = json::array();
  for (const RankAssignment& a : map.ranks) {
    json r;
    r["rank"] = a.rank;
    r["node"] = a.node;
    r["hostname"] = a.node >= 0 ? map.nodes[a.node].name : std::string();
    r["local_rank"] = a.local_rank;
    r["gpus"] = a.gpus;
    r["gpu_visible_indexes"] = a.gpu_visible_indexes;
    r["cpus"] = a.cpus.to_list();
    r["cores"] = a.cores;
    r["numa"] = a.numa;
    r["nics"] = a.nics;
    r["tp"] = a.tp;
    r["pp"] = a.pp;
    r["dp"] = a.dp;
    json env = json::object();
    for (const auto& [key, value] : a.env) env[key] = value;
    r["env"] = std::move(env);
    ranks.push_back(std::move(r));
  }
  j["ranks"] = std::move(ranks);
  j["warnings"] = map.warnings;
  return pretty ? j.dump(2) : j.dump();
}

}  // namespace topolaunch::topology
