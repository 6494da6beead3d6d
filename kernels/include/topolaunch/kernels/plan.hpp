// The compiled plan: passes over a training graph (fusion, rematerialisation under a memory
// budget, gradient buckets under a communication budget) and the liveness-based static memory plan
// that gives every tensor an offset in ONE arena. A backend allocates `arena_bytes` once and runs
// `graph.ops` in order; nothing else is allocated per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "topolaunch/kernels/graph.hpp"

namespace topolaunch::kernels {

inline constexpr std::size_t kNoOffset = std::numeric_limits<std::size_t>::max();

// --- elementwise fusion -------------------------------------------------------------------
// residual_forward followed by the layernorm_forward of its sum -> residual_layernorm_forward.
// Runs on the whole training graph (after autodiff); returns the number of fused pairs.
int fuse_elementwise(Graph& graph);

// --- static memory plan --------------------------------------------------------------------
struct MemoryPlan {
  std::vector<std::size_t> offsets;  // per tensor; kNoOffset for tensors no op touches
  std::size_t arena_bytes = 0;
  std::size_t persistent_bytes = 0;  // params + grads + optimizer state + comm staging (whole step)
  std::size_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0, comm_bytes = 0;
  std::size_t planned_bytes = 0;   // the liveness-planned region (activations, inputs, workspace)
  std::size_t max_live_bytes = 0;  // lower bound: persistent + max over ops of live planned bytes
  std::size_t activation_peak_bytes = 0, workspace_peak_bytes = 0,
              input_bytes = 0;  // at the peak op
  int peak_op = 0;
  std::string strategy;  // which greedy order won ("size" or "time")
};
// Gradients are laid out in `gradient_order` (bucket order), so each bucket is one contiguous
// range.
MemoryPlan plan_memory(const Graph& graph, const std::vector<TensorId>& gradient_order,
                       std::size_t comm_bytes, std::size_t alignment = 256);

// --- rematerialisation ---------------------------------------------------------------------
struct RecomputeDecision {
  TensorId tensor;
  std::string tensor_name, op_name;
  double flops;
  std::size_t bytes;
};
// Clone the producers of `recomputed` into the backward, just before first use (recursively).
Graph apply_recompute(const Graph& graph, const std::vector<TensorId>& recomputed);

// --- communication -------------------------------------------------------------------------
struct CommModel {
  int world_size = 1;
  double link_gbytes_per_s = 10.0;     // algorithm bandwidth of the all-reduce transport
  double latency_us = 50.0;            // per collective
  double compute_gflops = 20.0;        // backend throughput, to time the backward
  double max_exposed_fraction = 0.05;  // budget: exposed communication / compute per optimizer step
  double max_exposed_ms = 0;           // budget: exposed ms per micro-step on average (0: none)
  std::size_t max_bytes_per_step =
      0;  // budget: bytes sent per rank per micro-step on average (0: none)
  std::size_t bucket_cap_bytes = 0;  // 0: choose
  int grad_accum = 0;                // 0: choose within max_grad_accum
  int max_grad_accum = 64;
};

struct Bucket {
  std::vector<TensorId> grads;  // in the order they become final
  std::size_t offset = 0, bytes = 0;
  int issue_after_op = -1;  // index into graph.ops of the all_reduce op
  double ready_ms = 0, start_ms = 0, done_ms = 0;
};

struct CommPlan {
  std::vector<Bucket> buckets;
  std::size_t bucket_cap_bytes = 0;
  int grad_accum = 1;
  std::size_t bytes_per_step = 0;  // sent per rank per optimizer step (ring: 2(n-1)/n * S)
  double comm_ms = 0, exposed_ms = 0, compute_ms = 0;
  double exposed_fraction = 0;
  bool within_budget = true;
};

// --- the whole compile ----------------------------------------------------------------------
struct PlanOptions {
  std::size_t memory_budget_bytes = 0;  // 0: unlimited
  std::size_t alignment = 256;
  bool fuse = true;
  CommModel comm;
};

struct Plan {
  Graph graph;  // final op order: forward, backward (+ recompute + all_reduce), optimizer
  MemoryPlan memory;
  MemoryPlan unconstrained;  // before rematerialisation
  std::vector<RecomputeDecision> recompute;
  double step_flops = 0, extra_flops = 0;
  int fused_pairs = 0;
  CommPlan comm;
  std::size_t memory_budget_bytes = 0;
};

// Builds the plan; refuses (exit code 2) a budget below params+grads+optimizer state, or one that
// no rematerialisation fits, naming the smallest budget that would fit.
Result<Plan> compile_plan(Graph training_graph, const PlanOptions& options);

std::string format_bytes(std::size_t bytes);
// Human-readable plan: ops (when list_ops), arena layout, recompute decisions, buckets, budgets.
std::string format_plan(const Plan& plan, bool list_ops);

}  // namespace topolaunch::kernels
