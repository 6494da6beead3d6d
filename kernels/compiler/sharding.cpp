// Buckets as flat buffers and sharded data parallelism; see sharding.hpp and plan.hpp.
#include "sharding.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <string>

namespace topolaunch::kernels::detail {

namespace {

std::int64_t align_up(std::int64_t n, std::int64_t a) { return (n + a - 1) / a * a; }

// A bucket member starts at a multiple of this many elements (256 bytes of fp32, as the memory
// plan aligns every tensor).
constexpr std::int64_t kMemberAlignment = 64;

TensorId base_of(const Graph& g, TensorId t) {
  return g[t].view_of != kNoTensor ? g[t].view_of : t;
}

bool is_step_op(const Op& op) {
  return op.phase == Phase::forward || op.phase == Phase::backward ||
         op.phase == Phase::recompute || op.phase == Phase::communication;
}

// Whether a fwd/bwd communication op runs on every micro-step (else only on the last one).
bool every_micro_step(const Op& op) {
  return (op.kind == OpKind::reduce_scatter && op.outputs.size() == 2) ||
         op.kind == OpKind::all_gather;
}

}  // namespace

void lay_out_buckets(Graph& g, CommPlan& cp, ShardMode mode, int world, int rank) {
  cp.shard = mode;
  cp.world_size = world;
  cp.rank = rank;
  std::map<TensorId, TensorId> param_of;  // gradient -> parameter
  for (auto p : g.params) param_of[g[p].grad] = p;
  const DType pdt = g.precision.param, odt = g.precision.optimizer;
  const bool sharded = mode != ShardMode::none;
  const bool transient_grads = mode == ShardMode::gradients || mode == ShardMode::parameters;
  const std::string r = std::to_string(rank);
  std::map<TensorId, int> bucket_of_param;
  std::map<TensorId, TensorId> backward_view;  // parameter -> its view in the backward's copy
  std::map<TensorId, int> bucket_of_grad;
  for (std::size_t k = 0; k < cp.buckets.size(); ++k) {
    Bucket& b = cp.buckets[k];
    const std::string name = "bucket" + std::to_string(k);
    std::int64_t offset = 0;
    b.members.clear();
    for (auto gt : b.grads) {
      const TensorId p = param_of.at(gt);
      b.members.push_back({p, gt, offset, g[gt].elements(), g[p].decayed});
      offset = align_up(offset + g[gt].elements(), kMemberAlignment);
      bucket_of_param[p] = static_cast<int>(k);
      bucket_of_grad[gt] = static_cast<int>(k);
    }
    b.elements = align_up(std::max<std::int64_t>(offset, 1), kMemberAlignment * world);
    b.segment_elements = b.elements / world;
    const std::int64_t S = b.segment_elements, own = rank * S;
    const DType gdt = g[b.grads.front()].dtype;
    b.grad_buffer = g.add_tensor(name + ".grads", {b.elements}, gdt,
                                 transient_grads ? Role::activation : Role::gradient);
    for (const auto& m : b.members) {
      g[m.grad].view_of = b.grad_buffer;
      g[m.grad].view_offset = m.offset;
    }
    if (!sharded) continue;
    if (mode != ShardMode::parameters) {
      b.param_buffer = g.add_tensor(name + ".params", {b.elements}, pdt, Role::parameter);
      b.param_shard =
          g.add_view(name + ".params[rank " + r + "]", b.param_buffer, own, {S}, Role::parameter);
    } else {
      b.param_shard = g.add_tensor(name + ".param_shard", {S}, pdt, Role::parameter);
      b.param_buffer = g.add_tensor(name + ".params", {b.elements}, pdt, Role::activation);
      b.param_buffer_backward =
          g.add_tensor(name + ".params_backward", {b.elements}, pdt, Role::activation);
    }
    for (const auto& m : b.members) {
      g[m.param].view_of = b.param_buffer;
      g[m.param].view_offset = m.offset;
      if (mode == ShardMode::parameters) {
        const Tensor p = g[m.param];
        const TensorId v = g.add_view(p.name + " (backward)", b.param_buffer_backward, m.offset,
                                      p.shape, Role::activation);
        b.param_views_backward.push_back(v);
        backward_view[m.param] = v;
      }
    }
    b.grad_shard =
        mode == ShardMode::optimizer
            ? g.add_view(name + ".grads[rank " + r + "]", b.grad_buffer, own, {S}, Role::gradient)
            : g.add_tensor(name + ".grad_shard", {S}, gdt, Role::gradient);
    b.m_shard = g.add_tensor(name + ".m", {S}, odt, Role::optimizer_state);
    b.v_shard = g.add_tensor(name + ".v", {S}, odt, Role::optimizer_state);
    if (pdt != odt)
      b.master_shard = g.add_tensor(name + ".master", {S}, odt, Role::optimizer_state);
  }

  // Where the inserted ops go: the first op reading each bucket's parameters in the forward and
  // in the backward (ZeRO-3's gathers, one bucket ahead), and writing its gradients (ZeRO-2/3's
  // zero of the transient buffer).
  const std::size_t nb = cp.buckets.size();
  std::vector<int> first_forward(nb, INT_MAX), first_backward(nb, INT_MAX),
      first_grad_write(nb, INT_MAX);
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    const int at = static_cast<int>(i);
    const bool fwd = op.phase == Phase::forward;
    const bool bwd = op.phase == Phase::backward || op.phase == Phase::recompute;
    if (!fwd && !bwd) continue;
    for (auto t : op.inputs)
      if (auto it = bucket_of_param.find(t); it != bucket_of_param.end()) {
        auto& first = fwd ? first_forward : first_backward;
        first[static_cast<std::size_t>(it->second)] =
            std::min(first[static_cast<std::size_t>(it->second)], at);
      }
    if (bwd)
      for (auto t : op.outputs)
        if (auto it = bucket_of_grad.find(t); it != bucket_of_grad.end())
          first_grad_write[static_cast<std::size_t>(it->second)] =
              std::min(first_grad_write[static_cast<std::size_t>(it->second)], at);
  }
  // Prefetch: bucket L[i] (in order of first use) is gathered where L[i-1] is first used.
  auto gather_points = [&](const std::vector<int>& first) {
    std::vector<std::size_t> order;
    for (std::size_t k = 0; k < nb; ++k)
      if (first[k] != INT_MAX) order.push_back(k);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return first[a] < first[b]; });
    std::multimap<int, std::size_t> at;  // op index -> bucket, in order of use
    for (std::size_t i = 0; i < order.size(); ++i)
      at.emplace(first[order[i == 0 ? 0 : i - 1]], order[i]);
    return at;
  };
  const bool gathers = mode == ShardMode::parameters;
  const auto forward_gathers =
      gathers ? gather_points(first_forward) : std::multimap<int, std::size_t>{};
  const auto backward_gathers =
      gathers ? gather_points(first_backward) : std::multimap<int, std::size_t>{};

  std::vector<Op> ops;
  ops.reserve(g.ops.size() + 4 * nb);
  bool optimizer_emitted = false;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const int at = static_cast<int>(i);
    for (const auto* points : {&forward_gathers, &backward_gathers}) {
      auto [lo, hi] = points->equal_range(at);
      for (auto it = lo; it != hi; ++it) {
        const Bucket& b = cp.buckets[it->second];
        const bool forward = points == &forward_gathers;
        Op ag{OpKind::all_gather, Phase::communication,
              "all_gather bucket " + std::to_string(it->second) +
                  (forward ? " (forward)" : " (backward)")};
        ag.inputs = {b.param_shard};
        ag.outputs = {forward ? b.param_buffer : b.param_buffer_backward};
        ag.bucket = static_cast<int>(it->second);
        ops.push_back(std::move(ag));
      }
    }
    if (transient_grads)
      for (std::size_t k = 0; k < nb; ++k)
        if (first_grad_write[k] == at)
          ops.push_back(Op{OpKind::zero,
                           Phase::backward,
                           "zero bucket" + std::to_string(k) + ".grads",
                           {},
                           {cp.buckets[k].grad_buffer}});
    Op op = g.ops[i];
    switch (op.kind) {
      case OpKind::all_reduce: {
        const Bucket& b = cp.buckets[static_cast<std::size_t>(op.bucket)];
        op.inputs = {b.grad_buffer};
        op.outputs = {b.grad_buffer};
        if (sharded) {
          op.kind = OpKind::reduce_scatter;
          op.name = "reduce_scatter bucket " + std::to_string(op.bucket);
          if (transient_grads) op.outputs.push_back(b.grad_shard);
        }
        break;
      }
      case OpKind::global_norm:
        op.inputs.clear();
        if (sharded) {
          op.kind = OpKind::sharded_global_norm;
          for (const auto& b : cp.buckets) op.inputs.push_back(b.grad_shard);
        } else {
          for (const auto& b : cp.buckets) op.inputs.push_back(b.grad_buffer);
          op.segments = world;
        }
        break;
      case OpKind::adamw:
        if (!sharded) break;
        if (!optimizer_emitted) {
          optimizer_emitted = true;
          const TensorId norm = op.inputs[1], scalars = op.inputs[2];
          for (std::size_t k = 0; k < nb; ++k) {
            const Bucket& b = cp.buckets[k];
            Op a{OpKind::sharded_adamw, Phase::optimizer, "adamw bucket " + std::to_string(k)};
            a.inputs = {b.grad_shard, norm, scalars};
            a.outputs = {b.param_shard, b.m_shard, b.v_shard};
            if (b.master_shard != kNoTensor) a.outputs.push_back(b.master_shard);
            a.bucket = static_cast<int>(k);
            ops.push_back(std::move(a));
          }
          if (mode != ShardMode::parameters)
            for (std::size_t k = 0; k < nb; ++k) {
              const Bucket& b = cp.buckets[k];
              Op ag{OpKind::all_gather, Phase::optimizer,
                    "all_gather bucket " + std::to_string(k) + " (parameters)"};
              ag.inputs = {b.param_shard};
              ag.outputs = {b.param_buffer};
              ag.bucket = static_cast<int>(k);
              ops.push_back(std::move(ag));
            }
        }
        continue;  // the per-parameter AdamW is the buckets'
      case OpKind::zero:
        if (sharded && op.phase == Phase::optimizer) {
          op.outputs.clear();
          for (const auto& b : cp.buckets)
            op.outputs.push_back(transient_grads ? b.grad_shard : b.grad_buffer);
        }
        break;
      default:
        if (gathers && (op.phase == Phase::backward || op.phase == Phase::recompute))
          for (auto& t : op.inputs)
            if (auto it = backward_view.find(t); it != backward_view.end()) t = it->second;
        break;
    }
    ops.push_back(std::move(op));
  }
  g.ops = std::move(ops);
  TensorId previous_buffer = kNoTensor;  // of the reduce-scatter before, in op order
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    Op& op = g.ops[i];
    if ((op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter) && op.bucket >= 0) {
      cp.buckets[static_cast<std::size_t>(op.bucket)].issue_after_op = static_cast<int>(i);
      if (transient_grads && previous_buffer != kNoTensor) op.keep_alive = {previous_buffer};
      previous_buffer = op.inputs[0];
    }
  }
}

}  // namespace topolaunch::kernels::detail

