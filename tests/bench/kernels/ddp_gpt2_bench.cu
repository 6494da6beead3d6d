// Data-parallel GPT-2 124M on `--world` GPUs (default 2; 1 = the no-communication baseline of a
// scaling series) through our stack: the compiled plan on the CUDA executor
// (kernels/cuda/cuda_backend.hpp), gradient buckets all-reduced by NcclCommunicator on the
// executor's side stream while the backward continues, the whole step one CUDA graph. Started
// without --worker it is the launcher: our TCP store plus one process per GPU with the launcher's
// worker environment (tests/gpu/nccl_ranks.hpp). ddp_gpt2_torch.py is the peer (PyTorch DDP +
// torch.compile) in the same device run. Never a pass/fail on timing.
//
// Per rank: same init on every rank (as DDP's broadcast), own random tokens, loss scale 1/world
// (the summed gradients are the mean). Measured:
//   step_ms             wall time per step over `steps` back-to-back steps (one sync at the end)
//   step_ms_no_comm     the same steps without the all-reduces (forward+backward, optimizer)
//   exposed_comm_ms     step_ms - step_ms_no_comm: what communication adds to a step
//   comm_ms             sum of the bucket all-reduces' own times (the communicator's events,
//                       re-recorded on each graph replay), and comm_span_ms first start..last done
//   overlap             1 - max(0, exposed) / comm_ms
//
//   ddp_gpt2_bench [--world 2] [--batch 64] [--seq 1024] [--steps 20] [--bucket-mib 25]
//                  [--comm-priority normal|high] [--timeout-s 130] [--out FILE]
// --timeout-s bounds the ranks' wall time (they are killed past it); ranks use GPUs 0..world-1.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda_backend.hpp"
#include "nccl_communicator.hpp"
#include "nccl_ranks.hpp"
#include "topolaunch/kernels/plan.hpp"

namespace tk = topolaunch::kernels;
namespace gpu = topolaunch::kernels::cuda;
namespace t = topolaunch::testing;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int world = 2, timeout_s = 130;
  int batch = 64, seq = 1024, steps = 20, warmup = 5;
  std::size_t bucket_mib = 25;
  bool comm_high_priority =
      false;  // --comm-priority high: CudaExecutorOptions::comm_stream_high_priority
  std::string out = "/dev/stdout";
  bool worker = false;
};

