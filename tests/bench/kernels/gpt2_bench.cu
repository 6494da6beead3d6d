// GPT-2 training steps through the CUDA executor on one GPU (124M: L=12, C=768, NH=12; also 350M,
// 774M, 1558M; V=50257 padded to 50304, T=1024, bf16 with fp32 master weights, AdamW, grad clip
// 1.0), random tokens; and the ~1B LLaMA of configs/jobs/llama-1b-1gpu.toml (L=18, C=2048, 32
// heads of 64 sharing 8 key/value heads, SwiGLU 5632, untied head, the same vocabulary and T).
// Prints one JSON object per line (gpt2_torch.py adds the PyTorch peer from the same device run):
//   {"bench":"gpt2_train", "batch":B, "mode":"graph"|"op_by_op", "budget_gib":0|16, ...}
// with median and p90 step time (CUDA events between consecutive step launches, after warm-up),
// tokens/s, the arena, the planned max-live bound, the device memory in use (cudaMemGetInfo, minus
// what the process held before the executor existed) and, for the whole-step graph, its nodes;
// and the attention implementation in use (own | cudnn), with the timings an auto choice made.
//
// usage: gpt2_bench [config ...]  where config =
//        B:mode[:budget_gib][:attention][:nogelu][:nochunk|:cROWS][:fp8|:fp8all][:model],
//        mode = graph | op_by_op | profile (op by op with an event pair per op: the step by op
//        kind with bytes, FLOPs and the H200's bounds, one "gpt2_op_profile" line), attention =
//        auto (default) | own | cudnn, nogelu = the separate gelu kernels
//        (CudaExecutorOptions::fuse_gelu off), nobiasfuse = every bias gradient in its own
//        matmul_backward (CudaExecutorOptions::fuse_bias_gradients off), nochunk = the whole logits
//        at once (PlanOptions::classifier_chunk_rows 0), cROWS = ROWS rows of logits per chunk
//        (default: automatic), fp8 = the blocks' GEMMs in FP8 (CudaExecutorOptions::fp8,
//        train.precision = "fp8": FP8 where measured faster), fp8all = every eligible GEMM in
//        FP8 (Fp8Choice::always), offload = the optimizer state in host memory
//        (PlanOptions::offload optimizer; autooffload: automatic, the planner's choice under the
//        budget), model = 124m (default) | 350m | 774m | 1558m | llama1b;
//        default configs 16:graph 64:graph 8:graph 8:op_by_op 64:graph:16 16:profile
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
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
  bool fuse_bias = true;  // CudaExecutorOptions::fuse_bias_gradients (nobiasfuse: off)
  bool fp8 = false;
  bool fp8_all = false;  // fp8all: every eligible GEMM in FP8 (Fp8Choice::always), not measured
  std::int64_t classifier_chunk_rows = -1;  // PlanOptions::classifier_chunk_rows
  tk::OffloadMode offload = tk::OffloadMode::none;
  std::string model = "124m";  // GPT-2 124m | 350m | 774m | 1558m, or llama1b
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
      else if (f == "nobiasfuse")
        c.fuse_bias = false;
      else if (f == "fp8")
        c.fp8 = true;
      else if (f == "fp8all")
        c.fp8 = c.fp8_all = true;
      else if (f == "offload")
        c.offload = tk::OffloadMode::optimizer;
      else if (f == "autooffload")
        c.offload = tk::OffloadMode::automatic;
      else if (f == "nochunk")
        c.classifier_chunk_rows = 0;
      else if (f.size() > 1 && f[0] == 'c')
        c.classifier_chunk_rows = std::atoll(f.c_str() + 1);
      else if (f == "124m" || f == "350m" || f == "774m" || f == "1558m" || f == "llama1b")
        c.model = f;
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

// [0.3259,-1.0000,...] (JSON)
std::string ms_list(const std::vector<double>& v) {
  std::string out = "[";
  char buf[32];
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.4f", i == 0 ? "" : ",", v[i]);
    out += buf;
  }
  return out + "]";
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double idx = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(idx);
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

