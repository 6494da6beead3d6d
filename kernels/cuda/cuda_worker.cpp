// See cuda_worker.hpp.
#include "cuda_worker.hpp"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "cuda_backend.hpp"
#include "nccl_communicator.hpp"
#include "topolaunch/kernels/heartbeat.hpp"
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

std::string env_text(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string(fallback);
}

// "0-3,8" from a bit per index (CPUs, NUMA nodes).
std::string index_list(const std::vector<bool>& bits) {
  std::string out;
  for (std::size_t i = 0; i < bits.size();) {
    if (!bits[i]) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j + 1 < bits.size() && bits[j + 1]) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(i);
    if (j > i) out += '-' + std::to_string(j);
    i = j + 1;
  }
  return out.empty() ? std::string("none") : out;
}

// Where this process really runs, read back from the kernel and the driver (not from the
// environment the launcher set), so that a job can check it against the rank map: the GPU's PCI
// bus id, the CPU affinity and the NUMA memory policy.
std::string binding_line(int rank, int device) {
  char busid[32] = "?";
  cudaDeviceGetPCIBusId(busid, sizeof busid, device);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<bool> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    cpus.resize(CPU_SETSIZE);
    for (int c = 0; c < CPU_SETSIZE; ++c) cpus[static_cast<std::size_t>(c)] = CPU_ISSET(c, &set);
  }
  // get_mempolicy(2) without libnuma: mode and node mask of this thread's default policy.
  int mode = -1;
  unsigned long mask[16] = {};
  std::vector<bool> nodes;
  if (::syscall(SYS_get_mempolicy, &mode, mask, sizeof(mask) * 8, nullptr, 0UL) == 0) {
    nodes.resize(sizeof(mask) * 8);
    for (std::size_t n = 0; n < nodes.size(); ++n) nodes[n] = (mask[n / 64] >> (n % 64)) & 1UL;
  }
  static const char* const kModes[] = {"default", "preferred", "bind", "interleave", "local"};
  const std::string policy = mode >= 0 && mode < 5 ? kModes[mode] : std::to_string(mode);
  return fmt(
      "rank %d binding: cuda device %d (%s, pci %s, CUDA_VISIBLE_DEVICES=%s) | cpus %s | numa "
      "%s (memory policy %s) | TOPOLAUNCH_CPUS=%s TOPOLAUNCH_NUMA=%s\n",
      rank, device, prop.name, busid, env_text("CUDA_VISIBLE_DEVICES", "unset").c_str(),
      index_list(cpus).c_str(), mode == 0 ? "any" : index_list(nodes).c_str(), policy.c_str(),
      env_text("TOPOLAUNCH_CPUS", "unset").c_str(), env_text("TOPOLAUNCH_NUMA", "unset").c_str());
}

// The data-parallel communicator of a worker the launcher started: the wireup store and run id of
// the environment (as nccl_communicator_from_env reads them), bound to `device`. The device is
// passed explicitly because the launcher gives each rank its own CUDA_VISIBLE_DEVICES: then the
// GPU is device 0 of the process whatever TOPOLAUNCH_LOCAL_RANK says.
Result<std::unique_ptr<NcclCommunicator>> communicator_for(int device) {
  NcclOptions options;
  options.run_id = env_text("TOPOLAUNCH_RUN_ID", "local");
  options.attempt = env_int("TOPOLAUNCH_ATTEMPT", 0);
  options.device = device;
  options.time_calls = false;  // per-call events are the benchmark's; the worker times steps
  const wireup::Env env = wireup::current_environment();
  auto store = wireup::connect_from_env(env, options.timeout);
  if (!store)
    return make_error(
        "nccl: connecting to the wireup store (TOPOLAUNCH_STORE_ADDR): " + store.error().message,
        1);
  return NcclCommunicator::create(**store, options);
}

}  // namespace

