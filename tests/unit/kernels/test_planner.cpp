// Passes and the static memory plan: fusion, liveness arena vs its lower bound, rematerialisation
// under a budget (same numbers as without), refusals naming the smallest budget, gradient buckets.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "catch.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/kernels/rng.hpp"

using namespace topolaunch::kernels;

namespace {

GptConfig small_gpt() {
  GptConfig c;
  c.n_layer = 3;
  c.n_embd = 32;
  c.n_head = 4;
  c.block_size = 16;
  c.vocab_size = 50;
  c.batch = 4;
  c.seq_len = 16;
  return c;
}

Graph training_graph(const GptConfig& c) {
  Graph g = build_gpt2(c);
  append_backward(g);
  append_optimizer(g);
  return g;
}

// Losses over a few steps and the final parameters, for comparing plans bit for bit.
std::vector<float> train(const Plan& plan, int steps, std::vector<float>* params_out = nullptr) {
  CpuExecutor<float> ex(plan);
  const Graph& g = ex.plan().graph;
  ex.init_parameters(5);
  NormalRng rng(9);
  std::vector<float> losses;
  for (int s = 1; s <= steps; ++s) {
    for (std::int64_t i = 0; i < g[g.tokens].elements(); ++i) {
      ex.ints(g.tokens)[i] = static_cast<std::int32_t>(rng.next_u64() % 50);
      ex.ints(g.targets)[i] = static_cast<std::int32_t>(rng.next_u64() % 50);
    }
    ex.set_loss_scale(1.0 / static_cast<double>(g[g.losses].elements()));
    REQUIRE(ex.run_forward_backward(nullptr).ok());
    losses.push_back(static_cast<float>(ex.mean_loss()));
    REQUIRE(ex.run_optimizer(AdamWSettings{}, s).ok());
  }
  if (params_out)
    for (auto p : g.params)
      for (float v : ex.values(p)) params_out->push_back(v);
  return losses;
}

}  // namespace

TEST_CASE("fusion turns residual+layernorm pairs into one op and leaves the numbers unchanged") {
  PlanOptions fused, unfused;
  unfused.fuse = false;
  auto a = compile_plan(training_graph(small_gpt()), fused);
  auto b = compile_plan(training_graph(small_gpt()), unfused);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->fused_pairs == 2 * 3);  // ln2 of every layer, ln1 of layers 1.., lnf
  CHECK(a->graph.ops.size() + static_cast<std::size_t>(a->fused_pairs) == b->graph.ops.size());
  std::vector<float> pa, pb;
  CHECK(train(*a, 3, &pa) == train(*b, 3, &pb));
  CHECK(pa == pb);
}

TEST_CASE(
    "static plan: arena within 5% of the max-live lower bound, tensors that overlap in time never "
    "share bytes") {
  auto plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(plan.ok());
  const auto& m = plan->memory;
  CHECK(m.arena_bytes >= m.max_live_bytes);
  CHECK(static_cast<double>(m.arena_bytes) <= 1.05 * static_cast<double>(m.max_live_bytes));
  // Independent check of the offsets: any two planned tensors live at the same op are disjoint
  // (the in-place dlogits/logits pair excepted).
  const Graph& g = plan->graph;
  std::vector<int> first(g.tensors.size(), -1), last(g.tensors.size(), -1);
  for (int i = 0; i < static_cast<int>(g.ops.size()); ++i) {
    const Op& op = g.ops[static_cast<std::size_t>(i)];
    auto touch = [&](TensorId t) {
      if (first[static_cast<std::size_t>(t)] < 0) first[static_cast<std::size_t>(t)] = i;
      last[static_cast<std::size_t>(t)] = i;
    };
    for (auto t : op.inputs) touch(t);
    for (auto t : op.outputs) touch(t);
    if (op.workspace != kNoTensor) touch(op.workspace);
  }
  for (std::size_t a = 0; a < g.tensors.size(); ++a) {
    if (m.offsets[a] == kNoOffset || first[a] < 0) continue;
    for (std::size_t b = a + 1; b < g.tensors.size(); ++b) {
      if (m.offsets[b] == kNoOffset || first[b] < 0) continue;
      const bool input_a = g.tensors[a].role == Role::input,
                 input_b = g.tensors[b].role == Role::input;
      const bool overlap_time = input_a || input_b || (first[a] <= last[b] && first[b] <= last[a]);
      const bool overlap_bytes = m.offsets[a] < m.offsets[b] + g.tensors[b].bytes() &&
                                 m.offsets[b] < m.offsets[a] + g.tensors[a].bytes();
      const bool inplace =
          g.tensors[a].grad == static_cast<TensorId>(b) && g.tensors[a].name == "logits";
      if (overlap_time && overlap_bytes && !inplace)
        FAIL(g.tensors[a].name << " and " << g.tensors[b].name << " share bytes while both live");
    }
  }
}

