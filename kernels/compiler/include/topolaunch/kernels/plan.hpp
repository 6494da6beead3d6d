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
// residual_forward followed by the layernorm_forward (rmsnorm_forward) of its sum ->
// residual_layernorm_forward (residual_rmsnorm_forward).
// Runs on the whole training graph (after autodiff); returns the number of fused pairs.
int fuse_elementwise(Graph& graph);

// --- chunked classifier ------------------------------------------------------------------
// The output head (matmul_forward to logits(N, Vp)), its crossentropy_forward,
// crossentropy_backward and the head's matmul_backward -> classifier_forward + classifier_backward,
// which hold the logits of chunk_rows rows at a time (a workspace of chunk_rows x Vp) instead of
// all N rows: at GPT-2 B=64 T=1024 the logits are 6.6 GB of bf16, the largest activation of the
// step. chunk_rows -1: automatic (auto_classifier_chunk_rows); 0 or >= N: the graph is left as it
// is; a head with a bias is left as it is. Returns the rows per chunk applied (0: not applied).
std::int64_t chunk_classifier(Graph& graph, std::int64_t chunk_rows);
// Automatic: chunk when the logits exceed kClassifierChunkMinBytes, into kClassifierChunks chunks
// (rows a multiple of 64, at least kClassifierChunkMinRows); else 0 (none). Eight chunks keep
// 7/8 of the logits' memory for one extra fp32 read and write of dw per chunk. Shorter chunks
// starve the GEMMs: GPT-2 124M B=16 on an H200 trained at 570.5K tok/s with 2,048 rows per chunk,
// 579.9K with 4,096 and 582.8K unchunked (tests/bench/kernels/results/
// gpu-h200-gpt2-chunk-rows-2026-12-03.jsonl).
inline constexpr std::size_t kClassifierChunkMinBytes = std::size_t{256} << 20;
inline constexpr std::int64_t kClassifierChunks = 8;
inline constexpr std::int64_t kClassifierChunkMinRows = 4096;
std::int64_t auto_classifier_chunk_rows(std::int64_t rows, std::size_t logits_bytes);

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
  // Optimizer state offloaded to host memory (offload_optimizer): the moments and fp32 master
  // weights that AdamW reads and writes once per optimizer step. Their offsets follow the arena,
  // [arena_bytes, arena_bytes + host_bytes): a backend maps that range to host memory the device
  // reaches directly (the CUDA backend: pinned, mapped), and arena_bytes is device memory only.
  // optimizer_bytes still counts them; persistent_bytes does not.
  std::size_t host_bytes = 0;
};
// Gradients are laid out in `gradient_order` (bucket order), so each bucket is one contiguous
// range. offload_optimizer: the tensors AdamW updates in place (moments, fp32 master weights) go
// after the arena, into host_bytes.
MemoryPlan plan_memory(const Graph& graph, const std::vector<TensorId>& gradient_order,
                       std::size_t comm_bytes, std::size_t alignment = 256,
                       bool offload_optimizer = false);
// The tensors offload_optimizer moves to host memory: the outputs of adamw and sharded_adamw ops
// other than the parameter (or its shard) they update.
std::vector<bool> offloadable_optimizer_state(const Graph& graph);

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
// Sharded data parallelism (ZeRO, Rajbhandari et al. 2020; FSDP): what each rank holds only its
// segment (1/world) of. Every gradient bucket is one flat buffer cut into world_size equal
// segments; rank r's segment is its shard.
//   none        every rank holds everything; bucket all-reduce (plain data parallelism)
//   optimizer   AdamW state sharded: bucket reduce-scatter on the last micro-step, AdamW of the
//               shard, parameters all-gathered after the optimizer
//   gradients   + gradients: each micro-step's bucket is reduce-scattered into a persistent
//               gradient shard and its full buffer freed
//   parameters  + parameters: each bucket's parameters are all-gathered before the forward ops
//               that read them and again before the backward's, one bucket ahead (prefetch), and
//               freed after their last reader
// The buckets, their segments and the order of every addition are the same in every mode, so the
// modes train bit-identically (ZeRO-2/3 with grad_accum > 1 excepted: there each micro-step's sum
// over ranks is accumulated, where the others accumulate the micro-steps first and sum once).
enum class ShardMode : std::uint8_t { none, optimizer, gradients, parameters };
std::string_view shard_mode_name(ShardMode mode);

// The compute throughput GPU plans are costed at (comm.compute_gflops) unless [train]
// compute_gflops says otherwise: an H200's bf16 rate as research/static_graph.md measured it.
inline constexpr double kGpuComputeGflops = 400e3;