int train_on_gpu(const WorkerConfig& c, const Plan& plan, const Dataset& data, std::ostream& out,
                 std::ostream& err) {
  auto fail = [&](const std::string& message, int code) {
    err << "topolaunch-worker: " << message << "\n";
    return code;
  };
  const int world = std::max(1, env_int("TOPOLAUNCH_WORLD_SIZE", env_int("WORLD_SIZE", 1)));
  const int rank = world > 1 ? env_int("TOPOLAUNCH_RANK", env_int("RANK", 0)) : 0;
  if (rank < 0 || rank >= world)
    return fail("RANK=" + std::to_string(rank) + " is outside WORLD_SIZE=" + std::to_string(world) +
                    " (set both, or start the worker with topolaunch run)",
                2);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return fail(
        "train.precision: \"bf16\": no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver)", 1);
  const int device = env_int("LOCAL_RANK", 0) % devices;
  if (cudaSetDevice(device) != cudaSuccess)
    return fail("cudaSetDevice(" + std::to_string(device) + ") failed", 1);
  // Under the launcher every rank says where it runs (checked against the map by
  // tests/gpu/run_launcher_on_gpu_host.sh).
  if (world > 1 || std::getenv("TOPOLAUNCH_RANKMAP_FILE") != nullptr)
    out << binding_line(rank, device) << std::flush;

  // Data parallel: the bucket all-reduces of the plan go through NCCL, wired up through the
  // launcher's store. Declared before the executor, which must not outlive it.
  std::unique_ptr<NcclCommunicator> comm;
  if (world > 1) {
    auto comm_r = communicator_for(device);
    if (!comm_r)
      return fail("rank " + std::to_string(rank) + ": " + comm_r.error().message,
                  comm_r.error().exit_code);
    comm = std::move(*comm_r);
    if (comm->world_size() != world || comm->rank() != rank)
      return fail(fmt("the wireup store says rank %d of %d, the environment rank %d of %d",
                      comm->rank(), comm->world_size(), rank, world),
                  2);
  }

  auto ex_r = CudaExecutor::create(plan, {}, comm.get());
  if (!ex_r) return fail(ex_r.error().message, ex_r.error().exit_code);
  CudaExecutor& ex = **ex_r;
  const Graph& g = plan.graph;
  const TrainSpec& t = c.train;
  const std::int64_t B = t.batch, T = t.seq_len;
  // Tokens of one micro-step over all ranks; rank r reads the r-th B*T slice of each window, as
  // the CPU loop does (worker.cpp).
  const std::int64_t local = B * T, stride = static_cast<std::int64_t>(world) * local;
  if (static_cast<std::int64_t>(data.tokens.size()) < stride + 1)
    return fail(c.data.path + ": data.path: " + std::to_string(data.tokens.size()) +
                    " tokens are fewer than one step needs (" + std::to_string(stride + 1) +
                    " = ranks x batch x seq_len + 1)",
                2);
  if (auto s = ex.init_parameters(t.seed); !s) return fail(s.error().message, 1);
  const int accum = plan.comm.grad_accum;
  // The all-reduce sums the ranks' gradients: scale by the tokens of all ranks (a mean).
  ex.set_loss_scale(1.0 / static_cast<double>(stride * accum));
  if (rank == 0) {
    out << data.description << "\n";
    out << fmt("model %s: %zu parameters, vocabulary %lld; %d rank(s), GPU %d (CUDA backend, "
               "bf16, %s%s), batch %lld x seq %lld x accum %d per rank; arena %s\n",
               c.model.kind.c_str(), g.parameter_count(), static_cast<long long>(g.vocab), world,
               device, "whole step replayed as a CUDA Graph",
               world > 1 ? ("; NCCL " + NcclCommunicator::nccl_version() + ", " +
                            std::to_string(plan.comm.buckets.size()) + " gradient buckets")
                               .c_str()
                         : "",
               static_cast<long long>(B), static_cast<long long>(T), accum,
               format_bytes(plan.memory.arena_bytes).c_str())
        << std::flush;
  }
  std::ofstream metrics;
  if (!t.metrics_file.empty() && rank == 0) metrics.open(t.metrics_file, std::ios::app);

  // One float on the device for the mean loss over ranks (logged steps only).
  float* loss_device = nullptr;
  if (comm && cudaMalloc(&loss_device, sizeof(float)) != cudaSuccess)
    return fail("cudaMalloc of 4 bytes failed", 1);
  struct FreeOnExit {
    float* p;
    ~FreeOnExit() {
      if (p) cudaFree(p);
    }
  } free_loss{loss_device};
  auto mean_over_ranks = [&](double local_loss) -> Result<double> {
    if (!comm) return local_loss;
    float v = static_cast<float>(local_loss);
    cudaStream_t s = ex.stream();
    if (cudaMemcpyAsync(loss_device, &v, sizeof v, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        comm->all_reduce_sum(loss_device, 1, s) != cudaSuccess ||
        cudaMemcpyAsync(&v, loss_device, sizeof v, cudaMemcpyDeviceToHost, s) != cudaSuccess)
      return make_error("loss all-reduce: " + comm->last_error(), 1);
    if (auto st = comm->synchronize(s, std::chrono::minutes(2)); !st) return st.error();
    return static_cast<double>(v) / world;
  };

  WorkerHeartbeat heartbeat;
  heartbeat.beat(0);
  const std::int64_t n_tokens = static_cast<std::int64_t>(data.tokens.size());
  std::int64_t position = 0;
  std::vector<std::int32_t> x(static_cast<std::size_t>(local)), y(x.size());
  double tokens_timed = 0, seconds_timed = 0;  // steps after the first (capture, NCCL warm-up)
  // Logged figures are per step over the steps since the last logged one: an unlogged step only
  // enqueues (the host runs ahead), so its GPU time lands in the next step that synchronises.
  auto last_log = std::chrono::steady_clock::now();
  std::int64_t last_log_step = 0;
  for (std::int64_t step = 1; step <= t.steps; ++step) {
    const auto s0 = std::chrono::steady_clock::now();
    // The same steps on every rank (the loss all-reduce is collective).
    const bool log =
        step % t.log_every == 0 || step == 1 || step == t.steps || !t.metrics_file.empty();
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
      const std::int64_t base = position + static_cast<std::int64_t>(rank) * local;
      for (std::int64_t i = 0; i < local; ++i) {
        x[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(base + i)];
        y[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(base + i + 1)];
      }
      position += stride;
      if (auto s = ex.set_batch(x, y); !s) return fail(s.error().message, 1);
      Status s = accum == 1 ? ex.train_step(adamw, step)
                            : ex.run_forward_backward(comm != nullptr && micro == accum - 1);
      if (!s) return fail(s.error().message, 1);
      if (log || accum > 1) {
        auto l = ex.mean_loss();
        if (!l) return fail(l.error().message, 1);
        loss += *l / accum;
      }
    }
    if (accum > 1)
      if (auto s = ex.run_optimizer(adamw, step); !s) return fail(s.error().message, 1);
    heartbeat.beat(step);
    if (!log) {
      if (step > 1) {  // unlogged steps are timed at their launch; the next sync settles them
        tokens_timed += static_cast<double>(stride * accum);
        seconds_timed +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      }
      continue;
    }
    auto mean = mean_over_ranks(loss);
    if (!mean) return fail("rank " + std::to_string(rank) + ": " + mean.error().message, 1);
    auto norm = ex.last_grad_norm();
    if (!norm) return fail(norm.error().message, 1);
    const auto now = std::chrono::steady_clock::now();
    if (step > 1) {
      tokens_timed += static_cast<double>(stride * accum);
      seconds_timed += std::chrono::duration<double>(now - s0).count();
    }
    const double ms = std::chrono::duration<double, std::milli>(now - last_log).count() /
                      static_cast<double>(step - last_log_step);
    last_log = now;
    last_log_step = step;
    if (rank != 0) continue;
    if (step % t.log_every == 0 || step == 1 || step == t.steps)
      out << fmt("step %5lld/%lld | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s\n",
                 static_cast<long long>(step), static_cast<long long>(t.steps), *mean,
                 adamw.learning_rate, *norm, ms, static_cast<double>(stride * accum) / (ms / 1e3))
          << std::flush;
    if (metrics.is_open())
      metrics
          << fmt("{\"step\":%lld,\"loss\":%.17g,\"grad_norm\":%.17g,\"ms\":%.3f,\"tokens\":%lld}\n",
                 static_cast<long long>(step), *mean, *norm, ms,
                 static_cast<long long>(stride * accum))
          << std::flush;
  }
  if (auto s = ex.synchronize(); !s) return fail(s.error().message, 1);
  if (comm)
    if (auto s = comm->check(); !s) return fail(s.error().message, 1);
  if (rank == 0) {
    if (seconds_timed > 0)
      out << fmt("throughput: %.0f tok/s over steps 2..%lld (%d rank(s), all ranks' tokens)\n",
                 tokens_timed / seconds_timed, static_cast<long long>(t.steps), world);
    out << "done: " << t.steps << " steps on " << world
        << " GPU(s) (the CUDA backend writes no checkpoint yet)\n";
  }
  return 0;
}

}  // namespace topolaunch::kernels::cuda
