// The two placements our map is compared with. They model what a job gets without topolaunch;
// they are scored, never launched.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "local_plan.hpp"
#include "node_profile.hpp"
#include "topolaunch/topology/rankmap.hpp"

namespace topolaunch::topology {

using namespace rankmap_detail;

namespace {

// Shared set-up: the same nodes, world size and layout as our map, nodes in name order.
Result<RankMap> start(const std::vector<ResolvedNode>& nodes, const MappingSpec& spec,
                      const char* label) {
  RankMap map;
  map.label = label;
  map.policy = MappingPolicy::block;
  for (const auto& node : nodes) map.world_size += node.local_ranks;
  if (auto status = resolve_layout(spec, map.world_size, map.tensor, map.pipeline, map.data);
      !status) {
    return status.error();
  }
  for (const auto& node : nodes) {
    RankMapNode out;
    out.name = node.name;
    out.ranks = node.local_ranks;
    out.rank_ids.assign(static_cast<std::size_t>(node.local_ranks), -1);
    out.allowed_gpus = node.gpus;
    map.nodes.push_back(std::move(out));
  }
  map.ranks.resize(static_cast<std::size_t>(map.world_size));
  return map;
}

struct Task {
  std::vector<int> gpus;
  CpuSet cpus;
  int cores = 0;
  int nic = -1;
};

// Per-node layouts depend only on (hardware, allocation, rank count): computed once per distinct
// node, like our map's plans.
struct LayoutCache {
  struct Key {
    int profile;
    std::vector<int> gpus;
    CpuSet cpus;
    int local_ranks;
    bool operator==(const Key&) const = default;
  };
  std::vector<Key> keys;
  std::vector<std::vector<Task>> layouts;

  template <class Make>
  std::size_t index(const ResolvedNode& node, Make&& make) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const Key& k = keys[i];
      if (k.profile == node.profile && k.local_ranks == node.local_ranks && k.gpus == node.gpus &&
          k.cpus == node.cpus) {
        return i;
      }
    }
    keys.push_back(Key{node.profile, node.gpus, node.cpus, node.local_ranks});
    layouts.push_back(make());
    return layouts.size() - 1;
  }
};

void place(RankMap& map, int rank, int node, int local, const NodeProfile& profile,
           const ResolvedNode& resolved, const Task& task) {
  const std::vector<int>& gpus = task.gpus;
  const CpuSet& cpus = task.cpus;
  const int cores = task.cores;
  const int nic = task.nic;
  RankAssignment& a = map.ranks[rank];
  a.rank = rank;
  a.node = node;
  a.local_rank = local;
  for (int g : gpus) {
    auto pos = std::lower_bound(resolved.gpus.begin(), resolved.gpus.end(), g);
    a.gpu_visible_indexes.push_back(static_cast<int>(pos - resolved.gpus.begin()));
  }
  a.gpus = gpus;
  a.numa = cpus.empty() ? -1 : profile.numa_of_pu(cpus.first());  // first touch
  a.cpus = cpus;
  a.cores = cores;
  if (nic >= 0) a.nics.push_back(profile.topology->nics[nic].name);
  a.tp = rank % map.tensor;
  a.dp = (rank / map.tensor) % map.data;
  a.pp = rank / (map.tensor * map.data);
  map.nodes[node].rank_ids[local] = rank;
}

std::vector<int> allowed_cores(const NodeProfile& profile, const ResolvedNode& node) {
  std::vector<int> cores;
  const auto& all = profile.topology->cores;
  for (std::size_t c = 0; c < all.size(); ++c) {
    if (all[c].pus.intersects(node.cpus)) cores.push_back(static_cast<int>(c));
  }
  return cores;
}

CpuSet pus_of(const NodeProfile& profile, const ResolvedNode& node, const std::vector<int>& cores) {
  std::vector<int> pus;
  for (int c : cores) {
    for (int pu : profile.topology->cores[c].pus.ids()) {
      if (node.cpus.contains(pu)) pus.push_back(pu);
    }
  }
  return CpuSet(std::move(pus));
}

}  // namespace

