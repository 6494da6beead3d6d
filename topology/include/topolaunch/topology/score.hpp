// Scoring a rank map on the job's communication pattern with a bandwidth model of the topology,
// and comparing it with the baselines (ARCHITECTURE.md "Rank-map quality").
//
// Bandwidth model (MB/s, one direction):
//   GPU<->GPU on a node: NVLink count x per-link bandwidth when NV#, else the slower GPU's PCIe
//     (gen x width, 128b/130b) scaled by the path: PIX/PXB 1.0, PHB 0.9, NODE 0.8, SYS 0.5
//     (the cross-socket penalty).
//   Across nodes: each side's NIC rate (port rate, else its PCIe link), capped by the GPU<->NIC
//     PCIe path as above, divided by the number of ranks on that node using that NIC.
// A ring's bottleneck is its slowest edge between consecutive ranks (ranks sharing one GPU are
// not an edge).
#pragma once

#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/mapping_spec.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/topology/switch_tree.hpp"

namespace topolaunch::topology {

struct MapScore {
  std::string label;
  int tp_rings = 0;               // rings with >1 rank
  double tp_ring_min_mbps = 0.0;  // 0 when there is no such ring
  double tp_ring_mean_mbps = 0.0;
  int dp_rings = 0;
  double dp_ring_min_mbps = 0.0;
  double dp_ring_mean_mbps = 0.0;
  int ranks_cpus_off_numa = 0;    // some core not on the NUMA node of the rank's GPU
  int ranks_memory_off_numa = 0;  // memory node != the GPU's NUMA node
  int ranks_nic_not_closest = 0;  // a NIC with a better relation to the GPU was selectable
  // shares its NIC while an idle selectable NIC on the node is as close to its GPU
  int ranks_nic_shared_needlessly = 0;
  int max_ranks_per_nic = 0;
  int ranks_without_nic = 0;
  long switch_hops = 0;  // over all tp and dp ring edges between nodes

  bool operator==(const MapScore&) const = default;
};

// Per metric: is `a` at least as good as `b`? Names the first metric where it is not ("" = yes).
std::string first_worse_metric(const MapScore& a, const MapScore& b);

Result<MapScore> score_rank_map(const RankMap& map, const std::vector<NodeInput>& nodes,
                                const MappingSpec& spec, const SwitchTree* tree = nullptr);

// Ours, the two baselines, their scores and the explanation of what ours does differently.
struct MappingReport {
  RankMap map;
  MapScore score;
  std::vector<RankMap> baselines;  // slurm-block-closest, round-robin
  std::vector<MapScore> baseline_scores;
  std::vector<std::string> explanation;  // one line per decision that differs from the baseline
};

Result<MappingReport> plan_rank_map(const std::vector<NodeInput>& nodes, const MappingSpec& spec,
                                    const SwitchTree* tree = nullptr);

std::string to_json(const MapScore& score);
std::string to_json(const MappingReport& report, bool pretty = true);

}  // namespace topolaunch::topology