namespace topolaunch::kernels {

ShardSlice shard_slice(const Bucket& b, const BucketMember& m, int rank) {
  const std::int64_t s0 = rank * b.segment_elements, s1 = s0 + b.segment_elements;
  const std::int64_t lo = std::max(s0, m.offset), hi = std::min(s1, m.offset + m.elements);
  if (lo >= hi) return {};
  return {lo - m.offset, hi - lo, lo - s0};
}

}  // namespace topolaunch::kernels

namespace topolaunch::kernels::detail {

std::vector<TensorId> gradient_order(const Graph& g, const CommPlan& cp) {
  (void)g;
  std::vector<TensorId> order;
  const bool transient = cp.shard == ShardMode::gradients || cp.shard == ShardMode::parameters;
  for (const auto& b : cp.buckets) order.push_back(transient ? b.grad_shard : b.grad_buffer);
  return order;
}

void time_communication(const Graph& g, CommPlan& cp, const CommModel& m) {
  const double n = static_cast<double>(cp.world_size);
  const double flops_per_ms = m.compute_gflops * 1e6;
  auto bytes_sent = [&](const Op& op) {
    const double b = static_cast<double>(g[op.outputs[0]].bytes());
    const double ring = (n - 1) / n;
    return op.kind == OpKind::all_reduce ? 2 * ring * b : ring * b;
  };
  auto duration_ms = [&](double sent) {
    return cp.world_size > 1 ? m.latency_us / 1e3 + sent / (m.link_gbytes_per_s * 1e6) : 0.0;
  };
  // One micro-step's forward and backward: compute in op order; communication on one channel,
  // each collective issued at its place and waited for by the first op that reads what it wrote
  // (and, at the end, by the optimizer).
  auto micro_step = [&](bool last, double& bytes, double& busy, double& exposed) {
    double clock = 0, channel = 0, compute = 0;
    std::map<TensorId, double> ready;  // base tensor -> when its collective is done
    bytes = busy = exposed = 0;
    for (const Op& op : g.ops) {
      if (!is_step_op(op)) continue;
      const bool comm = op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter ||
                        op.kind == OpKind::all_gather;
      if (comm) {
        if (!last && !every_micro_step(op)) continue;
        const double sent = bytes_sent(op);
        const double start = std::max(clock, channel), done = start + duration_ms(sent);
        channel = done;
        bytes += sent;
        busy += done - start;
        for (auto t : op.outputs) ready[base_of(g, t)] = done;
        if (last && op.bucket >= 0 && op.kind != OpKind::all_gather) {
          Bucket& b = cp.buckets[static_cast<std::size_t>(op.bucket)];
          b.ready_ms = clock;
          b.start_ms = start;
          b.done_ms = done;
        }
        continue;
      }
      double wait = clock;
      for (auto t : op.inputs)
        if (auto it = ready.find(base_of(g, t)); it != ready.end())
          wait = std::max(wait, it->second);
      exposed += wait - clock;
      const double ms = op_flops(g, op) / flops_per_ms;
      clock = wait + ms;
      compute += ms;
    }
    exposed += std::max(0.0, channel - clock);
    return compute;
  };
  double bytes = 0, busy = 0, exposed = 0;
  cp.compute_ms = micro_step(false, bytes, busy, exposed);
  cp.bytes_every_micro_step = static_cast<std::size_t>(bytes);
  cp.comm_every_ms = busy;
  cp.exposed_every_ms = exposed;
  micro_step(true, bytes, busy, exposed);
  cp.bytes_last_micro_step = static_cast<std::size_t>(bytes);
  cp.comm_last_ms = busy;
  cp.exposed_last_ms = exposed;
  // After the optimizer: its all-gathers (nothing overlaps them), and a sharded global norm's
  // gather of the partial sums (one latency).
  bytes = busy = 0;
  for (const Op& op : g.ops) {
    if (op.phase != Phase::optimizer) continue;
    if (op.kind == OpKind::all_gather) {
      const double sent = bytes_sent(op);
      bytes += sent;
      busy += duration_ms(sent);
    } else if (op.kind == OpKind::sharded_global_norm) {
      busy += duration_ms(0);
    }
  }
  cp.bytes_after_optimizer = static_cast<std::size_t>(bytes);
  cp.comm_after_optimizer_ms = busy;
  cp.exposed_after_optimizer_ms = busy;
  combine_step_figures(cp, cp.grad_accum > 0 ? cp.grad_accum : 1);
}

void combine_step_figures(CommPlan& cp, int k) {
  const double others = static_cast<double>(k - 1);
  cp.bytes_per_step =
      cp.bytes_last_micro_step +
      static_cast<std::size_t>(others * static_cast<double>(cp.bytes_every_micro_step)) +
      cp.bytes_after_optimizer;
  cp.comm_ms = cp.comm_last_ms + others * cp.comm_every_ms + cp.comm_after_optimizer_ms;
  cp.exposed_ms = cp.exposed_last_ms + others * cp.exposed_every_ms + cp.exposed_after_optimizer_ms;
}

}  // namespace topolaunch::kernels::detail
