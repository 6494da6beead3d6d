// Sharded data parallelism in the planner (ShardMode): what each rank holds per mode, the same
// buckets and segments in every mode, where the collectives go, the predicted communication, the
// "auto" choice, and one rank's sharded plans training as the unsharded one does.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "catch.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/kernels/rng.hpp"

using namespace topolaunch::kernels;

namespace {

const ShardMode kModes[] = {ShardMode::none, ShardMode::optimizer, ShardMode::gradients,
                            ShardMode::parameters};

Graph llama_training_graph(std::int64_t layers = 3) {
  LlamaConfig c;
  c.n_layer = layers;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.vocab_size = 50;
  c.batch = 2;
  c.seq_len = 16;
  Graph g = build_llama(c);
  append_backward(g);
  append_optimizer(g);
  return g;
}

Plan plan_for(ShardMode mode, int world, int rank = 0, std::size_t cap = 64 * 1024, int accum = 1) {
  PlanOptions o;
  o.shard = mode;
  o.comm.world_size = world;
  o.comm.rank = rank;
  o.comm.bucket_cap_bytes = cap;
  o.comm.grad_accum = accum;
  auto p = compile_plan(llama_training_graph(), o);
  REQUIRE(p.ok());
  return std::move(*p);
}

// Every parameter's current values (a ZeRO-3 plan keeps them in its shards: one rank's are all).
std::vector<float> parameters_of(CpuExecutor<float>& ex) {
  const Plan& p = ex.plan();
  std::vector<float> out;
  if (p.comm.shard != ShardMode::parameters) {
    for (auto t : p.graph.params)
      for (float v : ex.values(t)) out.push_back(v);
    return out;
  }
  std::map<TensorId, std::vector<float>> by_param;
  for (const auto& b : p.comm.buckets)
    for (const auto& m : b.members) {
      const float* s = ex.data(b.param_shard) + shard_slice(b, m, 0).shard_offset;
      by_param[m.param].assign(s, s + m.elements);
    }
  for (auto t : p.graph.params) out.insert(out.end(), by_param[t].begin(), by_param[t].end());
  return out;
}

std::vector<double> train(const Plan& plan, int steps, std::vector<float>* params) {
  CpuExecutor<float> ex(plan);
  const Graph& g = ex.plan().graph;
  ex.init_parameters(5);
  NormalRng rng(9);
  std::vector<double> losses;
  for (int s = 1; s <= steps; ++s) {
    for (std::int64_t i = 0; i < g[g.tokens].elements(); ++i) {
      ex.ints(g.tokens)[i] = static_cast<std::int32_t>(rng.next_u64() % 50);
      ex.ints(g.targets)[i] = static_cast<std::int32_t>(rng.next_u64() % 50);
    }
    ex.set_loss_scale(1.0 / static_cast<double>(g[g.losses].elements()));
    REQUIRE(ex.run_forward_backward(nullptr).ok());
    losses.push_back(ex.mean_loss());
    AdamWSettings adamw;
    adamw.grad_clip = 1e-3;  // always clipping: the global norm's value is used every step
    REQUIRE(ex.run_optimizer(adamw, s).ok());
  }
  if (params) *params = parameters_of(ex);
  return losses;
}

}  // namespace