struct CommModel {
  int world_size = 1;
  int rank = 0;  // whose shards a sharded plan holds (its views and the shard tensors)
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

// A parameter of a bucket and where it lies in the bucket's flat layout (elements).
struct BucketMember {
  TensorId param = kNoTensor, grad = kNoTensor;
  std::int64_t offset = 0, elements = 0;
  bool decayed = false;
};

struct Bucket {
  std::vector<TensorId> grads;        // in the order they become final
  std::size_t offset = 0, bytes = 0;  // the gradient buffer in the arena (set with the memory plan)
  int issue_after_op = -1;            // index into graph.ops of its all_reduce / reduce_scatter op
  double ready_ms = 0, start_ms = 0, done_ms = 0;
  // Data-parallel plans (world > 1, or any shard mode): the flat layout. Each member starts at a
  // multiple of 64 elements; `elements` is padded to a multiple of 64 x world_size, so the
  // world_size segments are equal (segment_elements each) and 256-byte aligned in fp32.
  std::vector<BucketMember> members;
  std::int64_t elements = 0, segment_elements = 0;
  TensorId grad_buffer = kNoTensor;  // the members' gradients are views of it
  // Sharded plans. optimizer, gradients: param_buffer holds the full parameters (persistent, the
  // members are views of it) and param_shard is a view of its segment. parameters: param_shard
  // is the persistent tensor; param_buffer is the forward's gathered copy (the members are views
  // of it) and param_buffer_backward the backward's (the backward reads the members'
  // param_views).
  TensorId param_buffer = kNoTensor, param_buffer_backward = kNoTensor;
  std::vector<TensorId> param_views_backward;  // per member, parameters only
  // optimizer: a view of grad_buffer's segment; gradients, parameters: a persistent tensor that
  // each micro-step's reduce-scatter adds into.
  TensorId param_shard = kNoTensor, grad_shard = kNoTensor;
  TensorId m_shard = kNoTensor, v_shard = kNoTensor, master_shard = kNoTensor;
};

// The part of bucket member `m` that lies in rank `rank`'s segment of bucket `b`: elements
// [member_begin, member_begin + count) of the member (count 0: none), at element shard_offset of
// the bucket's shard tensors (param_shard, grad_shard, m_shard, ...).
struct ShardSlice {
  std::int64_t member_begin = 0, count = 0, shard_offset = 0;
};
ShardSlice shard_slice(const Bucket& b, const BucketMember& m, int rank);

struct CommPlan {
  ShardMode shard = ShardMode::none;
  int world_size = 1, rank = 0;
  std::vector<Bucket> buckets;
  std::size_t bucket_cap_bytes = 0;
  int grad_accum = 1;
  // Per optimizer step at grad_accum micro-steps, per rank: bytes sent (a ring all-reduce of S
  // bytes sends 2(n-1)/n S, a reduce-scatter or an all-gather (n-1)/n S), communication busy
  // time, and the part of it that compute waits for (an all-reduce's tail after the backward, a
  // gather a forward op waits on, the optimizer's all-gather).
  std::size_t bytes_per_step = 0;
  double comm_ms = 0, exposed_ms = 0;
  double compute_ms = 0;  // one micro-step's forward + backward
  // Of those, per micro-step, as the model times them: what runs on every micro-step (ZeRO-2/3's
  // reduce-scatters, ZeRO-3's gathers), on the last one only (the all-reduces, ZeRO-1's
  // reduce-scatters) and once after the optimizer (ZeRO-1/2's parameter all-gathers).
  std::size_t bytes_every_micro_step = 0, bytes_last_micro_step = 0, bytes_after_optimizer = 0;
  double exposed_every_ms = 0, exposed_last_ms = 0, exposed_after_optimizer_ms = 0;
  double comm_every_ms = 0, comm_last_ms = 0, comm_after_optimizer_ms = 0;
  double exposed_fraction = 0;
  bool within_budget = true;
};

// --- attention workspace --------------------------------------------------------------------
// What cuDNN's fused attention backward (kernels/cuda/attention_cudnn.cu) takes besides its
// engine's own workspace: an fp32 dQ accumulator (B*T*C floats) and the row sums of dO*O
// (B*NH*T floats), each 256-byte aligned.
inline std::size_t fused_attention_accumulator_bytes(std::int64_t B, std::int64_t T, std::int64_t C,
                                                     std::int64_t NH) {
  auto a256 = [](std::size_t n) { return (n + 255) / 256 * 256; };
  return a256(static_cast<std::size_t>(B * T * C) * 4) +
         a256(static_cast<std::size_t>(B * NH * T) * 4);
}
// Room planned for the engine's own workspace on top (the Hopper flash engines of cuDNN 9.14 take
// 0-256 bytes at GPT-2 shapes; an engine that takes more gets a separate allocation).
inline constexpr std::size_t kFusedAttentionEngineWorkspaceBytes = std::size_t{1} << 20;

// --- the whole compile ----------------------------------------------------------------------
// [train] offload: where the optimizer state lives. none: in the arena; optimizer: in host
// memory (MemoryPlan::host_bytes); automatic: in host memory only when the memory budget needs
// it, and then only when moving it over the host link costs less than the recomputation it saves.
enum class OffloadMode : std::uint8_t { none, optimizer, automatic };

struct PlanOptions {
  std::size_t memory_budget_bytes = 0;       // 0: unlimited
  std::string budget_key = "budget.memory";  // the key a refusal names (GPU plans: gpu_memory)
  std::size_t alignment = 256;
  bool fuse = true;
  // Rows of logits per classifier chunk: -1 automatic (auto_classifier_chunk_rows), 0 never, else
  // that many.
  std::int64_t classifier_chunk_rows = -1;
  // CUDA plans (Precision::fp32_statistics): each attention backward's workspace is planned large
  // enough for cuDNN's fused attention backward too (fused_attention_accumulator_bytes +
  // kFusedAttentionEngineWorkspaceBytes instead of our kernels' B*NH*T floats), so that the
  // executor can choose either implementation inside the arena, and a memory budget counts it.
  bool fused_attention_workspace = true;
  CommModel comm;
  ShardMode shard = ShardMode::none;
  // [train] shard = "auto": the least sharding whose plan fits memory_budget_bytes without
  // recomputation; when none fits, the mode with the smallest plan, then recomputation (cheapest
  // first). `shard` is then ignored.
  bool shard_auto = false;
  OffloadMode offload = OffloadMode::none;
  // With offload none, a refusal points at this key (empty: a backend that cannot offload).
  std::string offload_key = "train.offload";
  // The host link the offloaded state crosses, GB/s each way, to cost offloading against
  // recomputation (which comm.compute_gflops costs): the state is read and written once per
  // optimizer step in one pass, both directions at once, so a step costs host_bytes at this rate.
  double host_link_gbytes_per_s = 20.0;
  // The device memory's bandwidth, for the recomputation's cost: an op costs the longer of its
  // FLOPs at comm.compute_gflops and its operands' bytes at this (the layernorms and GELUs the
  // cheapest recomputation takes first are memory-bound). HBM3: 3.35 TB/s on an H100, 4.8 on an
  // H200, less what kernels reach.
  double device_gbytes_per_s = 3000.0;
};

struct Plan {
  Graph graph;  // final op order: forward, backward (+ recompute + all_reduce), optimizer
  MemoryPlan memory;
  MemoryPlan unconstrained;  // before rematerialisation
  std::vector<RecomputeDecision> recompute;
  double step_flops = 0, extra_flops = 0;
  int fused_pairs = 0;                     // residual + layernorm/rmsnorm
  std::int64_t classifier_chunk_rows = 0;  // rows of logits per classifier chunk (0: not chunked)
  CommPlan comm;
  std::size_t memory_budget_bytes = 0;
  // shard_auto: each mode's arena without recomputation, in the order tried, and why the chosen
  // one was taken (one line).
  std::vector<std::pair<ShardMode, std::size_t>> shard_candidates;
  std::string shard_reason;
  // The optimizer state is in host memory (memory.host_bytes), and why (one line; empty when the
  // offload setting had no choice to make). offload_ms: the model's time per optimizer step for
  // reading and writing it over the host link; recompute_ms: the recomputation's per micro-step.
  bool optimizer_offloaded = false;
  double offload_ms = 0, recompute_ms = 0;
  std::string offload_reason;
};

// Builds the plan; refuses (exit code 2) a budget below params+grads+optimizer state, or one that
// no rematerialisation fits, naming the smallest budget that would fit.
Result<Plan> compile_plan(Graph training_graph, const PlanOptions& options);

std::string format_bytes(std::size_t bytes);
// Human-readable plan: ops (when list_ops), arena layout, recompute decisions, buckets, budgets.
std::string format_plan(const Plan& plan, bool list_ops);

}  // namespace topolaunch::kernels