// The H200's limits the profile compares against: HBM3e bandwidth by the datasheet, and the dense
// bf16 GEMM rate measured on this kind of machine (8192^3 products, random data).
constexpr double kHbmBytesPerS = 4.8e12;
constexpr double kBf16FlopPerS = 790e12;

// The bytes an op must move at the least (each operand read once, each output written once and
// read too where it accumulates), and its floating-point work, as the executor runs it: `host` is
// true for the op whose launch does the work, false for an op folded into another's launch (a
// gelu in a GEMM epilogue, the crossentropy_backward of the fused classifier, an adamw of the
// multi-tensor launch), which then adds only what the fused launch moves for it.
struct Traffic {
  double bytes = 0, flops = 0;
  bool tensor_core = false;
};
Traffic op_traffic(const tk::Graph& g, const tk::Op& op, bool overwrites, bool host,
                   bool dx_fused_away) {
  auto bytes = [&](tk::TensorId t) { return static_cast<double>(g[t].bytes()); };
  Traffic r;
  r.flops = tk::op_flops(g, op);
  const bool accumulates =
      op.kind == tk::OpKind::layernorm_backward || op.kind == tk::OpKind::matmul_backward ||
      op.kind == tk::OpKind::attention_backward || op.kind == tk::OpKind::gelu_backward ||
      op.kind == tk::OpKind::residual_backward || op.kind == tk::OpKind::encoder_backward;
  switch (op.kind) {
    case tk::OpKind::matmul_forward:
    case tk::OpKind::matmul_backward:
    case tk::OpKind::attention_forward:
    case tk::OpKind::attention_backward:
    case tk::OpKind::classifier_forward:
    case tk::OpKind::classifier_backward:
      r.tensor_core = true;
      break;
    default:
      break;
  }
  if (host &&
      (op.kind == tk::OpKind::classifier_forward || op.kind == tk::OpKind::classifier_backward)) {
    // the chunk's logits: written by the GEMM and read by the loss; the backward's loss writes
    // their gradient in place, which the dx and dw GEMMs read
    const auto& w = g[op.inputs[1]].shape;
    const double logits = static_cast<double>(g[op.inputs[0]].elements()) /
                          static_cast<double>(w[1]) * static_cast<double>(w[0]) * 2;
    r.bytes += (op.kind == tk::OpKind::classifier_forward ? 2 : 5) * logits;
  }
  if (op.kind == tk::OpKind::zero) {
    for (auto t : op.outputs) r.bytes += bytes(t);
    return r;
  }
  if (!host) {  // folded into another op's launch: its outputs (and dgelu's pre-activation)
    for (auto t : op.outputs) r.bytes += bytes(t);
    if (op.kind == tk::OpKind::gelu_backward) r.bytes += bytes(op.inputs[1]);
    if (op.kind == tk::OpKind::adamw) {  // the gradient; m, v and the master copy are read too
      r.bytes += bytes(op.inputs[0]);
      for (std::size_t k = 1; k < op.outputs.size(); ++k) r.bytes += bytes(op.outputs[k]);
    }
    return r;
  }
  for (auto t : op.inputs) r.bytes += bytes(t);
  for (std::size_t k = 0; k < op.outputs.size(); ++k) {
    const tk::TensorId t = op.outputs[k];
    if (k == 0 && dx_fused_away) continue;  // dH of a DGELU GEMM is never written
    r.bytes += bytes(t);
    const bool read_too =
        op.kind == tk::OpKind::adamw ? k >= 1 : accumulates && !(k == 0 && overwrites);
    if (read_too) r.bytes += bytes(t);
  }
  if (op.kind == tk::OpKind::encoder_forward) {  // only the rows of wte the tokens pick
    r.bytes -= bytes(op.inputs[1]);
    r.bytes += bytes(op.outputs[0]);
  }
  if (op.kind == tk::OpKind::encoder_backward) {  // dwte: only the rows the tokens touch
    const double rows = std::min<double>(static_cast<double>(g[op.inputs[1]].elements()),
                                         static_cast<double>(g[op.outputs[0]].shape[0]));
    r.bytes -= 2 * bytes(op.outputs[0]);
    r.bytes += 2 * rows * static_cast<double>(g[op.outputs[0]].shape[1]) * 4;
  }
  return r;
}

