#include "topolaunch/topology/score.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "local_plan.hpp"
#include "node_profile.hpp"

namespace topolaunch::topology {

using namespace rankmap_detail;

namespace {

// Without an RDMA NIC, inter-node traffic is assumed to go over 10 GbE sockets.
constexpr double kNoNicMbps = 1250.0;

struct RankFacts {
  const NodeProfile* profile = nullptr;
  int node = -1;
  int gpu = -1;                  // first GPU, -1 none
  double nic_mbps = kNoNicMbps;  // this rank's share of its NIC(s) towards other nodes
};

struct Prepared {
  std::vector<RankFacts> ranks;
  std::vector<const std::vector<int>*> switch_path;  // per map node
  std::vector<std::vector<int>> nic_users;           // per map node, per NIC index
};

bool better_or_equal_high(double a, double b) { return a >= b * (1.0 - 1e-9); }

}  // namespace

std::string first_worse_metric(const MapScore& a, const MapScore& b) {
  if (a.tp_rings > 0 && b.tp_rings > 0) {
    if (!better_or_equal_high(a.tp_ring_min_mbps, b.tp_ring_min_mbps)) return "tp_ring_min_mbps";
    if (!better_or_equal_high(a.tp_ring_mean_mbps, b.tp_ring_mean_mbps)) return "tp_ring_mean_mbps";
  }
  if (a.dp_rings > 0 && b.dp_rings > 0) {
    if (!better_or_equal_high(a.dp_ring_min_mbps, b.dp_ring_min_mbps)) return "dp_ring_min_mbps";
    if (!better_or_equal_high(a.dp_ring_mean_mbps, b.dp_ring_mean_mbps)) return "dp_ring_mean_mbps";
  }
  if (a.ranks_cpus_off_numa > b.ranks_cpus_off_numa) return "ranks_cpus_off_numa";
  if (a.ranks_memory_off_numa > b.ranks_memory_off_numa) return "ranks_memory_off_numa";
  if (a.ranks_nic_not_closest > b.ranks_nic_not_closest) return "ranks_nic_not_closest";
  if (a.ranks_nic_shared_needlessly > b.ranks_nic_shared_needlessly)
    return "ranks_nic_shared_needlessly";
  if (a.max_ranks_per_nic > b.max_ranks_per_nic) return "max_ranks_per_nic";
  if (a.ranks_without_nic > b.ranks_without_nic) return "ranks_without_nic";
  if (a.switch_hops > b.switch_hops) return "switch_hops";
  return "";
}

namespace {

int nic_index(const NodeTopology& topo, const std::string& name) {
  for (std::size_t k = 0; k < topo.nics.size(); ++k) {
    if (topo.nics[k].name == name) return static_cast<int>(k);
  }
  return -1;
}

Result<Prepared> prepare(const RankMap& map, const std::vector<NodeInput>& inputs,
                         ProfileCache& cache, const SwitchDistance& distance) {
  Prepared out;
  std::vector<const NodeInput*> by_name;
  for (const auto& input : inputs) by_name.push_back(&input);
  std::sort(by_name.begin(), by_name.end(),
            [](const NodeInput* a, const NodeInput* b) { return a->name < b->name; });
  std::vector<const NodeProfile*> node_profile;
  for (const RankMapNode& node : map.nodes) {
    auto it =
        std::lower_bound(by_name.begin(), by_name.end(), node.name,
                         [](const NodeInput* a, const std::string& key) { return a->name < key; });
    if (it == by_name.end() || (*it)->name != node.name || !(*it)->topology) {
      return make_error(fmt::format("score: node {} of the map has no topology", node.name));
    }
    node_profile.push_back(&cache.get(cache.intern((*it)->topology)));
    out.switch_path.push_back(distance.path(node.name));
    out.nic_users.emplace_back(node_profile.back()->nic_count, 0);
  }
  out.ranks.resize(map.ranks.size());
  std::vector<std::vector<int>> rank_nics(map.ranks.size());
  for (std::size_t r = 0; r < map.ranks.size(); ++r) {
    const RankAssignment& a = map.ranks[r];
    RankFacts& f = out.ranks[r];
    f.node = a.node;
    f.profile = node_profile[a.node];
    f.gpu = a.gpus.empty() ? -1 : a.gpus.front();
    for (const std::string& name : a.nics) {
      int k = nic_index(*f.profile->topology, name);
      if (k >= 0) {
        rank_nics[r].push_back(k);
        out.nic_users[a.node][k]++;
      }
    }
  }
  for (std::size_t r = 0; r < map.ranks.size(); ++r) {
    RankFacts& f = out.ranks[r];
    if (rank_nics[r].empty()) continue;
    double total = 0.0;
    for (int k : rank_nics[r]) {
      double path = f.gpu >= 0 ? f.profile->gpu_nic_mbps(f.gpu, k) : f.profile->nic_mbps[k];
      total += path / out.nic_users[f.node][k];
    }
    f.nic_mbps = total;
  }
  return out;
}

// Bandwidth of one ring edge; nullopt when both ranks drive the same GPU (no link used).
std::optional<double> edge_mbps(const Prepared& p, int a, int b) {
  const RankFacts& x = p.ranks[a];
  const RankFacts& y = p.ranks[b];
  if (x.node == y.node) {
    if (x.gpu < 0 || y.gpu < 0 || x.gpu == y.gpu) return std::nullopt;
    return x.profile->gpu_gpu(x.gpu, y.gpu);
  }
  return std::min(x.nic_mbps, y.nic_mbps);
}

struct RingStats {
  int rings = 0;
  double min_mbps = 0.0;
  double sum_mbps = 0.0;
  long hops = 0;
};

void score_ring(const Prepared& p, const std::vector<int>& members, RingStats& stats) {
  const std::size_t n = members.size();
  if (n < 2) return;
  const std::size_t edges = n == 2 ? 1 : n;
  double bottleneck = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < edges; ++i) {
    int a = members[i], b = members[(i + 1) % n];
    if (auto mbps = edge_mbps(p, a, b)) bottleneck = std::min(bottleneck, *mbps);
    int na = p.ranks[a].node, nb = p.ranks[b].node;
    if (na != nb) stats.hops += SwitchDistance::hops_between(p.switch_path[na], p.switch_path[nb]);
  }
  if (std::isinf(bottleneck)) return;
  stats.min_mbps = stats.rings == 0 ? bottleneck : std::min(stats.min_mbps, bottleneck);
  stats.sum_mbps += bottleneck;
  stats.rings++;
}

}  // namespace

