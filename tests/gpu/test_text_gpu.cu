// The CUDA side of text-to-model against the CPU: attention_cached_forward against its CPU twin,
// the KV-cache CudaDecoder against CpuDecoder on the same (bf16-rounded) weights, and the
// executor's forward-only pass (validation) against the CPU backend's, between training steps that
// it must not disturb. Plain main, exit status = failed checks (the GPU host has no Catch2 of
// ours).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "attention.hpp"
#include "cuda_backend.hpp"
#include "cuda_decoder.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/kernels/cpu_decoder.hpp"

namespace tk = topolaunch::kernels;
namespace gpu = topolaunch::kernels::cuda;
using bf16 = __nv_bfloat16;

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
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
void must(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, cudaGetErrorString(e));
    std::exit(100);
  }
}

float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

void cached_attention(std::int64_t C, std::int64_t NH, std::int64_t t) {
  std::mt19937 rng(static_cast<unsigned>(C * 31 + t));
  std::normal_distribution<float> n(0.f, 1.f);
  const std::int64_t rows = t + 1;
  std::vector<float> q(C), k(rows * C), v(rows * C);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = round_bf16(n(rng));
  std::vector<float> y(C), scores(rows);
  tk::cpu::attention_cached_forward(y.data(), scores.data(), q.data(), k.data(), v.data(), t, C,
                                    NH);
  auto to_device = [](const std::vector<float>& h) {
    std::vector<bf16> b(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) b[i] = __float2bfloat16(h[i]);
    bf16* d = nullptr;
    must(cudaMalloc(&d, b.size() * sizeof(bf16)), "cudaMalloc");
    must(cudaMemcpy(d, b.data(), b.size() * sizeof(bf16), cudaMemcpyHostToDevice), "copy");
    return d;
  };
  bf16 *dq = to_device(q), *dk = to_device(k), *dv = to_device(v), *dy = to_device(y);
  must(gpu::attention_cached_forward(dy, dq, dk, dv, t, C, NH, nullptr),
       "attention_cached_forward");
  std::vector<bf16> out(C);
  must(cudaMemcpy(out.data(), dy, C * sizeof(bf16), cudaMemcpyDeviceToHost), "copy back");
  double worst = 0;
  for (std::int64_t i = 0; i < C; ++i)
    worst = std::max(worst, std::abs(double(__bfloat162float(out[i])) - y[i]));
  check(worst < 2e-2, fmt("attention_cached_forward C=%lld NH=%lld t=%lld: max |gpu - cpu| %.2e",
                          (long long)C, (long long)NH, (long long)t, worst));
  for (bf16* p : {dq, dk, dv, dy}) cudaFree(p);
}

tk::GptConfig small_gpt() {
  tk::GptConfig c;
  c.n_layer = 2;
  c.n_embd = 128;
  c.n_head = 2;
  c.block_size = 64;
  c.vocab_size = 300;
  c.batch = 4;
  c.seq_len = 64;
  return c;
}

tk::Plan make_plan(const tk::Precision& precision) {
  tk::Graph g = tk::build_gpt2(small_gpt(), precision);
  tk::append_backward(g);
  tk::append_optimizer(g);
  return must(tk::compile_plan(std::move(g), tk::PlanOptions{}), "compile_plan");
}

