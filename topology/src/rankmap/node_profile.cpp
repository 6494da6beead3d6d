#include "node_profile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace topolaunch::topology::rankmap_detail {

namespace {

bool same_hardware(const NodeTopology& a, const NodeTopology& b) {
  return a.packages == b.packages && a.numa_nodes == b.numa_nodes && a.cores == b.cores &&
         a.allowed_cpus == b.allowed_cpus && a.gpus == b.gpus && a.nics == b.nics &&
         a.nvswitches == b.nvswitches && a.nvlinks == b.nvlinks &&
         a.nvlink_per_link_mbps == b.nvlink_per_link_mbps && a.locality_known == b.locality_known;
}

bool nic_selectable(const Nic& nic, const NicFilter& filter) {
  return nic.has_driver && !nic.name.empty() && nic.role == NicRole::compute &&
         filter.selects(nic.name);
}

std::unique_ptr<NodeProfile> build_profile(std::shared_ptr<const NodeTopology> topology,
                                           const NicFilter& filter) {
  auto profile = std::make_unique<NodeProfile>();
  const NodeTopology& topo = *topology;
  profile->topology = std::move(topology);
  const int n_gpu = static_cast<int>(topo.gpus.size());
  const int n_nic = static_cast<int>(topo.nics.size());
  profile->gpu_count = n_gpu;
  profile->nic_count = n_nic;
  for (const Core& core : topo.cores) {
    profile->all_pus = profile->all_pus | core.pus;
    profile->core_numa.push_back(core.numa);
    profile->core_package.push_back(core.package);
  }
  profile->usable_pus =
      topo.allowed_cpus.empty() ? profile->all_pus : topo.allowed_cpus & profile->all_pus;
  if (profile->usable_pus.empty()) {
    profile->usable_pus = topo.allowed_cpus;
  }
  for (const Gpu& gpu : topo.gpus) {
    int numa = topo.locality_known ? gpu.numa : -1;
    profile->gpu_numa.push_back(numa);
    profile->gpu_cpus.push_back(topo.locality_known ? gpu.cpus : CpuSet{});
    int package = -1;
    CpuSet probe =
        gpu.cpus.empty() && numa >= 0 && topo.numa(numa) ? topo.numa(numa)->cpus : gpu.cpus;
    if (topo.locality_known) {
      for (const Package& pkg : topo.packages) {
        if (!probe.empty() && pkg.cpus.contains(probe.first())) {
          package = pkg.os_index;
          break;
        }
      }
    }
    profile->gpu_package.push_back(package);
    const NumaNode* host = numa >= 0 ? topo.numa(numa) : nullptr;
    profile->gpu_numa_cpus.push_back(host ? host->cpus : CpuSet{});
    profile->gpu_pcie_mbps.push_back(pcie_mbps(gpu.link));
  }
  // NVLink domains: connected components of the NVLink graph; without NVLink data the whole node
  // is one domain (tensor groups then only have to stay on the node).
  profile->nvlink_domain.assign(static_cast<std::size_t>(n_gpu), -1);
  bool any_link = false;
  for (const auto& row : topo.nvlinks) {
    for (int links : row) {
      any_link = any_link || links > 0;
    }
  }
  int domains = 0;
  for (int g = 0; g < n_gpu; ++g) {
    if (profile->nvlink_domain[g] != -1) {
      continue;
    }
    int id = any_link ? domains++ : 0;
    if (!any_link) {
      domains = 1;
    }
    std::vector<int> stack{g};
    profile->nvlink_domain[g] = id;
    while (!stack.empty()) {
      int current = stack.back();
      stack.pop_back();
      for (int other = 0; other < n_gpu; ++other) {
        bool linked =
            !any_link || (static_cast<std::size_t>(current) < topo.nvlinks.size() &&
                          static_cast<std::size_t>(other) < topo.nvlinks[current].size() &&
                          topo.nvlinks[current][other] > 0);
        if (linked && profile->nvlink_domain[other] == -1) {
          profile->nvlink_domain[other] = id;
          stack.push_back(other);
        }
      }
    }
  }
  profile->nvlink_domain_size.assign(static_cast<std::size_t>(domains), 0);
  for (int d : profile->nvlink_domain) {
    profile->nvlink_domain_size[d]++;
  }
  const double per_link = topo.nvlink_per_link_mbps > 0 ? topo.nvlink_per_link_mbps : 25000.0;
  profile->gpu_gpu_mbps.assign(static_cast<std::size_t>(n_gpu * n_gpu), 0.0);
  for (int a = 0; a < n_gpu; ++a) {
    for (int b = 0; b < n_gpu; ++b) {
      double mbps = 0.0;
      if (a != b) {
        int links = static_cast<std::size_t>(a) < topo.nvlinks.size() &&
                            static_cast<std::size_t>(b) < topo.nvlinks[a].size()
                        ? topo.nvlinks[a][b]
                        : 0;
        if (links > 0) {
          mbps = links * per_link;
        } else {
          Relation rel = pcie_relation(topo, {DeviceRef::Kind::gpu, a}, {DeviceRef::Kind::gpu, b});
          mbps = std::min(profile->gpu_pcie_mbps[a], profile->gpu_pcie_mbps[b]) *
                 path_factor(rel.kind);
        }
      }
      profile->gpu_gpu_mbps[static_cast<std::size_t>(a * n_gpu + b)] = mbps;
    }
  }
  for (const Nic& nic : topo.nics) {
    profile->nic_selected.push_back(nic_selectable(nic, filter));
    double rate = 0.0;
    for (const NicPort& port : nic.ports) {
      rate = std::max(rate, port.rate_gbps);
    }
    profile->nic_mbps.push_back(rate > 0.0 ? rate * 125.0 : pcie_mbps(nic.link));
  }
  for (int k = 0; k < n_nic; ++k) {
    if (profile->nic_selected[k]) {
      profile->selected_nics.push_back(k);
    }
  }
  profile->gpu_nic.reserve(static_cast<std::size_t>(n_gpu * n_nic));
  for (int g = 0; g < n_gpu; ++g) {
    for (int k = 0; k < n_nic; ++k) {
      profile->gpu_nic.push_back(
          pcie_relation(topo, {DeviceRef::Kind::gpu, g}, {DeviceRef::Kind::nic, k}));
    }
  }
  profile->closest_nics.resize(static_cast<std::size_t>(n_gpu));
  for (int g = 0; g < n_gpu; ++g) {
    const Relation* best = nullptr;
    for (int k : profile->selected_nics) {
      const Relation& rel = profile->gpu_nic_relation(g, k);
      if (best == nullptr || rel.closer_than(*best)) {
        best = &rel;
      }
    }
    for (int k : profile->selected_nics) {
      const Relation& rel = profile->gpu_nic_relation(g, k);
      if (!best->closer_than(rel) && !rel.closer_than(*best)) {
        profile->closest_nics[g].push_back(k);
      }
    }
  }
  return profile;
}

std::string join_ints(const std::vector<int>& values) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    out += (i ? "," : "") + std::to_string(values[i]);
  }
  return out;
}

}  // namespace