template <class T>
T must(topolaunch::Result<T> r, const char* what) {
  if (!r) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, r.error().message.c_str());
    std::exit(100);
  }
  return std::move(*r);
}
void must(const topolaunch::Status& s, const char* what, gpu::NcclCommunicator* comm = nullptr) {
  if (!s) {
    std::fprintf(stderr, "FATAL %s: %s%s%s\n", what, s.error().message.c_str(),
                 comm != nullptr && !comm->last_error().empty() ? " | nccl: " : "",
                 comm != nullptr ? comm->last_error().c_str() : "");
    std::exit(100);
  }
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int worker(const Args& a) {
  gpu::NcclOptions options;
  options.name = "ddp";
  auto comm = must(gpu::nccl_communicator_from_env(options), "nccl communicator");
  const int world = comm->world_size(), rank = comm->rank();

  tk::GptConfig c;
  c.n_layer = 12;
  c.n_embd = 768;
  c.n_head = 12;
  c.block_size = 1024;
  c.vocab_size = 50257;
  c.batch = a.batch;
  c.seq_len = a.seq;
  const auto plan_start = Clock::now();
  tk::Graph g = tk::build_gpt2(c, tk::Precision::cuda_bf16());
  tk::append_backward(g);
  tk::append_optimizer(g);
  tk::PlanOptions po;
  po.comm.world_size = world;
  // The planner's model of this host (measured: ~300 GB/s algbw between the two H200s).
  po.comm.link_gbytes_per_s = 300;
  po.comm.latency_us = 20;
  po.comm.compute_gflops = 400000;
  po.comm.bucket_cap_bytes = a.bucket_mib << 20;
  po.comm.grad_accum = 1;
  tk::Plan plan = must(tk::compile_plan(std::move(g), po), "compile_plan");
  const double plan_s = seconds_since(plan_start);

  gpu::CudaExecutorOptions executor_options;
  executor_options.comm_stream_high_priority = a.comm_high_priority;
  auto ex =
      must(gpu::CudaExecutor::create(plan, executor_options, comm.get()), "CudaExecutor::create");
  must(ex->init_parameters(1337), "init_parameters");
  ex->set_loss_scale(1.0 / world);

  const std::size_t n = static_cast<std::size_t>(a.batch) * static_cast<std::size_t>(a.seq);
  std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(rank));
  std::vector<std::int32_t> tokens(n + 1);
  for (auto& tok : tokens) tok = static_cast<std::int32_t>(rng() % 50257);
  std::vector<std::int32_t> inputs(tokens.begin(), tokens.end() - 1),
      targets(tokens.begin() + 1, tokens.end());
  tk::AdamWSettings adamw;
  adamw.learning_rate = 3e-4;

  std::int64_t step = 0;
  auto train = [&](bool communicate) {
    must(ex->set_batch(inputs, targets), "set_batch");
    ++step;
    if (communicate) {
      must(ex->train_step(adamw, step), "train_step", comm.get());
    } else {
      must(ex->run_forward_backward(false), "forward+backward");
      must(ex->run_optimizer(adamw, step), "optimizer");
    }
  };

  // Warm-up: step 1 runs eagerly, step 2 captures the graph; the communicator's timing slots are
  // reset in between so that they hold the captured calls (re-recorded on every replay).
  train(true);
  must(ex->synchronize(), "synchronize", comm.get());
  const double loss_first = must(ex->mean_loss(), "loss");
  comm->clear_timings();
  for (int i = 1; i < a.warmup; ++i) train(true);
  must(ex->synchronize(), "synchronize", comm.get());

  // Per-step communication figures from one synchronised step at a time.
  std::vector<double> comm_ms, span_ms;
  std::size_t bytes_per_step = 0, calls_per_step = 0;
  for (int i = 0; i < 5; ++i) {
    train(true);
    must(ex->synchronize(), "synchronize", comm.get());
    auto timings = must(comm->timings(), "timings");
    double sum = 0;
    std::size_t bytes = 0;
    for (const auto& tm : timings) {
      sum += tm.ms;
      bytes += tm.bytes;
    }
    float span = 0;
    if (!timings.empty()) cudaEventElapsedTime(&span, timings.front().start, timings.back().done);
    comm_ms.push_back(sum);
    span_ms.push_back(span);
    bytes_per_step = bytes;
    calls_per_step = timings.size();
  }
  std::sort(comm_ms.begin(), comm_ms.end());
  std::sort(span_ms.begin(), span_ms.end());

  // Throughput with communication.
  auto t0 = Clock::now();
  for (int i = 0; i < a.steps; ++i) train(true);
  must(ex->synchronize(), "synchronize", comm.get());
  const double step_ms = seconds_since(t0) * 1e3 / a.steps;
  const double loss_last = must(ex->mean_loss(), "loss");

  // Data-parallel semantics: after the same summed gradients every rank must hold bit-identical
  // parameters. Each rank sums its fp32 master copies into one float checksum per parameter; the
  // all-reduce of the checksums equals world * own exactly only if all ranks agree.
  bool params_identical = true;
  double params_max_rel_diff = 0;  // largest |own checksum - mean| / |mean| over parameters
  {
    const std::size_t n_params = plan.graph.params.size();
    std::vector<float> checksum(n_params);
    for (std::size_t i = 0; i < n_params; ++i) {
      auto values = must(ex->parameter(plan.graph.params[i]), "parameter");
      double sum = 0;
      for (std::size_t j = 0; j < values.size(); ++j)
        sum += static_cast<double>(values[j]) * static_cast<double>(1 + j % 7);
      checksum[i] = static_cast<float>(sum);
    }
    float* d = nullptr;
    cudaStream_t s = nullptr;
    if (cudaMalloc(&d, n_params * sizeof(float)) != cudaSuccess ||
        cudaStreamCreate(&s) != cudaSuccess ||
        cudaMemcpy(d, checksum.data(), n_params * sizeof(float), cudaMemcpyHostToDevice) !=
            cudaSuccess) {
      std::fprintf(stderr, "FATAL checksum buffers\n");
      return 100;
    }
    comm->set_time_calls(false);
    if (comm->all_reduce_sum(d, n_params, s) != cudaSuccess) {
      std::fprintf(stderr, "FATAL %s\n", comm->last_error().c_str());
      return 100;
    }
    must(comm->synchronize(s, std::chrono::milliseconds(60000)), "checksum all-reduce");
    comm->set_time_calls(true);
    std::vector<float> total(n_params);
    cudaMemcpy(total.data(), d, n_params * sizeof(float), cudaMemcpyDeviceToHost);
    for (std::size_t i = 0; i < n_params; ++i) {
      params_identical = params_identical && total[i] == checksum[i] * static_cast<float>(world);
      const double mean = static_cast<double>(total[i]) / world;
      if (mean != 0)
        params_max_rel_diff =
            std::max(params_max_rel_diff,
                     std::fabs(static_cast<double>(checksum[i]) - mean) / std::fabs(mean));
    }
    cudaFree(d);
    cudaStreamDestroy(s);
  }

  // The same steps without the all-reduces (own warm-up: eager run + capture of those ranges).
  for (int i = 0; i < 3; ++i) train(false);
  must(ex->synchronize(), "synchronize", comm.get());
  t0 = Clock::now();
  for (int i = 0; i < a.steps; ++i) train(false);
  must(ex->synchronize(), "synchronize", comm.get());
  const double step_ms_no_comm = seconds_since(t0) * 1e3 / a.steps;

  const double comm_median = comm_ms[comm_ms.size() / 2];
  const double exposed = step_ms - step_ms_no_comm;
  const double overlap = comm_median > 0 ? 1.0 - std::max(0.0, exposed) / comm_median : 0.0;
  const gpu::DeviceMemory mem = ex->memory();
  const double tok_s = static_cast<double>(n) * world / (step_ms * 1e-3);
  std::fprintf(stderr,
               "rank %d: step %.2f ms (no comm %.2f), %.0f tok/s total, comm %.2f ms in %zu "
               "calls (span %.2f), exposed %.2f ms, loss %.4f -> %.4f, params identical: %s\n",
               rank, step_ms, step_ms_no_comm, tok_s, comm_median, calls_per_step,
               span_ms[span_ms.size() / 2], exposed, loss_first, loss_last,
               params_identical ? "yes" : "NO");
  if (rank == 0) {
    std::FILE* out = std::fopen(a.out.c_str(), "w");
    if (out == nullptr) return 100;
    std::fprintf(
        out,
        "{\"benchmark\": \"ddp_gpt2_124m\", \"system\": \"topolaunch CudaExecutor + "
        "NcclCommunicator\", \"nccl_version\": \"%s\", \"world_size\": %d, \"batch_per_gpu\": %d, "
        "\"seq_len\": %d, \"steps\": %d, \"plan_s\": %.2f, \"buckets\": %zu, "
        "\"bucket_cap_bytes\": %zu, \"all_reduce_calls_per_step\": %zu, \"bytes_per_step\": %zu, "
        "\"step_ms\": %.3f, \"tokens_per_s_total\": %.0f, \"tokens_per_s_per_gpu\": %.0f, "
        "\"step_ms_no_comm\": %.3f, \"exposed_comm_ms\": %.3f, \"comm_ms\": %.3f, "
        "\"comm_span_ms\": %.3f, \"overlap\": %.3f, \"planned_comm_ms\": %.3f, "
        "\"planned_exposed_ms\": %.3f, \"loss_first\": %.4f, \"loss_last\": %.4f, "
        "\"params_identical_across_ranks\": %s, \"params_max_rel_checksum_diff\": %.3e, "
        "\"arena_bytes\": %zu, "
        "\"device_used_bytes\": %zu, \"comm_stream_priority\": \"%s\"}\n",
        gpu::NcclCommunicator::nccl_version().c_str(), world, a.batch, a.seq, a.steps, plan_s,
        plan.comm.buckets.size(), plan.comm.bucket_cap_bytes, calls_per_step, bytes_per_step,
        step_ms, tok_s, tok_s / world, step_ms_no_comm, exposed, comm_median,
        span_ms[span_ms.size() / 2], overlap, plan.comm.comm_ms, plan.comm.exposed_ms, loss_first,
        loss_last, params_identical ? "true" : "false", params_max_rel_diff, mem.arena_bytes,
        mem.used_bytes, a.comm_high_priority ? "high" : "normal");
    std::fclose(out);
  }
  ex.reset();
  comm.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--worker")
      a.worker = true;
    else if (s == "--world")
      a.world = std::stoi(next());
    else if (s == "--timeout-s")
      a.timeout_s = std::stoi(next());
    else if (s == "--batch")
      a.batch = std::stoi(next());
    else if (s == "--seq")
      a.seq = std::stoi(next());
    else if (s == "--steps")
      a.steps = std::stoi(next());
    else if (s == "--bucket-mib")
      a.bucket_mib = std::stoull(next());
    else if (s == "--out")
      a.out = next();
    else if (s == "--comm-priority") {
      const std::string v = next();
      if (v != "high" && v != "normal") {
        std::fprintf(stderr, "ddp_gpt2_bench: --comm-priority takes high or normal, not '%s'\n",
                     v.c_str());
        return 2;
      }
      a.comm_high_priority = v == "high";
    } else {
      std::fprintf(stderr,
                   "usage: ddp_gpt2_bench [--world 2] [--batch 64] [--seq 1024] [--steps 20] "
                   "[--bucket-mib 25] [--comm-priority normal|high] [--timeout-s 130] "
                   "[--out FILE]\n");
      return 2;
    }
  }
  if (a.worker) return worker(a);

  const int world = a.world;
  int devices = 0;
  if (world < 1 || a.timeout_s < 1) {
    std::fprintf(stderr, "ddp_gpt2_bench: --world and --timeout-s must be at least 1\n");
    return 2;
  }
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < world) {
    std::fprintf(stderr, "ddp_gpt2_bench: --world %d needs %d GPUs, this process sees %d\n", world,
                 world, devices);
    return 3;
  }
  const std::string secret = t::random_secret();
  auto store = t::start_store(world, secret);
  const std::string tmp = "/tmp/ddp_gpt2_bench." + std::to_string(::getpid());
  std::vector<std::string> args{"--worker",
                                "--batch",
                                std::to_string(a.batch),
                                "--seq",
                                std::to_string(a.seq),
                                "--steps",
                                std::to_string(a.steps),
                                "--bucket-mib",
                                std::to_string(a.bucket_mib),
                                "--comm-priority",
                                a.comm_high_priority ? "high" : "normal",
                                "--out",
                                tmp + ".json"};
  std::vector<t::RankProcess> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(t::spawn_rank(t::self_path(), args, r, world, store->address(), secret,
                                  "ddp-gpt2-" + std::to_string(::getpid()), {},
                                  tmp + ".rank" + std::to_string(r) + ".log"));
  t::wait_ranks(ranks, Clock::now() + std::chrono::seconds(a.timeout_s));
  int failed = 0;
  for (const auto& p : ranks) {
    std::fprintf(stderr, "%s", t::read_file(p.log_path).c_str());
    if (p.timed_out || p.signal != 0 || p.exit_code != 0) {
      std::fprintf(stderr, "rank %d: %s (exit %d, signal %d)\n", p.rank,
                   p.timed_out ? "killed at --timeout-s" : "failed", p.exit_code, p.signal);
      ++failed;
    }
  }
  if (failed != 0) return 1;
  const std::string json = t::read_file(tmp + ".json");
  std::FILE* out = std::fopen(a.out.c_str(), "w");
  if (out == nullptr) return 1;
  std::fputs(json.c_str(), out);
  std::fclose(out);
  return 0;
}
