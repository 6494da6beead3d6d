#include "topolaunch/topology/rankmap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "local_plan.hpp"
#include "node_profile.hpp"

namespace topolaunch::topology {

using namespace rankmap_detail;

namespace {

struct PlanKey {
  int profile;
  std::vector<int> gpus;
  CpuSet cpus;
  int local_ranks;
  bool operator==(const PlanKey&) const = default;
};

void add_warning(RankMap& map, std::set<std::string>& seen, const std::string& line) {
  if (seen.insert(line).second) {
    map.warnings.push_back(line);
  }
}

void fill_env(RankAssignment& rank, const RankMap& map, const ResolvedNode& node,
              const NodeProfile& profile, const MappingSpec& spec) {
  const NodeTopology& topo = *profile.topology;
  Environment& env = rank.env;
  std::vector<std::string> ids, busids;
  double pcie_mbps = 0;  // the slowest of the rank's GPUs' host links; 0: one is unknown
  for (std::size_t i = 0; i < rank.gpus.size(); ++i) {
    ids.push_back(node.cuda_ids[rank.gpu_visible_indexes[i]]);
    const Gpu& gpu = topo.gpus[rank.gpus[i]];
    busids.push_back(gpu.busid.to_string());
    const double mbps = known_pcie_mbps(gpu.link);
    pcie_mbps = i == 0 ? mbps : std::min(pcie_mbps, mbps);
  }
  if (!ids.empty()) {
    env["CUDA_VISIBLE_DEVICES"] = join(ids);
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
    env["TOPOLAUNCH_GPU_BUSIDS"] = join(busids);
    // What topolaunch-worker costs an optimizer-state offload at ([train] offload = "auto").
    if (pcie_mbps > 0)
      env["TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S"] = fmt::format("{:.1f}", pcie_mbps / 1000);
  }
  env["RANK"] = std::to_string(rank.rank);
  env["LOCAL_RANK"] = std::to_string(rank.local_rank);
  env["WORLD_SIZE"] = std::to_string(map.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(map.nodes[rank.node].ranks);
  env["GROUP_RANK"] = std::to_string(rank.node);
  env["GROUP_WORLD_SIZE"] = std::to_string(map.nodes.size());
  env["OMP_NUM_THREADS"] = std::to_string(std::max(1, rank.cores));
  env["TOPOLAUNCH_CPUS"] = rank.cpus.to_list();
  if (rank.numa >= 0 && spec.bind_memory) {  // bind_memory = false: report the node, bind nothing
    env["TOPOLAUNCH_NUMA"] = std::to_string(rank.numa);
  }
  env["TOPOLAUNCH_TP_RANK"] = std::to_string(rank.tp);
  env["TOPOLAUNCH_PP_RANK"] = std::to_string(rank.pp);
  env["TOPOLAUNCH_DP_RANK"] = std::to_string(rank.dp);
  env["TOPOLAUNCH_TP_SIZE"] = std::to_string(map.tensor);
  env["TOPOLAUNCH_PP_SIZE"] = std::to_string(map.pipeline);
  env["TOPOLAUNCH_DP_SIZE"] = std::to_string(map.data);
  if (!rank.nics.empty()) {
    env["TOPOLAUNCH_NICS"] = join(rank.nics);
    if (spec.pin_nics) {
      std::vector<std::string> ports;
      for (const std::string& name : rank.nics) {
        const Nic* nic = topo.nic_by_name(name);
        int port = nic && !nic->ports.empty() ? nic->ports.front().number : 1;
        ports.push_back(fmt::format("{}:{}", name, port));
      }
      env["NCCL_IB_HCA"] = "=" + join(ports);  // '=': exact names, not prefixes
      env["UCX_NET_DEVICES"] = join(ports);
    }
  }
}

// Node order of our map: the switch tree's depth-first order for `automatic`, names otherwise.
std::vector<int> node_order(const std::vector<ResolvedNode>& nodes, const MappingSpec& spec,
                            const SwitchTree* tree, RankMap& map, std::set<std::string>& seen) {
  std::vector<int> order(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) order[i] = static_cast<int>(i);
  if (tree == nullptr || spec.policy != MappingPolicy::automatic) {
    return order;
  }
  std::vector<std::string> tree_order = tree->node_order();
  std::vector<std::pair<std::string_view, int>> position;
  position.reserve(tree_order.size());
  for (std::size_t i = 0; i < tree_order.size(); ++i) {
    position.emplace_back(tree_order[i], static_cast<int>(i));
  }
  std::sort(position.begin(), position.end());
  const int missing = static_cast<int>(tree_order.size());
  std::vector<int> key(nodes.size());
  std::vector<std::string> absent;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto it = std::lower_bound(position.begin(), position.end(),
                               std::pair<std::string_view, int>(nodes[i].name, -1));
    if (it != position.end() && it->first == nodes[i].name) {
      key[i] = it->second;
    } else {
      key[i] = missing;
      absent.push_back(nodes[i].name);
    }
  }
  if (!absent.empty()) {
    add_warning(map, seen,
                fmt::format("switch tree {}: {} node(s) not in it (e.g. {}); they go last, by name",
                            tree->origin, absent.size(), absent.front()));
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] < key[b]; });
  map.switch_tree_order = true;
  return order;
}

