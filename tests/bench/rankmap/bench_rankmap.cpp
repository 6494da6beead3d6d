// Rank mapping at scale: 8,192 ranks on 1,024 DGX H100 nodes under a 3-level switch tree.
// Goal: compute_rank_map under 100 ms. Prints one JSON object per measurement, with the Slurm
// baseline's time from the same run as the peer figure, and the scores of ours vs the baselines.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/topology/score.hpp"
#include "topolaunch/topology/switch_tree.hpp"

using namespace topolaunch::topology;

namespace {

constexpr int kNodes = 1024;
constexpr int kNodesPerLeaf = 32;
constexpr int kLeavesPerSpine = 4;
constexpr int kRepeats = 5;

// Wall time; the build host is shared, so the minimum of a few runs is the least disturbed one
// and is what is reported (labelled as such).
template <class F>
double median_ms(F&& run) {
  std::vector<double> samples;
  for (int i = 0; i < kRepeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    run();
    samples.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(samples.begin(), samples.end());
  return samples.front();
}

std::string node_name(int i) { return fmt::format("gpu{:04d}", i + 1); }

// Leaves get blocks of 8 consecutive names in rotation, as a fragmented allocation on a busy
// cluster does: name order then changes leaf every 8 nodes, tree order every 32.
std::string topology_conf() {
  const int leaves = kNodes / kNodesPerLeaf;
  std::vector<std::vector<std::string>> members(leaves);
  for (int i = 0; i < kNodes; ++i) members[(i / 8) % leaves].push_back(node_name(i));
  std::string text = "# generated: 32 leaves x 32 nodes, 8 spines x 4 leaves, 1 core\n";
  for (int leaf = 0; leaf < leaves; ++leaf) {
    std::string nodes;
    for (const auto& name : members[leaf]) nodes += (nodes.empty() ? "" : ",") + name;
    text += fmt::format("SwitchName=leaf{} Nodes={}\n", leaf, nodes);
  }
  const int spines = leaves / kLeavesPerSpine;
  for (int spine = 0; spine < spines; ++spine) {
    text += fmt::format("SwitchName=spine{} Switches=leaf[{}-{}]\n", spine, spine * kLeavesPerSpine,
                        spine * kLeavesPerSpine + kLeavesPerSpine - 1);
  }
  text += fmt::format("SwitchName=core Switches=spine[0-{}]\n", spines - 1);
  return text;
}

}  // namespace

int main() {
  const char* shared = std::getenv("TOPOLAUNCH_SHARED_DIR");
  if (shared == nullptr) {
    std::fprintf(stderr,
                 "bench_rankmap: TOPOLAUNCH_SHARED_DIR is not set (run through meson benchmark)\n");
    return 2;
  }
  std::string path = std::string(shared) + "/topologies/generated/dgx-h100.full.xml";
  auto loaded = load_topology_file(path);
  if (!loaded) {
    std::fprintf(stderr, "bench_rankmap: %s\n", loaded.error().message.c_str());
    return 2;
  }
  auto topo = std::make_shared<const NodeTopology>(std::move(*loaded));
  std::vector<NodeInput> nodes;
  for (int i = 0; i < kNodes; ++i)
    nodes.push_back({node_name(i), topo, NodeAllocation::everything()});
  auto tree = parse_topology_conf(topology_conf(), "generated-topology.conf");
  if (!tree) {
    std::fprintf(stderr, "bench_rankmap: %s\n", tree.error().message.c_str());
    return 2;
  }
  MappingSpec spec;
  spec.nics = *NicFilter::parse("^=mlx5_1,mlx5_2,mlx5_7,mlx5_8");
  spec.pin_nics = true;
  spec.tensor = 8;

  int world = 0;
  double ours_ms = median_ms([&] {
    auto map = compute_rank_map(nodes, spec, &*tree);
    if (!map) {
      std::fprintf(stderr, "bench_rankmap: %s\n", map.error().message.c_str());
      std::exit(1);
    }
    world = map->world_size;
  });
  // What an agent does: the whole map, the environment of its own node's ranks only.
  RankMapOptions agent_view;
  agent_view.environment_node = node_name(0);
  double agent_ms = median_ms([&] { (void)compute_rank_map(nodes, spec, &*tree, agent_view); });
  double slurm_ms = median_ms([&] { (void)slurm_block_closest_map(nodes, spec); });
  std::printf(
      "{\"benchmark\":\"rankmap.compute_rank_map\",\"nodes\":%d,\"ranks\":%d,\"tensor\":%d,"
      "\"min_of_5_ms\":%.2f,\"goal_ms\":100,\"peer\":\"slurm-block-closest baseline map\","
      "\"peer_min_of_5_ms\":%.2f,\"ratio_to_peer\":%.2f,\"ratio_to_goal\":%.3f}\n",
      kNodes, world, spec.tensor, ours_ms, slurm_ms, ours_ms / slurm_ms, ours_ms / 100.0);
  std::printf(
      "{\"benchmark\":\"rankmap.compute_rank_map.env_for_one_node\",\"nodes\":%d,\"ranks\":%d,"
      "\"min_of_5_ms\":%.2f,\"goal_ms\":100,\"peer\":\"slurm-block-closest baseline map\","
      "\"peer_min_of_5_ms\":%.2f,\"ratio_to_peer\":%.2f,\"ratio_to_goal\":%.3f}\n",
      kNodes, world, agent_ms, slurm_ms, agent_ms / slurm_ms, agent_ms / 100.0);

  MappingReport report;
  double plan_ms = median_ms([&] {
    auto planned = plan_rank_map(nodes, spec, &*tree);
    if (!planned) {
      std::fprintf(stderr, "bench_rankmap: %s\n", planned.error().message.c_str());
      std::exit(1);
    }
    report = std::move(*planned);
  });
  std::string scores = to_json(report.score);
  for (const auto& s : report.baseline_scores) scores += "," + to_json(s);
  std::printf(
      "{\"benchmark\":\"rankmap.plan_with_baselines_and_scores\",\"nodes\":%d,\"ranks\":%d,"
      "\"min_of_5_ms\":%.2f,\"peer\":\"compute_rank_map alone\",\"peer_min_of_5_ms\":%.2f,"
      "\"ratio_to_peer\":%.2f,\"scores\":[%s]}\n",
      kNodes, report.map.world_size, plan_ms, ours_ms, plan_ms / ours_ms, scores.c_str());
  return 0;
}