TEST_CASE(
    "4 ranks: each mode holds a quarter of what it shards (AdamW state; + gradients; + "
    "parameters), the rest whole") {
  const Plan none = plan_for(ShardMode::none, 4);
  const std::size_t P = none.graph.parameter_count();
  const auto& m0 = none.memory;
  for (ShardMode mode : kModes) {
    INFO(shard_mode_name(mode));
    const Plan p = plan_for(mode, 4, 1);
    const auto& m = p.memory;
    const double quarter = static_cast<double>(P) * 4 / 4;  // fp32 bytes of a quarter of P
    auto near = [](std::size_t bytes, double want) {
      return std::abs(static_cast<double>(bytes) - want) <= 0.06 * want + 64 * 1024;
    };
    CHECK(near(m.optimizer_bytes, mode == ShardMode::none ? 2.0 * 4 * P : 2 * quarter));
    CHECK(near(m.gradient_bytes,
               mode == ShardMode::none || mode == ShardMode::optimizer ? 4.0 * P : quarter));
    CHECK(near(m.parameter_bytes, mode == ShardMode::parameters ? quarter : 4.0 * P));
    if (mode != ShardMode::none) CHECK(m.persistent_bytes < m0.persistent_bytes);
    CHECK(p.comm.shard == mode);
  }
  // ZeRO-2/3 hold the transient full buffers in the planned region instead: the largest bucket's
  // gradients (and ZeRO-3 the gathered parameters), not all of them.
  CHECK(plan_for(ShardMode::gradients, 4).memory.arena_bytes <
        plan_for(ShardMode::optimizer, 4).memory.arena_bytes);
  CHECK(plan_for(ShardMode::parameters, 4).memory.arena_bytes <
        plan_for(ShardMode::gradients, 4).memory.arena_bytes);
}

TEST_CASE("every mode has the same buckets, members and segments (so the same sums)") {
  const Plan none = plan_for(ShardMode::none, 4);
  REQUIRE(none.comm.buckets.size() > 2);
  for (ShardMode mode : kModes) {
    INFO(shard_mode_name(mode));
    const Plan p = plan_for(mode, 4, 2);
    REQUIRE(p.comm.buckets.size() == none.comm.buckets.size());
    for (std::size_t k = 0; k < p.comm.buckets.size(); ++k) {
      const Bucket& a = none.comm.buckets[k];
      const Bucket& b = p.comm.buckets[k];
      CHECK(a.elements == b.elements);
      CHECK(b.segment_elements * 4 == b.elements);
      CHECK(b.elements % (64 * 4) == 0);
      REQUIRE(a.members.size() == b.members.size());
      for (std::size_t i = 0; i < a.members.size(); ++i) {
        CHECK(p.graph[b.members[i].param].name == none.graph[a.members[i].param].name);
        CHECK(a.members[i].offset == b.members[i].offset);
        CHECK(b.members[i].offset % 64 == 0);
      }
    }
  }
}

TEST_CASE("shard_slice: a member's part within each rank's segment; the parts tile the member") {
  Bucket b;
  b.elements = 1024;
  b.segment_elements = 256;                    // 4 ranks
  const BucketMember m{0, 1, 200, 400, true};  // elements 200..600 of the bucket
  std::int64_t covered = 0;
  for (int r = 0; r < 4; ++r) {
    const ShardSlice s = shard_slice(b, m, r);
    if (s.count == 0) continue;
    CHECK(s.member_begin == covered);
    CHECK(m.offset + s.member_begin == r * 256 + s.shard_offset);
    covered += s.count;
  }
  CHECK(covered == 400);
  CHECK(shard_slice(b, m, 3).count == 0);
  CHECK(shard_slice(b, m, 0).count == 56);
}

