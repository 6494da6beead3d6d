// Passes and the static memory plan. See plan.hpp for the contract.
#include "topolaunch/kernels/plan.hpp"

#include "sharding.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

namespace topolaunch::kernels {

namespace {

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

bool is_persistent(Role r) {
  return r == Role::parameter || r == Role::gradient || r == Role::optimizer_state;
}

template <class Fn>
void for_each_operand(const Op& op, Fn&& fn) {
  for (auto t : op.inputs) fn(t);
  for (auto t : op.outputs) fn(t);
  if (op.workspace != kNoTensor) fn(op.workspace);
  for (auto t : op.keep_alive) fn(t);
}

struct Interval {
  int first = -1, last = -1;
};

std::vector<Interval> liveness(const Graph& g) {
  std::vector<Interval> live(g.tensors.size());
  const int n = static_cast<int>(g.ops.size());
  for (int i = 0; i < n; ++i) {
    for_each_operand(g.ops[static_cast<std::size_t>(i)], [&](TensorId t) {
      auto& iv = live[static_cast<std::size_t>(t)];
      if (iv.first < 0) iv.first = i;
      iv.last = i;
    });
  }
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    if (g.tensors[t].role == Role::input)
      live[t] = {0, n - 1};  // written by the host before the step
  }
  if (g.losses != kNoTensor && live[static_cast<std::size_t>(g.losses)].first >= 0)
    live[static_cast<std::size_t>(g.losses)].last = n - 1;  // read by the host after the step
  // A view's uses are its base's.
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    const TensorId base = g.tensors[t].view_of;
    if (base == kNoTensor || live[t].first < 0) continue;
    auto& b = live[static_cast<std::size_t>(base)];
    b.first = b.first < 0 ? live[t].first : std::min(b.first, live[t].first);
    b.last = std::max(b.last, live[t].last);
  }
  return live;
}

struct Buffer {
  std::size_t bytes = 0;
  Interval live;
  std::vector<TensorId> tensors;
  std::size_t offset = 0;
};

// Best-fit offset assignment among lifetime-overlapping buffers (TFLite GreedyBySize, XLA heap).
std::size_t place(std::vector<Buffer>& bufs, const std::vector<std::size_t>& order) {
  std::vector<std::size_t> placed;
  std::size_t total = 0;
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // (offset, end)
  for (auto bi : order) {
    Buffer& b = bufs[bi];
    busy.clear();
    for (auto pi : placed) {
      const Buffer& p = bufs[pi];
      if (p.live.first <= b.live.last && b.live.first <= p.live.last)
        busy.emplace_back(p.offset, p.offset + p.bytes);
    }
    std::sort(busy.begin(), busy.end());
    std::size_t prev_end = 0, best = kNoOffset, best_gap = kNoOffset;
    for (auto [off, end] : busy) {
      if (off > prev_end && off - prev_end >= b.bytes && off - prev_end < best_gap) {
        best = prev_end;
        best_gap = off - prev_end;
      }
      prev_end = std::max(prev_end, end);
    }
    b.offset = best != kNoOffset ? best : prev_end;
    total = std::max(total, b.offset + b.bytes);
    placed.push_back(bi);
  }
  return total;
}

}  // namespace

std::int64_t auto_classifier_chunk_rows(std::int64_t rows, std::size_t logits_bytes) {
  if (logits_bytes <= kClassifierChunkMinBytes) return 0;
  std::int64_t r = (rows + kClassifierChunks - 1) / kClassifierChunks;
  r = std::max<std::int64_t>((r + 63) / 64 * 64, kClassifierChunkMinRows);
  return r < rows ? r : 0;
}

std::int64_t chunk_classifier(Graph& g, std::int64_t chunk_rows) {
  if (chunk_rows == 0) return 0;
  const std::size_t none = g.ops.size();
  auto find = [&](auto&& match) {
    for (std::size_t i = 0; i < g.ops.size(); ++i)
      if (match(g.ops[i])) return i;
    return none;
  };
  const std::size_t ce_f = find([](const Op& o) {
    return o.kind == OpKind::crossentropy_forward && o.phase == Phase::forward;
  });
  if (ce_f == none) return 0;
  const TensorId logits = g.ops[ce_f].inputs[0];
  const std::size_t head_f =
      find([&](const Op& o) { return o.kind == OpKind::matmul_forward && o.outputs[0] == logits; });
  const std::size_t ce_b = find([&](const Op& o) {
    return o.kind == OpKind::crossentropy_backward && o.inputs[0] == logits;
  });
  if (head_f == none || ce_b == none || g.ops[head_f].inputs.size() != 2) return 0;
  const TensorId dlogits = g.ops[ce_b].outputs[0];
  const std::size_t head_b = find(
      [&](const Op& o) { return o.kind == OpKind::matmul_backward && o.inputs[0] == dlogits; });
  if (head_b == none || head_f > ce_f || ce_b > head_b) return 0;
  const TensorId x = g.ops[head_f].inputs[0], w = g.ops[head_f].inputs[1];
  const std::int64_t Vp = g[w].shape[0], C = g[w].shape[1], N = g[x].elements() / C;
  if (chunk_rows < 0) chunk_rows = auto_classifier_chunk_rows(N, g[logits].bytes());
  if (chunk_rows <= 0 || chunk_rows >= N) return 0;

  const Op& ce = g.ops[ce_f];
  Op forward{OpKind::classifier_forward, Phase::forward, "classifier"};
  forward.inputs = {x, w, ce.inputs[1]};
  forward.outputs = {ce.outputs[0]};
  forward.vocab = ce.vocab;
  forward.chunk_rows = chunk_rows;
  forward.workspace =
      g.add_tensor("classifier.logits_chunk", {chunk_rows, Vp}, g[logits].dtype, Role::workspace);
  Op backward = forward;
  backward.kind = OpKind::classifier_backward;
  backward.phase = Phase::backward;
  backward.inputs.push_back(g.ops[ce_b].inputs[2]);  // scalars: the loss scale
  backward.outputs = {g.ops[head_b].outputs[0], g.ops[head_b].outputs[1], ce.outputs[0]};
  backward.workspace =
      g.add_tensor("classifier.dlogits_chunk", {chunk_rows, Vp}, g[logits].dtype, Role::workspace);
  std::vector<Op> ops;
  ops.reserve(g.ops.size() - 2);
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    if (i == ce_f || i == ce_b) continue;
    if (i == head_f)
      ops.push_back(forward);
    else if (i == head_b)
      ops.push_back(backward);
    else
      ops.push_back(std::move(g.ops[i]));
  }
  g.ops = std::move(ops);
  g[logits].grad = kNoTensor;  // logits and dlogits are no op's operands now
  return chunk_rows;
}

