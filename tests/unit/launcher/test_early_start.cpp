// job.start = "early": the step's nodes from Slurm's variables, the map of nodes all like this
// one that the workers start from, and the check of the whole map against it.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "catch.hpp"
#include "early_start.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"

using namespace topolaunch::launcher;
namespace tt = topolaunch::topology;

namespace {

std::shared_ptr<const tt::NodeTopology> fixture(const std::string& path) {
  auto topo =
      tt::load_topology_file(std::string(TOPOLAUNCH_SOURCE_ROOT) + "/tests/fixtures/" + path);
  if (!topo) FAIL(topo.error().message);
  return std::make_shared<const tt::NodeTopology>(std::move(*topo));
}

tt::NodeInput node(const std::string& name, std::shared_ptr<const tt::NodeTopology> topology) {
  tt::NodeInput input;
  input.name = name;
  input.topology = std::move(topology);
  return input;
}

topolaunch::jobspec::JobConfig config_of(const std::string& toml) {
  auto config = topolaunch::jobspec::parse_job_config(toml, "job.toml");
  if (!config) FAIL(config.error().message);
  return *config;
}

tt::RankMap map_of(const std::vector<tt::NodeInput>& nodes,
                   const topolaunch::jobspec::JobConfig& config) {
  auto map = tt::compute_rank_map(nodes, config.mapping);
  if (!map) FAIL(map.error().message);
  return *map;
}

}  // namespace

TEST_CASE("the step's nodes come from SLURM_STEP_NODELIST, in Slurm's order") {
  auto names = step_node_names({{"SLURM_STEP_NODELIST", "n[1-3],gpu07"}}, 4, "n2");
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"n1", "n2", "n3", "gpu07"});
  // The whole allocation's list serves when the step's is not there.
  auto job_list = step_node_names({{"SLURM_JOB_NODELIST", "n[1-2]"}}, 2, "n1");
  REQUIRE(job_list.ok());
  CHECK(job_list->size() == 2);
}

TEST_CASE("a node list that cannot be the step's is one line naming the variable") {
  CHECK(step_node_names({}, 2, "n1").error().message ==
        "SLURM_STEP_NODELIST is not set: the step's nodes are unknown");
  CHECK(step_node_names({{"SLURM_STEP_NODELIST", "n[1-3]"}}, 2, "n1").error().message ==
        "SLURM_STEP_NODELIST=\"n[1-3]\" names 3 nodes, the step has 2");
  CHECK(step_node_names({{"SLURM_STEP_NODELIST", "n[1-2]"}}, 2, "n9").error().message ==
        "SLURM_STEP_NODELIST=\"n[1-2]\" does not name this node n9");
  CHECK(step_node_names({{"SLURM_STEP_NODELIST", "n[3-1]"}}, 2, "n1")
            .error()
            .message.starts_with("SLURM_STEP_NODELIST: "));
}

TEST_CASE("nodes like this one: this node's topology and allocation under every step name") {
  auto mine = node("n2", fixture("slurm/dgx-h100.pci.xml"));
  mine.allocation.all_gpus = false;
  mine.allocation.gpus = {0, 1};
  auto nodes = nodes_like(mine, {"n1", "n2", "n3"});
  REQUIRE(nodes.size() == 3);
  CHECK(nodes[0].name == "n1");
  CHECK(nodes[2].name == "n3");
  for (const auto& n : nodes) {
    CHECK(n.topology == mine.topology);  // shared, not copied
    CHECK(n.allocation == mine.allocation);
  }
}

TEST_CASE("nodes of three types with ranks_per_node fixed: each node's ranks are its own") {
  // The scale suite's case: the map a node starts from takes every node to be like itself, and
  // the whole map, with the other types, still gives it the same ranks, cores and environment.
  const auto config = config_of("[job]\nranks_per_node = 2\n[mapping]\noversubscribe = true\n");
  const std::vector<tt::NodeInput> all{node("n1", fixture("slurm/dgx-a100.pci.xml")),
                                       node("n2", fixture("slurm/dgx-h100.pci.xml")),
                                       node("n3", fixture("slurm/pcie-l40s-8gpu.pci.xml"))};
  const tt::RankMap full = map_of(all, config);
  for (const auto& mine : all) {
    INFO(mine.name);
    const tt::RankMap started = map_of(nodes_like(mine, {"n1", "n2", "n3"}), config);
    CHECK(early_start_difference(started, full, mine.name, config).empty());
  }
}

TEST_CASE("a node with fewer GPUs: every node's start differs from the whole map") {
  // Ranks from the GPUs (gpus_per_rank = 4): 2 on an 8-GPU node, 1 on the 4-GPU GH200 node.
  const auto config = config_of("[mapping]\ngpus_per_rank = 4\n");
  const auto h100 = fixture("slurm/dgx-h100.pci.xml");
  const auto gh200 = fixture("topology/gh200-quad.xml");
  const std::vector<tt::NodeInput> all{node("n1", h100), node("n2", h100), node("n3", gh200)};
  const tt::RankMap full = map_of(all, config);
  REQUIRE(full.world_size == 5);
  const std::vector<std::string> names{"n1", "n2", "n3"};
  CHECK(early_start_difference(map_of(nodes_like(all[0], names), config), full, "n1", config) ==
        "world size 5, not 6");
  CHECK(early_start_difference(map_of(nodes_like(all[2], names), config), full, "n3", config) ==
        "world size 5, not 3");
}

TEST_CASE("the first difference in a rank's binding or environment is named") {
  const auto config = config_of("[job]\nranks_per_node = 2\n[mapping]\noversubscribe = true\n");
  const auto h100 = fixture("slurm/dgx-h100.pci.xml");
  const tt::RankMap started = map_of({node("n1", h100), node("n2", h100)}, config);
  REQUIRE(early_start_difference(started, started, "n2", config).empty());

  tt::RankMap full = started;
  full.ranks[3].env.insert_or_assign("CUDA_VISIBLE_DEVICES", std::string("5"));
  const std::string was = started.ranks[3].env.at("CUDA_VISIBLE_DEVICES");
  CHECK(early_start_difference(started, full, "n2", config) ==
        fmt::format("local rank 1 (rank 3): CUDA_VISIBLE_DEVICES=\"5\", not \"{}\"", was));
  CHECK(early_start_difference(started, full, "n1", config).empty());  // not n1's rank

  full = started;
  full.ranks[2].numa = 7;
  CHECK(early_start_difference(started, full, "n2", config) ==
        fmt::format("local rank 0 (rank 2): NUMA node 7, not {}", started.ranks[2].numa));

  full = started;
  full.ranks[2].cpus = *tt::CpuSet::parse_list("0-3");
  CHECK(early_start_difference(started, full, "n2", config)
            .starts_with("local rank 0 (rank 2): cpus 0-3, not "));

  full = started;
  std::swap(full.nodes[0], full.nodes[1]);  // another node order: n2 first
  CHECK(early_start_difference(started, full, "n2", config) == "node index 0, not 1");

  full = started;
  full.ranks[3].env.erase("TOPOLAUNCH_TP_RANK");  // a variable the whole map does not set
  CHECK(early_start_difference(started, full, "n2", config) ==
        fmt::format("local rank 1 (rank 3): TOPOLAUNCH_TP_RANK unset, not \"{}\"",
                    started.ranks[3].env.at("TOPOLAUNCH_TP_RANK")));
}
