// The worker: job file -> data -> graph -> plan, then the one training loop over the executor of
// train.precision (executor.hpp): data-parallel micro-steps, AdamW with the learning-rate
// schedule, logging and metrics, checkpoints, and the SIGUSR1/SIGTERM "checkpoint at the step
// boundary and stop" that every rank obeys after the same step.
#include "topolaunch/kernels/worker.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <ostream>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/data.hpp"
#include "topolaunch/kernels/executor.hpp"
#include "topolaunch/kernels/interchange.hpp"
#include "topolaunch/kernels/rng.hpp"
#include "topolaunch/kernels/step_communication.hpp"
#include "topolaunch/kernels/step_observer.hpp"
#include "topolaunch/kernels/tokenizer.hpp"
#include "topolaunch/kernels/validation.hpp"

namespace topolaunch::kernels {

namespace {

// A signal handler can only touch a lock-free flag; this is the one piece of process state.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// SIGUSR1 (preemption notice) and SIGTERM: finish the step, checkpoint, exit 75 or 143. (A signal
// before this is fatal anyway, so the flag of an earlier run in this process is cleared.)
void install_stop_handler() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// The host link an optimizer-state offload is costed at when [train] host_link_gbytes_per_s is 0:
// the share of the GPU's PCIe capability (the rank map's TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S) that
// AdamW on mapped host memory reached on an H100 (47.7 of Gen5 x16's 63.0 GB/s each way,
// docs/gpu-runs.md); without the variable `unknown` (PlanOptions' 20, a Gen4 x16 link's
// practical rate).
constexpr double kHostLinkShareOfPcie = 0.75;

Result<double> default_host_link_gbytes_per_s(double unknown) {
  const char* name = jobspec::env::kGpuPcieGbytesPerS;
  const auto text = env_value(name);
  if (!text) return unknown;
  double v = 0;
  const char* end = text->data() + text->size();
  const auto [p, ec] = std::from_chars(text->data(), end, v);
  if (ec != std::errc() || p != end || !std::isfinite(v) || v <= 0)
    return make_error(std::string(name) + "=" + *text + ": not a positive number of GB/s");
  return kHostLinkShareOfPcie * v;
}

}  // namespace

using jobspec::ModelKind;
using jobspec::TrainPrecision;
using jobspec::TrainSpec;

GptConfig gpt_config(const jobspec::ModelSpec& m, const TrainSpec& t, std::int64_t vocab) {
  GptConfig g;
  g.n_layer = m.n_layer;
  g.n_embd = m.n_embd;
  g.n_head = m.n_head;
  g.block_size = m.block_size;
  g.vocab_size = vocab;
  g.padded_vocab = m.padded_vocab;
  g.batch = t.batch;
  g.seq_len = t.seq_len;
  return g;
}

LlamaConfig llama_config(const jobspec::ModelSpec& m, const TrainSpec& t, std::int64_t vocab) {
  LlamaConfig l;
  l.n_layer = m.n_layer;
  l.n_embd = m.n_embd;
  l.n_head = m.n_head;
  l.n_kv_head = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  l.ffn_hidden = m.ffn_hidden;
  l.rope_theta = m.rope_theta;
  l.vocab_size = vocab;
  l.padded_vocab = m.padded_vocab;
  l.batch = t.batch;
  l.seq_len = t.seq_len;
  return l;
}

MlpConfig mlp_config(const jobspec::ModelSpec& m, const TrainSpec& t, std::int64_t vocab) {
  MlpConfig c;
  c.vocab_size = vocab;
  c.n_embd = m.n_embd;
  c.hidden = m.hidden;
  c.batch = t.batch;
  c.seq_len = t.seq_len;
  return c;
}

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

AdamWSettings adamw_at_step(const TrainSpec& t, std::int64_t step) {
  const jobspec::AdamWSpec& a = t.adamw;
  return AdamWSettings{a.learning_rate > 0 ? scheduled_learning_rate(t, step) : a.learning_rate,
                       a.beta1,
                       a.beta2,
                       a.epsilon,
                       a.weight_decay,
                       a.grad_clip};
}

double exposed_budget_ms(const jobspec::BudgetSection& budget) {
  return std::chrono::duration<double, std::milli>(budget.comm_exposed_time_per_step).count();
}

namespace {

Result<Graph> build_training_graph(const jobspec::JobConfig& c, std::int64_t vocab) {
  const jobspec::ModelSpec& m = *c.model;
  if (m.padded_vocab != 0 && m.padded_vocab < vocab)
    return make_error(c.path + ": model.padded_vocab: " + std::to_string(m.padded_vocab) +
                      " is smaller than the vocabulary in use (" + std::to_string(vocab) + ")");
  Precision prec;
  // fp8 keeps the bf16 graph: only the executor's GEMMs change
  if (c.train.precision != TrainPrecision::fp32) prec = Precision::cuda_bf16();
  Graph g = m.kind == ModelKind::gpt2    ? build_gpt2(gpt_config(m, c.train, vocab), prec)
            : m.kind == ModelKind::llama ? build_llama(llama_config(m, c.train, vocab), prec)
                                         : build_mlp(mlp_config(m, c.train, vocab), prec);
  append_backward(g);
  append_optimizer(g);
  return g;
}

// "12.3 MB"
std::string megabytes(double bytes) { return fmt("%.1f MB", bytes / 1e6); }

int fail_with(const Error& e, std::ostream& err) {
  err << "topolaunch-worker: " << e.message << "\n";
  return e.exit_code;
}

// The training loop, from the parameters' initialisation (or the checkpoint's state) to the last
// step or a stop signal. Every rank makes the same executor calls in the same order.
int train(TrainingExecutor& ex, const jobspec::JobConfig& c, const Dataset& data,
          const Dataset& val, std::int32_t newline_token, std::int64_t vocab, std::ostream& out,
          std::ostream& err) {
  auto fail = [&](const Error& e) { return fail_with(e, err); };
  const TrainSpec& t = c.train;
  const int rank = ex.rank(), world = ex.world_size();
  const std::int64_t B = t.batch, T = t.seq_len;
  // Tokens of one micro-step over all ranks; rank r reads the r-th B*T slice of each window.
  const std::int64_t local = B * T, stride = static_cast<std::int64_t>(world) * local;
  if (static_cast<std::int64_t>(data.tokens.size()) < stride + 1)
    return fail(make_error(c.data.path + ": data.path: " + std::to_string(data.tokens.size()) +
                           " tokens are fewer than one step needs (" + std::to_string(stride + 1) +
                           " = ranks x batch x seq_len + 1)"));
  if (auto s = ex.init_parameters(t.seed); !s) return fail(s.error());

  // The RNG is seeded from train.seed and kept in the checkpoint (step, data position, RNG), so
  // that every backend's file says the same.
  NormalRng rng(t.seed);
  TrainingState state{0, 0, rng.state()};
  std::string ckpt_dir = t.checkpoint_dir;
  if (auto dir = env_value(jobspec::env::kCheckpointDir)) ckpt_dir = *dir;
  // Rank 0 writes the generations (checkpoint-<step>.bin; train.keep_checkpoints of them), by
  // default from a thread, so the step loop does not wait for the disk.
  CheckpointWriter checkpoints(ckpt_dir, t.keep_checkpoints, t.checkpoint_async);
  const bool gpt2 = c.model->kind == ModelKind::gpt2;
  // Beside the checkpoints: the model's shape and the tokenizer, so that sample and export need
  // nothing else.
  if (rank == 0 && gpt2)
    if (auto s = describe_checkpoint_dir(ckpt_dir, {gpt_config(*c.model, t, vocab), newline_token},
                                         c.data.tokenizer);
        !s)
      return fail(s.error());
  bool resumed_any = false;
  if (t.resume) {
    auto resumed = resume_from_newest(ckpt_dir, ex.plan().graph, ex.checkpoint_writer());
    if (!resumed) return fail(resumed.error());
    if (*resumed) {
      state = (*resumed)->state;
      rng.set_state(state.rng_state);
      resumed_any = true;
      if (rank == 0) {
        for (const auto& line : (*resumed)->skipped) out << line << "\n";
        out << "resumed from " << (*resumed)->path << " at step " << state.step << "\n";
      }
    }
  }
  if (!resumed_any && !t.init_from.empty()) {
    if (auto s = load_initial_weights(t.init_from, gpt_config(*c.model, t, vocab), ex.plan().graph,
                                      ex.checkpoint_writer());
        !s)
      return fail(s.error());
    if (rank == 0) out << "initialised from " << t.init_from << "/model.safetensors\n";
  }
  const int accum = ex.plan().comm.grad_accum;
  // The all-reduce sums the ranks' gradients: scale by the tokens of all ranks (a mean).
  ex.set_loss_scale(1.0 / static_cast<double>(stride * accum));  // (loss_scale below)
  if (rank == 0) {
    out << data.description << "\n";
    out << ex.banner(RunShape{std::string(to_string(c.model->kind)), vocab, B, T, accum})
        << std::flush;
  }
  std::ofstream metrics;
  if (!t.metrics_file.empty() && rank == 0) metrics.open(t.metrics_file, std::ios::app);
  // Under topolaunch run the validation losses also go to <job_dir>/validation.jsonl, where the
  // report reads them (with or without a metrics file).
  std::ofstream validations;
  if (auto dir = env_value(jobspec::env::kJobDir); dir && rank == 0 && t.val_every > 0)
    validations.open(*dir + "/validation.jsonl", std::ios::app);
  // Validation (train.val_every): at the start, every val_every steps and after the last step.
  std::int64_t val_windows = 0;
  if (t.val_every > 0) {
    auto w = validation_windows(val, c.data.val_path, t.val_batches, B, T, world);
    if (!w) return fail(w.error());
    val_windows = *w;
  }
  auto validate = [&](std::int64_t step) -> Status {
    if (val_windows == 0) return ok_status();
    auto l = validation_loss(ex, val, val_windows, B, T);
    if (!l) return l.error();
    if (rank == 0) {
      out << fmt("val   %5lld/%lld | val loss %.6f | %lld batches of %lld tokens\n",
                 static_cast<long long>(step), static_cast<long long>(t.steps), *l,
                 static_cast<long long>(val_windows), static_cast<long long>(stride))
          << std::flush;
      const std::string line =
          fmt("{\"step\":%lld,\"val_loss\":%.17g,\"val_tokens\":%lld}\n",
              static_cast<long long>(step), *l, static_cast<long long>(val_windows * stride));
      for (std::ofstream* file : {&metrics, &validations})
        if (file->is_open()) *file << line << std::flush;
    }
    return ok_status();
  };
  if (auto s = validate(state.step); !s) return fail(s.error());

  // Rank 0 takes the checkpoint between steps (the steps' work complete): `wait` (a stop, the
  // end) until it is on disk, else only the snapshot (the writer's thread writes it). Then every
  // rank waits at a barrier (a sum of rank 0's outcome) so that no rank exits before the file is
  // complete, and each knows whether it is.
  auto save = [&](bool wait) -> Status {
    state.rng_state = rng.state();
    if (auto s = ex.synchronize(); !s) return s;
    Status written = ok_status();
    if (ex.plan().comm.shard != ShardMode::none) {  // every rank writes its parts, synchronously
      auto path = write_checkpoint_parts(
          ckpt_dir, ex.plan().graph, checkpoint_parts(ex.plan().graph, ex.plan().comm),
          ex.checkpoint_part_reader(), state, t.keep_checkpoints, rank,
          [&](double v) -> Result<double> {
            double x[1] = {v};
            if (auto s = ex.sum_over_ranks(x, "checkpoint write"); !s) return s.error();
            return x[0];
          });
      if (!path) written = path.error();
    } else if (rank == 0) {
      written = checkpoints.submit(ex.plan().graph, ex.checkpoint_reader(), state);
      if (written && wait) written = checkpoints.flush();
    }
    double failed[1] = {written ? 0.0 : 1.0};
    if (auto s = ex.sum_over_ranks(failed, "checkpoint barrier"); !s) return written ? s : written;
    if (!written) return written;
    if (failed[0] > 0.5)
      return make_error(
          fmt("rank %d: rank 0 failed to write a checkpoint in %s", rank, ckpt_dir.c_str()),
          jobspec::exit_status::kPeerFailed);  // rank 0's own failure is the root cause
    return ok_status();
  };

  // [observe]: the step-time split, the traced steps' timeline, the figures the agent reads.
  StepObserver observe(c.observe, ex, out);
  if (auto s = observe.start(local * accum, ex.plan().step_flops * accum); !s)
    return fail(s.error());

  jobspec::HeartbeatWriter heartbeat;
  heartbeat.beat(static_cast<std::uint64_t>(state.step));
  const std::int64_t n_tokens = static_cast<std::int64_t>(data.tokens.size());
  std::vector<std::int32_t> x(static_cast<std::size_t>(local)), y(x.size());
  const std::int64_t first_step = state.step + 1;
  double tokens_timed = 0, seconds_timed = 0;  // steps after the first (a GPU's capture, warm-up)
  auto last_log = Clock::now();
  std::int64_t last_log_step = state.step;
  const CommBudget budget{c.budget.comm_bytes_per_step, exposed_budget_ms(c.budget),
                          CommModel{}.max_exposed_fraction};
  bool warned_bytes = false, warned_exposed = false;
  // Optimizer steps skipped for non-finite gradients (the executor counts them on its device):
  // read on logged steps, where the loop waits for the device anyway.
  std::int64_t skipped_seen = 0, skipped_seen_at = state.step;
  // Fault injection for tests of that path: TOPOLAUNCH_FAULT_NONFINITE_STEP=N makes step N's loss
  // scale nan, so its every gradient is nan.
  const auto poisoned_step = env_int("TOPOLAUNCH_FAULT_NONFINITE_STEP", 0, 1);
  if (!poisoned_step) return fail(poisoned_step.error());
  const double loss_scale = 1.0 / static_cast<double>(stride * accum);
  for (std::int64_t step = first_step; step <= t.steps; ++step) {
    const auto s0 = Clock::now();
    // The same steps on every rank (the loss sum is collective).
    const bool printed = step % t.log_every == 0 || step == 1 || step == t.steps;
    const bool logged = printed || !t.metrics_file.empty();
    const AdamWSettings adamw = adamw_at_step(t, step);
    observe.begin_step(step);
    ex.begin_step();
    if (*poisoned_step > 0 && (step == *poisoned_step || step == *poisoned_step + 1))
      ex.set_loss_scale(step == *poisoned_step ? std::nan("") : loss_scale);
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      auto data_input = observe.time(StepPart::data, "data: batch");
      if (state.data_position + stride + 1 > n_tokens) state.data_position = 0;  // next epoch
      const std::int64_t base = state.data_position + static_cast<std::int64_t>(rank) * local;
      for (std::int64_t i = 0; i < local; ++i) {
        x[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(base + i)];
        y[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(base + i + 1)];
      }
      state.data_position += stride;
      if (auto s = ex.load_batch(x, y); !s) return fail(s.error());
      data_input.stop();
      if (auto s = ex.run_micro_step(micro, accum, adamw, step); !s) return fail(s.error());
      // (reading the loss waits for a GPU: only for a logged step, or an accumulation's mean)
      if (logged || accum > 1) {
        auto timed = observe.time(StepPart::idle, "wait: loss");
        auto l = ex.mean_loss();
        if (!l) return fail(l.error());
        loss += *l / accum;
      }
    }
    if (auto s = ex.finish_step(adamw, step); !s) return fail(s.error());
    state.step = step;
    heartbeat.beat(static_cast<std::uint64_t>(step));
    auto waiting = observe.time(StepPart::idle, "wait: stop flag, loss, log");
    auto stop = ex.stop_after(step, g_stop_signal != 0);
    if (!stop) return fail(stop.error());
    double mean[1] = {0};
    if (logged) {
      mean[0] = loss / world;
      if (auto s = ex.sum_over_ranks(mean, "loss all-reduce"); !s)
        return fail(make_error("rank " + std::to_string(rank) + ": " + s.error().message,
                               s.error().exit_code));
      auto norm = ex.last_grad_norm();
      if (!norm) return fail(norm.error());
      auto skipped = ex.skipped_steps();
      if (!skipped) return fail(skipped.error());
      if (*skipped > skipped_seen) {
        const std::int64_t fresh = *skipped - skipped_seen;
        if (rank == 0)
          out << (fresh == 1 && skipped_seen_at == step - 1
                      ? fmt("warning: step %lld: gradients not finite (global norm %g): the "
                            "optimizer step is skipped (%lld skipped in all)\n",
                            static_cast<long long>(step), *norm, static_cast<long long>(*skipped))
                      : fmt("warning: steps %lld..%lld: %lld with gradients not finite: their "
                            "optimizer steps are skipped (%lld skipped in all)\n",
                            static_cast<long long>(skipped_seen_at + 1),
                            static_cast<long long>(step), static_cast<long long>(fresh),
                            static_cast<long long>(*skipped)))
              << std::flush;
        skipped_seen = *skipped;
        observe.set_skipped_steps(skipped_seen);
      }
      skipped_seen_at = step;
      const auto now = Clock::now();
      if (step > first_step) {
        tokens_timed += static_cast<double>(stride * accum);
        seconds_timed += std::chrono::duration<double>(now - s0).count();
      }
      // A host that runs ahead only enqueued the unlogged steps: their device time lands in this
      // step's synchronisation, so it is timed as the mean over the steps since the last logged
      // one.
      const double ms = ex.runs_ahead()
                            ? ms_between(last_log, now) / static_cast<double>(step - last_log_step)
                            : ms_between(s0, now);
      last_log = now;
      last_log_step = step;
      auto comm = ex.step_communication();
      if (!comm) return fail(comm.error());
      const std::optional<CommStepFigures>& cf = *comm;
      if (rank == 0 && printed) {
        out << fmt("step %5lld/%lld | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s\n",
                   static_cast<long long>(step), static_cast<long long>(t.steps), mean[0],
                   adamw.learning_rate, *norm, ms,
                   static_cast<double>(stride * accum) / (ms / 1e3));
        if (cf) {
          const CommPlan& plan = ex.plan().comm;
          out << fmt(
              "comm  %5lld/%lld | all-reduce %s in %zu buckets, %s sent per rank | %.2f ms "
              "| exposed %.2f ms | plan: %s sent, %.2f ms, exposed %.2f ms\n",
              static_cast<long long>(step), static_cast<long long>(t.steps),
              megabytes(static_cast<double>(cf->payload_bytes)).c_str(), cf->calls,
              megabytes(ring_bytes_sent(cf->payload_bytes, world)).c_str(), cf->busy_ms,
              cf->exposed_ms, megabytes(static_cast<double>(plan.bytes_per_step)).c_str(),
              plan.comm_ms, plan.exposed_ms);
        }
        out << std::flush;
      }
      // The budget is judged on steps after the first (a GPU's NCCL connects, its graph is
      // captured).
      if (rank == 0 && cf && step > first_step) {
        const auto over = check_comm_budget(*cf, world, accum, ms, budget);
        if (over.bytes_over && !warned_bytes) {
          out << "warning: step " << step << ": " << *over.bytes_over << "\n" << std::flush;
          warned_bytes = true;
        }
        if (over.exposed_over && !warned_exposed) {
          out << "warning: step " << step << ": " << *over.exposed_over << "\n" << std::flush;
          warned_exposed = true;
        }
      }
      if (metrics.is_open()) {
        metrics << fmt(
            "{\"step\":%lld,\"loss\":%.17g,\"grad_norm\":%.17g,\"ms\":%.3f,\"tokens\":%lld",
            static_cast<long long>(step), mean[0], *norm, ms,
            static_cast<long long>(stride * accum));
        if (cf)
          metrics << fmt(
              ",\"comm_bytes\":%zu,\"comm_sent_bytes\":%.0f,\"comm_ms\":%.4f,"
              "\"comm_exposed_ms\":%.4f",
              cf->payload_bytes, ring_bytes_sent(cf->payload_bytes, world), cf->busy_ms,
              cf->exposed_ms);
        metrics << "}\n" << std::flush;
      }
    } else if (step > first_step) {  // an unlogged step is timed at its end (its launch)
      tokens_timed += static_cast<double>(stride * accum);
      seconds_timed += std::chrono::duration<double>(Clock::now() - s0).count();
    }
    waiting.stop();
    if (*stop) {
      {
        auto timed = observe.time(StepPart::checkpoint, "checkpoint");
        if (auto s = save(true); !s) return fail(s.error());
      }
      if (auto s = observe.end_step(step, logged, mean[0], local * accum); !s)
        return fail(s.error());
      if (auto s = observe.finish(step); !s) return fail(s.error());
      const bool requeue = g_stop_signal != SIGTERM;
      const std::string ckpt = checkpoint_path(ckpt_dir, step);
      if (rank == 0)
        out << "stopped by " << (requeue ? "SIGUSR1" : "SIGTERM") << " after step " << step
            << "; checkpoint " << ckpt << (requeue ? " (exit 75: requeue and resume)" : "") << "\n";
      else
        out << "rank " << rank << " stopped after step " << step << " (rank 0 wrote " << ckpt
            << ")\n";
      out << std::flush;
      return requeue ? jobspec::exit_status::kRequeue : jobspec::exit_status::kTerminated;
    }
    if (t.val_every > 0 && (step % t.val_every == 0 || step == t.steps)) {
      auto timed = observe.time(StepPart::validation, "validation");
      if (auto s = validate(step); !s) return fail(s.error());
      // (a host that runs ahead waited for every step: the next logged step's mean starts here)
      last_log = Clock::now();
      last_log_step = step;
    }
    if (t.checkpoint_every > 0 && step % t.checkpoint_every == 0 && step != t.steps) {
      auto timed = observe.time(StepPart::checkpoint, "checkpoint");
      if (auto s = save(false); !s) return fail(s.error());
    }
    if (auto s = observe.end_step(step, logged, mean[0], local * accum); !s) return fail(s.error());
  }
  {
    auto timed = observe.time(StepPart::checkpoint, "checkpoint");
    if (auto s = ex.synchronize(); !s) return fail(s.error());
    if (auto s = save(true); !s) return fail(s.error());
  }
  if (auto s = observe.finish(state.step); !s) return fail(s.error());
  if (rank == 0) {
    if (seconds_timed > 0)
      out << fmt("throughput: %.0f tok/s over steps %lld..%lld (%d rank(s), all ranks' tokens)\n",
                 tokens_timed / seconds_timed, static_cast<long long>(first_step + 1),
                 static_cast<long long>(t.steps), world);
    out << "done: " << state.step << " steps" << ex.where_it_ran() << "; checkpoint "
        << checkpoint_path(ckpt_dir, state.step) << "\n";
    if (skipped_seen > 0)
      out << "skipped: " << skipped_seen
          << " optimizer step(s) with gradients not finite (parameters left as they were)\n";
  }
  return 0;
}

// data.tokenizer: a file that is there (it is copied beside the checkpoints); where this build has
// SentencePiece, a model whose vocabulary is the token files'.
Status check_tokenizer(const std::string& path, std::int64_t data_vocab,
                       const std::string& data_path, std::int32_t& newline_token,
                       std::ostream& err) {
  if (!have_sentencepiece()) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      return make_error("data.tokenizer: cannot open " + path +
                        " (check the path and permissions)");
    err << "topolaunch-worker: data.tokenizer " << path << " not read: " << without_sentencepiece()
        << "; training needs only the token files\n";
    return ok_status();
  }
  auto tokenizer = Tokenizer::load(path, "data.tokenizer");
  if (!tokenizer) return tokenizer.error();
  if (tokenizer->vocab_size() != data_vocab)
    return make_error("data.tokenizer: " + path + " has a vocabulary of " +
                      std::to_string(tokenizer->vocab_size()) + ", " + data_path + " one of " +
                      std::to_string(data_vocab) + " (not the tokenizer that encoded it)");
  newline_token = tokenizer->newline_id();
  return ok_status();
}

}  // namespace