int fuse_elementwise(Graph& g) {
  // Count readers of every tensor: a residual sum may be fused only into its layernorm's op slot
  // when that layernorm directly follows it (the sum itself stays an output: backward needs it).
  int fused = 0;
  std::vector<Op> out;
  out.reserve(g.ops.size());
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& r = g.ops[i];
    if (r.kind == OpKind::residual_forward && r.phase == Phase::forward && i + 1 < g.ops.size()) {
      const Op& ln = g.ops[i + 1];
      const bool layernorm = ln.kind == OpKind::layernorm_forward;
      if ((layernorm || ln.kind == OpKind::rmsnorm_forward) && ln.phase == Phase::forward &&
          ln.inputs[0] == r.outputs[0]) {
        Op f{layernorm ? OpKind::residual_layernorm_forward : OpKind::residual_rmsnorm_forward,
             Phase::forward, r.name + "+" + ln.name};
        // {a, b, norm's parameters...} -> {sum, norm's outputs...}
        f.inputs = {r.inputs[0], r.inputs[1]};
        f.inputs.insert(f.inputs.end(), ln.inputs.begin() + 1, ln.inputs.end());
        f.outputs = {r.outputs[0]};
        f.outputs.insert(f.outputs.end(), ln.outputs.begin(), ln.outputs.end());
        out.push_back(std::move(f));
        ++i;
        ++fused;
        continue;
      }
    }
    out.push_back(r);
  }
  g.ops = std::move(out);
  return fused;
}

std::vector<bool> offloadable_optimizer_state(const Graph& g) {
  std::vector<bool> out(g.tensors.size(), false);
  for (const auto& op : g.ops) {
    if (op.kind != OpKind::adamw && op.kind != OpKind::sharded_adamw) continue;
    for (std::size_t k = 1; k < op.outputs.size(); ++k)
      if (g[op.outputs[k]].role == Role::optimizer_state)
        out[static_cast<std::size_t>(op.outputs[k])] = true;
  }
  return out;
}

