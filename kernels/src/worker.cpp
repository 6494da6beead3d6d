// The training loop: data-parallel micro-steps, bucketed gradient all-reduce inside the backward,
// AdamW, logging, checkpoints, and the SIGUSR1 "checkpoint at the step boundary and requeue".
#include "topolaunch/kernels/worker.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <chrono>
#include <cmath>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <ostream>

#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/heartbeat.hpp"
#include "topolaunch/kernels/job.hpp"
#include "topolaunch/kernels/rng.hpp"

namespace topolaunch::kernels {

namespace {

// A signal handler can only touch a lock-free flag; this is the one piece of process state.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

}  // namespace

double scheduled_learning_rate(const TrainSpec& t, std::int64_t step) {
  const double base = t.adamw.learning_rate;
  if (t.warmup_steps > 0 && step <= t.warmup_steps)
    return base * static_cast<double>(step) / static_cast<double>(t.warmup_steps);
  if (t.min_lr_fraction >= 1.0 || t.steps <= t.warmup_steps) return base;
  const double progress = static_cast<double>(step - t.warmup_steps) /
                          static_cast<double>(std::max<std::int64_t>(1, t.steps - t.warmup_steps));
  const double min_lr = base * t.min_lr_fraction;
  return min_lr +
         0.5 * (base - min_lr) * (1.0 + std::cos(3.141592653589793 * std::min(1.0, progress)));
}

namespace {

double learning_rate(const TrainSpec& t, std::int64_t step) {
  return scheduled_learning_rate(t, step);
}

Result<Graph> build_training_graph(const WorkerConfig& c, std::int64_t vocab) {
  Precision prec;
  if (c.train.precision == "bf16") prec = Precision::cuda_bf16();
  Graph g;
  if (c.model.kind == "gpt2") {
    GptConfig gc = c.model.gpt;
    gc.vocab_size = vocab;
    g = build_gpt2(gc, prec);
  } else {
    MlpConfig mc = c.model.mlp;
    mc.vocab_size = vocab;
    g = build_mlp(mc, prec);
  }
  append_backward(g);
  append_optimizer(g);
  return g;
}

}  // namespace

int run_worker(const WorkerOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const Error& e) {
    err << "topolaunch-worker: " << e.message << "\n";
    return e.exit_code;
  };
  if (o.config_path.empty())
    return fail(make_error("no job file: pass job.toml or set TOPOLAUNCH_CONFIG"));
  auto cfg = load_worker_config(o.config_path, o.overrides);
  if (!cfg) return fail(cfg.error());
  const WorkerConfig& c = *cfg;

  // Data first when it decides the vocabulary (character level); a plan of a model with an
  // explicit vocabulary needs no data.
  Dataset data;
  const bool need_data = !o.plan_only || c.model.vocab_from_data;
  if (need_data) {
    if (c.data.path.empty())
      return fail(make_error(
          c.path + ": data.path: missing (a text file, a folder of text files or an llm.c .bin)"));
    auto d = load_dataset(c.data);
    if (!d) return fail(d.error());
    data = std::move(*d);
  }
  std::int64_t vocab = c.model.vocab_from_data ? data.vocab_size : c.model.gpt.vocab_size;
  if (need_data && data.vocab_size > vocab)
    return fail(make_error(c.path + ": model.vocab_size: " + std::to_string(vocab) +
                           " is smaller than the data's vocabulary (" +
                           std::to_string(data.vocab_size) + " in " + c.data.path +
                           "); raise it or remove the key"));