Result<RankMap> explicit_map(const std::vector<ResolvedNode>& nodes, ProfileCache& cache,
                             const MappingSpec& spec, RankMap map, std::set<std::string>& seen) {
  const std::string where = spec.source.empty() ? std::string("job config") : spec.source;
  auto fail = [&](const ExplicitRank& row, const std::string& what) {
    return make_error(fmt::format("{}:{}: mapping.explicit: rank {}: {}", where, row.source_line,
                                  row.rank, what));
  };
  const int world = static_cast<int>(spec.explicit_ranks.size());
  if (world == 0) {
    return make_error(fmt::format(
        "{}: mapping.explicit: policy \"explicit\" needs [[mapping.explicit]] rows (rank, node, "
        "gpus)",
        where));
  }
  std::vector<const ExplicitRank*> by_rank(static_cast<std::size_t>(world), nullptr);
  for (const ExplicitRank& row : spec.explicit_ranks) {
    if (row.rank < 0 || row.rank >= world) {
      return fail(row, fmt::format("out of range: {} rows give ranks 0..{}", world, world - 1));
    }
    if (by_rank[row.rank] != nullptr) {
      return fail(row,
                  fmt::format("given twice (also on line {})", by_rank[row.rank]->source_line));
    }
    if (row.node < 0 || row.node >= static_cast<int>(nodes.size())) {
      return fail(row,
                  fmt::format("node {} does not exist (the job has {} node(s): 0..{}, by name)",
                              row.node, nodes.size(), nodes.size() - 1));
    }
    if (row.gpus.empty()) {
      return fail(row, "gpus: needs at least one GPU index");
    }
    const ResolvedNode& node = nodes[row.node];
    for (int g : row.gpus) {
      if (!std::binary_search(node.gpus.begin(), node.gpus.end(), g)) {
        return fail(row, fmt::format("gpus: GPU {} is not allocated on node {} ({})", g, row.node,
                                     node.name));
      }
    }
    if (row.cpus && !node.cpus.contains_all(*row.cpus)) {
      return fail(row, fmt::format("cpus: {} are not all allowed on node {} (allowed {})",
                                   row.cpus->to_list(), node.name, node.cpus.to_list()));
    }
    const NodeTopology& topo = *cache.get(node.profile).topology;
    for (const std::string& nic : row.nics) {
      if (topo.nic_by_name(nic) == nullptr) {
        return fail(row, fmt::format("nics: {} is not a NIC of node {}", nic, node.name));
      }
    }
    by_rank[row.rank] = &row;
  }
  // GPU sharing within the limits of ranks_per_gpu.
  std::map<std::pair<int, int>, int> users;
  for (const ExplicitRank* row : by_rank) {
    for (int g : row->gpus) {
      if (++users[{row->node, g}] > spec.ranks_per_gpu && !spec.allow_oversubscribe) {
        return fail(
            *row,
            fmt::format(
                "gpus: GPU {} on node {} already has {} rank(s) (mapping.ranks_per_gpu = {}); "
                "raise mapping.ranks_per_gpu or set mapping.oversubscribe = true",
                g, nodes[row->node].name, spec.ranks_per_gpu, spec.ranks_per_gpu));
      }
    }
  }
  map.world_size = world;
  if (auto status = resolve_layout(spec, world, map.tensor, map.pipeline, map.data); !status) {
    return status.error();
  }
  std::vector<std::vector<int>> ranks_on(nodes.size());
  for (const ExplicitRank* row : by_rank) {
    ranks_on[row->node].push_back(row->rank);
  }
  map.ranks.resize(static_cast<std::size_t>(world));
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    RankMapNode out{nodes[n].name, static_cast<int>(ranks_on[n].size()), ranks_on[n],
                    nodes[n].gpus};
    map.nodes.push_back(std::move(out));
    std::vector<std::vector<int>> gpus_of_rank;
    for (int r : ranks_on[n]) {
      gpus_of_rank.push_back(by_rank[r]->gpus);
    }
    const NodeProfile& profile = cache.get(nodes[n].profile);
    LocalPlan plan = plan_local_ranks(profile, nodes[n], gpus_of_rank);
    for (const auto& w : plan.warnings) add_warning(map, seen, w);
    for (std::size_t l = 0; l < ranks_on[n].size(); ++l) {
      const ExplicitRank& row = *by_rank[ranks_on[n][l]];
      RankAssignment& a = map.ranks[row.rank];
      const LocalRank& lr = plan.ranks[l];
      a.rank = row.rank;
      a.node = static_cast<int>(n);
      a.local_rank = static_cast<int>(l);
      a.gpus = lr.gpus;
      a.gpu_visible_indexes = lr.visible;
      a.cpus = row.cpus ? *row.cpus : lr.cpus;
      if (row.cpus) {
        std::set<int> cores;
        for (const Core& core : profile.topology->cores) {
          if (core.pus.intersects(*row.cpus)) cores.insert(&core - profile.topology->cores.data());
        }
        a.cores = static_cast<int>(cores.size());
      } else {
        a.cores = lr.cores;
      }
      a.numa = lr.numa;
      a.tp = row.rank % map.tensor;
      a.dp = (row.rank / map.tensor) % map.data;
      a.pp = row.rank / (map.tensor * map.data);
      if (!row.nics.empty()) {
        a.nics = row.nics;
      } else {
        for (int k : lr.nics) a.nics.push_back(profile.topology->nics[k].name);
      }
    }
  }
  return map;
}

}  // namespace