double known_pcie_mbps(const PcieLink& link) {
  // Idle GPUs train down their link, so the capability (max) is the better model of a transfer.
  int gen = link.max_gen > 0 ? link.max_gen : link.gen;
  int width = link.max_width > 0 ? link.max_width : link.width;
  static constexpr double per_lane_mbps[] = {0, 250, 500, 985, 1969, 3938, 7563};
  if (gen >= 1 && gen <= 6 && width > 0) {
    return per_lane_mbps[gen] * width;
  }
  return link.speed_gbytes_per_s > 0.0 ? link.speed_gbytes_per_s * 1000.0 : 0.0;
}

double pcie_mbps(const PcieLink& link) {
  const double known = known_pcie_mbps(link);
  return known > 0.0 ? known : 985.0 * 16;  // unknown: assume Gen3 x16
}

double path_factor(RelationKind kind) {
  switch (kind) {
    case RelationKind::X:
    case RelationKind::NV:
    case RelationKind::PIX:
    case RelationKind::PXB:
      return 1.0;
    case RelationKind::PHB:
      return 0.9;
    case RelationKind::NODE:
      return 0.8;
    case RelationKind::SYS:
      return 0.5;
  }
  return 0.5;
}

double NodeProfile::gpu_nic_mbps(int gpu, int nic) const {
  return std::min(nic_mbps[nic], gpu_pcie_mbps[gpu] * path_factor(gpu_nic_relation(gpu, nic).kind));
}