TEST_CASE("rematerialisation under a budget: fits, reports extra compute, trains bit-identically") {
  auto free_plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(free_plan.ok());
  PlanOptions tight;
  tight.memory_budget_bytes =
      free_plan->memory.persistent_bytes + free_plan->memory.planned_bytes * 7 / 10;
  auto plan = compile_plan(training_graph(small_gpt()), tight);
  REQUIRE(plan.ok());
  CHECK(plan->memory.arena_bytes <= tight.memory_budget_bytes);
  CHECK(!plan->recompute.empty());
  CHECK(plan->extra_flops > 0);
  std::vector<float> pa, pb;
  CHECK(train(*plan, 3, &pa) == train(*free_plan, 3, &pb));
  CHECK(pa == pb);
}

TEST_CASE(
    "a budget below params+grads+optimizer state is refused with the smallest budget that fits") {
  auto free_plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(free_plan.ok());
  PlanOptions tiny;
  tiny.memory_budget_bytes = free_plan->memory.parameter_bytes;
  auto refused = compile_plan(training_graph(small_gpt()), tiny);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().exit_code == 2);
  CHECK_THAT(refused.error().message,
             Catch::Contains("below the parameters, gradients and optimizer state"));
  CHECK_THAT(refused.error().message, Catch::Contains("smallest budget"));
}

TEST_CASE(
    "offload = optimizer: the moments follow the arena in host_bytes, the device arena shrinks by "
    "them, and training is bit-identical") {
  auto free_plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(free_plan.ok());
  PlanOptions opt;
  opt.offload = OffloadMode::optimizer;
  auto plan = compile_plan(training_graph(small_gpt()), opt);
  REQUIRE(plan.ok());
  const Graph& g = plan->graph;
  const MemoryPlan& m = plan->memory;
  CHECK(plan->optimizer_offloaded);
  // read and written in one pass, both directions of the link at once: host_bytes at its rate
  CHECK(plan->offload_ms ==
        Approx(static_cast<double>(plan->memory.host_bytes) / (opt.host_link_gbytes_per_s * 1e6)));
  const auto offloaded = offloadable_optimizer_state(g);
  std::size_t moments = 0;
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    if (!offloaded[t]) continue;
    CHECK(g.tensors[t].role == Role::optimizer_state);
    moments += g.tensors[t].bytes();
    CHECK(m.offsets[t] >= m.arena_bytes);
    CHECK(m.offsets[t] + g.tensors[t].bytes() <= m.arena_bytes + m.host_bytes);
  }
  // AdamW's m and v of every parameter; the global norm stays on the device
  CHECK(moments == 2 * g.parameter_count() * sizeof(float));
  CHECK(m.host_bytes >= moments);
  CHECK_FALSE(offloaded[static_cast<std::size_t>(g.grad_norm)]);
  CHECK(m.offsets[static_cast<std::size_t>(g.grad_norm)] < m.arena_bytes);
  CHECK(m.optimizer_bytes == free_plan->memory.optimizer_bytes);
  CHECK(m.arena_bytes + m.host_bytes == free_plan->memory.arena_bytes);
  CHECK_THAT(format_plan(*plan, false), Catch::Contains("of which in host memory"));
  std::vector<float> pa, pb;
  CHECK(train(*plan, 3, &pa) == train(*free_plan, 3, &pb));
  CHECK(pa == pb);
}

