#include "topolaunch/topology/score.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
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
    // Needless sharing: an idle selectable NIC would serve this rank's GPU at least as well.
    auto idle_as_close = [&](int used) {
      for (int k : profile.selected_nics) {
        if (users[k] != 0) continue;
        if (f.gpu < 0 || !profile.gpu_nic_relation(f.gpu, used)
                              .closer_than(profile.gpu_nic_relation(f.gpu, k))) {
          return true;
        }
      }
      return false;
    };
    bool not_closest = false, shared_needlessly = false;
    int nics = 0;
    for (const std::string& name : a.nics) {
      int k = nic_index(*profile.topology, name);
      if (k < 0) continue;
      ++nics;
      score.max_ranks_per_nic = std::max(score.max_ranks_per_nic, users[k]);
      shared_needlessly = shared_needlessly || (users[k] > 1 && idle_as_close(k));
      if (f.gpu >= 0 && !profile.closest_nics[f.gpu].empty()) {
        const Relation& best = profile.gpu_nic_relation(f.gpu, profile.closest_nics[f.gpu].front());
        if (best.closer_than(profile.gpu_nic_relation(f.gpu, k))) not_closest = true;
      }
    }
    if (nics == 0 && !profile.selected_nics.empty()) score.ranks_without_nic++;
    if (not_closest) score.ranks_nic_not_closest++;
    if (shared_needlessly) score.ranks_nic_shared_needlessly++;
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
        "stride by {} (Megatron order: tensor, data, pipeline)",
        ours.tensor, ours.tensor));
  }
  ProfileCache cache(spec.nics);
  std::map<std::string, const NodeInput*> input_of;
  for (const auto& input : inputs) input_of[input.name] = &input;
  std::map<std::string, int> base_node_of;
  for (std::size_t n = 0; n < base.nodes.size(); ++n)
    base_node_of[base.nodes[n].name] = static_cast<int>(n);
  auto users = [](const RankMap& map, int node, const std::string& nic) {
    int count = 0;
    for (int r : map.nodes[node].rank_ids) {
      if (r < 0) continue;
      const auto& nics = map.ranks[r].nics;
      count += std::find(nics.begin(), nics.end(), nic) != nics.end();
    }
    return count;
  };
  auto gpu_list = [](const RankMap& map, int node) {
    std::string out;
    for (int r : map.nodes[node].rank_ids) {
      if (r < 0) continue;
      const auto& gpus = map.ranks[r].gpus;
      out += (out.empty() ? "" : ",") +
             (gpus.empty() ? std::string("-") : std::to_string(gpus.front()));
    }
    return out;
  };
  // Per node, what differs from the baseline, GPU by GPU; nodes with the same differences are
  // reported once ("n1 +1023").
  std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> groups;
  for (std::size_t n = 0; n < ours.nodes.size(); ++n) {
    const RankMapNode& node = ours.nodes[n];
    auto found = base_node_of.find(node.name);
    auto input = input_of.find(node.name);
    if (found == base_node_of.end() || input == input_of.end()) continue;
    const int bn = found->second;
    const NodeProfile& profile = cache.get(cache.intern(input->second->topology));
    std::vector<std::string> body;
    std::string our_gpus = gpu_list(ours, static_cast<int>(n)), base_gpus = gpu_list(base, bn);
    if (our_gpus != base_gpus) {
      body.push_back(
          fmt::format("local ranks take GPUs {} (bus order inside NVLink domains) where {} "
                      "deals {} (tasks cyclic over sockets)",
                      our_gpus, base.label, base_gpus));
    }
    std::map<int, int> base_rank_of_gpu;
    for (int r : base.nodes[bn].rank_ids) {
      if (r >= 0 && !base.ranks[r].gpus.empty())
        base_rank_of_gpu.emplace(base.ranks[r].gpus.front(), r);
    }
    for (int r : node.rank_ids) {
      if (r < 0) continue;
      const RankAssignment& a = ours.ranks[r];
      if (a.gpus.empty()) continue;
      const int g = a.gpus.front();
      auto other = base_rank_of_gpu.find(g);
      if (other == base_rank_of_gpu.end()) continue;
      const RankAssignment& b = base.ranks[other->second];
      const int numa = profile.gpu_numa[g];
      if (numa >= 0) {
        const CpuSet& local = profile.gpu_numa_cpus[g];
        bool ours_on = local.contains_all(a.cpus) && a.numa == numa;
        bool base_off = !local.contains_all(b.cpus) || b.numa != numa;
        if (ours_on && base_off) {
          body.push_back(
              fmt::format("GPU{} (NUMA {}): cores {} and memory on NUMA {}; {} gives cores "
                          "{} and first-touch memory on NUMA {}",
                          g, numa, a.cpus.to_list(), a.numa, base.label, b.cpus.to_list(), b.numa));
        }
      }
      if (a.nics != b.nics && !a.nics.empty()) {
        const std::string base_nic = b.nics.empty() ? std::string("none") : b.nics.front();
        body.push_back(
            fmt::format("GPU{}: NIC {} ({}, {} rank(s) on it) instead of {} ({}, {} rank(s) on it)",
                        g, join(a.nics), relation_text(profile, g, a.nics.front()),
                        users(ours, static_cast<int>(n), a.nics.front()), base_nic,
                        b.nics.empty() ? "-" : relation_text(profile, g, base_nic),
                        b.nics.empty() ? 0 : users(base, bn, base_nic)));
      }
    }
    if (body.empty()) continue;
    auto same = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& group) { return group.second == body; });
    if (same != groups.end()) {
      same->first.push_back(node.name);
    } else {
      groups.push_back({{node.name}, std::move(body)});
    }
  }
  constexpr std::size_t kMaxLines = 64;
  std::size_t skipped = 0;
  for (const auto& [names, body] : groups) {
    std::string who =
        names.size() == 1 ? names.front() : fmt::format("{} +{}", names.front(), names.size() - 1);
    for (const auto& line : body) {
      if (lines.size() < kMaxLines) {
        lines.push_back(fmt::format("{}: {}", who, line));
      } else {
        ++skipped;
      }
    }
  }
  if (skipped > 0) {
    lines.push_back(fmt::format("... and {} more lines of the same kinds", skipped));
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