MemoryPlan plan_memory(const Graph& g, const std::vector<TensorId>& gradient_order,
                       std::size_t comm_bytes, std::size_t alignment, bool offload_optimizer) {
  MemoryPlan mp;
  mp.offsets.assign(g.tensors.size(), kNoOffset);
  const auto live = liveness(g);
  const std::vector<bool> to_host =
      offload_optimizer ? offloadable_optimizer_state(g) : std::vector<bool>(g.tensors.size());
  std::size_t cursor = 0;
  // A persistent tensor (a view: its base) that some op touches; one no op touches (a sharded
  // plan's per-parameter optimizer state, which the checkpoint names but the shards hold) gets
  // no memory.
  auto put = [&](TensorId t) {
    if (g[t].view_of != kNoTensor) t = g[t].view_of;
    if (!is_persistent(g[t].role) || live[static_cast<std::size_t>(t)].first < 0) return;
    if (mp.offsets[static_cast<std::size_t>(t)] != kNoOffset) return;
    mp.offsets[static_cast<std::size_t>(t)] = cursor;
    cursor = align_up(cursor + g[t].bytes(), alignment);
  };
  // Persistent region: params, grads (bucket order), optimizer state, comm staging.
  for (auto p : g.params) put(p);
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t)
    if (g[t].role == Role::parameter) put(t);  // a sharded plan's parameter shards
  mp.parameter_bytes = cursor;
  for (auto t : gradient_order) put(t);
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t)
    if (g[t].role == Role::gradient) put(t);
  mp.gradient_bytes = cursor - mp.parameter_bytes;
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t)
    if (g[t].role == Role::optimizer_state && !to_host[static_cast<std::size_t>(t)]) put(t);
  mp.optimizer_bytes = cursor - mp.parameter_bytes - mp.gradient_bytes;
  mp.comm_bytes = align_up(comm_bytes, alignment);
  cursor += mp.comm_bytes;
  mp.persistent_bytes = cursor;

  // Planned region: one buffer per tensor, except in-place outputs that share their input's buffer.
  std::vector<Buffer> bufs;
  std::vector<int> buf_of(g.tensors.size(), -1);
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t) {
    const auto& iv = live[static_cast<std::size_t>(t)];
    if (is_persistent(g[t].role) || iv.first < 0 || g[t].view_of != kNoTensor) continue;
    buf_of[static_cast<std::size_t>(t)] = static_cast<int>(bufs.size());
    bufs.push_back(Buffer{align_up(g[t].bytes(), alignment), iv, {t}, 0});
  }
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind != OpKind::crossentropy_backward) continue;
    TensorId in = op.inputs[0], out = op.outputs[0];
    int bi = buf_of[static_cast<std::size_t>(in)], bo = buf_of[static_cast<std::size_t>(out)];
    if (bi < 0 || bo < 0 || bi == bo) continue;
    Buffer& a = bufs[static_cast<std::size_t>(bi)];
    Buffer& b = bufs[static_cast<std::size_t>(bo)];
    if (a.live.last == static_cast<int>(i) && b.live.first == static_cast<int>(i) &&
        a.bytes == b.bytes) {
      a.live.last = b.live.last;  // dlogits overwrites logits row by row: one buffer
      a.tensors.push_back(out);
      b.bytes = 0;
      b.tensors.clear();
      buf_of[static_cast<std::size_t>(out)] = bi;
    }
  }
  // Lower bound: the largest sum of live planned bytes at any op (unaligned, exact sizes).
  const int n = static_cast<int>(g.ops.size());
  std::vector<long long> delta(static_cast<std::size_t>(n) + 1, 0);
  for (const auto& b : bufs) {
    if (b.tensors.empty()) continue;
    std::size_t raw = 0;
    for (auto t : b.tensors) raw = std::max(raw, g[t].bytes());
    delta[static_cast<std::size_t>(b.live.first)] += static_cast<long long>(raw);
    delta[static_cast<std::size_t>(b.live.last) + 1] -= static_cast<long long>(raw);
  }
  long long run = 0, peak = 0;
  for (int i = 0; i < n; ++i) {
    run += delta[static_cast<std::size_t>(i)];
    if (run > peak) {
      peak = run;
      mp.peak_op = i;
    }
  }
  mp.max_live_bytes = mp.persistent_bytes + static_cast<std::size_t>(peak);
  for (const auto& b : bufs) {
    if (b.tensors.empty() || b.live.first > mp.peak_op || b.live.last < mp.peak_op) continue;
    const Role r = g[b.tensors.front()].role;
    if (r == Role::workspace)
      mp.workspace_peak_bytes += b.bytes;
    else if (r == Role::input)
      mp.input_bytes += b.bytes;
    else
      mp.activation_peak_bytes += b.bytes;
  }

  // Two greedy orders (XLA keeps the better): by size, and by start time.
  std::vector<std::size_t> by_size, by_time;
  for (std::size_t i = 0; i < bufs.size(); ++i)
    if (!bufs[i].tensors.empty()) by_size.push_back(i);
  by_time = by_size;
  std::stable_sort(by_size.begin(), by_size.end(), [&](auto a, auto b) {
    const auto& x = bufs[a];
    const auto& y = bufs[b];
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    return x.live.first < y.live.first;
  });
  std::stable_sort(by_time.begin(), by_time.end(), [&](auto a, auto b) {
    const auto& x = bufs[a];
    const auto& y = bufs[b];
    if (x.live.first != y.live.first) return x.live.first < y.live.first;
    return x.bytes > y.bytes;
  });
  auto size_bufs = bufs;
  const std::size_t size_total = place(size_bufs, by_size);
  const std::size_t time_total = place(bufs, by_time);
  if (size_total <= time_total) {
    bufs = std::move(size_bufs);
    mp.planned_bytes = size_total;
    mp.strategy = "size";
  } else {
    mp.planned_bytes = time_total;
    mp.strategy = "time";
  }
  for (const auto& b : bufs)
    for (auto t : b.tensors)
      mp.offsets[static_cast<std::size_t>(t)] = mp.persistent_bytes + b.offset;
  mp.arena_bytes = mp.persistent_bytes + align_up(mp.planned_bytes, alignment);
  // The offloaded state after the arena: [arena_bytes, arena_bytes + host_bytes).
  cursor = mp.arena_bytes;
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t)
    if (to_host[static_cast<std::size_t>(t)]) put(t);
  mp.host_bytes = cursor - mp.arena_bytes;
  mp.optimizer_bytes += mp.host_bytes;
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors.size()); ++t) {
    const TensorId base = g[t].view_of;
    if (base == kNoTensor || mp.offsets[static_cast<std::size_t>(base)] == kNoOffset) continue;
    mp.offsets[static_cast<std::size_t>(t)] =
        mp.offsets[static_cast<std::size_t>(base)] +
        static_cast<std::size_t>(g[t].view_offset) * dtype_bytes(g[base].dtype);
  }
  return mp;
}

namespace {

// The op that recomputes tensor t: its producer, except that the normalised output of a fused
// residual+layernorm (or +rmsnorm) is recomputed by a plain layernorm (rmsnorm) from the saved sum
// (the residual branch inputs are dead by then; the sum is saved for the layernorm backward
// anyway).
Op recompute_source(const Op& producer, TensorId t) {
  const bool layernorm = producer.kind == OpKind::residual_layernorm_forward;
  if ((layernorm || producer.kind == OpKind::residual_rmsnorm_forward) &&
      t != producer.outputs[0]) {
    Op ln{layernorm ? OpKind::layernorm_forward : OpKind::rmsnorm_forward, Phase::forward,
          producer.name};
    ln.inputs = {producer.outputs[0]};
    ln.inputs.insert(ln.inputs.end(), producer.inputs.begin() + 2, producer.inputs.end());
    ln.outputs.assign(producer.outputs.begin() + 1, producer.outputs.end());
    return ln;
  }
  return producer;
}

}  // namespace

