// Planner figures for GPT-2 124M (T=1024, bf16 params/activations, fp32 optimizer state):
// planned arena vs the max-live lower bound at B=16 and B=64, the plan under a budget of 60% of the
// unconstrained arena (rematerialisation and its extra compute), the refusal of a budget below the
// model state, and the planning time. One JSON object per measurement; the peer figure is the
// lower bound (no allocator can go below it) or llm.c's hand-made plan where one exists.
#include <chrono>
#include <cstdio>

#include "topolaunch/kernels/plan.hpp"

using namespace topolaunch::kernels;

namespace {

Graph gpt2_124m(std::int64_t batch) {
  GptConfig c;
  c.n_layer = 12;
  c.n_embd = 768;
  c.n_head = 12;
  c.block_size = 1024;
  c.vocab_size = 50257;
  c.padded_vocab = 50304;
  c.batch = batch;
  c.seq_len = 1024;
  Graph g = build_gpt2(c, {DType::bf16, DType::bf16, DType::f32});
  append_backward(g);
  append_optimizer(g);
  return g;
}

double gib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }

}  // namespace

int main() {
  for (std::int64_t batch : {16, 64}) {
    auto t0 = std::chrono::steady_clock::now();
    auto plan = compile_plan(gpt2_124m(batch), PlanOptions{});
    const double plan_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!plan.ok()) {
      std::fprintf(stderr, "%s\n", plan.error().message.c_str());
      return 1;
    }
    const auto& m = plan->memory;
    std::printf(
        "{\"bench\":\"planner_arena_vs_lower_bound\",\"model\":\"gpt2-124m\",\"batch\":%lld,\"seq_"
        "len\":1024,"
        "\"dtype\":\"bf16\",\"arena_gib\":%.4f,\"peer\":\"max_live_lower_bound\",\"peer_gib\":%.4f,"
        "\"ratio\":%.4f,"
        "\"activation_region_gib\":%.4f,\"persistent_gib\":%.4f,\"plan_seconds\":%.3f}\n",
        static_cast<long long>(batch), gib(m.arena_bytes), gib(m.max_live_bytes),
        static_cast<double>(m.arena_bytes) / static_cast<double>(m.max_live_bytes),
        gib(m.planned_bytes), gib(m.persistent_bytes), plan_s);

    PlanOptions tight;
    tight.memory_budget_bytes = static_cast<std::size_t>(0.6 * static_cast<double>(m.arena_bytes));
    t0 = std::chrono::steady_clock::now();
    auto remat = compile_plan(gpt2_124m(batch), tight);
    const double remat_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (remat.ok()) {
      std::printf(
          "{\"bench\":\"planner_budget_60pct\",\"model\":\"gpt2-124m\",\"batch\":%lld,\"budget_"
          "gib\":%.4f,"
          "\"arena_gib\":%.4f,\"fits\":%s,\"recomputed_tensors\":%zu,\"extra_gflop\":%.1f,\"extra_"
          "compute_pct\":%.2f,"
          "\"lower_bound_gib\":%.4f,\"ratio_to_bound\":%.4f,\"peer\":\"unconstrained_arena\","
          "\"peer_gib\":%.4f,"
          "\"ratio\":%.4f,\"plan_seconds\":%.3f}\n",
          static_cast<long long>(batch), gib(tight.memory_budget_bytes),
          gib(remat->memory.arena_bytes),
          remat->memory.arena_bytes <= tight.memory_budget_bytes ? "true" : "false",
          remat->recompute.size(), remat->extra_flops / 1e9,
          100.0 * remat->extra_flops / remat->step_flops, gib(remat->memory.max_live_bytes),
          static_cast<double>(remat->memory.arena_bytes) /
              static_cast<double>(remat->memory.max_live_bytes),
          gib(m.arena_bytes),
          static_cast<double>(remat->memory.arena_bytes) / static_cast<double>(m.arena_bytes),
          remat_s);
    } else {
      std::printf(
          "{\"bench\":\"planner_budget_60pct\",\"batch\":%lld,\"fits\":false,\"error\":\"%s\"}\n",
          static_cast<long long>(batch), remat.error().message.c_str());
    }
    PlanOptions too_small;
    too_small.memory_budget_bytes = m.parameter_bytes + m.optimizer_bytes / 2;
    auto refused = compile_plan(gpt2_124m(batch), too_small);
    std::printf(
        "{\"bench\":\"planner_budget_below_model_state\",\"batch\":%lld,\"budget_gib\":%.4f,"
        "\"refused\":%s,"
        "\"message\":\"%s\"}\n",
        static_cast<long long>(batch), gib(too_small.memory_budget_bytes),
        refused.ok() ? "false" : "true", refused.ok() ? "" : refused.error().message.c_str());
  }
  return 0;
}
