// GPT-2 124M training steps through the CUDA executor on one GPU (L=12, C=768, NH=12, V=50257
// padded to 50304, T=1024, bf16 with fp32 master weights, AdamW, grad clip 1.0), random tokens.
// Prints one JSON object per line (gpt2_torch.py adds the PyTorch peer from the same device run):
//   {"bench":"gpt2_train", "batch":B, "mode":"graph"|"op_by_op", "budget_gib":0|16, ...}
// with median and p90 step time (CUDA events between consecutive step launches, after warm-up),
// tokens/s, the arena, the planned max-live bound, the device memory in use (cudaMemGetInfo, minus
// what the process held before the executor existed) and, for the whole-step graph, its nodes;
// and the attention implementation in use (own | cudnn), with the timings an auto choice made.
//
// usage: gpt2_bench [config ...]  where config = B:mode[:budget_gib][:attention][:nogelu],
//        attention = auto (default) | own | cudnn, nogelu = the separate gelu kernels
//        (CudaExecutorOptions::fuse_gelu off); default configs
//        16:graph 64:graph 8:graph 8:op_by_op 64:graph:16
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cuda_backend.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace tk = topolaunch::kernels;
namespace gpu = topolaunch::kernels::cuda;

namespace {

constexpr int kWarmupSteps = 4;  // eager step, capture + first replay, then replays
constexpr int kTimedSteps = 20;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Config {
  int batch = 16;
  bool graph = true;
  bool profile = false;  // op by op with CUDA events around every op: time by op kind
  double budget_gib = 0;
  gpu::AttentionImpl attention = gpu::AttentionImpl::auto_select;
  bool fuse_gelu = true;
};

Config parse(const std::string& s) {
  Config c;
  const auto a = s.find(':');
  c.batch = std::atoi(s.substr(0, a).c_str());
  if (a != std::string::npos) {
    const auto b = s.find(':', a + 1);
    const std::string mode =
        s.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
    c.graph = mode != "op_by_op" && mode != "profile";
    c.profile = mode == "profile";
    // the rest: [budget_gib][:attention][:nogelu], in any order
    std::size_t at = b;
    while (at != std::string::npos) {
      const auto next = s.find(':', at + 1);
      const std::string f =
          s.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
      if (f == "own")
        c.attention = gpu::AttentionImpl::own;
      else if (f == "cudnn")
        c.attention = gpu::AttentionImpl::cudnn;
      else if (f == "auto")
        c.attention = gpu::AttentionImpl::auto_select;
      else if (f == "nogelu")
        c.fuse_gelu = false;
      else
        c.budget_gib = std::atof(f.c_str());
      at = next;
    }
  }
  return c;
}

std::size_t used_bytes() {
  std::size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  return total_b - free_b;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double idx = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(idx);
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

int run(const Config& cfg) {
  const auto t_plan0 = std::chrono::steady_clock::now();
  tk::GptConfig c;
  c.n_layer = 12;
  c.n_embd = 768;
  c.n_head = 12;
  c.block_size = 1024;
  c.vocab_size = 50257;
  c.padded_vocab = 50304;
  c.batch = cfg.batch;
  c.seq_len = 1024;
  tk::Graph g = tk::build_gpt2(c, tk::Precision::cuda_bf16());
  tk::append_backward(g);
  tk::append_optimizer(g);
  tk::PlanOptions po;
  po.memory_budget_bytes = static_cast<std::size_t>(cfg.budget_gib * kGiB);
  auto plan = tk::compile_plan(std::move(g), po);
  if (!plan) {
    std::printf("{\"bench\":\"gpt2_train\",\"batch\":%d,\"error\":\"%s\"}\n", cfg.batch,
                plan.error().message.c_str());
    return 1;
  }
  const double plan_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_plan0).count();
  const std::size_t used0 = used_bytes();
  gpu::CudaExecutorOptions opt;
  opt.mode = cfg.graph ? gpu::ExecutionMode::graph : gpu::ExecutionMode::op_by_op;
  opt.profile_ops = cfg.profile;
  opt.attention = cfg.attention;
  opt.fuse_gelu = cfg.fuse_gelu;
  auto ex_r = gpu::CudaExecutor::create(*plan, opt);
  if (!ex_r) {
    std::printf("{\"bench\":\"gpt2_train\",\"batch\":%d,\"error\":\"%s\"}\n", cfg.batch,
                ex_r.error().message.c_str());
    return 1;
  }
  auto ex = std::move(*ex_r);
  if (auto s = ex->init_parameters(1337); !s) {
    std::fprintf(stderr, "gpt2_bench: %s\n", s.error().message.c_str());
    return 1;
  }
  const std::size_t BT = static_cast<std::size_t>(cfg.batch) * 1024;
  std::vector<std::int32_t> tokens(BT + 1);
  std::uint64_t s = 7;
  for (auto& t : tokens) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<std::int32_t>((s >> 33) % 50257);
  }
  const std::vector<std::int32_t> x(tokens.begin(), tokens.end() - 1),
      y(tokens.begin() + 1, tokens.end());
  ex->set_loss_scale(1.0 / static_cast<double>(BT));
  tk::AdamWSettings adamw;
  adamw.learning_rate = 6e-4;
  std::vector<cudaEvent_t> ev(kTimedSteps + 1);
  for (auto& e : ev) cudaEventCreate(&e);
  const auto t_first0 = std::chrono::steady_clock::now();
  double first_step_s = 0;
  std::int64_t step = 0;
  for (int i = 0; i < kWarmupSteps; ++i) {
    if (auto st = ex->set_batch(x, y); !st) return 1;
    if (auto st = ex->train_step(adamw, ++step); !st) {
      std::fprintf(stderr, "gpt2_bench: %s\n", st.error().message.c_str());
      return 1;
    }
    if (i == 0) {
      if (auto st = ex->synchronize(); !st) return 1;
      first_step_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_first0).count();
    }
  }
  if (auto st = ex->synchronize(); !st) {
    std::fprintf(stderr, "gpt2_bench: %s\n", st.error().message.c_str());
    return 1;
  }
  const double loss_warm = ex->mean_loss().ok() ? *ex->mean_loss() : -1;
  std::vector<double> launch_ms;
  for (int i = 0; i < kTimedSteps; ++i) {
    cudaEventRecord(ev[static_cast<std::size_t>(i)], ex->stream());
    if (auto st = ex->set_batch(x, y); !st) return 1;
    if (auto st = ex->train_step(adamw, ++step); !st) {
      std::fprintf(stderr, "gpt2_bench: %s\n", st.error().message.c_str());
      return 1;
    }
    launch_ms.push_back(ex->last_launch_host_ms());
  }
  const double host_enqueue_ms = percentile(launch_ms, 0.5);
  cudaEventRecord(ev[kTimedSteps], ex->stream());
  if (auto st = ex->synchronize(); !st) {
    std::fprintf(stderr, "gpt2_bench: %s\n", st.error().message.c_str());
    return 1;
  }
  std::vector<double> ms(kTimedSteps);
  for (int i = 0; i < kTimedSteps; ++i) {
    float f = 0;
    cudaEventElapsedTime(&f, ev[static_cast<std::size_t>(i)], ev[static_cast<std::size_t>(i) + 1]);
    ms[static_cast<std::size_t>(i)] = f;
  }
  const double loss = ex->mean_loss().ok() ? *ex->mean_loss() : -1;
  const double norm = ex->last_grad_norm().ok() ? *ex->last_grad_norm() : -1;
  const std::size_t used = used_bytes() - used0;
  const double med = percentile(ms, 0.5), p90 = percentile(ms, 0.9);
  const auto& mp = ex->plan().memory;
  const gpu::AttentionChoice& ac = ex->attention_choice();
  std::string reason = ac.reason;  // JSON-safe
  for (auto& ch : reason)
    if (ch == '"' || ch == '\\') ch = '\'';
  std::printf(
      "{\"bench\":\"gpt2_train\",\"system\":\"topolaunch_cuda\",\"model\":\"gpt2-124m\",\"batch\":%"
      "d,"
      "\"seq_len\":1024,\"mode\":\"%s\",\"budget_gib\":%.2f,\"median_ms\":%.3f,\"p90_ms\":%.3f,"
      "\"tokens_per_s\":%.0f,\"arena_gib\":%.4f,\"unconstrained_arena_gib\":%.4f,"
      "\"max_live_gib\":%.4f,\"device_used_gib\":%.4f,\"recomputed_tensors\":%zu,"
      "\"extra_compute_pct\":%.2f,\"graph_nodes\":%zu,\"host_launch_ms_per_step\":%.3f,"
      "\"plan_s\":%.3f,\"first_step_s\":%.3f,\"loss_after_warmup\":%.4f,\"loss_last\":%.4f,"
      "\"grad_norm_last\":%.4f,\"timed_steps\":%d,\"attention\":{\"option\":\"%s\","
      "\"chosen\":\"%s\",\"own_fwd_ms\":%.4f,\"own_bwd_ms\":%.4f,\"cudnn_fwd_ms\":%.4f,"
      "\"cudnn_bwd_ms\":%.4f,\"cudnn_workspace_bytes\":%zu,\"cudnn_backward_ops\":%d,"
      "\"cudnn_version\":\"%s\",\"reason\":\"%s\"},\"fuse_gelu\":%s,\"gelu_ops_fused\":%zu}\n",
      cfg.batch, cfg.graph ? "graph" : (cfg.profile ? "profile_op_by_op" : "op_by_op"),
      cfg.budget_gib, med, p90, static_cast<double>(BT) / (med / 1e3),
      static_cast<double>(mp.arena_bytes) / kGiB,
      static_cast<double>(ex->plan().unconstrained.arena_bytes) / kGiB,
      static_cast<double>(mp.max_live_bytes) / kGiB, static_cast<double>(used) / kGiB,
      ex->plan().recompute.size(), 100.0 * ex->plan().extra_flops / ex->plan().step_flops,
      ex->graph_nodes(), host_enqueue_ms, plan_s, first_step_s, loss_warm, loss, norm, kTimedSteps,
      gpu::attention_impl_name(cfg.attention), gpu::attention_impl_name(ac.chosen), ac.own_fwd_ms,
      ac.own_bwd_ms, ac.cudnn_fwd_ms, ac.cudnn_bwd_ms, ac.cudnn_workspace_bytes,
      ac.cudnn_backward_ops, ac.cudnn_version.c_str(), reason.c_str(),
      cfg.fuse_gelu ? "true" : "false", ex->gelu_ops_fused());
  std::fflush(stdout);
  if (cfg.profile) {
    // The last step's GPU time by op kind (events around each op, launched op by op).
    auto times = ex->op_times_ms();
    if (!times) return 1;
    const auto& ops = ex->plan().graph.ops;
    std::map<std::string, std::pair<double, int>> by_kind;
    double total = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if ((*times)[i] <= 0) continue;
      std::string kind(tk::op_name(ops[i].kind));
      if (ops[i].phase == tk::Phase::recompute) kind += " (recompute)";
      if (ops[i].kind == tk::OpKind::matmul_forward && ops[i].name == "lm_head") kind = "lm_head";
      by_kind[kind].first += (*times)[i];
      by_kind[kind].second += 1;
      total += (*times)[i];
    }
    std::printf("{\"bench\":\"gpt2_op_profile\",\"batch\":%d,\"step_ops_ms\":%.3f,\"by_kind\":{",
                cfg.batch, total);
    bool first = true;
    for (const auto& [kind, v] : by_kind) {
      std::printf("%s\"%s\":{\"ms\":%.3f,\"ops\":%d}", first ? "" : ",", kind.c_str(), v.first,
                  v.second);
      first = false;
    }
    std::printf("}}\n");
    std::fflush(stdout);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Config> configs;
  for (int i = 1; i < argc; ++i) configs.push_back(parse(argv[i]));
  if (configs.empty())
    for (const char* s :
         {"16:graph", "64:graph", "8:graph", "8:op_by_op", "64:graph:16", "16:profile"})
      configs.push_back(parse(s));
  cudaFree(nullptr);  // create the context before the baseline of memory in use
  int failures = 0;
  for (const auto& c : configs) failures += run(c);
  return failures;
}