TEST_CASE(
    "offload = auto: a budget below the model state fits by moving the optimizer state to host "
    "memory, which offload = none refuses naming the setting") {
  GptConfig c = small_gpt();
  c.batch = 1;  // activations smaller than the moments
  auto free_plan = compile_plan(training_graph(c), PlanOptions{});
  REQUIRE(free_plan.ok());
  PlanOptions opt;
  opt.memory_budget_bytes = free_plan->memory.persistent_bytes - 1024;
  auto refused = compile_plan(training_graph(c), opt);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().exit_code == 2);
  CHECK_THAT(refused.error().message,
             Catch::Contains("below the parameters, gradients and optimizer state"));
  CHECK_THAT(refused.error().message, Catch::Contains("train.offload = \"auto\""));
  opt.offload = OffloadMode::automatic;
  auto plan = compile_plan(training_graph(c), opt);
  REQUIRE(plan.ok());
  CHECK(plan->optimizer_offloaded);
  CHECK(plan->memory.arena_bytes <= opt.memory_budget_bytes);
  CHECK_THAT(plan->offload_reason, Catch::Contains("without it no recomputation fits"));
  std::vector<float> pa, pb;
  CHECK(train(*plan, 3, &pa) == train(*free_plan, 3, &pb));
  CHECK(pa == pb);
}

TEST_CASE(
    "offload = auto under a budget recomputation can meet: host memory only when the host link "
    "costs less than the recomputation") {
  auto free_plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(free_plan.ok());
  PlanOptions opt;
  opt.offload = OffloadMode::automatic;
  opt.memory_budget_bytes =
      free_plan->memory.persistent_bytes + free_plan->memory.planned_bytes * 7 / 10;
  opt.host_link_gbytes_per_s = 1e-6;  // a slow link: recomputation is cheaper
  auto slow = compile_plan(training_graph(small_gpt()), opt);
  REQUIRE(slow.ok());
  CHECK_FALSE(slow->optimizer_offloaded);
  CHECK(slow->memory.host_bytes == 0);
  CHECK_FALSE(slow->recompute.empty());
  CHECK_THAT(slow->offload_reason, Catch::Contains("kept the optimizer state in device memory"));
  opt.host_link_gbytes_per_s = 1e6;  // a fast link: the offload is cheaper
  auto fast = compile_plan(training_graph(small_gpt()), opt);
  REQUIRE(fast.ok());
  CHECK(fast->optimizer_offloaded);
  CHECK(fast->memory.arena_bytes <= opt.memory_budget_bytes);
  CHECK(fast->offload_ms + fast->recompute_ms < slow->recompute_ms);
  CHECK_THAT(fast->offload_reason, Catch::Contains("moved the optimizer state to host memory"));
  // no budget pressure: auto leaves it where it is
  PlanOptions roomy;
  roomy.offload = OffloadMode::automatic;
  auto plain = compile_plan(training_graph(small_gpt()), roomy);
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->optimizer_offloaded);
  CHECK(plain->offload_reason.empty());
}

TEST_CASE(
    "a budget rematerialisation cannot reach is refused with the smallest that fits, which then "
    "fits") {
  auto free_plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(free_plan.ok());
  PlanOptions tight;
  tight.memory_budget_bytes = free_plan->memory.persistent_bytes + 1024;
  auto refused = compile_plan(training_graph(small_gpt()), tight);
  REQUIRE_FALSE(refused.ok());
  const std::string msg = refused.error().message;
  CHECK_THAT(msg, Catch::Contains("the smallest budget that fits is"));
}

