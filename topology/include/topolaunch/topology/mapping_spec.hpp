// What the job asks of the rank map: the `[mapping]` table of a job config, as plain data.
// The launcher parses TOML into this (with file:line errors); rank mapping only consumes it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topolaunch/topology/cpuset.hpp"
#include "topolaunch/topology/discover.hpp"

namespace topolaunch::topology {

enum class MappingPolicy { automatic, block, cyclic, explicit_table };

// One row of `[[mapping.explicit]]`: which node-local resources a global rank gets.
struct ExplicitRank {
  int rank = -1;
  int node = -1;                  // index into the node order
  std::vector<int> gpus;          // GPU indexes on that node (bus order)
  std::optional<CpuSet> cpus;     // PUs; default: derived from the GPUs like `automatic`
  std::vector<std::string> nics;  // default: closest to the GPUs
  int source_line = 0;            // for error messages
};

struct MappingSpec {
  MappingPolicy policy = MappingPolicy::automatic;
  int ranks_per_node = 0;            // 0 = derive from GPUs (ranks_per_gpu / gpus_per_rank)
  int ranks_per_gpu = 1;             // > 1: several ranks share a GPU (e.g. MPS)
  int gpus_per_rank = 1;             // > 1: one rank drives several GPUs
  bool allow_oversubscribe = false;  // more ranks than GPUs x ranks_per_gpu
  int tensor = 1;                    // tensor-parallel size (inside one NVLink domain)
  int pipeline = 1;
  int data = 0;               // 0 = auto (world / (tensor * pipeline))
  NicFilter nics;             // which NICs ranks may use (storage NICs excluded here)
  bool pin_nics = false;      // export NCCL_IB_HCA / UCX_NET_DEVICES per rank
  bool bind_memory = true;    // NUMA memory policy to the GPU's node
  std::string topology_conf;  // Slurm topology.conf (switch tree) for node order
  std::vector<ExplicitRank> explicit_ranks;
  std::string source;  // the config file the table came from, for error messages
};

}  // namespace topolaunch::topology