TEST_CASE(
    "collectives in place: reduce-scatter for the all-reduce, ZeRO-2/3 zero each micro-step's "
    "buffer before its first gradient, ZeRO-3 gathers one bucket ahead of forward and backward") {
  for (ShardMode mode : kModes) {
    INFO(shard_mode_name(mode));
    const Plan p = plan_for(mode, 4, 3);
    const Graph& g = p.graph;
    std::map<OpKind, int> count;
    for (const auto& op : g.ops) ++count[op.kind];
    const int nb = static_cast<int>(p.comm.buckets.size());
    CHECK(count[OpKind::all_reduce] == (mode == ShardMode::none ? nb : 0));
    CHECK(count[OpKind::reduce_scatter] == (mode == ShardMode::none ? 0 : nb));
    CHECK(count[OpKind::adamw] ==
          (mode == ShardMode::none ? static_cast<int>(g.params.size()) : 0));
    CHECK(count[OpKind::sharded_adamw] == (mode == ShardMode::none ? 0 : nb));
    // optimizer, gradients: one gather of the updated parameters per bucket; parameters: two
    // per micro-step (forward, backward).
    CHECK(count[OpKind::all_gather] == (mode == ShardMode::none         ? 0
                                        : mode == ShardMode::parameters ? 2 * nb
                                                                        : nb));
    for (std::size_t k = 0; k < p.comm.buckets.size(); ++k) {
      const Bucket& b = p.comm.buckets[k];
      const Op& reduce = g.ops[static_cast<std::size_t>(b.issue_after_op)];
      CHECK(reduce.bucket == static_cast<int>(k));
      CHECK(reduce.inputs == std::vector<TensorId>{b.grad_buffer});
      // No op after the reduction writes the bucket's gradients in the backward.
      for (std::size_t i = static_cast<std::size_t>(b.issue_after_op) + 1; i < g.ops.size(); ++i) {
        if (g.ops[i].phase == Phase::optimizer) break;
        for (auto o : g.ops[i].outputs)
          for (const auto& m : b.members) CHECK(o != m.grad);
      }
      if (mode == ShardMode::none) continue;
      // Where the members' gradients are first written, their buffer was zeroed just before
      // (transient) or is zero from the last step (persistent).
      std::size_t first_write = g.ops.size(), zero_at = g.ops.size(), gather_fwd = g.ops.size(),
                  first_read = g.ops.size(), gather_bwd = g.ops.size(),
                  first_bwd_read = g.ops.size();
      std::set<TensorId> members,
          backward_views(b.param_views_backward.begin(), b.param_views_backward.end());
      for (const auto& m : b.members) members.insert(m.param);
      for (std::size_t i = 0; i < g.ops.size(); ++i) {
        const Op& op = g.ops[i];
        for (auto o : op.outputs) {
          if (o == b.grad_buffer && op.kind == OpKind::zero && op.phase == Phase::backward)
            zero_at = std::min(zero_at, i);
          for (const auto& m : b.members)
            if (o == m.grad) first_write = std::min(first_write, i);
          if (op.kind == OpKind::all_gather && o == b.param_buffer && op.phase != Phase::optimizer)
            gather_fwd = std::min(gather_fwd, i);
          if (op.kind == OpKind::all_gather && o == b.param_buffer_backward)
            gather_bwd = std::min(gather_bwd, i);
        }
        for (auto in : op.inputs) {
          if (op.phase == Phase::forward && members.count(in)) first_read = std::min(first_read, i);
          if (op.phase == Phase::backward && backward_views.count(in))
            first_bwd_read = std::min(first_bwd_read, i);
          if (mode == ShardMode::parameters && op.phase == Phase::backward)
            CHECK(members.count(in) == 0);
        }
      }
      if (mode == ShardMode::gradients || mode == ShardMode::parameters) {
        CHECK(zero_at < first_write);
        CHECK(g[b.grad_buffer].role == Role::activation);  // planned by liveness, not persistent
      }
      if (mode == ShardMode::parameters) {
        CHECK(gather_fwd < first_read);
        CHECK(gather_bwd < first_bwd_read);
        CHECK(first_bwd_read < g.ops.size());
      }
    }
  }
}

TEST_CASE(
    "predicted communication per rank and step: all-reduce 2(n-1)/n G; reduce-scatter + gather "
    "(n-1)/n (G + P); ZeRO-2/3 reduce every micro-step, ZeRO-3 gathers twice") {
  const double n = 4, ring = (n - 1) / n;
  const int k = 3;
  double G = 0;  // the buckets' padded fp32 bytes (parameters and gradients alike)
  for (const auto& b : plan_for(ShardMode::none, 4).comm.buckets)
    G += static_cast<double>(b.elements) * 4;
  auto sent = [&](ShardMode mode) {
    return static_cast<double>(plan_for(mode, 4, 0, 64 * 1024, k).comm.bytes_per_step);
  };
  auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 * b + 8; };
  CHECK(near(sent(ShardMode::none), 2 * ring * G));
  CHECK(near(sent(ShardMode::optimizer), ring * G + ring * G));
  CHECK(near(sent(ShardMode::gradients), k * ring * G + ring * G));
  CHECK(near(sent(ShardMode::parameters), k * (ring * G + 2 * ring * G)));
  const Plan p = plan_for(ShardMode::parameters, 4, 0, 64 * 1024, k);
  CHECK(p.comm.exposed_ms >= p.comm.exposed_every_ms * k);
  CHECK_THAT(format_plan(p, false), Catch::Contains("sharding: parameters over 4 rank(s)"));
  CHECK_THAT(format_plan(p, false), Catch::Contains("reduce-scatter"));
}