TEST_CASE(
    "gradient buckets: reverse production order, contiguous, padded to equal segments per rank, "
    "all-reduce right after the bucket completes") {
  PlanOptions opt;
  opt.comm.world_size = 2;
  opt.comm.bucket_cap_bytes = 16 * 1024;
  auto plan = compile_plan(training_graph(small_gpt()), opt);
  REQUIRE(plan.ok());
  const auto& c = plan->comm;
  REQUIRE(c.buckets.size() > 2);
  const Graph& g = plan->graph;
  std::set<TensorId> seen;
  for (const auto& b : c.buckets) {
    REQUIRE(g.ops[static_cast<std::size_t>(b.issue_after_op)].kind == OpKind::all_reduce);
    // Contiguous: each gradient starts where the previous one (aligned) ended.
    std::size_t expect = b.offset;
    for (auto t : b.grads) {
      CHECK(plan->memory.offsets[static_cast<std::size_t>(t)] == expect);
      expect += (g[t].bytes() + 255) / 256 * 256;
      seen.insert(t);
      // Final before the all-reduce: no later op writes it in the backward.
      for (std::size_t i = static_cast<std::size_t>(b.issue_after_op) + 1; i < g.ops.size(); ++i) {
        if (g.ops[i].phase == Phase::optimizer) break;
        for (auto o : g.ops[i].outputs)
          if (g.ops[i].kind != OpKind::all_reduce) CHECK(o != t);
      }
    }
    // One flat buffer per bucket, padded to a multiple of 64 x world elements (fp32).
    CHECK(expect - b.offset <= b.bytes);
    CHECK(b.bytes == static_cast<std::size_t>(b.elements) * 4);
    CHECK(b.elements % (64 * 2) == 0);
    CHECK(b.segment_elements * 2 == b.elements);
    CHECK(expect - b.offset > b.bytes - 64 * 2 * 4);
  }
  CHECK(seen.size() == g.params.size());
  // The last layer's gradients are reduced first; wte (tied, finished by the encoder) last.
  CHECK(g[c.buckets.front().grads.front()].name.rfind("dlnf", 0) == 0);
  const auto& tail = c.buckets.back().grads;
  CHECK(std::find_if(tail.begin(), tail.end(), [&](TensorId t) { return g[t].name == "dwte"; }) !=
        tail.end());
}

TEST_CASE(
    "communication budget: a slow link raises the accumulation until exposed time is within "
    "budget") {
  PlanOptions opt;
  opt.comm.world_size = 2;
  opt.comm.link_gbytes_per_s = 0.2;
  opt.comm.max_exposed_fraction = 0.05;
  auto plan = compile_plan(training_graph(small_gpt()), opt);
  REQUIRE(plan.ok());
  CHECK(plan->comm.grad_accum > 1);
  CHECK(plan->comm.within_budget);
  CHECK(plan->comm.exposed_fraction <= 0.05);
  opt.comm.link_gbytes_per_s = 1000;
  opt.comm.latency_us = 1;
  auto fast = compile_plan(training_graph(small_gpt()), opt);
  REQUIRE(fast.ok());
  CHECK(fast->comm.grad_accum == 1);
}

