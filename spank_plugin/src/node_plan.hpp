// The pure core of the plugin: from what Slurm says about a step (plain data gathered in
// user_init) and the nodes' topologies to the per-task plan of this node: binding, memory node
// and environment. The rank map itself is the library's compute_rank_map; this file only
// adapts Slurm's view (node list, tasks per node, allocated cores, GPU variables) to it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/cpuset.hpp"
#include "topolaunch/topology/mapping_spec.hpp"
#include "topolaunch/topology/model.hpp"
#include "topolaunch/topology/rankmap.hpp"

namespace topolaunch::spank {

struct StepInfo {
  std::uint32_t job_id = 0;
  std::uint32_t step_id = 0;
  std::string node_name;                        // this node (Slurm name)
  std::vector<std::string> step_nodes;          // SLURM_STEP_NODELIST, expanded, Slurm order
  std::vector<int> tasks_per_node;              // SLURM_STEP_TASKS_PER_NODE, expanded
  int world_size = 0;                           // S_JOB_TOTAL_TASK_COUNT
  int local_tasks = 0;                          // S_JOB_LOCAL_TASK_COUNT
  std::optional<topology::CpuSet> alloc_cores;  // S_STEP_ALLOC_CORES (Slurm core indexes)
  Environment env;                              // the step environment (GPU variables, MASTER_*)
};

struct TaskPlan {
  int local_task = -1;            // Slurm's local task id (SLURM_LOCALID)
  topology::RankAssignment rank;  // from the library's map
  Environment env;                // everything to export, torchrun names included
};

struct NodePlan {
  std::string node_name;
  int map_node_index = -1;
  std::vector<TaskPlan> tasks;     // by local task id
  std::vector<std::string> notes;  // warnings of the map, one line each
};

// Where a node's topology comes from: this node's is given; others' are loaded by name (the
// site's topology_xml pattern) or, without a pattern, assumed equal to this node's.
using TopologyLoader =
    std::function<Result<std::shared_ptr<const topology::NodeTopology>>(const std::string& node)>;

// Slurm core indexes are hwloc logical core indexes (gres.conf docs): core k = topo.cores[k].
Result<topology::CpuSet> pus_of_cores(const topology::NodeTopology& topo,
                                      const topology::CpuSet& cores);

// The whole computation of user_init, once per node per step.
Result<NodePlan> plan_node(const StepInfo& step,
                           std::shared_ptr<const topology::NodeTopology> this_node,
                           const TopologyLoader& load_other, topology::MappingSpec spec);

// MASTER_PORT derived from the job and step ids, identical on every node, in [20000, 60000).
int master_port_for(std::uint32_t job_id, std::uint32_t step_id);

}  // namespace topolaunch::spank
