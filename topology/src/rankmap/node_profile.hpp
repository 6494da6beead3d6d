// Private to rank mapping: what the mapper and the scorer need from one node's topology,
// computed once per distinct topology (thousands of identical nodes share one profile).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/model.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/topology/relation.hpp"

namespace topolaunch::topology::rankmap_detail {

struct NodeProfile {
  std::shared_ptr<const NodeTopology> topology;
  int gpu_count = 0;
  int nic_count = 0;
  std::vector<int> gpu_numa;            // -1 unknown
  std::vector<CpuSet> gpu_cpus;         // locality, empty = unknown
  std::vector<int> gpu_package;         // -1 unknown
  std::vector<int> nvlink_domain;       // per GPU; one domain for the node without NVLink data
  std::vector<int> nvlink_domain_size;  // per domain id
  std::vector<double> gpu_gpu_mbps;     // gpu_count^2
  std::vector<double> gpu_pcie_mbps;
  std::vector<bool> nic_selected;  // compute role, driver bound, selected by the filter
  std::vector<double> nic_mbps;
  std::vector<Relation> gpu_nic;               // gpu_count x nic_count, PCIe relation
  std::vector<std::vector<int>> closest_nics;  // per GPU: selected NICs with the best relation
  std::vector<int> selected_nics;              // indexes, in NIC order
  CpuSet all_pus;
  CpuSet usable_pus;                  // allowed_cpus of the topology (all PUs when not given)
  std::vector<CpuSet> gpu_numa_cpus;  // CPUs of each GPU's NUMA node, empty when unknown
  std::vector<int> core_numa;         // per topology core
  std::vector<int> core_package;

  double gpu_gpu(int a, int b) const {
    return gpu_gpu_mbps[static_cast<std::size_t>(a * gpu_count + b)];
  }
  const Relation& gpu_nic_relation(int gpu, int nic) const {
    return gpu_nic[static_cast<std::size_t>(gpu * nic_count + nic)];
  }
  // GPU->NIC effective bandwidth before sharing: min(NIC rate, GPU PCIe x path factor).
  double gpu_nic_mbps(int gpu, int nic) const;
  CpuSet numa_cpus(int numa) const;
  int numa_of_pu(int pu) const;
};

// A PCIe link's capability in MB/s each way (lane rate x width, the max over the current):
// known_pcie_mbps is 0 when the topology does not say, pcie_mbps then assumes Gen3 x16.
double known_pcie_mbps(const PcieLink& link);
double pcie_mbps(const PcieLink& link);
double path_factor(RelationKind kind);

// Profiles shared by identical hardware (pointer identity first, then deep comparison that
// ignores hostname and data sources).
class ProfileCache {
 public:
  explicit ProfileCache(NicFilter filter) : filter_(std::move(filter)) {}
  // Returns the profile id.
  int intern(const std::shared_ptr<const NodeTopology>& topology);
  const NodeProfile& get(int id) const { return *profiles_[static_cast<std::size_t>(id)]; }

 private:
  NicFilter filter_;
  std::vector<std::unique_ptr<NodeProfile>> profiles_;
};

// One node of the job, resolved against its topology.
struct ResolvedNode {
  std::string name;
  int profile = -1;
  std::vector<int> gpus;              // allowed GPU indexes, bus order
  std::vector<std::string> cuda_ids;  // CUDA_VISIBLE_DEVICES name of each allowed GPU
  CpuSet cpus;                        // allowed PUs
  int local_ranks = 0;                // what the spec asks of this node
};

// Sorts by natural name order, resolves allocations, derives local rank counts.
Result<std::vector<ResolvedNode>> resolve_nodes(const std::vector<NodeInput>& nodes,
                                                const MappingSpec& spec, ProfileCache& cache);

Status validate_spec(const MappingSpec& spec);

// Parallel layout from world size: fills tensor/pipeline/data or says what would work.
Status resolve_layout(const MappingSpec& spec, int world, int& tensor, int& pipeline, int& data);

// NICs per GPU among `used_gpus` (bus order) as NCCL shares them: GPUs with the same closest set
// split it, netsPerGpu = ceil(nNic / nGpu), GPU k starts at (k * netsPerGpu) mod nNic.
std::vector<std::vector<int>> assign_nics(const NodeProfile& profile,
                                          const std::vector<int>& used_gpus);

}  // namespace topolaunch::topology::rankmap_detail