Result<RankMap> compute_rank_map(const std::vector<NodeInput>& inputs, const MappingSpec& spec,
                                 const SwitchTree* tree, const RankMapOptions& options) {
  auto wants_env = [&](const std::string& node) {
    return options.environment &&
           (options.environment_node.empty() || options.environment_node == node);
  };
  if (auto status = validate_spec(spec); !status) {
    return status.error();
  }
  ProfileCache cache(spec.nics);
  auto resolved = resolve_nodes(inputs, spec, cache);
  if (!resolved) {
    return resolved.error();
  }
  const std::vector<ResolvedNode>& nodes = *resolved;
  RankMap map;
  map.label = "topolaunch";
  map.policy = spec.policy;
  std::set<std::string> seen;

  if (spec.policy == MappingPolicy::explicit_table) {
    auto out = explicit_map(nodes, cache, spec, std::move(map), seen);
    if (!out) return out.error();
    for (auto& rank : out->ranks) {
      if (!wants_env(nodes[rank.node].name)) continue;
      fill_env(rank, *out, nodes[rank.node], cache.get(nodes[rank.node].profile), spec);
    }
    return out;
  }

  std::vector<int> order = node_order(nodes, spec, tree, map, seen);
  int world = 0;
  for (const auto& node : nodes) world += node.local_ranks;
  map.world_size = world;
  if (auto status = resolve_layout(spec, world, map.tensor, map.pipeline, map.data); !status) {
    return status.error();
  }
  if (map.tensor > 1 && spec.policy == MappingPolicy::cyclic) {
    return make_error(fmt::format(
        "mapping.policy: \"cyclic\" deals consecutive ranks to different nodes, so tensor groups "
        "(tensor={}) would leave their NVLink domain; use policy \"auto\" or \"block\"",
        map.tensor));
  }

  // Per node: which GPUs each local rank drives (NVLink domain by domain, bus order inside).
  std::vector<PlanKey> keys;
  std::vector<LocalPlan> plans;
  std::vector<int> plan_of(nodes.size());
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const ResolvedNode& node = nodes[n];
    PlanKey key{node.profile, node.gpus, node.cpus, node.local_ranks};
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it != keys.end()) {
      plan_of[n] = static_cast<int>(it - keys.begin());
      continue;
    }
    const NodeProfile& profile = cache.get(node.profile);
    std::vector<int> walk = gpu_walk_order(profile, node.gpus);
    const int n_gpu = static_cast<int>(walk.size());
    std::vector<std::vector<int>> gpus_of_rank(static_cast<std::size_t>(node.local_ranks));
    for (int l = 0; l < node.local_ranks && n_gpu > 0; ++l) {
      if (spec.gpus_per_rank > 1) {
        for (int j = 0; j < spec.gpus_per_rank; ++j) {
          gpus_of_rank[l].push_back(walk[(l * spec.gpus_per_rank + j) % n_gpu]);
        }
        std::sort(gpus_of_rank[l].begin(), gpus_of_rank[l].end());
      } else {
        gpus_of_rank[l].push_back(walk[(l / spec.ranks_per_gpu) % n_gpu]);
      }
    }
    // Tensor groups are consecutive local ranks: they must fit the node and one NVLink domain.
    if (map.tensor > 1) {
      int largest = 0;  // ranks in the largest allowed NVLink domain
      std::map<int, int> domain_gpus;
      for (int g : node.gpus) domain_gpus[profile.nvlink_domain[g]]++;
      for (auto [d, count] : domain_gpus) {
        largest = std::max(largest, spec.gpus_per_rank > 1 ? count / spec.gpus_per_rank
                                                           : count * spec.ranks_per_gpu);
      }
      bool any_nvlink = profile.nvlink_domain_size.size() > 1 || !profile.topology->nvlinks.empty();
      const char* domain_word = any_nvlink ? "one NVLink domain" : "one node (no NVLink)";
      if (map.tensor > largest || node.local_ranks % map.tensor != 0) {
        int suggest = 1;
        for (int t = 1; t <= largest; ++t) {
          if (node.local_ranks % t == 0 && world % t == 0) suggest = t;
        }
        return make_error(fmt::format(
            "mapping.tensor: tensor={} needs {} ranks in {}, but node {} has at most {} there "
            "({} local ranks); use tensor <= {} (e.g. tensor={}, data=auto){}",
            map.tensor, map.tensor, domain_word, node.name, largest, node.local_ranks, suggest,
            suggest,
            spec.ranks_per_gpu == 1 && spec.gpus_per_rank == 1
                ? fmt::format(", or ranks_per_gpu={} so that {} ranks share the domain's GPUs",
                              (map.tensor + largest - 1) / std::max(1, largest), map.tensor)
                : std::string()));
      }
      for (int start = 0; start < node.local_ranks; start += map.tensor) {
        int domain = -1;
        for (int l = start; l < start + map.tensor; ++l) {
          for (int g : gpus_of_rank[l]) {
            if (domain == -1) domain = profile.nvlink_domain[g];
            if (profile.nvlink_domain[g] != domain) {
              return make_error(fmt::format(
                  "mapping.tensor: tensor={}: local ranks {}..{} of node {} would span NVLink "
                  "domains (the allocated GPUs split unevenly across domains); use tensor={} or "
                  "allocate whole domains",
                  map.tensor, start, start + map.tensor - 1, node.name, largest));
            }
          }
        }
      }
    }
    keys.push_back(std::move(key));
    plans.push_back(plan_local_ranks(profile, node, gpus_of_rank));
    plan_of[n] = static_cast<int>(plans.size() - 1);
  }

  // Global rank numbering.
  map.nodes.resize(nodes.size());
  map.ranks.resize(static_cast<std::size_t>(world));
  std::vector<std::pair<int, int>> placement;  // rank -> (position in order, local rank)
  placement.reserve(static_cast<std::size_t>(world));
  if (spec.policy == MappingPolicy::cyclic) {
    std::vector<int> next(nodes.size(), 0);
    bool progress = true;
    while (progress) {
      progress = false;
      for (std::size_t p = 0; p < order.size(); ++p) {
        if (next[p] < nodes[order[p]].local_ranks) {
          placement.emplace_back(static_cast<int>(p), next[p]++);
          progress = true;
        }
      }
    }
  } else {
    for (std::size_t p = 0; p < order.size(); ++p) {
      for (int l = 0; l < nodes[order[p]].local_ranks; ++l) {
        placement.emplace_back(static_cast<int>(p), l);
      }
    }
  }
  for (std::size_t p = 0; p < order.size(); ++p) {
    const ResolvedNode& node = nodes[order[p]];
    RankMapNode& out = map.nodes[p];
    out.name = node.name;
    out.ranks = node.local_ranks;
    out.rank_ids.assign(static_cast<std::size_t>(node.local_ranks), -1);
    out.allowed_gpus = node.gpus;
    for (const auto& w : plans[plan_of[order[p]]].warnings) add_warning(map, seen, w);
  }
  for (int r = 0; r < world; ++r) {
    auto [p, l] = placement[r];
    const ResolvedNode& node = nodes[order[p]];
    const NodeProfile& profile = cache.get(node.profile);
    const LocalRank& lr = plans[plan_of[order[p]]].ranks[l];
    RankAssignment& a = map.ranks[r];
    a.rank = r;
    a.node = p;
    a.local_rank = l;
    a.gpus = lr.gpus;
    a.gpu_visible_indexes = lr.visible;
    a.cpus = lr.cpus;
    a.cores = lr.cores;
    a.numa = lr.numa;
    for (int k : lr.nics) a.nics.push_back(profile.topology->nics[k].name);
    // Megatron's default order: tensor fastest, then data, then pipeline.
    a.tp = r % map.tensor;
    a.dp = (r / map.tensor) % map.data;
    a.pp = r / (map.tensor * map.data);
    map.nodes[p].rank_ids[l] = r;
  }
  for (auto& rank : map.ranks) {
    const ResolvedNode& node = nodes[order[rank.node]];
    if (!wants_env(node.name)) continue;
    fill_env(rank, map, node, cache.get(node.profile), spec);
  }
  return map;
}

}  // namespace topolaunch::topology