  auto comm_env = [&]() -> int {
    const char* w = std::getenv("TOPOLAUNCH_WORLD_SIZE");
    if (w == nullptr) w = std::getenv("WORLD_SIZE");
    return w ? std::max(1, std::atoi(w)) : 1;
  }();
  PlanOptions po;
  po.memory_budget_bytes =
      c.train.precision == "bf16" ? c.budget.gpu_memory_bytes : c.budget.memory_bytes;
  po.comm.world_size = comm_env;
  const bool gpu = c.train.precision == "bf16";
  auto or_default = [](double v, double fallback) { return v > 0 ? v : fallback; };
  po.comm.link_gbytes_per_s = or_default(c.train.link_gbytes_per_s, gpu ? 300.0 : 2.0);
  po.comm.latency_us = or_default(c.train.collective_latency_us, gpu ? 45.0 : 50.0);
  po.comm.compute_gflops = or_default(c.train.compute_gflops, gpu ? 400e3 : 10.0);
  po.comm.grad_accum = c.train.grad_accum;
  po.comm.max_exposed_ms = c.budget.comm_exposed_ms_per_step;
  po.comm.max_bytes_per_step = c.budget.comm_bytes_per_step;

  const auto t0 = std::chrono::steady_clock::now();
  auto graph = build_training_graph(c, vocab);
  if (!graph) return fail(graph.error());
  auto plan = compile_plan(std::move(*graph), po);
  if (!plan) return fail(make_error(c.path + ": " + plan.error().message, plan.error().exit_code));
  const double plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (o.plan_only) {
    out << format_plan(*plan, o.list_ops);
    out << fmt("planned in %.1f ms (%s, %s, world size %d)\n", plan_ms, c.model.kind.c_str(),
               c.train.precision.c_str(), comm_env);
    return 0;
  }
  if (c.train.precision == "bf16") {
    if (o.gpu_trainer == nullptr)
      return fail(make_error(c.path +
                             ": train.precision: \"bf16\" needs the CUDA backend, and this "
                             "topolaunch-worker was built without it (meson setup -Dcuda=enabled "
                             "on a host with nvcc); use \"fp32\" for the CPU backend, or "
                             "--plan-only to see the plan"));
    return o.gpu_trainer(c, *plan, data, out, err);
  }
  if (c.train.precision != "fp32")
    return fail(make_error(c.path + ": train.precision: \"" + c.train.precision +
                           "\" is not one the worker trains with (\"fp32\" on the CPU, "
                           "\"bf16\" on a GPU)"));

  const TrainSpec& t = c.train;
  const std::int64_t B = t.batch, T = t.seq_len;
  auto comm_r = communicator_for_worker();
  if (!comm_r) return fail(comm_r.error());
  std::unique_ptr<Communicator> comm = std::move(*comm_r);
  const int rank = comm->rank(), world = comm->world_size();
  const std::int64_t stride =
      static_cast<std::int64_t>(world) * B * T;  // tokens per micro-step, all ranks
  if (static_cast<std::int64_t>(data.tokens.size()) < stride + 1)
    return fail(make_error(c.data.path + ": data.path: " + std::to_string(data.tokens.size()) +
                           " tokens are fewer than one step needs (" + std::to_string(stride + 1) +
                           " = ranks x batch x seq_len + 1)"));

