// See cuda_worker.hpp.
#include "cuda_worker.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>

#include "cuda_backend.hpp"
#include "topolaunch/kernels/worker.hpp"

namespace topolaunch::kernels::cuda {

namespace {

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

}  // namespace

int train_on_gpu(const WorkerConfig& c, const Plan& plan, const Dataset& data, std::ostream& out,
                 std::ostream& err) {
  auto fail = [&](const std::string& message, int code) {
    err << "topolaunch-worker: " << message << "\n";
    return code;
  };
  const int world = std::max(1, env_int("TOPOLAUNCH_WORLD_SIZE", env_int("WORLD_SIZE", 1)));
  if (world > 1)
    return fail(c.path +
                    ": train.precision: \"bf16\" trains on one GPU per job for now (WORLD_SIZE=" +
                    std::to_string(world) +
                    "); the NCCL gradient all-reduce is not wired into the worker yet",
                2);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return fail(
        "train.precision: \"bf16\": no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)", 1);
  const int device = env_int("LOCAL_RANK", 0) % devices;
  if (cudaSetDevice(device) != cudaSuccess)
    return fail("cudaSetDevice(" + std::to_string(device) + ") failed", 1);

  auto ex_r = CudaExecutor::create(plan);
  if (!ex_r) return fail(ex_r.error().message, ex_r.error().exit_code);
  CudaExecutor& ex = **ex_r;
  const Graph& g = plan.graph;
  const TrainSpec& t = c.train;
  const std::int64_t B = t.batch, T = t.seq_len, stride = B * T;
  if (static_cast<std::int64_t>(data.tokens.size()) < stride + 1)
    return fail(c.data.path + ": data.path: " + std::to_string(data.tokens.size()) +
                    " tokens are fewer than one step needs (" + std::to_string(stride + 1) + ")",
                2);
  if (auto s = ex.init_parameters(t.seed); !s) return fail(s.error().message, 1);
  const int accum = plan.comm.grad_accum;
  ex.set_loss_scale(1.0 / static_cast<double>(stride * accum));
  out << data.description << "\n";
  out << fmt("model %s: %zu parameters, vocabulary %lld; GPU %d (CUDA backend, bf16, %s), batch "
             "%lld x seq %lld x accum %d; arena %s\n",
             c.model.kind.c_str(), g.parameter_count(), static_cast<long long>(g.vocab), device,
             "whole step replayed as a CUDA Graph", static_cast<long long>(B),
             static_cast<long long>(T), accum, format_bytes(plan.memory.arena_bytes).c_str())
      << std::flush;
  std::ofstream metrics;
  if (!t.metrics_file.empty()) metrics.open(t.metrics_file, std::ios::app);

  const std::int64_t n_tokens = static_cast<std::int64_t>(data.tokens.size());
  std::int64_t position = 0;
  std::vector<std::int32_t> x(static_cast<std::size_t>(stride)), y(x.size());
  for (std::int64_t step = 1; step <= t.steps; ++step) {
    const auto s0 = std::chrono::steady_clock::now();
    const bool log = step % t.log_every == 0 || step == 1 || step == t.steps || metrics.is_open();
    const AdamWSettings adamw = t.adamw.learning_rate > 0
                                    ? AdamWSettings{scheduled_learning_rate(t, step),
                                                    t.adamw.beta1,
                                                    t.adamw.beta2,
                                                    t.adamw.epsilon,
                                                    t.adamw.weight_decay,
                                                    t.adamw.grad_clip}
                                    : t.adamw;
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      if (position + stride + 1 > n_tokens) position = 0;  // next epoch
      for (std::int64_t i = 0; i < stride; ++i) {
        x[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(position + i)];
        y[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(position + i + 1)];
      }
      position += stride;
      if (auto s = ex.set_batch(x, y); !s) return fail(s.error().message, 1);
      Status s = accum == 1 ? ex.train_step(adamw, step) : ex.run_forward_backward(false);
      if (!s) return fail(s.error().message, 1);
      if (log || accum > 1) {
        auto l = ex.mean_loss();
        if (!l) return fail(l.error().message, 1);
        loss += *l / accum;
      }
    }
    if (accum > 1)
      if (auto s = ex.run_optimizer(adamw, step); !s) return fail(s.error().message, 1);
    if (!log) continue;
    auto norm = ex.last_grad_norm();
    if (!norm) return fail(norm.error().message, 1);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
    if (step % t.log_every == 0 || step == 1 || step == t.steps)
      out << fmt("step %5lld/%lld | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s\n",
                 static_cast<long long>(step), static_cast<long long>(t.steps), loss,
                 adamw.learning_rate, *norm, ms, static_cast<double>(stride * accum) / (ms / 1e3))
          << std::flush;
    if (metrics.is_open())
      metrics
          << fmt("{\"step\":%lld,\"loss\":%.17g,\"grad_norm\":%.17g,\"ms\":%.3f,\"tokens\":%lld}\n",
                 static_cast<long long>(step), loss, *norm, ms,
                 static_cast<long long>(stride * accum))
          << std::flush;
  }
  if (auto s = ex.synchronize(); !s) return fail(s.error().message, 1);
  out << "done: " << t.steps << " steps on the GPU (the CUDA backend writes no checkpoint yet)\n";
  return 0;
}

}  // namespace topolaunch::kernels::cuda