Result<MapScore> score_rank_map(const RankMap& map, const std::vector<NodeInput>& nodes,
                                const MappingSpec& spec, const SwitchTree* tree) {
  ProfileCache cache(spec.nics);
  SwitchDistance distance = tree ? SwitchDistance(*tree) : SwitchDistance();
  auto prepared = prepare(map, nodes, cache, distance);
  if (!prepared) return prepared.error();
  const Prepared& p = *prepared;
  MapScore score;
  score.label = map.label;
  for (std::size_t r = 0; r < map.ranks.size(); ++r) {
    const RankAssignment& a = map.ranks[r];
    const RankFacts& f = p.ranks[r];
    const NodeProfile& profile = *f.profile;
    if (f.gpu >= 0) {
      int numa = profile.gpu_numa[f.gpu];
      if (numa >= 0) {
        const CpuSet& local = profile.gpu_numa_cpus[f.gpu];
        if (!local.empty() && !local.contains_all(a.cpus)) score.ranks_cpus_off_numa++;
        if (a.numa != numa) score.ranks_memory_off_numa++;
      }
    }
    const auto& users = p.nic_users[f.node];
    bool has_idle = false;
    for (int k : profile.selected_nics) has_idle = has_idle || users[k] == 0;
    bool not_closest = false, shared = false;
    int nics = 0;
    for (const std::string& name : a.nics) {
      int k = nic_index(*profile.topology, name);
      if (k < 0) continue;
      ++nics;
      score.max_ranks_per_nic = std::max(score.max_ranks_per_nic, users[k]);
      shared = shared || users[k] > 1;
      if (f.gpu >= 0 && !profile.closest_nics[f.gpu].empty()) {
        const Relation& best = profile.gpu_nic_relation(f.gpu, profile.closest_nics[f.gpu].front());
        if (best.closer_than(profile.gpu_nic_relation(f.gpu, k))) not_closest = true;
      }
    }
    if (nics == 0 && !profile.selected_nics.empty()) score.ranks_without_nic++;
    if (not_closest) score.ranks_nic_not_closest++;
    if (shared && has_idle) score.ranks_nic_shared_needlessly++;
  }
  // Rings: tensor groups are consecutive ranks; data-parallel rings stride by `tensor`.
  const int tp = map.tensor, dp = map.data, pp = map.pipeline;
  RingStats tp_stats, dp_stats;
  std::vector<int> members;
  if (tp > 1) {
    for (int base = 0; base < map.world_size; base += tp) {
      members.clear();
      for (int i = 0; i < tp; ++i) members.push_back(base + i);
      score_ring(p, members, tp_stats);
    }
  }
  if (dp > 1) {
    for (int stage = 0; stage < pp; ++stage) {
      for (int t = 0; t < tp; ++t) {
        members.clear();
        for (int d = 0; d < dp; ++d) members.push_back(t + tp * (d + dp * stage));
        score_ring(p, members, dp_stats);
      }
    }
  }
  score.tp_rings = tp_stats.rings;
  score.tp_ring_min_mbps = tp_stats.min_mbps;
  score.tp_ring_mean_mbps = tp_stats.rings ? tp_stats.sum_mbps / tp_stats.rings : 0.0;
  score.dp_rings = dp_stats.rings;
  score.dp_ring_min_mbps = dp_stats.min_mbps;
  score.dp_ring_mean_mbps = dp_stats.rings ? dp_stats.sum_mbps / dp_stats.rings : 0.0;
  score.switch_hops = tp_stats.hops + dp_stats.hops;
  return score;
}