Graph apply_recompute(const Graph& base, const std::vector<TensorId>& recomputed) {
  Graph g = base;
  std::set<TensorId> S(recomputed.begin(), recomputed.end());
  std::map<TensorId, std::size_t> producer;
  for (std::size_t i = 0; i < base.ops.size(); ++i)
    if (base.ops[i].phase == Phase::forward)
      for (auto t : base.ops[i].outputs) producer[t] = i;
  std::map<TensorId, TensorId> copy;  // original -> recomputed
  std::vector<Op> ops;
  ops.reserve(base.ops.size() + 2 * recomputed.size());
  auto ensure = [&](auto&& self, TensorId t) -> TensorId {
    if (auto it = copy.find(t); it != copy.end()) return it->second;
    const Op p = recompute_source(base.ops[producer.at(t)], t);
    Op clone = p;
    clone.phase = Phase::recompute;
    clone.name = p.name + " (recompute)";
    for (auto& in : clone.inputs)
      if (S.count(in)) in = self(self, in);
    for (auto& out : clone.outputs) {
      const Tensor src = g[out];
      TensorId fresh = g.add_tensor(src.name + "'", src.shape, src.dtype, src.role);
      if (S.count(out)) copy[out] = fresh;
      out = fresh;
    }
    if (p.workspace != kNoTensor) {
      const Tensor ws = g[p.workspace];
      clone.workspace = g.add_tensor(ws.name + "'", ws.shape, ws.dtype, ws.role);
    }
    ops.push_back(std::move(clone));
    return copy.at(t);
  };
  for (const Op& op : base.ops) {
    if (op.phase != Phase::backward || S.empty()) {
      ops.push_back(op);
      continue;
    }
    Op b = op;
    for (auto& in : b.inputs)
      if (S.count(in)) in = ensure(ensure, in);
    ops.push_back(std::move(b));
  }
  g.ops = std::move(ops);
  return g;
}

namespace {

struct Realized {
  Graph graph;
  CommPlan comm;
  MemoryPlan memory;
};

// Inserts one all_reduce after the op that completes each bucket (gradients taken in the order
// they become final, i.e. reverse layer order) and simulates the overlap with the backward.
CommPlan insert_buckets(Graph& g, std::size_t cap, const CommModel& m,
                        std::vector<TensorId>& grad_order, bool bucketed) {
  CommPlan cp;
  cp.bucket_cap_bytes = cap;
  grad_order.clear();
  std::map<TensorId, std::size_t> last_writer;
  std::set<TensorId> is_grad;
  for (auto p : g.params) is_grad.insert(g[p].grad);
  std::size_t last_backward = 0;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.phase != Phase::backward && op.phase != Phase::recompute) continue;
    last_backward = i;
    for (auto t : op.outputs)
      if (is_grad.count(t)) last_writer[t] = i;
  }
  const double flops_per_ms = m.compute_gflops * 1e6;
  const double n = static_cast<double>(m.world_size);
  auto comm_ms = [&](std::size_t bytes) {
    return m.latency_us / 1e3 +
           2.0 * (n - 1) / n * static_cast<double>(bytes) / (m.link_gbytes_per_s * 1e6);
  };
  std::vector<Op> ops;
  Bucket cur;
  double t_ms = 0, comm_free_ms = 0, backward_end_ms = 0;
  auto close = [&]() {
    if (cur.grads.empty()) return;
    for (auto gt : cur.grads) grad_order.push_back(gt);
    cur.ready_ms = t_ms;
    cur.start_ms = std::max(t_ms, comm_free_ms);
    cur.done_ms = cur.start_ms + comm_ms(cur.bytes);
    comm_free_ms = cur.done_ms;
    cp.comm_ms += cur.done_ms - cur.start_ms;
    Op ar{OpKind::all_reduce, Phase::communication,
          "all_reduce bucket " + std::to_string(cp.buckets.size())};
    ar.inputs = cur.grads;
    ar.outputs = cur.grads;
    ar.bucket = static_cast<int>(cp.buckets.size());
    ops.push_back(std::move(ar));
    cur.issue_after_op = static_cast<int>(ops.size()) - 1;
    cp.buckets.push_back(cur);
    cur = Bucket{};
  };
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    ops.push_back(op);
    t_ms += op_flops(g, op) / flops_per_ms;
    if (op.phase == Phase::forward || op.phase == Phase::backward || op.phase == Phase::recompute)
      backward_end_ms = t_ms;
    if (!bucketed) continue;
    for (auto t : op.outputs) {
      auto it = last_writer.find(t);
      if (it == last_writer.end() || it->second != i) continue;
      if (std::find(cur.grads.begin(), cur.grads.end(), t) != cur.grads.end()) continue;
      cur.grads.push_back(t);
      cur.bytes += align_up(g[t].bytes(), 256);
    }
    if (cur.bytes >= cap || (i == last_backward && !cur.grads.empty())) close();
  }
  g.ops = std::move(ops);
  cp.compute_ms = backward_end_ms;
  cp.exposed_ms = m.world_size > 1 ? std::max(0.0, comm_free_ms - backward_end_ms) : 0.0;
  std::size_t grad_bytes = 0;
  for (auto p : g.params) grad_bytes += g[g[p].grad].bytes();
  cp.bytes_per_step =
      m.world_size > 1
          ? static_cast<std::size_t>(2.0 * (n - 1) / n * static_cast<double>(grad_bytes))
          : 0;
  return cp;
}

std::size_t max_bucket_bytes(const CommPlan& cp) {
  std::size_t b = 0;
  for (const auto& k : cp.buckets) b = std::max(b, k.bytes);
  return b;
}

}  // namespace

namespace {

// PlanOptions::fused_attention_workspace: every attention backward's workspace tensor grows to the
// fused attention's need (fp32 elements, one dimension); its first B*NH*T floats stay our kernels'.
void size_fused_attention_workspace(Graph& g) {
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::attention_backward || op.workspace == kNoTensor ||
        op.inputs.size() < 2 || op.num_heads <= 0)
      continue;
    if (g[op.inputs[1]].shape.size() != 3) continue;
    const AttentionShape a = attention_shape(g, op, op.inputs[1]);
    if (a.NKV != a.NH) continue;  // grouped-query: our kernels only (cuda_backend.cu)
    const std::size_t need = fused_attention_accumulator_bytes(a.B, a.T, a.C, a.NH) +
                             kFusedAttentionEngineWorkspaceBytes;
    Tensor& ws = g[op.workspace];
    if (ws.bytes() >= need) continue;
    ws.shape = {static_cast<std::int64_t>((need + 3) / 4)};
    ws.dtype = DType::f32;
  }
}

}  // namespace

