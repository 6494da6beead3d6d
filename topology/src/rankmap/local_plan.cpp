#include "local_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace topolaunch::topology::rankmap_detail {

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) {
      out += separator;
    }
    out += parts[i];
  }
  return out;
}

std::vector<int> gpu_walk_order(const NodeProfile& profile, const std::vector<int>& allowed) {
  std::vector<int> order = allowed;
  // Domain rank = the smallest allowed GPU index in that domain.
  std::map<int, int> first_of_domain;
  for (int g : allowed) {
    int d = profile.nvlink_domain[g];
    auto it = first_of_domain.find(d);
    if (it == first_of_domain.end() || g < it->second) {
      first_of_domain[d] = g;
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    int da = first_of_domain[profile.nvlink_domain[a]];
    int db = first_of_domain[profile.nvlink_domain[b]];
    return da != db ? da < db : a < b;
  });
  return order;
}

namespace {

std::string gpu_label(const NodeProfile& profile, int g) {
  return fmt::format("GPU{} ({})", g, profile.topology->gpus[g].busid.to_string());
}

}  // namespace

LocalPlan plan_local_ranks(const NodeProfile& profile, const ResolvedNode& node,
                           const std::vector<std::vector<int>>& gpus_of_rank) {
  LocalPlan plan;
  const NodeTopology& topo = *profile.topology;
  const int n_rank = static_cast<int>(gpus_of_rank.size());
  plan.ranks.resize(static_cast<std::size_t>(n_rank));

  // Allowed cores: whole cores with at least one allowed PU (SMT siblings travel together).
  std::vector<int> allowed_cores;
  for (std::size_t c = 0; c < topo.cores.size(); ++c) {
    if (topo.cores[c].pus.intersects(node.cpus)) {
      allowed_cores.push_back(static_cast<int>(c));
    }
  }
  // Candidate cores per rank: local to its GPUs, else the GPU's package, else anywhere allowed.
  std::vector<std::vector<int>> candidates(static_cast<std::size_t>(n_rank));
  for (int r = 0; r < n_rank; ++r) {
    auto& rank = plan.ranks[r];
    rank.gpus = gpus_of_rank[r];
    for (int g : rank.gpus) {
      auto pos = std::lower_bound(node.gpus.begin(), node.gpus.end(), g);
      rank.visible.push_back(static_cast<int>(pos - node.gpus.begin()));
    }
    CpuSet locality;
    for (int g : rank.gpus) {
      locality = locality | profile.gpu_cpus[g];
    }
    auto& cand = candidates[r];
    if (!locality.empty()) {
      for (int c : allowed_cores) {
        if (topo.cores[c].pus.intersects(locality)) {
          cand.push_back(c);
        }
      }
    }
    if (cand.empty() && !rank.gpus.empty()) {
      int package = profile.gpu_package[rank.gpus.front()];
      if (package >= 0) {
        for (int c : allowed_cores) {
          if (profile.core_package[c] == package) {
            cand.push_back(c);
          }
        }
      }
      if (!cand.empty()) {
        plan.warnings.push_back(
            fmt::format("node {}: no allowed core is local to {}; using cores of its package {}",
                        node.name, gpu_label(profile, rank.gpus.front()), package));
      }
    }
    if (cand.empty()) {
      cand = allowed_cores;
      if (rank.gpus.empty()) {
        // A rank without a GPU (oversubscribed CPU ranks) has no locality to honour.
      } else if (locality.empty()) {
        plan.warnings.push_back(fmt::format(
            "node {}: locality of {} is unknown (VM or BIOS without _PXM); using any allowed core",
            node.name, gpu_label(profile, rank.gpus.front())));
      } else {
        plan.warnings.push_back(fmt::format(
            "node {}: no allowed core is local to {} or its package; using any allowed core",
            node.name, gpu_label(profile, rank.gpus.front())));
      }
    }
  }
  // Ranks with the same candidate cores split them; groups are served in order of their first
  // rank and do not take cores an earlier group took, unless nothing else is left.
  std::vector<int> group_of(static_cast<std::size_t>(n_rank), -1);
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < n_rank; ++r) {
    if (group_of[r] != -1) {
      continue;
    }
    groups.push_back({});
    for (int s = r; s < n_rank; ++s) {
      if (group_of[s] == -1 && candidates[s] == candidates[r]) {
        group_of[s] = static_cast<int>(groups.size() - 1);
        groups.back().push_back(s);
      }
    }
  }
  std::vector<bool> claimed(topo.cores.size(), false);
  for (const auto& group : groups) {
    const auto& cand = candidates[group.front()];
    std::vector<int> avail;
    for (int c : cand) {
      if (!claimed[c]) {
        avail.push_back(c);
      }
    }
    if (avail.empty()) {
      avail = cand;
      plan.warnings.push_back(
          fmt::format("node {}: local ranks {}.. share cores already given to other ranks (their "
                      "GPUs' locality "
                      "overlaps)",
                      node.name, group.front()));
    }
    for (int c : avail) {
      claimed[c] = true;
    }
    const int n_core = static_cast<int>(avail.size());
    const int k = static_cast<int>(group.size());
    if (n_core < k) {
      plan.warnings.push_back(
          fmt::format("node {}: {} ranks share {} local cores (cores {}); ranks share cores",
                      node.name, k, n_core, topo.cores[avail.front()].pus.to_list()));
    }
    int next = 0;
    for (int i = 0; i < k; ++i) {
      auto& rank = plan.ranks[group[i]];
      std::vector<int> mine;
      if (n_core >= k) {
        int count = n_core / k + (i < n_core % k ? 1 : 0);
        for (int j = 0; j < count; ++j) {
          mine.push_back(avail[next++]);
        }
      } else {
        mine.push_back(avail[static_cast<std::size_t>(i * n_core / k)]);
      }
      std::vector<int> pus;
      for (int c : mine) {
        for (int pu : topo.cores[c].pus.ids()) {
          if (node.cpus.contains(pu)) {
            pus.push_back(pu);
          }
        }
      }
      rank.cpus = CpuSet(std::move(pus));
      rank.cores = static_cast<int>(mine.size());
    }
  }
  // Memory: the GPU's NUMA node (never a GPU-memory node); without one, where the cores are.
  for (auto& rank : plan.ranks) {
    int numa = rank.gpus.empty() ? -1 : profile.gpu_numa[rank.gpus.front()];
    const NumaNode* host = numa >= 0 ? topo.numa(numa) : nullptr;
    if (host == nullptr || host->gpu_memory) {
      numa = rank.cpus.empty() ? -1 : profile.numa_of_pu(rank.cpus.first());
    }
    rank.numa = numa;
  }
  // NICs: per GPU as NCCL shares them, over the GPUs this node's ranks use.
  std::vector<int> used;
  for (const auto& rank : plan.ranks) {
    used.insert(used.end(), rank.gpus.begin(), rank.gpus.end());
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  auto nics_of_gpu = assign_nics(profile, used);
  for (auto& rank : plan.ranks) {
    for (int g : rank.gpus) {
      for (int k : nics_of_gpu[g]) {
        if (std::find(rank.nics.begin(), rank.nics.end(), k) == rank.nics.end()) {
          rank.nics.push_back(k);
        }
      }
    }
  }
  if (!topo.nics.empty() && profile.selected_nics.empty()) {
    plan.warnings.push_back(
        fmt::format("node {}: none of its {} NICs is a selected compute NIC (check rdma.nics)",
                    node.name, topo.nics.size()));
  }
  for (int g : used) {
    const auto& closest = profile.closest_nics[g];
    if (!closest.empty() &&
        profile.gpu_nic_relation(g, closest.front()).kind == RelationKind::SYS) {
      // R-MAP-5: reported, not fatal.
      plan.warnings.push_back(fmt::format("node {}: {}: closest NIC is SYS ({})", node.name,
                                          gpu_label(profile, g), topo.nics[closest.front()].name));
    }
  }
  return plan;
}

}  // namespace topolaunch::topology::rankmap_detail
