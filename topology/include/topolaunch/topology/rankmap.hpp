// The rank map: for every rank of a job, its node, GPU(s), cores, NUMA memory node, NIC(s),
// parallel-group coordinates and the environment that follows. A pure function of the nodes'
// topologies, their allocations and the `[mapping]` table, so every agent computes the same map
// from the same inputs whatever order they arrive in (research topology.md R-MAP-1..5).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/cpuset.hpp"
#include "topolaunch/topology/mapping_spec.hpp"
#include "topolaunch/topology/model.hpp"
#include "topolaunch/topology/switch_tree.hpp"

namespace topolaunch::topology {

// How CUDA_VISIBLE_DEVICES names a GPU on this node.
enum class CudaNaming {
  global_index,   // the GPU's index on the node (bus order): devices are not constrained
  visible_index,  // 0..n-1 within the allowed GPUs: Slurm ConstrainDevices renumbers them
  uuid,           // "GPU-..." (gres.conf Flags=env_uuid)
};

// What the job may use on one node. Outside Slurm: everything.
struct NodeAllocation {
  bool all_gpus = true;
  std::vector<int> gpus;               // node GPU indexes (bus order), when !all_gpus
  std::vector<std::string> gpu_uuids;  // alternative to `gpus`: matched by NodeTopology UUIDs
  CudaNaming cuda_naming = CudaNaming::global_index;
  std::optional<CpuSet> cpus;  // allowed PUs; nullopt = the topology's allowed_cpus

  static NodeAllocation everything() { return {}; }
  bool operator==(const NodeAllocation&) const = default;
};

// Pure: reads SLURM_STEP_GPUS (else SLURM_JOB_GPUS) and CUDA_VISIBLE_DEVICES from `env`.
// A CUDA_VISIBLE_DEVICES of 0..n-1 next to different Slurm indexes means ConstrainDevices
// (visible_index naming); UUIDs are kept as UUIDs. `cpus_allowed_list` is the process's allowed
// PU list ("0-55,112-167": /proc/self/status Cpus_allowed_list or cgroup cpuset.cpus.effective),
// "" = everything. Errors name the variable and its value.
Result<NodeAllocation> allocation_from_env(const Environment& env,
                                           std::string_view cpus_allowed_list = "");
// Thin shell: this process's environment and /proc/self/status.
Result<NodeAllocation> allocation_of_this_process();

struct NodeInput {
  std::string name;  // Slurm node name (sorting key); the topology's hostname is not used
  // Shared so that thousands of identical nodes need one copy; relations are computed once per
  // distinct topology.
  std::shared_ptr<const NodeTopology> topology;
  NodeAllocation allocation;
  // This node's GPU UUIDs in bus order, when `topology` is a shape shared by alike nodes and so
  // carries none (the agents' exchange); empty: the topology's own.
  std::vector<std::string> gpu_uuids = {};
};

struct RankAssignment {
  int rank = -1;
  int node = -1;  // index into RankMap::nodes
  int local_rank = -1;
  std::vector<int> gpus;                 // node GPU indexes (bus order)
  std::vector<int> gpu_visible_indexes;  // position of each GPU among the node's allowed GPUs
  CpuSet cpus;                           // PUs (whole cores, SMT siblings together)
  int cores = 0;
  int numa = -1;                  // memory node (host memory, never a GPU-memory node)
  std::vector<std::string> nics;  // RDMA names
  int tp = 0, pp = 0, dp = 0;     // coordinates in the parallel layout
  Environment env;

  bool operator==(const RankAssignment&) const = default;
};

struct RankMapNode {
  std::string name;
  int ranks = 0;
  std::vector<int> rank_ids;      // global ranks on this node, by local rank
  std::vector<int> allowed_gpus;  // node GPU indexes the job may use
  bool operator==(const RankMapNode&) const = default;
};

struct RankMap {
  std::string label;  // "topolaunch", "slurm-block-closest", "round-robin"
  MappingPolicy policy = MappingPolicy::automatic;
  int world_size = 0;
  int tensor = 1, pipeline = 1, data = 1;
  bool switch_tree_order = false;     // nodes ordered by the switch tree rather than by name
  std::vector<RankMapNode> nodes;     // in map order
  std::vector<RankAssignment> ranks;  // by global rank
  std::vector<std::string> warnings;  // one line each, deduplicated, in order found

  bool operator==(const RankMap&) const = default;
};

// The map. Errors (exit code 2) say what is impossible and what would work, e.g.
// "mapping.tensor: tensor=16 needs 16 ranks in one NVLink domain, but node n1 has at most 8;
// use tensor <= 8 (e.g. tensor=8, data=auto)".
struct RankMapOptions {
  // Fill RankAssignment::env. An agent needs the environment of its own ranks only: naming its
  // node skips building ~20 strings for each of the other ranks (most of the time at 8k ranks).
  bool environment = true;
  std::string environment_node;  // "" = every node
};

Result<RankMap> compute_rank_map(const std::vector<NodeInput>& nodes, const MappingSpec& spec,
                                 const SwitchTree* tree = nullptr,
                                 const RankMapOptions& options = {});

// Baselines, computed on the same inputs (same world size and parallel layout) for scoring:
// Slurm's default placement: nodes by name, block distribution of ranks, tasks cyclic over
// sockets with consecutive cores (block:cyclic auto-binding), `--gpu-bind=closest` = the first
// free GPU whose gres Cores overlap the task's CPUs (NUMA/socket granularity), memory by first
// touch (`--mem-bind=none`), and the NIC a CPU-overlap `gres/nic:closest` gives (first NIC on the
// task's NUMA node) since Slurm pairs NICs with cores, never with GPUs.
Result<RankMap> slurm_block_closest_map(const std::vector<NodeInput>& nodes,
                                        const MappingSpec& spec);
// Round-robin: ranks dealt over nodes in name order, GPU = local rank, cores in contiguous
// blocks by local rank, memory by first touch, NIC = local rank mod NIC count.
Result<RankMap> round_robin_map(const std::vector<NodeInput>& nodes, const MappingSpec& spec);

// Deterministic JSON (field order fixed, no timestamps).
std::string to_json(const RankMap& map, bool pretty = true);

}  // namespace topolaunch::topology