CpuSet NodeProfile::numa_cpus(int numa) const {
  const NumaNode* node = topology->numa(numa);
  return node ? node->cpus : CpuSet{};
}

int NodeProfile::numa_of_pu(int pu) const {
  for (const NumaNode& node : topology->numa_nodes) {
    if (!node.gpu_memory && node.cpus.contains(pu)) {
      return node.os_index;
    }
  }
  return -1;
}

int ProfileCache::intern(const std::shared_ptr<const NodeTopology>& topology) {
  for (std::size_t i = 0; i < profiles_.size(); ++i) {
    if (profiles_[i]->topology == topology) {
      return static_cast<int>(i);
    }
  }
  for (std::size_t i = 0; i < profiles_.size(); ++i) {
    if (same_hardware(*profiles_[i]->topology, *topology)) {
      return static_cast<int>(i);
    }
  }
  profiles_.push_back(build_profile(topology, filter_));
  return static_cast<int>(profiles_.size() - 1);
}

Status validate_spec(const MappingSpec& spec) {
  auto bad = [](const char* key, int value, const char* want) {
    return make_error(fmt::format("mapping.{}: {} is out of range ({})", key, value, want));
  };
  if (spec.ranks_per_node < 0)
    return bad("ranks_per_node", spec.ranks_per_node, "0 = derive from the GPUs, or >= 1");
  if (spec.ranks_per_gpu < 1) return bad("ranks_per_gpu", spec.ranks_per_gpu, ">= 1");
  if (spec.gpus_per_rank < 1) return bad("gpus_per_rank", spec.gpus_per_rank, ">= 1");
  if (spec.tensor < 1) return bad("tensor", spec.tensor, ">= 1");
  if (spec.pipeline < 1) return bad("pipeline", spec.pipeline, ">= 1");
  if (spec.data < 0) return bad("data", spec.data, "0 = auto, or >= 1");
  if (spec.ranks_per_gpu > 1 && spec.gpus_per_rank > 1) {
    return make_error(fmt::format(
        "mapping: ranks_per_gpu={} and gpus_per_rank={} cannot both be above 1 (pick one)",
        spec.ranks_per_gpu, spec.gpus_per_rank));
  }
  return ok_status();
}