Result<Plan> compile_plan(Graph graph, const PlanOptions& opt) {
  Plan plan;
  plan.memory_budget_bytes = opt.memory_budget_bytes;
  if (opt.fuse) plan.fused_pairs = fuse_elementwise(graph);
  plan.classifier_chunk_rows = chunk_classifier(graph, opt.classifier_chunk_rows);
  if (opt.fused_attention_workspace && graph.precision.fp32_statistics)
    size_fused_attention_workspace(graph);
  for (const auto& op : graph.ops) plan.step_flops += op_flops(graph, op);

  // Communication: pick the bucket cap that minimises the exposed tail, then the smallest
  // accumulation that keeps exposed / compute within the budget.
  const CommModel& m = opt.comm;
  std::size_t cap = m.bucket_cap_bytes;
  if (m.world_size > 1 && cap == 0) {
    // Every extra collective costs latency and (on GPUs) SMs that the simple model does not
    // charge, so take the largest cap whose exposed tail is within 5% (+10 us) of the best.
    std::vector<std::pair<std::size_t, double>> exposed;
    double best = 1e300;
    for (std::size_t mib : {1, 2, 4, 8, 16, 25, 32, 64, 128, 256, 1024}) {
      Graph probe = graph;
      std::vector<TensorId> order;
      const double e = insert_buckets(probe, mib << 20, m, order, true).exposed_ms;
      exposed.emplace_back(mib << 20, e);
      best = std::min(best, e);
    }
    for (auto [c, e] : exposed)
      if (e <= best * 1.05 + 0.01) cap = c;
  }
  if (cap == 0) cap = 25u << 20;
  // Every shard mode gets these buckets (the same cap), so that their segments, and the order
  // of every sum, are the same in every mode.
  auto realize = [&](const std::vector<TensorId>& recomputed, ShardMode mode,
                     bool offload = false) {
    Realized r{apply_recompute(graph, recomputed), {}, {}};
    std::vector<TensorId> order;
    const bool bucketed = m.world_size > 1 || mode != ShardMode::none;
    r.comm = insert_buckets(r.graph, cap, m, order, bucketed);
    if (bucketed) {
      detail::lay_out_buckets(r.graph, r.comm, mode, m.world_size, m.rank);
      order = detail::gradient_order(r.graph, r.comm);
      detail::time_communication(r.graph, r.comm, m);
    }
    // Staging for a ring all-reduce: one chunk of the largest bucket per peer.
    const std::size_t staging = m.world_size > 1 ? max_bucket_bytes(r.comm) : 0;
    r.memory = plan_memory(r.graph, order, staging, opt.alignment, offload);
    for (auto& b : r.comm.buckets) {
      if (b.grad_buffer == kNoTensor) continue;
      b.offset = r.memory.offsets[static_cast<std::size_t>(b.grad_buffer)];
      b.bytes = r.graph[b.grad_buffer].bytes();
    }
    return r;
  };

  const std::size_t budget = opt.memory_budget_bytes;
  ShardMode mode = opt.shard;
  if (opt.shard_auto) {
    // The least sharding that fits without recomputation; else the mode with the smallest plan.
    ShardMode smallest = ShardMode::none;
    std::size_t smallest_bytes = 0;
    bool fits = false;
    for (ShardMode candidate :
         {ShardMode::none, ShardMode::optimizer, ShardMode::gradients, ShardMode::parameters}) {
      const std::size_t bytes = realize({}, candidate).memory.arena_bytes;
      plan.shard_candidates.emplace_back(candidate, bytes);
      if (smallest_bytes == 0 || bytes < smallest_bytes) {
        smallest = candidate;
        smallest_bytes = bytes;
      }
      if (budget == 0 || bytes <= budget) {
        mode = candidate;
        fits = true;
        break;
      }
    }
    std::string tried;
    for (auto [c, bytes] : plan.shard_candidates)
      tried += std::string(tried.empty() ? "" : ", ") + std::string(shard_mode_name(c)) + " " +
               format_bytes(bytes);
    if (fits) {
      plan.shard_reason = "shard = \"auto\" chose \"" + std::string(shard_mode_name(mode)) +
                          "\": the least sharding whose arena fits " +
                          (budget ? "the budget of " + format_bytes(budget) : "(no budget)") +
                          " (" + tried + ")";
    } else {
      mode = smallest;
      plan.shard_reason = "shard = \"auto\" chose \"" + std::string(shard_mode_name(mode)) +
                          "\" and recomputation: no mode fits the budget of " +
                          format_bytes(budget) + " (" + tried + "); \"" +
                          std::string(shard_mode_name(mode)) + "\" is the smallest" +
                          (m.world_size == 1 ? " (one rank: sharding saves nothing)" : "");
    }
  }

  Realized best = realize({}, mode);
  plan.unconstrained = best.memory;
  // Greedy over candidates ordered by recompute flops per byte freed; keep a pick only when the
  // re-planned arena shrinks (fragmentation makes savings non-additive). They depend on the graph
  // alone: found once, on the first budget that needs them.
  std::optional<std::vector<RecomputeDecision>> candidates;
  auto fully_recomputed = [&]() -> const std::vector<RecomputeDecision>& {
    if (candidates) return *candidates;
    std::vector<RecomputeDecision> cands;
    const auto live = liveness(graph);
    std::map<TensorId, std::size_t> producer;
    int first_backward = static_cast<int>(graph.ops.size());
    for (std::size_t i = 0; i < graph.ops.size(); ++i) {
      const Op& op = graph.ops[i];
      if (op.phase == Phase::forward)
        for (auto t : op.outputs) producer[t] = i;
      if (op.phase == Phase::backward)
        first_backward = std::min(first_backward, static_cast<int>(i));
    }
    std::size_t largest = 0;
    for (auto [t, pi] : producer) {
      const Tensor& tensor = graph[t];
      if (tensor.role != Role::activation || t == graph.losses) continue;
      if (live[static_cast<std::size_t>(t)].last < first_backward)
        continue;  // not saved for backward
      const Op p = recompute_source(graph.ops[pi], t);
      if (p.kind == OpKind::crossentropy_forward) continue;
      double freed = static_cast<double>(tensor.bytes());
      for (auto u : p.inputs) {
        const Tensor& in = graph[u];
        if (is_persistent(in.role) || in.role == Role::input) continue;
        if (live[static_cast<std::size_t>(u)].last < first_backward)
          freed -= static_cast<double>(in.bytes());
      }
      if (freed <= 0) continue;
      cands.push_back({t, tensor.name, p.name, op_flops(graph, p), tensor.bytes()});
      largest = std::max(largest, tensor.bytes());
    }
    // mean/rstd and attention statistics never pay for a re-plan.
    std::erase_if(cands, [&](const auto& c) { return c.bytes * 1024 < largest; });
    std::stable_sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
      return a.flops / static_cast<double>(a.bytes) < b.flops / static_cast<double>(b.bytes);
    });
    candidates = std::move(cands);
    return *candidates;
  };
  // Recomputation, cheapest per byte first, from `start` until the arena fits the budget.
  struct Fitted {
    Realized realized;
    std::vector<RecomputeDecision> chosen;
    double extra_flops = 0, extra_ms = 0;
  };
  const double flops_per_ms = std::max(opt.comm.compute_gflops, 1e-9) * 1e6;
  const double bytes_per_ms = std::max(opt.device_gbytes_per_s, 1e-9) * 1e6;
  auto fit = [&](Realized start, bool offload) {
    Fitted f{std::move(start), {}, 0, 0};
    if (budget == 0 || f.realized.memory.arena_bytes <= budget) return f;
    std::vector<TensorId> S;
    for (const auto& c : fully_recomputed()) {
      S.push_back(c.tensor);
      Realized r = realize(S, mode, offload);
      if (std::getenv("TOPOLAUNCH_PLAN_DEBUG"))
        std::fprintf(stderr, "remat try %s: %zu -> %zu\n", c.tensor_name.c_str(),
                     f.realized.memory.arena_bytes, r.memory.arena_bytes);
      if (r.memory.arena_bytes < f.realized.memory.arena_bytes) {
        f.realized = std::move(r);
        f.chosen.push_back(c);
        if (f.realized.memory.arena_bytes <= budget) break;
      } else {
        S.pop_back();
      }
    }
    const Graph& rg = f.realized.graph;
    for (const auto& op : rg.ops) {
      if (op.phase != Phase::recompute) continue;
      const double flops = op_flops(rg, op);
      double bytes = 0;
      for (auto t : op.inputs) bytes += static_cast<double>(rg[t].bytes());
      for (auto t : op.outputs) bytes += static_cast<double>(rg[t].bytes());
      f.extra_flops += flops;
      f.extra_ms += std::max(flops / flops_per_ms, bytes / bytes_per_ms);
    }
    return f;
  };
  const int accum = std::max(opt.comm.grad_accum, 1);
  // AdamW reads and writes each offloaded byte once per optimizer step, in one pass: the reads
  // and the writes cross the (full-duplex) link in opposite directions at once. An H100's PCIe
  // Gen5 x16 link measured 1.39 GiB each way in 31.3 ms (47.7 GB/s each way) on GPT-2 124M.
  auto offload_ms = [&](const MemoryPlan& mp) {
    return static_cast<double>(mp.host_bytes) / (std::max(opt.host_link_gbytes_per_s, 1e-9) * 1e6);
  };
  auto take = [&](Fitted f, bool offloaded) {
    best = std::move(f.realized);
    plan.recompute = std::move(f.chosen);
    plan.extra_flops = f.extra_flops;
    plan.recompute_ms = f.extra_ms;
    plan.optimizer_offloaded = offloaded;
    plan.offload_ms = offloaded ? offload_ms(best.memory) : 0.0;
  };
  auto figure = [](double value, const char* unit) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g %s", value, unit);
    return std::string(b);
  };
  auto ms_text = [&](double ms) { return figure(ms, "ms"); };

  if (opt.offload == OffloadMode::optimizer) {
    take(fit(realize({}, mode, true), true), true);
    plan.offload_reason = "offload = \"optimizer\": " + format_bytes(best.memory.host_bytes) +
                          " of optimizer state in host memory";
  } else if (budget != 0 && best.memory.arena_bytes > budget) {
    Fitted in_device = fit(std::move(best), false);
    const bool device_fits = in_device.realized.memory.arena_bytes <= budget;
    if (opt.offload == OffloadMode::automatic) {
      Fitted on_host = fit(realize({}, mode, true), true);
      const bool host_fits = on_host.realized.memory.arena_bytes <= budget;
      // Per micro-step: the recomputation runs in every one, the offload once per optimizer step.
      const double device_cost = in_device.extra_ms;
      const double host_cost = on_host.extra_ms + offload_ms(on_host.realized.memory) / accum;
      // Neither fits: the smaller, whose size the refusal names.
      const bool offload = host_fits ? !device_fits || host_cost < device_cost
                                     : !device_fits && on_host.realized.memory.arena_bytes <
                                                           in_device.realized.memory.arena_bytes;
      if (host_fits)
        plan.offload_reason =
            std::string("offload = \"auto\" ") +
            (offload ? "moved the optimizer state to host memory: "
                     : "kept the optimizer state "
                       "in device memory: ") +
            (device_fits ? "recomputation alone costs " + ms_text(device_cost) +
                               " per micro-step, the offload " + ms_text(host_cost)
                         : "without it no recomputation fits the budget") +
            (offload ? " (" + format_bytes(on_host.realized.memory.host_bytes) + " over " +
                           ms_text(offload_ms(on_host.realized.memory)) +
                           " per optimizer step, at " + figure(opt.host_link_gbytes_per_s, "GB/s") +
                           " each way: train.host_link_gbytes_per_s)"
                     : "");
      if (offload)
        take(std::move(on_host), true);
      else
        take(std::move(in_device), false);
    } else {
      take(std::move(in_device), false);
    }
  }
  if (budget != 0 && best.memory.arena_bytes > budget) {
    const std::size_t model_state = best.memory.persistent_bytes;
    const std::string hint =
        opt.offload == OffloadMode::none && !opt.offload_key.empty()
            ? "; " + opt.offload_key +
                  " = \"auto\" or \"optimizer\" keeps the optimizer state in host memory"
            : "";
    if (budget < model_state)
      return make_error(opt.budget_key + ": " + format_bytes(budget) + " is below the " +
                        (plan.optimizer_offloaded ? "parameters and gradients ("
                                                  : "parameters, gradients and optimizer "
                                                    "state (") +
                        format_bytes(model_state) +
                        "); the smallest budget that fits this model and batch is " +
                        format_bytes(best.memory.arena_bytes) + hint);
    return make_error(
        opt.budget_key + ": the plan needs " + format_bytes(plan.unconstrained.arena_bytes) +
        " and rematerialisation brings it down to " + format_bytes(best.memory.arena_bytes) +
        ", above the budget of " + format_bytes(budget) + "; the smallest budget that fits is " +
        format_bytes(best.memory.arena_bytes) + " (or reduce train.batch)" + hint);
  }
  plan.graph = std::move(best.graph);
  plan.memory = std::move(best.memory);
  plan.comm = std::move(best.comm);
  plan.comm.shard = mode;
  plan.comm.world_size = m.world_size;
  plan.comm.rank = m.rank;
  // The accumulation that keeps exposed communication within budget.
  const bool bucketed = !plan.comm.buckets.empty();
  auto exposed_at = [&](int k) {
    if (!bucketed) return 0.0;
    detail::combine_step_figures(plan.comm, k);
    return plan.comm.exposed_ms;
  };
  auto bytes_at = [&](int k) {
    if (!bucketed) return std::size_t{0};
    detail::combine_step_figures(plan.comm, k);
    return plan.comm.bytes_per_step;
  };
  if (m.world_size <= 1) {
    plan.comm.grad_accum = m.grad_accum > 0 ? m.grad_accum : 1;
  } else if (m.grad_accum > 0) {
    plan.comm.grad_accum = m.grad_accum;
  } else {
    plan.comm.grad_accum = m.max_grad_accum;
    for (int k = 1; k <= m.max_grad_accum; ++k) {
      const double exposed = exposed_at(k) / k;
      const bool time_ok = m.max_exposed_ms > 0
                               ? exposed <= m.max_exposed_ms
                               : exposed <= m.max_exposed_fraction * plan.comm.compute_ms;
      const bool bytes_ok = m.max_bytes_per_step == 0 || bytes_at(k) <= m.max_bytes_per_step * k;
      if (time_ok && bytes_ok) {
        plan.comm.grad_accum = k;
        break;
      }
    }
  }
  const int k = plan.comm.grad_accum;
  if (bucketed) detail::combine_step_figures(plan.comm, k);
  plan.comm.exposed_fraction =
      plan.comm.compute_ms > 0 ? plan.comm.exposed_ms / (k * plan.comm.compute_ms) : 0;
  plan.comm.within_budget =
      (m.max_exposed_ms > 0 ? plan.comm.exposed_ms / k <= m.max_exposed_ms + 1e-12
                            : plan.comm.exposed_fraction <= m.max_exposed_fraction + 1e-12) &&
      (m.max_bytes_per_step == 0 ||
       plan.comm.bytes_per_step <= m.max_bytes_per_step * static_cast<std::size_t>(k));
  return plan;
}