TEST_CASE(
    "shard = auto: the least sharding that fits the budget, and why; none fitting: the smallest "
    "mode, then recomputation; one rank: none") {
  std::map<ShardMode, std::size_t> arena;
  for (ShardMode mode : kModes) arena[mode] = plan_for(mode, 4).memory.arena_bytes;
  auto plan_auto = [&](std::size_t budget, int world) {
    PlanOptions o;
    o.shard_auto = true;
    o.memory_budget_bytes = budget;
    o.comm.world_size = world;
    o.comm.bucket_cap_bytes = 64 * 1024;
    o.comm.grad_accum = 1;
    return compile_plan(llama_training_graph(), o);
  };
  for (ShardMode want :
       {ShardMode::none, ShardMode::optimizer, ShardMode::gradients, ShardMode::parameters}) {
    INFO(shard_mode_name(want));
    auto p = plan_auto(arena[want], 4);
    REQUIRE(p.ok());
    CHECK(p->comm.shard == want);
    CHECK(p->recompute.empty());
    CHECK_THAT(p->shard_reason,
               Catch::Contains("chose \"" + std::string(shard_mode_name(want)) + "\""));
    CHECK_THAT(p->shard_reason, Catch::Contains("the least sharding whose arena fits"));
    CHECK_THAT(format_plan(*p, false), Catch::Contains(p->shard_reason));
  }
  auto tight = plan_auto(arena[ShardMode::parameters] - 64 * 1024, 4);
  REQUIRE(tight.ok());
  CHECK(tight->comm.shard == ShardMode::parameters);
  CHECK(!tight->recompute.empty());
  CHECK(tight->memory.arena_bytes <= arena[ShardMode::parameters] - 64 * 1024);
  CHECK_THAT(tight->shard_reason, Catch::Contains("and recomputation: no mode fits"));
  auto one = plan_auto(0, 1);
  REQUIRE(one.ok());
  CHECK(one->comm.shard == ShardMode::none);
  // One rank, no mode fits: sharding saves nothing there, so none and recomputation.
  auto one_tight = plan_auto(plan_for(ShardMode::none, 1).memory.arena_bytes - 64 * 1024, 1);
  REQUIRE(one_tight.ok());
  CHECK(one_tight->comm.shard == ShardMode::none);
  CHECK_THAT(one_tight->shard_reason, Catch::Contains("one rank: sharding saves nothing"));
}

TEST_CASE(
    "one rank: every mode's plan (its collectives local) trains as the unsharded plan, losses "
    "and parameters within 1e-6, with clipping on every step") {
  std::vector<float> p_none;
  const auto reference = train(plan_for(ShardMode::none, 1), 4, &p_none);
  for (ShardMode mode : kModes) {
    INFO(shard_mode_name(mode));
    std::vector<float> params;
    const auto losses = train(plan_for(mode, 1), 4, &params);
    REQUIRE(losses.size() == reference.size());
    // The global norm sums per bucket instead of per tensor: the last bits of the clipping scale.
    for (std::size_t i = 0; i < losses.size(); ++i)
      CHECK(std::abs(losses[i] - reference[i]) <= 1e-6 * std::abs(reference[i]));
    REQUIRE(params.size() == p_none.size());
    for (std::size_t i = 0; i < params.size(); ++i)
      REQUIRE(std::abs(params[i] - p_none[i]) <= 1e-6f + 1e-5f * std::abs(p_none[i]));
  }
}