TEST_CASE(
    "the chunked classifier holds the logits of a chunk of rows, shrinks the arena and trains bit "
    "for bit like the whole logits") {
  GptConfig c = small_gpt();
  c.vocab_size = 500;  // logits (64 x 512) are the largest activation
  PlanOptions whole, chunked, uneven;
  whole.classifier_chunk_rows = 0;
  chunked.classifier_chunk_rows = 16;
  uneven.classifier_chunk_rows = 24;  // 24 + 24 + 16 rows
  auto a = compile_plan(training_graph(c), whole);
  auto b = compile_plan(training_graph(c), chunked);
  auto u = compile_plan(training_graph(c), uneven);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(u.ok());
  CHECK(a->classifier_chunk_rows == 0);
  CHECK(b->classifier_chunk_rows == 16);
  CHECK(u->classifier_chunk_rows == 24);
  const Graph& g = b->graph;
  int forward = 0, backward = 0;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    forward += op.kind == OpKind::classifier_forward;
    backward += op.kind == OpKind::classifier_backward;
    CHECK(op.kind != OpKind::crossentropy_forward);
    CHECK(op.kind != OpKind::crossentropy_backward);
    if (op.kind == OpKind::classifier_forward) {
      CHECK(classifier_backward_of(g, i) < g.ops.size());
      CHECK(g[op.workspace].shape == std::vector<std::int64_t>{16, 512});
    }
    for (auto t : op.inputs) CHECK(g[t].name != "logits");
  }
  CHECK(forward == 1);
  CHECK(backward == 1);
  for (std::size_t t = 0; t < g.tensors.size(); ++t)
    if (g.tensors[t].name == "logits" || g.tensors[t].name == "dlogits")
      CHECK(b->memory.offsets[t] == kNoOffset);  // no op's operand: not in the arena
  // 64 x 512 logits and their gradient's lifetime against two 16 x 512 chunks
  CHECK(b->memory.arena_bytes < a->memory.arena_bytes);
  CHECK_THAT(format_plan(*b, false),
             Catch::Contains("classifier: logits of 64 rows in chunks of 16"));
  // CPU sums run in row order either way: the same losses and parameters, bit for bit
  std::vector<float> pa, pb, pu;
  const auto la = train(*a, 3, &pa);
  CHECK(train(*b, 3, &pb) == la);
  CHECK(train(*u, 3, &pu) == la);
  CHECK(pb == pa);
  CHECK(pu == pa);
  // under a budget the head's input may be recomputed: the step still skips the forward
  PlanOptions tight = chunked;
  tight.memory_budget_bytes = b->memory.persistent_bytes + b->memory.planned_bytes * 6 / 10;
  auto t = compile_plan(training_graph(c), tight);
  REQUIRE(t.ok());
  CHECK(!t->recompute.empty());
  for (std::size_t i = 0; i < t->graph.ops.size(); ++i)
    if (t->graph.ops[i].kind == OpKind::classifier_forward)
      CHECK(classifier_backward_of(t->graph, i) < t->graph.ops.size());
  std::vector<float> pt;
  CHECK(train(*t, 3, &pt) == la);
  CHECK(pt == pa);
}

TEST_CASE("the chunked classifier's forward alone (evaluation) gives the losses of the whole") {
  GptConfig c = small_gpt();
  c.vocab_size = 500;
  PlanOptions whole, chunked;
  whole.classifier_chunk_rows = 0;
  chunked.classifier_chunk_rows = 16;
  std::vector<double> means;
  for (const PlanOptions* o : {&whole, &chunked}) {
    auto plan = compile_plan(training_graph(c), *o);
    REQUIRE(plan.ok());
    CpuExecutor<float> ex(*plan);
    const Graph& g = ex.plan().graph;
    ex.init_parameters(5);
    for (std::int64_t i = 0; i < g[g.tokens].elements(); ++i) {
      ex.ints(g.tokens)[i] = static_cast<std::int32_t>((i * 7) % 500);
      ex.ints(g.targets)[i] = static_cast<std::int32_t>((i * 13) % 500);
    }
    REQUIRE(ex.run_forward().ok());
    means.push_back(ex.mean_loss());
  }
  CHECK(means[0] > 5.0);  // about ln(500) from the initial weights
  CHECK(means[1] == means[0]);
}