void decoder_against_cpu() {
  const tk::Plan plan = make_plan({});
  tk::CpuExecutor<float> cpu(plan);
  cpu.init_parameters(1337);
  tk::NamedWeights w;
  for (tk::TensorId p : plan.graph.params) {
    auto v = cpu.values(p);
    auto& out = w[plan.graph[p].name];
    for (float x : v) out.push_back(round_bf16(x));  // both decoders see the GPU's weights
  }
  tk::GptConfig c = small_gpt();
  auto cd = must(tk::CpuDecoder::create(c, w), "CpuDecoder");
  auto gd = must(gpu::CudaDecoder::create(c, w), "CudaDecoder");
  double worst = 0, scale = 0;
  int argmax_same = 0;
  const int positions = 40;
  for (int t = 0; t < positions; ++t) {
    const std::int32_t token = (t * 37 + 5) % 300;
    auto a = cd.step(token);
    auto b = must(gd->step(token), "CudaDecoder::step");
    std::size_t ia = 0, ib = 0;
    for (std::size_t v = 0; v < a.size(); ++v) {
      worst = std::max(worst, std::abs(double(a[v]) - b[v]));
      scale = std::max(scale, std::abs(double(a[v])));
      if (a[v] > a[ia]) ia = v;
      if (b[v] > b[ib]) ib = v;
    }
    argmax_same += ia == ib;
  }
  check(worst < 0.05 * std::max(1.0, scale),
        fmt("CudaDecoder vs CpuDecoder over %d positions: max |gpu - cpu| %.3e (max |logit| %.2f)",
            positions, worst, scale));
  // (random weights: the top two logits can lie within bf16's rounding of each other)
  check(argmax_same >= positions * 4 / 5,
        fmt("CudaDecoder's most likely token is the CPU's at %d of %d positions", argmax_same,
            positions));
  check(gd->position() == positions, "CudaDecoder position after the steps");
}

void validation_forward() {
  const tk::Plan cpu_plan = make_plan({});
  const tk::Plan gpu_plan = make_plan(tk::Precision::cuda_bf16());
  tk::CpuExecutor<float> cpu(cpu_plan);
  cpu.init_parameters(1337);
  auto ex = must(gpu::CudaExecutor::create(gpu_plan), "CudaExecutor");
  must(ex->init_parameters(1337), "init");
  const auto c = small_gpt();
  const std::size_t n = static_cast<std::size_t>(c.batch * c.seq_len);
  std::vector<std::int32_t> x(n), y(n), vx(n), vy(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = (i * 7 + 3) % 300, y[i] = (i * 7 + 10) % 300, vx[i] = (i * 11 + 1) % 300,
    vy[i] = (i * 11 + 12) % 300;
  // CPU: the validation batch's loss through the forward alone.
  std::copy(vx.begin(), vx.end(), cpu.ints(cpu_plan.graph.tokens));
  std::copy(vy.begin(), vy.end(), cpu.ints(cpu_plan.graph.targets));
  must(cpu.run_forward(), "cpu forward");
  const double cpu_loss = cpu.mean_loss();
  // GPU: a training step, then the validation forward, twice (the second from the captured
  // graph), then a training step whose loss must be that of a run without the validation.
  tk::AdamWSettings adamw;
  adamw.learning_rate = 0;  // parameters stay as initialised: the CPU's are the same
  ex->set_loss_scale(1.0 / static_cast<double>(n));
  must(ex->set_batch(x, y), "batch");
  must(ex->train_step(adamw, 1), "train_step");
  const double train1 = must(ex->mean_loss(), "loss");
  double val[2];
  for (double& v : val) {
    must(ex->set_batch(vx, vy), "val batch");
    must(ex->run_forward(), "run_forward");
    v = must(ex->mean_loss(), "val loss");
  }
  must(ex->set_batch(x, y), "batch");
  must(ex->train_step(adamw, 2), "train_step");
  const double train2 = must(ex->mean_loss(), "loss");
  check(std::abs(val[0] - cpu_loss) < 2e-2,
        fmt("CUDA validation forward %.6f vs CPU %.6f", val[0], cpu_loss));
  check(val[0] == val[1],
        fmt("the forward graph's replay repeats it (%.9f, %.9f)", val[0], val[1]));
  check(std::abs(train2 - train1) < 1e-3 * train1,
        fmt("a training step after validation: loss %.6f (before: %.6f, learning rate 0)", train2,
            train1));
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "FATAL no CUDA device\n");
    return 100;
  }
  for (auto [C, NH] : {std::pair<std::int64_t, std::int64_t>{64, 4}, {768, 12}, {128, 2}})
    for (std::int64_t t : {0, 37, 511}) cached_attention(C, NH, t);
  decoder_against_cpu();
  validation_forward();
  std::printf("%d failed\n", g_failures);
  return g_failures;
}
