// The CUDA executor against the CPU backend on a small LLaMA (2 layers, C = 256, 4 query heads
// of 64 sharing 2 key/value heads, SwiGLU 512, V = 300 padded to 320, T = 64, B = 4), from the
// same init and on the same batch, 20 AdamW steps with clipping:
//   1. every loss within 1e-2 relative of the CPU's and every gradient norm within 5e-2, by graph
//      replay; the loss falls;
//   2. the same plan op by op: the losses of graph replay within 1e-3;
//   3. one GPU, each [train] shard mode's plan (its reduce-scatters, gathers and sharded AdamW
//      local): the losses of the unsharded GPU run within 1e-2 (the sharded plans sum the global
//      norm by bucket, and ZeRO-3 runs from its gathered copies).
// With an output folder argument it also exports the init, the batch, both backends' losses and
// gradient norms for the PyTorch reference (tests/bench/kernels/llama_torch_reference.py).
// Plain main (the GPU host has no Catch2 2.x): prints one line per check, exits with the number
// of failed checks (100 on a fatal error).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cuda_backend.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace tk = topolaunch::kernels;
namespace gpu = topolaunch::kernels::cuda;

namespace {

int g_failures = 0, g_checks = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) ++g_failures;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
}

template <class T>
T must(topolaunch::Result<T> r, const char* what) {
  if (!r) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, r.error().message.c_str());
    std::exit(100);
  }
  return std::move(*r);
}
void must(const topolaunch::Status& s, const char* what) {
  if (!s) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, s.error().message.c_str());
    std::exit(100);
  }
}

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

constexpr int kSteps = 20;
constexpr std::uint64_t kSeed = 1337;

tk::LlamaConfig small_llama() {
  tk::LlamaConfig c;
  c.n_layer = 2;
  c.n_embd = 256;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 512;
  c.vocab_size = 300;
  c.batch = 4;
  c.seq_len = 64;
  return c;
}

tk::Plan make_plan(const tk::Precision& precision, tk::ShardMode shard = tk::ShardMode::none) {
  tk::Graph g = tk::build_llama(small_llama(), precision);
  tk::append_backward(g);
  tk::append_optimizer(g);
  tk::PlanOptions po;
  po.shard = shard;
  po.comm.bucket_cap_bytes = 256 << 10;  // several buckets
  return must(tk::compile_plan(std::move(g), po), "compile_plan");
}

// A learnable sequence: next = (7 * prev + 13 + noise) mod V, noise in {0, 1, 2}.
std::vector<std::int32_t> make_tokens(std::size_t n, int vocab) {
  std::vector<std::int32_t> t(n);
  std::uint64_t s = 88172645463325252ull;
  t[0] = 1;
  for (std::size_t i = 1; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    t[i] = static_cast<std::int32_t>((7 * t[i - 1] + 13 + static_cast<int>((s >> 33) % 3)) % vocab);
  }
  return t;
}

struct Run {
  std::vector<double> losses, norms;
};

Run train_gpu(gpu::CudaExecutor& ex, const std::vector<std::int32_t>& tokens,
              const std::vector<std::int32_t>& targets, double loss_scale,
              const tk::AdamWSettings& adamw) {
  must(ex.init_parameters(kSeed), "init_parameters");
  ex.set_loss_scale(loss_scale);
  Run r;
  for (int step = 1; step <= kSteps; ++step) {
    must(ex.set_batch(tokens, targets), "set_batch");
    must(ex.train_step(adamw, step), "train_step");
    r.losses.push_back(must(ex.mean_loss(), "mean_loss"));
    r.norms.push_back(must(ex.last_grad_norm(), "grad norm"));
  }
  return r;
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return w;
}