  CpuExecutor<float> ex(*plan);
  const Graph& g = ex.plan().graph;
  NormalRng rng(t.seed);
  ex.init_parameters(t.seed);
  TrainingState state{0, 0, rng.state()};
  std::string ckpt_dir = t.checkpoint_dir;
  if (const char* e = std::getenv("TOPOLAUNCH_CHECKPOINT_DIR"); e && *e) ckpt_dir = e;
  const std::string ckpt = checkpoint_path(ckpt_dir);
  if (t.resume && std::ifstream(ckpt).good()) {
    auto s = load_checkpoint(ckpt, ex);
    if (!s) return fail(s.error());
    state = *s;
    rng.set_state(state.rng_state);
    if (rank == 0) out << "resumed from " << ckpt << " at step " << state.step << "\n";
  }
  const int accum = ex.plan().comm.grad_accum;
  ex.set_loss_scale(1.0 / static_cast<double>(B * T * accum * world));
  if (rank == 0) {
    out << data.description << "\n";
    out << fmt(
        "model %s: %zu parameters, vocabulary %lld (ln(vocab) = %.4f); %d rank(s) x batch %lld x "
        "seq %lld x "
        "accum %d; arena %s\n",
        c.model.kind.c_str(), g.parameter_count(), static_cast<long long>(vocab),
        std::log(static_cast<double>(vocab)), world, static_cast<long long>(B),
        static_cast<long long>(T), accum, format_bytes(ex.plan().memory.arena_bytes).c_str());
    out.flush();
  }
  std::ofstream metrics;
  if (!t.metrics_file.empty() && rank == 0) metrics.open(t.metrics_file, std::ios::app);

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  WorkerHeartbeat heartbeat;
  heartbeat.beat(state.step);
  const std::int64_t n_tokens = static_cast<std::int64_t>(data.tokens.size());
  auto save = [&]() -> Status {
    state.rng_state = rng.state();
    Status s = ok_status();
    if (rank == 0) s = write_checkpoint(ckpt_dir, ex, state);
    if (auto b = comm->barrier(); !b && s) s = b;
    return s;
  };
  for (std::int64_t step = state.step + 1; step <= t.steps; ++step) {
    const auto s0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      if (state.data_position + stride + 1 > n_tokens) state.data_position = 0;  // next epoch
      const std::int64_t base = state.data_position + static_cast<std::int64_t>(rank) * B * T;
      std::int32_t* tok = ex.ints(g.tokens);
      std::int32_t* tgt = ex.ints(g.targets);
      for (std::int64_t i = 0; i < B * T; ++i) {
        tok[i] = data.tokens[static_cast<std::size_t>(base + i)];
        tgt[i] = data.tokens[static_cast<std::size_t>(base + i + 1)];
      }
      state.data_position += stride;
      if (auto s = ex.run_forward_backward(micro == accum - 1 ? comm.get() : nullptr); !s)
        return fail(s.error());
      loss += ex.mean_loss() / accum;
    }
    ex.run_optimizer(t.adamw.learning_rate > 0
                         ? AdamWSettings{learning_rate(t, step), t.adamw.beta1, t.adamw.beta2,
                                         t.adamw.epsilon, t.adamw.weight_decay, t.adamw.grad_clip}
                         : t.adamw,
                     step);
    state.step = step;
    heartbeat.beat(step);
    // One small all-reduce per step: the mean loss and whether any rank was asked to stop.
    double stats[2] = {loss / world, g_stop_signal ? 1.0 : 0.0};
    if (auto s = comm->all_reduce_sum(std::span<double>(stats, 2)); !s) return fail(s.error());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
    if (rank == 0) {
      if (step % t.log_every == 0 || step == 1 || step == t.steps)
        out << fmt("step %5lld/%lld | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s\n",
                   static_cast<long long>(step), static_cast<long long>(t.steps), stats[0],
                   learning_rate(t, step), ex.last_grad_norm(), ms,
                   static_cast<double>(stride * accum) / (ms / 1e3))
            << std::flush;
      if (metrics.is_open())
        metrics << fmt("{\"step\":%lld,\"loss\":%.17g,\"grad_norm\":%.17g,\"ms\":%.3f,\"tokens\":%"
                       "lld}\n",
                       static_cast<long long>(step), stats[0], ex.last_grad_norm(), ms,
                       static_cast<long long>(stride * accum))
                << std::flush;
    }
    if (stats[1] > 0) {
      if (auto s = save(); !s) return fail(s.error());
      const bool requeue = g_stop_signal != SIGTERM;
      if (rank == 0)
        out << "stopped by " << (requeue ? "SIGUSR1" : "SIGTERM") << " after step " << step
            << "; checkpoint " << ckpt << (requeue ? " (exit 75: requeue and resume)" : "") << "\n";
      return requeue ? kExitRequeue : kExitTerminated;
    }
    if (t.checkpoint_every > 0 && step % t.checkpoint_every == 0 && step != t.steps)
      if (auto s = save(); !s) return fail(s.error());
  }
  if (auto s = save(); !s) return fail(s.error());
  if (rank == 0) out << "done: " << state.step << " steps; checkpoint " << ckpt << "\n";
  return 0;
}

}  // namespace topolaunch::kernels
