// job.start = "early" (architecture.md, "Early start"): an agent under Slurm forks its workers
// from a map of the step's nodes all taken to be like its own, before the agents' exchange; once
// the whole map is known, it must give this node the very ranks the workers were started as.
// Pure functions of plain data; run_agent (slurm_step.cpp) does the rest.
#pragma once

#include <string>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/topology/rankmap.hpp"

namespace topolaunch::launcher {

// The root cause's phase when the whole map differs from the one the workers started from: the
// same nodes give the same difference, so the job is not restarted (bad input, exit 2).
inline constexpr const char* kEarlyStartMismatchPhase = "early-start";

// The step's nodes in Slurm's order, from SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST when the
// step is the whole allocation): `nodes` names, this node's among them. Errors say which
// variable and why, for the agent's one line.
Result<std::vector<std::string>> step_node_names(const Environment& env, int nodes,
                                                 const std::string& node_name);

// `mine` once for every node of the step, under each node's name: the map's inputs when every
// node is like this one (same topology, same allocation).
std::vector<topology::NodeInput> nodes_like(const topology::NodeInput& mine,
                                            const std::vector<std::string>& step_nodes);

// "" when `full` gives node `node_name` what `started` gave it: the world size, the node count,
// the node's index, its number of ranks, and for each local rank the global rank, the cores, the
// NUMA node and the environment the map puts in worker_environment (torchrun's names, GPUs,
// NICs, thread count). Else the first difference in a few words, e.g. "world size 7, not 8" or
// "local rank 1 (rank 5): CUDA_VISIBLE_DEVICES \"3\", not \"1\"" (the full map's value first).
std::string early_start_difference(const topology::RankMap& started, const topology::RankMap& full,
                                   const std::string& node_name, const jobspec::JobConfig& config);

}  // namespace topolaunch::launcher