TEST_CASE("the classifier is chunked automatically only where its logits are large") {
  CHECK(auto_classifier_chunk_rows(65536, std::size_t{65536} * 50304 * 2) == 8192);  // B=64
  CHECK(auto_classifier_chunk_rows(16384, std::size_t{16384} * 50304 * 2) == 4096);  // B=16
  CHECK(auto_classifier_chunk_rows(8192, std::size_t{8192} * 50304 * 2) == 4096);
  CHECK(auto_classifier_chunk_rows(4096, std::size_t{100} << 20) == 0);   // under 256 MiB
  CHECK(auto_classifier_chunk_rows(4096, std::size_t{1} << 30) == 0);     // one chunk is all
  CHECK(auto_classifier_chunk_rows(5000, std::size_t{1} << 30) == 4096);  // 4,096 + 904
  auto plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(plan.ok());
  CHECK(plan->classifier_chunk_rows == 0);
  // a head with a bias (the MLP's) keeps its whole logits
  MlpConfig m;
  Graph mg = build_mlp(m);
  append_backward(mg);
  append_optimizer(mg);
  CHECK(chunk_classifier(mg, 16) == 0);
}

TEST_CASE(
    "a step with non-finite gradients is skipped: parameters and moments unchanged, AdamW's step "
    "counts the steps applied") {
  auto plan = compile_plan(training_graph(small_gpt()), PlanOptions{});
  REQUIRE(plan.ok());
  const Graph& g = plan->graph;
  const std::int64_t n = g[g.tokens].elements();
  auto batch = [&](CpuExecutor<float>& ex, int k) {
    for (std::int64_t i = 0; i < n; ++i) {
      ex.ints(g.tokens)[i] = static_cast<std::int32_t>((i * 7 + k * 3) % 50);
      ex.ints(g.targets)[i] = static_cast<std::int32_t>((i * 11 + k) % 50);
    }
  };
  auto state = [&](CpuExecutor<float>& ex) {  // parameters, then every optimizer state tensor
    std::vector<float> v;
    for (std::size_t t = 0; t < g.tensors.size(); ++t)
      if (g.tensors[t].role == Role::parameter || g.tensors[t].role == Role::optimizer_state) {
        if (g.tensors[t].name == "grad_norm") continue;
        const auto s = ex.values(static_cast<TensorId>(t));
        v.insert(v.end(), s.begin(), s.end());
      }
    return v;
  };
  AdamWSettings adamw;
  adamw.grad_clip = 1.0;
  const double scale = 1.0 / static_cast<double>(n);
  // a: batches 1, (2 with a nan loss scale: every gradient nan), 3; b: batches 1 and 3 alone
  CpuExecutor<float> a(*plan), b(*plan);
  a.init_parameters(5);
  b.init_parameters(5);
  for (auto* ex : {&a, &b}) {
    batch(*ex, 1);
    ex->set_loss_scale(scale);
    REQUIRE(ex->run_forward_backward(nullptr).ok());
    REQUIRE(ex->run_optimizer(adamw, 1).ok());
  }
  const auto after_one = state(a);
  batch(a, 2);
  a.set_loss_scale(std::nan(""));
  REQUIRE(a.run_forward_backward(nullptr).ok());
  REQUIRE(a.run_optimizer(adamw, 2).ok());
  CHECK(!std::isfinite(a.last_grad_norm()));
  CHECK(a.skipped_steps() == 1);
  CHECK(state(a) == after_one);                                           // nothing moved
  for (float v : a.values(g[g.params.front()].grad)) REQUIRE(v == 0.0f);  // re-zeroed as always
  batch(a, 3);
  a.set_loss_scale(scale);
  REQUIRE(a.run_forward_backward(nullptr).ok());
  REQUIRE(a.run_optimizer(adamw, 3).ok());
  batch(b, 3);
  REQUIRE(b.run_forward_backward(nullptr).ok());
  REQUIRE(b.run_optimizer(adamw, 2).ok());  // the same step t = 2 of AdamW
  CHECK(a.mean_loss() == b.mean_loss());
  CHECK(state(a) == state(b));
  CHECK(b.skipped_steps() == 0);
}