Result<std::vector<ResolvedNode>> resolve_nodes(const std::vector<NodeInput>& inputs,
                                                const MappingSpec& spec, ProfileCache& cache) {
  if (inputs.empty()) {
    return make_error("rank map: no nodes (give at least one topology)");
  }
  std::vector<const NodeInput*> sorted;
  sorted.reserve(inputs.size());
  for (const NodeInput& input : inputs) {
    if (!input.topology) {
      return make_error(fmt::format("node {}: no topology", input.name));
    }
    sorted.push_back(&input);
  }
  std::sort(sorted.begin(), sorted.end(), [](const NodeInput* a, const NodeInput* b) {
    return natural_less(a->name, b->name) || (!natural_less(b->name, a->name) && a->name < b->name);
  });
  std::vector<ResolvedNode> nodes;
  nodes.reserve(sorted.size());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const NodeInput& input = *sorted[i];
    if (i > 0 && sorted[i - 1]->name == input.name) {
      return make_error(
          fmt::format("node {}: given twice (node names must be unique)", input.name));
    }
    ResolvedNode node;
    node.name = input.name;
    node.profile = cache.intern(input.topology);
    const NodeTopology& topo = *input.topology;
    const NodeAllocation& alloc = input.allocation;
    const int n_gpu = static_cast<int>(topo.gpus.size());
    if (!input.gpu_uuids.empty() && input.gpu_uuids.size() != topo.gpus.size()) {
      return make_error(fmt::format("node {}: {} GPU UUIDs given for a topology of {} GPUs",
                                    input.name, input.gpu_uuids.size(), n_gpu));
    }
    auto uuid_of = [&](std::size_t position) -> const std::string& {
      return input.gpu_uuids.empty() ? topo.gpus[position].uuid : input.gpu_uuids[position];
    };
    if (!alloc.gpu_uuids.empty()) {
      for (const std::string& uuid : alloc.gpu_uuids) {
        std::size_t position = 0;
        while (position < topo.gpus.size() && uuid_of(position) != uuid) ++position;
        if (position == topo.gpus.size()) {
          return make_error(fmt::format(
              "node {}: allocated GPU {} is not in the topology (no GPU has that UUID; give a "
              "topology with NVML data or allocate by index)",
              input.name, uuid));
        }
        const int index = topo.gpus[position].index;
        node.gpus.push_back(index >= 0 ? index : static_cast<int>(position));
      }
    } else if (!alloc.all_gpus) {
      for (int g : alloc.gpus) {
        if (g < 0 || g >= n_gpu) {
          return make_error(fmt::format(
              "node {}: allocated GPU {} does not exist (the topology has {} GPUs: 0..{})",
              input.name, g, n_gpu, n_gpu - 1));
        }
        node.gpus.push_back(g);
      }
    } else {
      node.gpus.resize(static_cast<std::size_t>(n_gpu));
      std::iota(node.gpus.begin(), node.gpus.end(), 0);
    }
    std::sort(node.gpus.begin(), node.gpus.end());
    if (std::adjacent_find(node.gpus.begin(), node.gpus.end()) != node.gpus.end()) {
      return make_error(fmt::format("node {}: allocated GPUs {} name a GPU twice", input.name,
                                    join_ints(node.gpus)));
    }
    for (std::size_t v = 0; v < node.gpus.size(); ++v) {
      const std::string& uuid = uuid_of(static_cast<std::size_t>(node.gpus[v]));
      switch (alloc.cuda_naming) {
        case CudaNaming::global_index:
          node.cuda_ids.push_back(std::to_string(node.gpus[v]));
          break;
        case CudaNaming::visible_index:
          node.cuda_ids.push_back(std::to_string(v));
          break;
        case CudaNaming::uuid:
          node.cuda_ids.push_back(uuid.empty() ? std::to_string(node.gpus[v]) : uuid);
          break;
      }
    }
    const NodeProfile& profile = cache.get(node.profile);
    const CpuSet& base = profile.usable_pus;
    node.cpus = alloc.cpus ? (base & *alloc.cpus) : base;
    if (node.cpus.empty()) {
      return make_error(fmt::format(
          "node {}: the allocated CPUs {} are not CPUs of the topology ({}); check the cpuset or "
          "the "
          "topology file",
          input.name, alloc.cpus ? alloc.cpus->to_list() : std::string("(all)"), base.to_list()));
    }
    const int allowed = static_cast<int>(node.gpus.size());
    const int capacity =
        spec.gpus_per_rank > 1 ? allowed / spec.gpus_per_rank : allowed * spec.ranks_per_gpu;
    if (spec.policy == MappingPolicy::explicit_table) {
      node.local_ranks = 0;  // filled from the table
    } else if (spec.ranks_per_node > 0) {
      node.local_ranks = spec.ranks_per_node;
      if (node.local_ranks > capacity && !spec.allow_oversubscribe) {
        if (allowed == 0) {
          return make_error(fmt::format(
              "node {}: job.ranks_per_node = {} but the node has no allocated GPU; allocate GPUs "
              "or set mapping.oversubscribe = true to run without one",
              node.name, spec.ranks_per_node));
        }
        return make_error(fmt::format(
            "node {}: job.ranks_per_node = {} needs {} GPUs (mapping.ranks_per_gpu = {}, "
            "mapping.gpus_per_rank = {}) but {} {} allocated; use job.ranks_per_node <= {}, "
            "mapping.ranks_per_gpu = {}, or mapping.oversubscribe = true",
            node.name, spec.ranks_per_node,
            spec.gpus_per_rank > 1
                ? spec.ranks_per_node * spec.gpus_per_rank
                : (spec.ranks_per_node + spec.ranks_per_gpu - 1) / spec.ranks_per_gpu,
            spec.ranks_per_gpu, spec.gpus_per_rank, allowed, allowed == 1 ? "is" : "are", capacity,
            (spec.ranks_per_node + allowed - 1) / allowed));
      }
    } else {
      node.local_ranks = capacity;
      if (capacity == 0) {
        if (allowed == 0) {
          return make_error(
              fmt::format("node {}: no allocated GPU, so no rank to place; allocate GPUs or set "
                          "job.ranks_per_node (with mapping.oversubscribe = true)",
                          node.name));
        }
        return make_error(
            fmt::format("node {}: mapping.gpus_per_rank = {} but only {} GPUs are allocated; use "
                        "mapping.gpus_per_rank <= {}",
                        node.name, spec.gpus_per_rank, allowed, allowed));
      }
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

Status resolve_layout(const MappingSpec& spec, int world, int& tensor, int& pipeline, int& data) {
  tensor = spec.tensor;
  pipeline = spec.pipeline;
  const int model = tensor * pipeline;
  if (world % model != 0) {
    std::vector<int> pipelines;
    for (int p = 1; p <= world; ++p) {
      if (world % (tensor * p) == 0) {
        pipelines.push_back(p);
      }
    }
    if (pipelines.empty()) {
      return make_error(fmt::format(
          "mapping.tensor: tensor={} does not divide the {} ranks of the job; use a divisor of {}",
          tensor, world, world));
    }
    return make_error(fmt::format(
        "mapping.pipeline: tensor={} x pipeline={} = {} does not divide the {} ranks of the job; "
        "with tensor={} use pipeline in {{{}}}",
        tensor, pipeline, model, world, tensor, join_ints(pipelines)));
  }
  data = world / model;
  if (spec.data > 0 && spec.data != data) {
    return make_error(fmt::format(
        "mapping.data: tensor={} x pipeline={} x data={} = {} ranks, but the nodes give {} ranks; "
        "use mapping.data = {} or mapping.data = 0 (auto)",
        tensor, pipeline, spec.data, model * spec.data, world, data));
  }
  return ok_status();
}

std::vector<std::vector<int>> assign_nics(const NodeProfile& profile,
                                          const std::vector<int>& used_gpus) {
  std::vector<std::vector<int>> nics_of_gpu(static_cast<std::size_t>(profile.gpu_count));
  std::vector<bool> done(used_gpus.size(), false);
  for (std::size_t i = 0; i < used_gpus.size(); ++i) {
    if (done[i]) {
      continue;
    }
    const auto& set = profile.closest_nics[used_gpus[i]];
    std::vector<int> group;
    for (std::size_t j = i; j < used_gpus.size(); ++j) {
      if (!done[j] && profile.closest_nics[used_gpus[j]] == set) {
        group.push_back(used_gpus[j]);
        done[j] = true;
      }
    }
    if (set.empty()) {
      continue;
    }
    const int n_nic = static_cast<int>(set.size());
    const int n_gpu = static_cast<int>(group.size());
    const int per_gpu = (n_nic + n_gpu - 1) / n_gpu;
    for (int k = 0; k < n_gpu; ++k) {
      auto& out = nics_of_gpu[group[k]];
      for (int j = 0; j < per_gpu; ++j) {
        int nic = set[static_cast<std::size_t>((k * per_gpu + j) % n_nic)];
        if (std::find(out.begin(), out.end(), nic) == out.end()) {
          out.push_back(nic);
        }
      }
    }
  }
  return nics_of_gpu;
}

}  // namespace topolaunch::topology::rankmap_detail