namespace {

std::string relation_text(const NodeProfile& profile, int gpu, const std::string& nic_name) {
  int k = nic_index(*profile.topology, nic_name);
  if (k < 0 || gpu < 0) return "?";
  return profile.gpu_nic_relation(gpu, k).to_string();
}

void explain(const MappingReport& report, const std::vector<NodeInput>& inputs,
             const MappingSpec& spec, std::vector<std::string>& lines) {
  const RankMap& ours = report.map;
  const RankMap& base = report.baselines.front();
  const MapScore& our_score = report.score;
  const MapScore& base_score = report.baseline_scores.front();
  if (ours.switch_tree_order && our_score.switch_hops != base_score.switch_hops) {
    lines.push_back(
        fmt::format("node order follows the switch tree: rings cross {} switch hops instead of {} "
                    "in name order",
                    our_score.switch_hops, base_score.switch_hops));
  }
  if (ours.tensor > 1) {
    lines.push_back(fmt::format(
        "tensor groups of {} are consecutive ranks inside one NVLink domain; data-parallel rings "
        "stride by {} (Megatron order tensor, data, pipeline)",
        ours.tensor, ours.tensor));
  }
  ProfileCache cache(spec.nics);
  std::vector<const NodeInput*> by_name;
  for (const auto& input : inputs) by_name.push_back(&input);
  std::sort(by_name.begin(), by_name.end(),
            [](const NodeInput* a, const NodeInput* b) { return a->name < b->name; });
  auto profile_of = [&](const std::string& name) -> const NodeProfile& {
    auto it =
        std::lower_bound(by_name.begin(), by_name.end(), name,
                         [](const NodeInput* a, const std::string& key) { return a->name < key; });
    return cache.get(cache.intern((*it)->topology));
  };
  // NIC users per (map, node, nic) for the "shared by" notes.
  auto users = [](const RankMap& map, int node, const std::string& nic) {
    int count = 0;
    for (int r : map.nodes[node].rank_ids) {
      if (r < 0) continue;
      const auto& nics = map.ranks[r].nics;
      count += std::find(nics.begin(), nics.end(), nic) != nics.end();
    }
    return count;
  };
  constexpr std::size_t kMaxLines = 64;
  std::size_t skipped = 0;
  auto emit = [&](std::string line) {
    if (lines.size() < kMaxLines) {
      lines.push_back(std::move(line));
    } else {
      ++skipped;
    }
  };
  for (std::size_t r = 0; r < ours.ranks.size() && r < base.ranks.size(); ++r) {
    const RankAssignment& a = ours.ranks[r];
    const RankAssignment& b = base.ranks[r];
    const std::string& node_name = ours.nodes[a.node].name;
    const NodeProfile& profile = profile_of(node_name);
    const int g = a.gpus.empty() ? -1 : a.gpus.front();
    const std::string where = fmt::format("rank {} ({} local {})", r, node_name, a.local_rank);
    if (ours.nodes[a.node].name != base.nodes[b.node].name) {
      emit(fmt::format("{}: on {} instead of {} (switch-tree order)", where, node_name,
                       base.nodes[b.node].name));
      continue;
    }
    if (a.gpus != b.gpus && g >= 0 && !b.gpus.empty()) {
      emit(
          fmt::format("{}: GPU{} instead of GPU{}: local ranks follow bus order inside NVLink "
                      "domains, not the socket round-robin of block:cyclic",
                      where, g, b.gpus.front()));
    }
    if (g >= 0 && profile.gpu_numa[g] >= 0 && a.cpus != b.cpus) {
      int numa = profile.gpu_numa[g];
      CpuSet local = profile.numa_cpus(numa);
      int bg = b.gpus.empty() ? -1 : b.gpus.front();
      int bnuma = bg >= 0 ? profile.gpu_numa[bg] : -1;
      bool base_off = bnuma >= 0 && !profile.numa_cpus(bnuma).contains_all(b.cpus);
      if (local.contains_all(a.cpus) && base_off) {
        emit(fmt::format(
            "{}: cores {} on NUMA {} next to GPU{}; slurm's binding gives {} (NUMA {}), "
            "off its GPU's NUMA {}",
            where, a.cpus.to_list(), numa, g, b.cpus.to_list(), b.numa, bnuma));
      }
    }
    if (a.nics != b.nics && !a.nics.empty()) {
      std::string base_nic = b.nics.empty() ? std::string("none") : b.nics.front();
      int bg = b.gpus.empty() ? -1 : b.gpus.front();
      emit(fmt::format(
          "{}: NIC {} ({} to GPU{}, used by {} rank(s)) instead of {} ({}{}, used by {})", where,
          join(a.nics), relation_text(profile, g, a.nics.front()), g,
          users(ours, a.node, a.nics.front()), base_nic,
          b.nics.empty() ? "-" : relation_text(profile, bg, base_nic),
          bg >= 0 ? fmt::format(" to GPU{}", bg) : std::string(),
          b.nics.empty() ? 0 : users(base, b.node, base_nic)));
    }
  }
  if (skipped > 0) {
    lines.push_back(fmt::format("... and {} more differences of the same kinds", skipped));
  }
}

}  // namespace