// The last step's GPU time by op kind (CUDA events around each op, launched op by op), with the
// bytes and FLOPs of each kind, the bandwidth or FLOP rate achieved and the time the H200's limits
// allow (bound_ms = max(bytes / HBM bandwidth, FLOPs / bf16 rate for tensor-core ops)); one JSON
// line. lm_head's GEMMs are a kind of their own.
int print_op_profile(gpu::CudaExecutor& ex, int batch) {
  auto times = ex.op_times_ms();
  if (!times) {
    std::fprintf(stderr, "gpt2_bench: %s\n", times.error().message.c_str());
    return 1;
  }
  const tk::Graph& g = ex.plan().graph;
  const auto& ops = g.ops;
  struct Kind {
    double ms = 0, bytes = 0, flops = 0;
    int launches = 0, ops = 0;
    bool tensor_core = false;
  };
  std::map<std::string, Kind> by_kind;
  std::vector<std::string> kind_of(ops.size());
  std::vector<std::uint8_t> dx_fused_away(ops.size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const auto e = ex.execution_of(i);
    if (e.runs_in != i && e.runs_in != gpu::CudaExecutor::kNotRun &&
        ops[i].kind == tk::OpKind::gelu_backward)
      dx_fused_away[e.runs_in] = 1;
  }
  for (std::size_t i = 0; i < ops.size(); ++i) {
    std::string kind(tk::op_name(ops[i].kind));
    if (ops[i].phase == tk::Phase::recompute) kind += " (recompute)";
    if (ops[i].name == "lm_head" && ops[i].kind == tk::OpKind::matmul_forward) kind = "lm_head";
    if (ops[i].name == "lm_head" && ops[i].kind == tk::OpKind::matmul_backward)
      kind = "lm_head_backward";
    kind_of[i] = kind;
  }
  double total = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const auto e = ex.execution_of(i);
    if (e.runs_in == gpu::CudaExecutor::kNotRun) continue;
    Kind& k = by_kind[kind_of[e.runs_in]];  // folded work counts where it runs
    const Traffic t = op_traffic(g, ops[i], e.overwrites, e.runs_in == i, dx_fused_away[i] != 0);
    k.bytes += t.bytes;
    k.flops += t.flops;
    k.tensor_core = k.tensor_core || t.tensor_core;
    k.ops += 1;
    if (e.runs_in == i) {
      k.ms += (*times)[i];
      k.launches += 1;
      total += (*times)[i];
    }
  }
  double gemm_ms = 0, attention_ms = 0, classifier_ms = 0, other_ms = 0, other_bound_ms = 0;
  std::printf(
      "{\"bench\":\"gpt2_op_profile\",\"batch\":%d,\"step_ops_ms\":%.3f,"
      "\"hbm_tb_s\":%.1f,\"bf16_tflop_s\":%.0f,\"by_kind\":{",
      batch, total, kHbmBytesPerS / 1e12, kBf16FlopPerS / 1e12);
  bool first = true;
  for (const auto& [name, k] : by_kind) {
    const double bound_ms =
        std::max(k.bytes / kHbmBytesPerS, k.tensor_core ? k.flops / kBf16FlopPerS : 0.0) * 1e3;
    const double s = k.ms / 1e3;
    std::printf(
        "%s\"%s\":{\"ms\":%.3f,\"ops\":%d,\"launches\":%d,\"bytes\":%.0f,\"flop\":%.0f,"
        "\"tb_s\":%.3f,\"tflop_s\":%.1f,\"bound_ms\":%.3f,\"of_bound\":%.3f}",
        first ? "" : ",", name.c_str(), k.ms, k.ops, k.launches, k.bytes, k.flops,
        s > 0 ? k.bytes / s / 1e12 : 0.0, s > 0 ? k.flops / s / 1e12 : 0.0, bound_ms,
        k.ms > 0 ? bound_ms / k.ms : 0.0);
    first = false;
    if (name.rfind("matmul", 0) == 0 || name.rfind("lm_head", 0) == 0)
      gemm_ms += k.ms;
    else if (name.rfind("classifier", 0) == 0)  // the head's GEMMs and its loss, chunk by chunk
      classifier_ms += k.ms;
    else if (name.rfind("attention", 0) == 0)
      attention_ms += k.ms;
    else {
      other_ms += k.ms;
      other_bound_ms += bound_ms;
    }
  }
  std::printf(
      "},\"gemm_ms\":%.3f,\"attention_ms\":%.3f,\"classifier_ms\":%.3f,\"other_ms\":%.3f,"
      "\"other_bound_ms\":%.3f}\n",
      gemm_ms, attention_ms, classifier_ms, other_ms, other_bound_ms);
  std::fflush(stdout);
  return 0;
}

