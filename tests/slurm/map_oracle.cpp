// The slurm suite's oracle: the rank map the library computes for the same inputs the plugin
// sees (node names, their topology XMLs, tasks per node, optional job config), printed as the
// library's JSON. Used until `topolaunch map` can take the same inputs.
//
//   map_oracle --ranks-per-node N [--config job.toml] [--policy auto|block|cyclic]
//              NAME=XML [NAME=XML ...]
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"

namespace tt = topolaunch::topology;

int main(int argc, char** argv) {
  tt::MappingSpec spec;
  int ranks_per_node = 0;
  std::vector<tt::NodeInput> nodes;
  std::string policy;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ranks-per-node" && i + 1 < argc) {
      ranks_per_node = std::atoi(argv[++i]);
    } else if (arg == "--config" && i + 1 < argc) {
      auto config = topolaunch::jobspec::load_job_config(argv[++i]);
      if (!config) {
        std::fprintf(stderr, "map_oracle: %s\n", config.error().message.c_str());
        return 2;
      }
      spec = config->mapping;
    } else if (arg == "--policy" && i + 1 < argc) {
      policy = argv[++i];
    } else if (auto eq = arg.find('='); eq != std::string::npos) {
      tt::DiscoverOptions options;
      options.hostname = arg.substr(0, eq);
      auto topo = tt::load_topology_file(arg.substr(eq + 1), options);
      if (!topo) {
        std::fprintf(stderr, "map_oracle: %s\n", topo.error().message.c_str());
        return 2;
      }
      tt::NodeInput node;
      node.name = arg.substr(0, eq);
      node.topology = std::make_shared<tt::NodeTopology>(std::move(*topo));
      nodes.push_back(std::move(node));
    } else {
      std::fprintf(stderr, "map_oracle: unexpected argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  if (policy == "block") spec.policy = tt::MappingPolicy::block;
  if (policy == "cyclic") spec.policy = tt::MappingPolicy::cyclic;
  spec.ranks_per_node = ranks_per_node;
  auto map = tt::compute_rank_map(nodes, spec);
  if (!map) {
    std::fprintf(stderr, "map_oracle: %s\n", map.error().message.c_str());
    return 2;
  }
  std::fputs(tt::to_json(*map, true).c_str(), stdout);
  std::fputc('\n', stdout);
  return 0;
}