Result<MappingReport> plan_rank_map(const std::vector<NodeInput>& nodes, const MappingSpec& spec,
                                    const SwitchTree* tree) {
  auto ours = compute_rank_map(nodes, spec, tree);
  if (!ours) return ours.error();
  MappingReport report;
  report.map = std::move(*ours);
  auto score = score_rank_map(report.map, nodes, spec, tree);
  if (!score) return score.error();
  report.score = std::move(*score);
  for (auto* make : {&slurm_block_closest_map, &round_robin_map}) {
    auto baseline = make(nodes, spec);
    if (!baseline) return baseline.error();
    auto baseline_score = score_rank_map(*baseline, nodes, spec, tree);
    if (!baseline_score) return baseline_score.error();
    report.baselines.push_back(std::move(*baseline));
    report.baseline_scores.push_back(std::move(*baseline_score));
  }
  explain(report, nodes, spec, report.explanation);
  return report;
}

namespace {

nlohmann::ordered_json score_json(const MapScore& s) {
  nlohmann::ordered_json j;
  j["label"] = s.label;
  j["tp_rings"] = s.tp_rings;
  j["tp_ring_min_mbps"] = std::round(s.tp_ring_min_mbps);
  j["tp_ring_mean_mbps"] = std::round(s.tp_ring_mean_mbps);
  j["dp_rings"] = s.dp_rings;
  j["dp_ring_min_mbps"] = std::round(s.dp_ring_min_mbps);
  j["dp_ring_mean_mbps"] = std::round(s.dp_ring_mean_mbps);
  j["ranks_cpus_off_numa"] = s.ranks_cpus_off_numa;
  j["ranks_memory_off_numa"] = s.ranks_memory_off_numa;
  j["ranks_nic_not_closest"] = s.ranks_nic_not_closest;
  j["ranks_nic_shared_needlessly"] = s.ranks_nic_shared_needlessly;
  j["max_ranks_per_nic"] = s.max_ranks_per_nic;
  j["ranks_without_nic"] = s.ranks_without_nic;
  j["switch_hops"] = s.switch_hops;
  return j;
}

}  // namespace

std::string to_json(const MapScore& score) { return score_json(score).dump(); }

std::string to_json(const MappingReport& report, bool pretty) {
  nlohmann::ordered_json j;
  j["map"] = nlohmann::ordered_json::parse(to_json(report.map, false));
  nlohmann::ordered_json scores = nlohmann::ordered_json::array();
  scores.push_back(score_json(report.score));
  for (const auto& s : report.baseline_scores) scores.push_back(score_json(s));
  j["scores"] = scores;
  j["explanation"] = report.explanation;
  return pretty ? j.dump(2) : j.dump();
}

}  // namespace topolaunch::topology