int run(const Config& cfg) {
  const auto t_plan0 = std::chrono::steady_clock::now();
  tk::GptConfig c;
  // GPT-2's sizes (layers, width, heads); T = 1024, vocabulary 50257 padded to 50304
  const auto [L, C, NH] = cfg.model == "350m"    ? std::tuple{24, 1024, 16}
                          : cfg.model == "774m"  ? std::tuple{36, 1280, 20}
                          : cfg.model == "1558m" ? std::tuple{48, 1600, 25}
                                                 : std::tuple{12, 768, 12};
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = NH;
  c.block_size = 1024;
  c.vocab_size = 50257;
  c.padded_vocab = 50304;
  c.batch = cfg.batch;
  c.seq_len = 1024;
  tk::LlamaConfig lc;  // configs/jobs/llama-1b-1gpu.toml
  lc.n_layer = 18;
  lc.n_embd = 2048;
  lc.n_head = 32;
  lc.n_kv_head = 8;
  lc.ffn_hidden = 5632;
  lc.vocab_size = 50257;
  lc.padded_vocab = 50304;
  lc.batch = cfg.batch;
  lc.seq_len = 1024;
  tk::Graph g = cfg.model == "llama1b" ? tk::build_llama(lc, tk::Precision::cuda_bf16())
                                       : tk::build_gpt2(c, tk::Precision::cuda_bf16());
  tk::append_backward(g);
  tk::append_optimizer(g);
  tk::PlanOptions po;
  po.memory_budget_bytes = static_cast<std::size_t>(cfg.budget_gib * kGiB);
  po.classifier_chunk_rows = cfg.classifier_chunk_rows;
  po.offload = cfg.offload;
  po.comm.compute_gflops = tk::kGpuComputeGflops;  // as the worker costs GPU plans
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
  opt.fuse_bias_gradients = cfg.fuse_bias;
  opt.fp8 = cfg.fp8;
  if (cfg.fp8_all) opt.fp8_choice = gpu::CudaExecutorOptions::Fp8Choice::always;
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
      "{\"bench\":\"gpt2_train\",\"system\":\"topolaunch_cuda\",\"model\":\"%s\",\"batch\":%"
      "d,"
      "\"seq_len\":1024,\"mode\":\"%s\",\"budget_gib\":%.2f,\"median_ms\":%.3f,\"p90_ms\":%.3f,"
      "\"tokens_per_s\":%.0f,\"arena_gib\":%.4f,\"unconstrained_arena_gib\":%.4f,"
      "\"max_live_gib\":%.4f,\"device_used_gib\":%.4f,\"recomputed_tensors\":%zu,"
      "\"extra_compute_pct\":%.2f,\"graph_nodes\":%zu,\"host_launch_ms_per_step\":%.3f,"
      "\"plan_s\":%.3f,\"first_step_s\":%.3f,\"loss_after_warmup\":%.4f,\"loss_last\":%.4f,"
      "\"grad_norm_last\":%.4f,\"timed_steps\":%d,\"attention\":{\"option\":\"%s\","
      "\"chosen\":\"%s\",\"own_fwd_ms\":%.4f,\"own_bwd_ms\":%.4f,\"cudnn_fwd_ms\":%.4f,"
      "\"cudnn_bwd_ms\":%.4f,\"cudnn_workspace_bytes\":%zu,\"cudnn_workspace_planned\":%s,"
      "\"cudnn_workspace_outside_arena_bytes\":%zu,\"cudnn_backward_ops\":%d,"
      "\"cudnn_version\":\"%s\",\"cudnn_fwd_candidates_ms\":%s,\"cudnn_bwd_candidates_ms\":%s,"
      "\"cudnn_fwd_candidate\":%d,\"cudnn_bwd_candidate\":%d,\"cudnn_fwd_config\":\"%s\","
      "\"cudnn_bwd_config\":\"%s\",\"reason\":\"%s\"},\"fuse_gelu\":%s,\"fuse_bias\":%s,\"bias_"
      "gradients_fused\":%zu,"
      "\"gelu_ops_fused\":%zu,"
      "\"classifier_chunk_rows\":%lld,\"precision\":\"%s\",\"fp8_gemm_ops\":%d,"
      "\"fp8_fallback_ops\":%d,\"fp8_gemms\":%d,\"fp8_bf16_by_measurement\":%d,"
      "\"fp8_scratch_gib\":%.4f,\"optimizer_offloaded\":%s,\"host_gib\":%.4f,"
      "\"offload_model_ms\":%.3f,\"recompute_model_ms\":%.3f}\n",
      (cfg.model == "llama1b" ? std::string("llama-1b") : "gpt2-" + cfg.model).c_str(), cfg.batch,
      cfg.graph ? "graph" : (cfg.profile ? "profile_op_by_op" : "op_by_op"), cfg.budget_gib, med,
      p90, static_cast<double>(BT) / (med / 1e3), static_cast<double>(mp.arena_bytes) / kGiB,
      static_cast<double>(ex->plan().unconstrained.arena_bytes) / kGiB,
      static_cast<double>(mp.max_live_bytes) / kGiB, static_cast<double>(used) / kGiB,
      ex->plan().recompute.size(), 100.0 * ex->plan().extra_flops / ex->plan().step_flops,
      ex->graph_nodes(), host_enqueue_ms, plan_s, first_step_s, loss_warm, loss, norm, kTimedSteps,
      gpu::attention_impl_name(cfg.attention), gpu::attention_impl_name(ac.chosen), ac.own_fwd_ms,
      ac.own_bwd_ms, ac.cudnn_fwd_ms, ac.cudnn_bwd_ms, ac.cudnn_workspace_bytes,
      ac.cudnn_workspace_planned ? "true" : "false", ex->memory().attention_workspace_bytes,
      ac.cudnn_backward_ops, ac.cudnn_version.c_str(), ms_list(ac.cudnn_fwd_candidates_ms).c_str(),
      ms_list(ac.cudnn_bwd_candidates_ms).c_str(), ac.cudnn_fwd_candidate, ac.cudnn_bwd_candidate,
      ac.cudnn_fwd_config.c_str(), ac.cudnn_bwd_config.c_str(), reason.c_str(),
      cfg.fuse_gelu ? "true" : "false", cfg.fuse_bias ? "true" : "false",
      ex->bias_gradients_fused(), ex->gelu_ops_fused(),
      static_cast<long long>(ex->plan().classifier_chunk_rows),
      cfg.fp8_all ? "fp8all" : (cfg.fp8 ? "fp8" : "bf16"), ex->fp8_report().gemm_ops,
      ex->fp8_report().fallback_ops, ex->fp8_report().fp8_gemms,
      ex->fp8_report().bf16_by_measurement,
      static_cast<double>(ex->fp8_report().scratch_bytes) / kGiB,
      ex->plan().optimizer_offloaded ? "true" : "false", static_cast<double>(mp.host_bytes) / kGiB,
      ex->plan().offload_ms, ex->plan().recompute_ms);
  std::fflush(stdout);
  if (cfg.profile && print_op_profile(*ex, cfg.batch) != 0) return 1;
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