Result<RankMap> slurm_block_closest_map(const std::vector<NodeInput>& inputs,
                                        const MappingSpec& spec) {
  if (auto status = validate_spec(spec); !status) return status.error();
  ProfileCache cache(spec.nics);
  MappingSpec counting = spec;
  if (counting.policy == MappingPolicy::explicit_table) {
    counting.policy = MappingPolicy::block;
  }
  auto resolved = resolve_nodes(inputs, counting, cache);
  if (!resolved) return resolved.error();
  auto started = start(*resolved, spec, "slurm-block-closest");
  if (!started) return started.error();
  RankMap map = std::move(*started);
  int rank = 0;
  LayoutCache layouts;
  for (std::size_t n = 0; n < resolved->size(); ++n) {
    const ResolvedNode& node = (*resolved)[n];
    const NodeProfile& profile = cache.get(node.profile);
    const std::size_t layout_index = layouts.index(node, [&] {
      std::vector<Task> out;
      const int tasks = node.local_ranks;
      // Task/affinity auto-binding with the default distribution block:cyclic: tasks go round-robin
      // over sockets and take consecutive cores there.
      std::vector<int> cores = allowed_cores(profile, node);
      std::map<int, std::vector<int>> by_socket;
      for (int c : cores) by_socket[profile.core_package[c]].push_back(c);
      std::vector<std::vector<int>> sockets;
      for (auto& [package, list] : by_socket) sockets.push_back(list);
      std::vector<std::size_t> next(sockets.size(), 0);
      const int per_task = std::max<int>(1, static_cast<int>(cores.size()) / std::max(1, tasks));
      std::vector<int> gpu_users(static_cast<std::size_t>(profile.gpu_count), 0);
      const int capacity = spec.gpus_per_rank > 1 ? 1 : spec.ranks_per_gpu;
      const int want = spec.gpus_per_rank;
      for (int t = 0; t < tasks; ++t) {
        std::vector<int> mine;
        std::size_t s = sockets.empty() ? 0 : static_cast<std::size_t>(t) % sockets.size();
        for (std::size_t tries = 0;
             tries < sockets.size() && static_cast<int>(mine.size()) < per_task; ++tries) {
          auto& list = sockets[(s + tries) % sockets.size()];
          auto& at = next[(s + tries) % sockets.size()];
          while (at < list.size() && static_cast<int>(mine.size()) < per_task)
            mine.push_back(list[at++]);
        }
        if (mine.empty() && !cores.empty())
          mine.push_back(cores[static_cast<std::size_t>(t) % cores.size()]);
        CpuSet cpus = pus_of(profile, node, mine);
        // --gpu-bind=closest: a free GPU whose locality overlaps the task's CPUs, else any free
        // one.
        std::vector<int> gpus;
        for (int pass = 0; pass < 3 && static_cast<int>(gpus.size()) < want; ++pass) {
          for (int g : node.gpus) {
            if (static_cast<int>(gpus.size()) >= want) break;
            if (std::find(gpus.begin(), gpus.end(), g) != gpus.end()) continue;
            bool free = gpu_users[g] < capacity || pass == 2;
            bool close = profile.gpu_cpus[g].intersects(cpus);
            if (free && (close || pass >= 1)) gpus.push_back(g);
          }
        }
        if (spec.allow_oversubscribe && gpus.empty() && !node.gpus.empty()) {
          gpus.push_back(node.gpus[static_cast<std::size_t>(t) % node.gpus.size()]);
        }
        std::sort(gpus.begin(), gpus.end());
        for (int g : gpus) gpu_users[g]++;
        // gres/nic:closest pairs NICs with the task's cores: the first selected NIC on its NUMA
        // node.
        int memory = cpus.empty() ? -1 : profile.numa_of_pu(cpus.first());
        int nic = -1;
        for (int k : profile.selected_nics) {
          if (profile.topology->nics[k].numa == memory) {
            nic = k;
            break;
          }
        }
        if (nic < 0 && !profile.selected_nics.empty()) nic = profile.selected_nics.front();
        out.push_back(Task{gpus, cpus, static_cast<int>(mine.size()), nic});
      }
      return out;
    });
    for (int t = 0; t < node.local_ranks; ++t) {
      place(map, rank++, static_cast<int>(n), t, profile, node, layouts.layouts[layout_index][t]);
    }
  }
  return map;
}

Result<RankMap> round_robin_map(const std::vector<NodeInput>& inputs, const MappingSpec& spec) {
  if (auto status = validate_spec(spec); !status) return status.error();
  ProfileCache cache(spec.nics);
  MappingSpec counting = spec;
  if (counting.policy == MappingPolicy::explicit_table) {
    counting.policy = MappingPolicy::block;
  }
  auto resolved = resolve_nodes(inputs, counting, cache);
  if (!resolved) return resolved.error();
  auto started = start(*resolved, spec, "round-robin");
  if (!started) return started.error();
  RankMap map = std::move(*started);
  const auto& nodes = *resolved;
  LayoutCache cache_layouts;
  std::vector<std::size_t> layout_of(nodes.size());
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const ResolvedNode& node = nodes[n];
    const NodeProfile& profile = cache.get(node.profile);
    layout_of[n] = cache_layouts.index(node, [&] {
      std::vector<Task> out;
      const auto cores = allowed_cores(profile, node);
      const int n_gpu = static_cast<int>(node.gpus.size());
      for (int l = 0; l < node.local_ranks; ++l) {
        Task task;
        if (n_gpu > 0) {
          if (spec.gpus_per_rank > 1) {
            for (int j = 0; j < spec.gpus_per_rank; ++j)
              task.gpus.push_back(node.gpus[(l * spec.gpus_per_rank + j) % n_gpu]);
            std::sort(task.gpus.begin(), task.gpus.end());
          } else {
            task.gpus.push_back(node.gpus[(l / spec.ranks_per_gpu) % n_gpu]);
          }
        }
        // Cores in contiguous blocks by local rank, blind to the GPU.
        const int per =
            std::max<int>(1, static_cast<int>(cores.size()) / std::max(1, node.local_ranks));
        std::vector<int> mine;
        for (int j = 0; j < per && !cores.empty(); ++j) {
          mine.push_back(cores[static_cast<std::size_t>(l * per + j) % cores.size()]);
        }
        task.cpus = pus_of(profile, node, mine);
        task.cores = static_cast<int>(mine.size());
        task.nic =
            profile.selected_nics.empty()
                ? -1
                : profile.selected_nics[static_cast<std::size_t>(l) % profile.selected_nics.size()];
        out.push_back(std::move(task));
      }
      return out;
    });
  }
  std::vector<int> next(nodes.size(), 0);
  int rank = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      const ResolvedNode& node = nodes[n];
      if (next[n] >= node.local_ranks) continue;
      progress = true;
      const int l = next[n]++;
      place(map, rank++, static_cast<int>(n), l, cache.get(node.profile), node,
            cache_layouts.layouts[layout_of[n]][l]);
    }
  }
  return map;
}

}  // namespace topolaunch::topology
