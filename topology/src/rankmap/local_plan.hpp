// Private to rank mapping: node-local decisions (cores, memory node, NICs) once the GPUs of each
// local rank are known. Shared by our map and the explicit table.
#pragma once

#include <string>
#include <vector>

#include "node_profile.hpp"

namespace topolaunch::topology::rankmap_detail {

struct LocalRank {
  std::vector<int> gpus;
  std::vector<int> visible;  // index of each GPU among the node's allowed GPUs
  CpuSet cpus;
  int cores = 0;
  int numa = -1;
  std::vector<int> nics;
};

struct LocalPlan {
  std::vector<LocalRank> ranks;
  std::vector<std::string> warnings;
};

// Cores local to each rank's GPU(s), split evenly by whole cores among the ranks sharing that
// locality (R-MAP-2), memory node (R-MAP-3) and NICs (R-MAP-4). `gpus_of_rank[r]` are node GPU
// indexes, all allowed.
LocalPlan plan_local_ranks(const NodeProfile& profile, const ResolvedNode& node,
                           const std::vector<std::vector<int>>& gpus_of_rank);

// The GPU order our map walks on a node: NVLink domain by domain (domains in order of their
// first GPU), bus order inside a domain.
std::vector<int> gpu_walk_order(const NodeProfile& profile, const std::vector<int>& allowed);

std::string join(const std::vector<std::string>& parts, const char* separator = ",");

}  // namespace topolaunch::topology::rankmap_detail
