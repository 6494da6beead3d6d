// Applying a task's binding in the task itself (slurm_spank_task_init, as the user, before exec).
#pragma once

#include <string>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/cpuset.hpp"

namespace topolaunch::spank {

struct BindingChoice {
  topology::CpuSet cpus;  // what to pass to sched_setaffinity
  bool emulated = false;  // the intended CPUs are (partly) not on this host
};

// Pure. Intended CPUs inside the allowed set are used as they are. When the topology names CPUs
// this host lacks (an emulated node), bind to the allowed ones among them, or, when none is
// allowed, to one allowed CPU chosen by local task so tasks spread over what exists.
BindingChoice choose_binding(const topology::CpuSet& intended, const topology::CpuSet& allowed,
                             int local_task);

// This process's allowed CPUs (sched_getaffinity).
Result<topology::CpuSet> current_affinity();
Status set_affinity(const topology::CpuSet& cpus);
// MPOL_PREFERRED on `numa` (soft: never an OOM because a node is full). Returns false without
// changing anything when this host has no such NUMA node (an emulated node).
Result<bool> prefer_memory_node(int numa);

}  // namespace topolaunch::spank