int run_worker(const WorkerOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const Error& e) { return fail_with(e, err); };
  if (o.config_path.empty())
    return fail(make_error("no job file: pass job.toml or set TOPOLAUNCH_CONFIG"));
  auto cfg = jobspec::load_job_config(o.config_path, o.overrides);
  if (!cfg) return fail(cfg.error());
  const jobspec::JobConfig& c = *cfg;
  if (!c.model)
    return fail(make_error(c.path + ": model: missing table [model] (the worker needs a model)"));
  const jobspec::ModelSpec& model = *c.model;
  auto place_r = jobspec::worker_place(current_environment());
  if (!place_r) return fail(place_r.error());
  const jobspec::WorkerPlace place = *place_r;

  // Data first when it decides the vocabulary (character level); a plan of a model with an
  // explicit vocabulary needs no data.
  Dataset data;
  const bool need_data = !o.plan_only || !model.vocab_size;
  if (need_data) {
    if (c.data.path.empty())
      return fail(make_error(
          c.path + ": data.path: missing (a text file, a folder of text files or an llm.c .bin)"));
    auto d = load_dataset(c.data);
    if (!d) return fail(d.error());
    data = std::move(*d);
  }
  const std::int64_t vocab = model.vocab_size.value_or(data.vocab_size);
  if (need_data && data.vocab_size > vocab)
    return fail(make_error(c.path + ": model.vocab_size: " + std::to_string(vocab) +
                           " is smaller than the data's vocabulary (" +
                           std::to_string(data.vocab_size) + " in " + c.data.path +
                           "); raise it or remove the key"));
  // The held-out split and the tokenizer (data.val_path, data.tokenizer): checked before any
  // executor starts.
  Dataset val;
  std::int32_t newline_token = -1;
  if (!o.plan_only) {
    if (!c.data.val_path.empty() && c.train.val_every > 0) {
      auto v = load_token_file(c.data.val_path, "data.val_path");
      if (!v) return fail(v.error());
      if (v->vocab_size != data.vocab_size)
        return fail(make_error("data.val_path: " + c.data.val_path + ": a vocabulary of " +
                               std::to_string(v->vocab_size) + ", but data.path's is " +
                               std::to_string(data.vocab_size) + " (not the same tokenizer)"));
      val = std::move(*v);
    }
    if (!c.data.tokenizer.empty()) {
      auto s = check_tokenizer(c.data.tokenizer, data.vocab_size, c.data.path, newline_token, err);
      if (!s) return fail(s.error());
    }
  }

  const bool gpu = c.train.precision != TrainPrecision::fp32;
  PlanOptions po;
  po.memory_budget_bytes =
      gpu ? c.budget.gpu_memory_bytes_per_rank : c.budget.memory_bytes_per_rank;
  po.budget_key = gpu ? "budget.gpu_memory" : "budget.memory";
  po.comm.world_size = place.world_size;
  auto or_default = [](double v, double fallback) { return v > 0 ? v : fallback; };
  po.comm.link_gbytes_per_s = or_default(c.train.link_gbytes_per_s, gpu ? 300.0 : 2.0);
  po.comm.latency_us = or_default(c.train.collective_latency_us, gpu ? 45.0 : 50.0);
  po.comm.compute_gflops = or_default(c.train.compute_gflops, gpu ? kGpuComputeGflops : 10.0);
  po.comm.grad_accum = c.train.grad_accum;
  po.comm.max_exposed_ms = exposed_budget_ms(c.budget);
  po.comm.max_bytes_per_step = c.budget.comm_bytes_per_step;
  po.comm.rank = place.rank;
  po.shard_auto = c.train.shard == jobspec::ShardSetting::automatic;
  // On the CPU backend the optimizer state is in host memory already, and budget.memory counts it.
  if (!gpu && c.train.offload == jobspec::OffloadSetting::optimizer)
    return fail(make_error(c.path + ": train.offload: \"optimizer\" moves the optimizer state "
                                    "from GPU to host memory; train.precision \"fp32\" runs on "
                                    "the CPU backend, whose state is in host memory already "
                                    "(use \"none\" or \"auto\")"));
  if (!gpu) po.offload_key.clear();
  switch (gpu ? c.train.offload : jobspec::OffloadSetting::none) {
    case jobspec::OffloadSetting::none:
      po.offload = OffloadMode::none;
      break;
    case jobspec::OffloadSetting::optimizer:
      po.offload = OffloadMode::optimizer;
      break;
    case jobspec::OffloadSetting::automatic:
      po.offload = OffloadMode::automatic;
      break;
  }
  if (c.train.host_link_gbytes_per_s > 0) {
    po.host_link_gbytes_per_s = c.train.host_link_gbytes_per_s;
  } else if (gpu) {  // the CPU backend never offloads
    auto link = default_host_link_gbytes_per_s(po.host_link_gbytes_per_s);
    if (!link) return fail(link.error());
    po.host_link_gbytes_per_s = *link;
  }
  switch (c.train.shard) {
    case jobspec::ShardSetting::optimizer:
      po.shard = ShardMode::optimizer;
      break;
    case jobspec::ShardSetting::gradients:
      po.shard = ShardMode::gradients;
      break;
    case jobspec::ShardSetting::parameters:
      po.shard = ShardMode::parameters;
      break;
    case jobspec::ShardSetting::none:
    case jobspec::ShardSetting::automatic:
      po.shard = ShardMode::none;
      break;
  }

  const auto t0 = Clock::now();
  auto graph = build_training_graph(c, vocab);
  if (!graph) return fail(graph.error());
  auto plan = compile_plan(std::move(*graph), po);
  if (!plan) return fail(make_error(c.path + ": " + plan.error().message, plan.error().exit_code));
  const double plan_ms = ms_between(t0, Clock::now());
  if (o.plan_only) {
    out << format_plan(*plan, o.list_ops);
    out << fmt("planned in %.1f ms (%s, %s, world size %d)\n", plan_ms,
               std::string(to_string(model.kind)).c_str(),
               std::string(to_string(c.train.precision)).c_str(), place.world_size);
    return 0;
  }
  const ExecutorFactory make_executor = gpu ? o.bf16_executor : o.fp32_executor;
  if (make_executor == nullptr)
    return fail(make_error(c.path + ": train.precision: \"" +
                           std::string(to_string(c.train.precision)) +
                           "\" needs the CUDA backend, and this "
                           "topolaunch-worker was built without it (meson setup -Dcuda=enabled "
                           "on a host with nvcc); use \"fp32\" for the CPU backend, or "
                           "--plan-only to see the plan"));
  // Before the executor starts (a GPU's NCCL wire-up), so that an early signal is not fatal.
  install_stop_handler();
  auto ex = make_executor(ExecutorSetup{c, place, *plan, out});
  if (!ex) return fail(ex.error());
  return train(**ex, c, data, val, newline_token, vocab, out, err);
}

}  // namespace topolaunch::kernels
