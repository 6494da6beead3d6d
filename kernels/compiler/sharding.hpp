// Data-parallel buckets as flat buffers, the sharding of ShardMode (plan.hpp), and the timing of
// a bucketed plan's communication. Private to the compiler (plan.cpp calls them).
#pragma once

#include "topolaunch/kernels/plan.hpp"

namespace topolaunch::kernels::detail {

// After insert_buckets (one all_reduce op per bucket): lays each bucket out as one flat buffer
// whose views are the members' gradients (and, sharded, parameters), and for a shard mode other
// than none rewrites the graph: reduce_scatter for all_reduce, a zero of a transient gradient
// buffer before its first write, the parameter gathers, the sharded optimizer. Data-parallel
// `none` plans get their global_norm in per-rank segments, the order sharded plans sum in.
void lay_out_buckets(Graph& graph, CommPlan& comm, ShardMode mode, int world_size, int rank);

// The tensors of the persistent gradient region in bucket order (plan_memory's gradient_order).
std::vector<TensorId> gradient_order(const Graph& graph, const CommPlan& comm);

// Times a bucketed plan's communication with the model (per micro-step figures of CommPlan);
// compile_plan combines them for its grad_accum.
void time_communication(const Graph& graph, CommPlan& comm, const CommModel& model);

// CommPlan's per-step figures for `grad_accum` micro-steps.
void combine_step_figures(CommPlan& comm, int grad_accum);

}  // namespace topolaunch::kernels::detail