void write_json_array(std::FILE* f, const char* key, const std::vector<double>& v, bool comma) {
  std::fprintf(f, "  \"%s\": [", key);
  for (std::size_t i = 0; i < v.size(); ++i) std::fprintf(f, "%s%.9g", i ? ", " : "", v[i]);
  std::fprintf(f, "]%s\n", comma ? "," : "");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string export_dir = argc > 1 ? argv[1] : "";
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "FATAL no CUDA device visible: this test needs a GPU\n");
    return 100;
  }
  const tk::LlamaConfig c = small_llama();
  const std::int64_t BT = c.batch * c.seq_len;
  const auto stream_tokens = make_tokens(static_cast<std::size_t>(BT) + 1, 300);
  std::vector<std::int32_t> tokens(stream_tokens.begin(), stream_tokens.end() - 1);
  std::vector<std::int32_t> targets(stream_tokens.begin() + 1, stream_tokens.end());
  tk::AdamWSettings adamw;
  adamw.learning_rate = 1e-3;
  adamw.weight_decay = 0.1;
  adamw.grad_clip = 1.0;
  const double loss_scale = 1.0 / static_cast<double>(BT);

  // ---- CPU reference (fp32) ----
  const tk::Plan cpu_plan = make_plan({});
  tk::CpuExecutor<float> cpu(cpu_plan);
  const tk::Graph& cg = cpu.plan().graph;
  cpu.init_parameters(kSeed);
  std::vector<float> init_params;
  for (auto p : cg.params)
    init_params.insert(init_params.end(), cpu.values(p).begin(), cpu.values(p).end());
  cpu.set_loss_scale(loss_scale);
  Run cpu_run;
  for (int step = 1; step <= kSteps; ++step) {
    std::copy(tokens.begin(), tokens.end(), cpu.ints(cg.tokens));
    std::copy(targets.begin(), targets.end(), cpu.ints(cg.targets));
    must(cpu.run_forward_backward(nullptr), "cpu forward_backward");
    cpu_run.losses.push_back(cpu.mean_loss());
    must(cpu.run_optimizer(adamw, step), "cpu optimizer");
    cpu_run.norms.push_back(cpu.last_grad_norm());
  }

  // ---- CUDA executor, graph replay ----
  const tk::Plan gpu_plan = make_plan(tk::Precision::cuda_bf16());
  std::printf("plan: %zu ops, arena %s\n", gpu_plan.graph.ops.size(),
              tk::format_bytes(gpu_plan.memory.arena_bytes).c_str());
  auto ex = must(gpu::CudaExecutor::create(gpu_plan), "create");
  check(ex->attention_choice().chosen == gpu::AttentionImpl::own,
        "grouped-query attention runs our kernels: " + ex->attention_choice().reason);
  const Run graph = train_gpu(*ex, tokens, targets, loss_scale, adamw);
  for (int i = 0; i < kSteps; ++i)
    std::printf("  step %2d  cpu %.6f (norm %.4f)  gpu %.6f (norm %.4f)\n", i + 1,
                cpu_run.losses[i], cpu_run.norms[i], graph.losses[i], graph.norms[i]);
  const double loss_rel = worst_relative(graph.losses, cpu_run.losses);
  const double norm_rel = worst_relative(graph.norms, cpu_run.norms);
  check(loss_rel <= 1e-2,
        fmt("20-step losses, graph replay vs CPU: worst relative %.2e <= 1e-2", loss_rel));
  check(norm_rel <= 5e-2,
        fmt("20-step gradient norms vs CPU: worst relative %.2e <= 5e-2", norm_rel));
  check(graph.losses.back() < graph.losses.front() - 0.5,
        fmt("the loss falls: %.4f -> %.4f", graph.losses.front(), graph.losses.back()));

  // ---- op by op ----
  gpu::CudaExecutorOptions eager;
  eager.mode = gpu::ExecutionMode::op_by_op;
  auto ex2 = must(gpu::CudaExecutor::create(gpu_plan, eager), "create op-by-op");
  const Run op_by_op = train_gpu(*ex2, tokens, targets, loss_scale, adamw);
  const double eager_rel = worst_relative(op_by_op.losses, graph.losses);
  check(eager_rel <= 1e-3,
        fmt("op by op: the losses of graph replay (worst relative %.2e <= 1e-3)", eager_rel));

  // ---- each shard mode on one GPU ----
  for (tk::ShardMode mode :
       {tk::ShardMode::optimizer, tk::ShardMode::gradients, tk::ShardMode::parameters}) {
    const tk::Plan p = make_plan(tk::Precision::cuda_bf16(), mode);
    auto sx = must(gpu::CudaExecutor::create(p), "create sharded");
    const Run r = train_gpu(*sx, tokens, targets, loss_scale, adamw);
    const double rel = worst_relative(r.losses, graph.losses);
    check(rel <= 1e-2, fmt("shard = %s, one GPU (%zu buckets, arena %s): losses of the "
                           "unsharded run, worst relative %.2e <= 1e-2",
                           std::string(tk::shard_mode_name(mode)).c_str(), p.comm.buckets.size(),
                           tk::format_bytes(p.memory.arena_bytes).c_str(), rel));
  }

  // ---- export for the PyTorch reference ----
  if (!export_dir.empty()) {
    std::ofstream pf(export_dir + "/llama_small_params.bin", std::ios::binary);
    pf.write(reinterpret_cast<const char*>(init_params.data()),
             static_cast<std::streamsize>(init_params.size() * sizeof(float)));
    std::ofstream bf(export_dir + "/llama_small_batch.bin", std::ios::binary);
    bf.write(reinterpret_cast<const char*>(tokens.data()),
             static_cast<std::streamsize>(tokens.size() * sizeof(std::int32_t)));
    bf.write(reinterpret_cast<const char*>(targets.data()),
             static_cast<std::streamsize>(targets.size() * sizeof(std::int32_t)));
    std::FILE* f = std::fopen((export_dir + "/llama_small.json").c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "FATAL cannot write %s/llama_small.json\n", export_dir.c_str());
      return 100;
    }
    std::fprintf(f,
                 "{\n  \"n_layer\": %lld, \"n_embd\": %lld, \"n_head\": %lld, "
                 "\"n_kv_head\": %lld, \"ffn_hidden\": %lld, \"rope_theta\": %.17g,\n",
                 static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd),
                 static_cast<long long>(c.n_head), static_cast<long long>(c.n_kv_head),
                 static_cast<long long>(c.ffn_hidden), c.rope_theta);
    std::fprintf(f, "  \"vocab_size\": %lld, \"batch\": %lld, \"seq_len\": %lld, \"steps\": %d,\n",
                 static_cast<long long>(c.vocab_size), static_cast<long long>(c.batch),
                 static_cast<long long>(c.seq_len), kSteps);
    std::fprintf(f,
                 "  \"learning_rate\": %.17g, \"beta1\": %.17g, \"beta2\": %.17g, "
                 "\"epsilon\": %.17g, \"weight_decay\": %.17g, \"grad_clip\": %.17g,\n",
                 adamw.learning_rate, adamw.beta1, adamw.beta2, adamw.epsilon, adamw.weight_decay,
                 adamw.grad_clip);
    std::fprintf(f, "  \"params\": [");
    for (std::size_t i = 0; i < cg.params.size(); ++i) {
      const tk::Tensor& t = cg[cg.params[i]];
      std::fprintf(f, "%s{\"name\": \"%s\", \"shape\": [", i ? ", " : "", t.name.c_str());
      for (std::size_t d = 0; d < t.shape.size(); ++d)
        std::fprintf(f, "%s%lld", d ? ", " : "", static_cast<long long>(t.shape[d]));
      std::fprintf(f, "], \"decayed\": %s}", t.decayed ? "true" : "false");
    }
    std::fprintf(f, "],\n");
    write_json_array(f, "cpu_fp32_losses", cpu_run.losses, true);
    write_json_array(f, "cpu_fp32_grad_norms", cpu_run.norms, true);
    write_json_array(f, "cuda_bf16_losses", graph.losses, true);
    write_json_array(f, "cuda_bf16_grad_norms", graph.norms, false);
    std::fprintf(f, "}\n");
    std::fclose(f);
    std::printf("exported init, batch, losses and gradient norms to %s\n", export_dir.c_str());
  }
  std::printf("%d of %d checks failed\n", g_failures, g_checks);
  return g_failures;
}