std::string_view shard_mode_name(ShardMode mode) {
  switch (mode) {
    case ShardMode::none:
      return "none";
    case ShardMode::optimizer:
      return "optimizer";
    case ShardMode::gradients:
      return "gradients";
    case ShardMode::parameters:
      return "parameters";
  }
  return "?";
}

std::string format_bytes(std::size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

std::string format_plan(const Plan& p, bool list_ops) {
  std::string s;
  char line[512];
  const Graph& g = p.graph;
  const MemoryPlan& mp = p.memory;
  std::map<Phase, int> per_phase;
  for (const auto& op : g.ops) per_phase[op.phase]++;
  std::snprintf(line, sizeof line,
                "plan: %zu ops (forward %d, backward %d, recompute %d, communication %d, optimizer "
                "%d), %zu tensors, %zu parameters, %d fused residual+layernorm\n",
                g.ops.size(), per_phase[Phase::forward], per_phase[Phase::backward],
                per_phase[Phase::recompute], per_phase[Phase::communication],
                per_phase[Phase::optimizer], g.tensors.size(), g.parameter_count(), p.fused_pairs);
  s += line;
  if (p.classifier_chunk_rows > 0)
    for (const auto& op : g.ops)
      if (op.kind == OpKind::classifier_backward) {
        const std::int64_t rows = g[op.inputs[0]].elements() / g[op.inputs[1]].shape[1];
        std::snprintf(line, sizeof line,
                      "classifier: logits of %lld rows in chunks of %lld (workspace %s each for "
                      "the forward and the backward)\n",
                      static_cast<long long>(rows), static_cast<long long>(p.classifier_chunk_rows),
                      format_bytes(g[op.workspace].bytes()).c_str());
        s += line;
        break;
      }
  if (list_ops) {
    s += "ops:\n";
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      const Op& op = g.ops[i];
      std::snprintf(line, sizeof line, "  %4zu  %-13s %-28s %s\n", i,
                    std::string(phase_name(op.phase)).c_str(),
                    std::string(op_name(op.kind)).c_str(), op.name.c_str());
      s += line;
    }
  }
  s += "arena (one allocation):\n";
  auto row = [&](const char* what, std::size_t bytes) {
    std::snprintf(line, sizeof line, "  %-34s %14s\n", what, format_bytes(bytes).c_str());
    s += line;
  };
  row("parameters", mp.parameter_bytes);
  row("gradients", mp.gradient_bytes);
  row("optimizer state", mp.optimizer_bytes);
  if (mp.host_bytes) row("  of which in host memory", mp.host_bytes);
  row("communication buffers", mp.comm_bytes);
  row("planned region (activations, inputs,", mp.planned_bytes);
  row("  workspace; reused by liveness)", 0);
  row("  at peak: activations", mp.activation_peak_bytes);
  row("  at peak: workspace", mp.workspace_peak_bytes);
  row("  at peak: inputs", mp.input_bytes);
  row(mp.host_bytes ? "arena total (device memory)" : "arena total", mp.arena_bytes);
  row("max-live lower bound", mp.max_live_bytes);
  std::snprintf(line, sizeof line,
                "  arena / lower bound                %14.4f   (greedy order: %s, peak at op %d)\n",
                static_cast<double>(mp.arena_bytes) / static_cast<double>(mp.max_live_bytes),
                mp.strategy.c_str(), mp.peak_op);
  s += line;
  if (p.recompute.empty()) {
    s += "recompute: none\n";
  } else {
    std::snprintf(
        line, sizeof line,
        "recompute: %zu tensors, extra compute %.3g GFLOP per micro-step (%.2f%% of the step)\n",
        p.recompute.size(), p.extra_flops / 1e9, 100.0 * p.extra_flops / p.step_flops);
    s += line;
    for (const auto& r : p.recompute) {
      std::snprintf(line, sizeof line, "  %-24s %12s  by %-26s %10.3g GFLOP\n",
                    r.tensor_name.c_str(), format_bytes(r.bytes).c_str(), r.op_name.c_str(),
                    r.flops / 1e9);
      s += line;
    }
  }
  if (p.optimizer_offloaded) {
    std::snprintf(line, sizeof line,
                  "offload: %s of optimizer state in host memory, read and written by AdamW "
                  "(%.3g ms per optimizer step at the model's host link)\n",
                  format_bytes(mp.host_bytes).c_str(), p.offload_ms);
    s += line;
  }
  if (!p.offload_reason.empty()) s += "  " + p.offload_reason + "\n";
  const CommPlan& c = p.comm;
  if (c.shard != ShardMode::none) {
    std::snprintf(line, sizeof line,
                  "sharding: %s over %d rank(s); this is rank %d's plan (every rank's has the "
                  "same sizes)\n",
                  std::string(shard_mode_name(c.shard)).c_str(), c.world_size, c.rank);
    s += line;
  }
  if (!p.shard_reason.empty()) s += "  " + p.shard_reason + "\n";
  if (c.buckets.empty()) {
    s += "communication: single rank, no gradient all-reduce\n";
  } else {
    const char* reduce = c.shard == ShardMode::none ? "all-reduce" : "reduce-scatter";
    std::snprintf(line, sizeof line,
                  "communication: %zu buckets (cap %s, %s), grad_accum %d, %s sent per rank per "
                  "step\n",
                  c.buckets.size(), format_bytes(c.bucket_cap_bytes).c_str(), reduce, c.grad_accum,
                  format_bytes(c.bytes_per_step).c_str());
    s += line;
    std::snprintf(line, sizeof line,
                  "  per rank: each micro-step %s (%.3f ms, exposed %.3f ms); the last one %s in "
                  "all (%.3f ms, exposed %.3f ms); after the optimizer %s (%.3f ms, exposed)\n",
                  format_bytes(c.bytes_every_micro_step).c_str(), c.comm_every_ms,
                  c.exposed_every_ms, format_bytes(c.bytes_last_micro_step).c_str(), c.comm_last_ms,
                  c.exposed_last_ms, format_bytes(c.bytes_after_optimizer).c_str(),
                  c.comm_after_optimizer_ms);
    s += line;
    for (std::size_t i = 0; i < c.buckets.size(); ++i) {
      const Bucket& b = c.buckets[i];
      std::snprintf(line, sizeof line,
                    "  bucket %2zu  %10s  %3zu grads  first %-16s %s after op %4d  ready %.3f "
                    "ms done %.3f ms\n",
                    i, format_bytes(b.bytes).c_str(), b.grads.size(),
                    g[b.grads.front()].name.c_str(), reduce, b.issue_after_op - 1, b.ready_ms,
                    b.done_ms);
      s += line;
    }
  }
  s += "budget vs planned:\n";
  if (p.memory_budget_bytes) {
    std::snprintf(line, sizeof line,
                  "  memory         budget %12s  planned %12s  (unconstrained %s)  %s\n",
                  format_bytes(p.memory_budget_bytes).c_str(), format_bytes(mp.arena_bytes).c_str(),
                  format_bytes(p.unconstrained.arena_bytes).c_str(),
                  mp.arena_bytes <= p.memory_budget_bytes ? "fits" : "OVER");
  } else {
    std::snprintf(line, sizeof line, "  memory         budget    unlimited  planned %12s\n",
                  format_bytes(mp.arena_bytes).c_str());
  }
  s += line;
  std::snprintf(line, sizeof line,
                "  communication  exposed %.3f ms of %.3f ms compute per micro-step x %d = %.2f%%  "
                "(comm %.3f ms)  %s\n",
                c.exposed_ms, c.compute_ms, c.grad_accum, 100.0 * c.exposed_fraction, c.comm_ms,
                c.within_budget ? "within budget" : "OVER budget");
  s += line;
  return s;
}

}  // namespace topolaunch::kernels
