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
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_backend.hpp"
#include "cuda_worker_parts.hpp"
#include "nccl_communicator.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/heartbeat.hpp"
#include "topolaunch/kernels/rng.hpp"
#include "topolaunch/kernels/worker.hpp"

namespace topolaunch::kernels::cuda {

namespace {

// A signal handler can only touch a lock-free flag; the one piece of process state (as worker.cpp).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_gpu_stop_signal(int sig) { g_stop_signal = sig; }

using Clock = std::chrono::steady_clock;

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
  options.time_calls = false;  // the worker's MeasuredCommunicator times the bucket all-reduces
  const wireup::Env env = wireup::current_environment();
  auto store = wireup::connect_from_env(env, options.timeout);
  if (!store)
    return make_error(
        "nccl: connecting to the wireup store (TOPOLAUNCH_STORE_ADDR): " + store.error().message,
        1);
  return NcclCommunicator::create(**store, options);
}

// The executor's communicator in the worker: forwards each bucket all-reduce to NCCL and brackets
// it with CUDA events (start and done on the communication stream, plus one on the compute stream
// where the bucket became ready), so that every logged step can say how many bytes it all-reduced,
// how long the all-reduces ran, and how much of that ran past the backward (exposed). Inside a
// CUDA Graph capture the records are external event nodes: each replay re-records them, so the
// captured calls' events time the latest replay. Calls made outside a capture (the executor's
// first, eager run of a range, or op-by-op mode) time their own step.
class MeasuredCommunicator final : public GpuCommunicator {
 public:
  explicit MeasuredCommunicator(NcclCommunicator& nccl) : nccl_(nccl) {}
  ~MeasuredCommunicator() override {
    for (auto* list : {&eager_, &captured_, &spare_, &retired_})
      for (auto& c : *list) destroy(c);
  }
  MeasuredCommunicator(const MeasuredCommunicator&) = delete;
  MeasuredCommunicator& operator=(const MeasuredCommunicator&) = delete;

  int rank() const override { return nccl_.rank(); }
  int world_size() const override { return nccl_.world_size(); }
  void set_compute_stream(cudaStream_t s) { compute_ = s; }

  cudaError_t all_reduce_sum(float* data, std::size_t count, cudaStream_t stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (auto e = cudaStreamIsCapturing(stream, &status); e != cudaSuccess) return e;
    const bool capturing = status == cudaStreamCaptureStatusActive;
    if (capturing && !captured_this_step_) {  // a new graph: its calls replace the old ones
      // (kept alive, not reused: the old graph still holds their record nodes)
      retired_.insert(retired_.end(), captured_.begin(), captured_.end());
      captured_.clear();
      captured_this_step_ = true;
    }
    Call call;
    if (!spare_.empty()) {
      call = spare_.back();
      spare_.pop_back();
    } else {
      for (cudaEvent_t* e : {&call.compute, &call.start, &call.done})
        if (auto rc = cudaEventCreate(e); rc != cudaSuccess) return rc;
    }
    call.bytes = count * sizeof(float);
    auto record = [&](cudaEvent_t e, cudaStream_t on) {
      return capturing ? cudaEventRecordWithFlags(e, on, cudaEventRecordExternal)
                       : cudaEventRecord(e, on);
    };
    (capturing ? captured_ : eager_).push_back(call);
    if (auto e = record(call.compute, compute_ != nullptr ? compute_ : stream); e != cudaSuccess)
      return e;
    if (auto e = record(call.start, stream); e != cudaSuccess) return e;
    if (auto e = nccl_.all_reduce_sum(data, count, stream); e != cudaSuccess) return e;
    return record(call.done, stream);
  }

  // Before each step's launches.
  void begin_step() {
    for (auto& c : eager_) spare_.push_back(c);
    eager_.clear();
    captured_this_step_ = false;
  }

  // The figures of the last step (its work must be complete, e.g. after a synchronisation).
  Result<CommStepFigures> last_step() const {
    const std::vector<Call>& calls = eager_.empty() ? captured_ : eager_;
    CommStepFigures f;
    for (const Call& c : calls) {
      float ms = 0;
      if (auto e = cudaEventElapsedTime(&ms, c.start, c.done); e != cudaSuccess)
        return make_error(std::string("timing a bucket all-reduce: ") + cudaGetErrorString(e), 1);
      ++f.calls;
      f.payload_bytes += c.bytes;
      f.busy_ms += ms;
    }
    if (!calls.empty()) {
      float ms = 0;
      if (auto e = cudaEventElapsedTime(&ms, calls.back().compute, calls.back().done);
          e != cudaSuccess)
        return make_error(std::string("timing exposed communication: ") + cudaGetErrorString(e), 1);
      f.exposed_ms = std::max(0.0f, ms);
    }
    return f;
  }

 private:
  struct Call {
    std::size_t bytes = 0;
    cudaEvent_t compute = nullptr, start = nullptr, done = nullptr;
  };
  static void destroy(Call& c) {
    for (cudaEvent_t e : {c.compute, c.start, c.done})
      if (e != nullptr) cudaEventDestroy(e);
  }
  NcclCommunicator& nccl_;
  cudaStream_t compute_ = nullptr;
  std::vector<Call> eager_, captured_, spare_, retired_;
  bool captured_this_step_ = false;
};

// Waits for `event` without hanging on a dead peer: polls it and NCCL's error state; past
// `timeout` aborts the communicator (its kernels return) and says what it waited for.
Status wait_for(cudaEvent_t event, NcclCommunicator* comm, std::chrono::milliseconds timeout,
                const std::string& what) {
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return comm != nullptr ? comm->check() : ok_status();
    if (e != cudaErrorNotReady) return make_error(what + ": " + cudaGetErrorString(e), 1);
    if (comm != nullptr) {
      if (auto s = comm->check(); !s) {
        comm->abort();
        return make_error(what + ": " + s.error().message, 1);
      }
    }
    if (Clock::now() - start >= timeout) {
      if (comm != nullptr) comm->abort();
      return make_error(what + ": not complete within " + std::to_string(timeout.count()) +
                            " ms (a peer rank died or stopped); communicator aborted",
                        1);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

std::string megabytes(double bytes) { return fmt("%.1f MB", bytes / 1e6); }

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
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  auto device_r = cuda_device_for_local_rank(
      env_int("TOPOLAUNCH_LOCAL_RANK", env_int("LOCAL_RANK", 0)), devices);
  if (!device_r) return fail("train.precision: \"bf16\": " + device_r.error().message, 1);
  const int device = *device_r;
  if (cudaSetDevice(device) != cudaSuccess)
    return fail("cudaSetDevice(" + std::to_string(device) + ") failed", 1);
  // Under the launcher every rank says where it runs (checked against the map by
  // tests/gpu/run_launcher_on_gpu_host.sh).
  if (world > 1 || std::getenv("TOPOLAUNCH_RANKMAP_FILE") != nullptr)
    out << binding_line(rank, device) << std::flush;

  // SIGUSR1 (preemption notice) and SIGTERM: finish the step, checkpoint, exit (as worker.cpp).
  // Installed before NCCL's wire-up so that an early signal is not fatal.
  struct sigaction sa {};
  sa.sa_handler = on_gpu_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  // Data parallel: the bucket all-reduces of the plan go through NCCL, wired up through the
  // launcher's store. Declared before the executor, which must not outlive them.
  std::unique_ptr<NcclCommunicator> comm;
  std::unique_ptr<MeasuredCommunicator> measured;
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
    measured = std::make_unique<MeasuredCommunicator>(*comm);
  }

  auto ex_r = CudaExecutor::create(plan, {}, measured.get());
  if (!ex_r) return fail(ex_r.error().message, ex_r.error().exit_code);
  CudaExecutor& ex = **ex_r;
  if (measured) measured->set_compute_stream(ex.stream());
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

  // Checkpoints: the CPU worker's file (checkpoint.hpp's backend-neutral view): the fp32 master
  // weights under the parameters' names, grad_norm, AdamW m and v; step, data position, RNG.
  // The RNG is the CPU loop's (seeded the same, not drawn from by either loop), kept so the two
  // workers' files say the same.
  NormalRng rng(t.seed);
  TrainingState state{0, 0, rng.state()};
  std::string ckpt_dir = t.checkpoint_dir;
  if (const char* e = std::getenv("TOPOLAUNCH_CHECKPOINT_DIR"); e && *e) ckpt_dir = e;
  const std::string ckpt = checkpoint_path(ckpt_dir);
  if (t.resume && std::ifstream(ckpt).good()) {
    auto s = load_checkpoint(ckpt, g, [&](const CheckpointEntry& e, std::span<const float> v) {
      return e.kind == CheckpointEntry::Kind::parameter ? ex.set_parameter(e.tensor, v)
                                                        : ex.set_values(e.tensor, v);
    });
    if (!s) return fail(s.error().message, s.error().exit_code);
    state = *s;
    rng.set_state(state.rng_state);
    if (rank == 0) out << "resumed from " << ckpt << " at step " << state.step << "\n";
  }
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

  // Small device buffers for the collective scalars: [0] the mean loss over ranks (logged steps),
  // [1..2] the stop flag of even/odd steps, [3] the checkpoint barrier.
  float* scalars_device = nullptr;
  float* flags_host = nullptr;  // pinned: [0..1] flag in, [2..3] flag out, [4] barrier
  if (comm && (cudaMalloc(&scalars_device, 4 * sizeof(float)) != cudaSuccess ||
               cudaMallocHost(&flags_host, 5 * sizeof(float)) != cudaSuccess))
    return fail("allocating the stop-flag buffers failed", 1);
  cudaEvent_t flag_done[2] = {nullptr, nullptr};
  if (comm)
    for (auto& e : flag_done)
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
        return fail("creating the stop-flag events failed", 1);
  struct FreeOnExit {
    float *device, *host;
    cudaEvent_t* events;
    ~FreeOnExit() {
      if (device) cudaFree(device);
      if (host) cudaFreeHost(host);
      for (int i = 0; i < 2; ++i)
        if (events[i]) cudaEventDestroy(events[i]);
    }
  } free_on_exit{scalars_device, flags_host, flag_done};
  const auto deadline = std::chrono::minutes(2);
  auto mean_over_ranks = [&](double local_loss) -> Result<double> {
    if (!comm) return local_loss;
    float v = static_cast<float>(local_loss);
    cudaStream_t s = ex.stream();
    if (cudaMemcpyAsync(scalars_device, &v, sizeof v, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        comm->all_reduce_sum(scalars_device, 1, s) != cudaSuccess ||
        cudaMemcpyAsync(&v, scalars_device, sizeof v, cudaMemcpyDeviceToHost, s) != cudaSuccess)
      return make_error("loss all-reduce: " + comm->last_error(), 1);
    if (auto st = comm->synchronize(s, deadline); !st) return st.error();
    return static_cast<double>(v) / world;
  };
  // Enqueues step `step`'s stop flag (this rank's signal) into a sum over ranks, read back one
  // step later so the host keeps running one step ahead; every rank reads the same sum after the
  // same step, so all stop at the same step.
  auto enqueue_stop_flag = [&](std::int64_t step) -> Status {
    const int slot = static_cast<int>(step & 1);
    flags_host[slot] = g_stop_signal != 0 ? 1.0f : 0.0f;
    cudaStream_t s = ex.stream();
    if (cudaMemcpyAsync(scalars_device + 1 + slot, flags_host + slot, sizeof(float),
                        cudaMemcpyHostToDevice, s) != cudaSuccess ||
        comm->all_reduce_sum(scalars_device + 1 + slot, 1, s) != cudaSuccess ||
        cudaMemcpyAsync(flags_host + 2 + slot, scalars_device + 1 + slot, sizeof(float),
                        cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaEventRecord(flag_done[slot], s) != cudaSuccess)
      return make_error("stop-flag all-reduce: " + comm->last_error(), 1);
    return ok_status();
  };
  auto stop_flag_of = [&](std::int64_t step) -> Result<bool> {
    const int slot = static_cast<int>(step & 1);
    if (auto s = wait_for(
            flag_done[slot], comm.get(), deadline,
            fmt("rank %d: step %lld's stop-flag all-reduce", rank, static_cast<long long>(step)));
        !s)
      return s.error();
    return flags_host[2 + slot] > 0.5f;
  };
  // Rank 0 writes the checkpoint between steps (the step's work synchronised, values copied out of
  // the arena; graph replay is untouched); then every rank waits at a barrier (an all-reduce of
  // rank 0's outcome, bounded by the deadline) so no rank exits before the file is complete.
  auto save = [&]() -> Status {
    state.rng_state = rng.state();
    if (comm) {
      if (auto s = comm->synchronize(ex.stream(), deadline); !s) return s;
    } else if (auto s = ex.synchronize(); !s) {
      return s;
    }
    Status written = ok_status();
    if (rank == 0)
      written = write_checkpoint(
          ckpt_dir, g,
          [&](const CheckpointEntry& e, std::span<float> values) -> Status {
            auto v = e.kind == CheckpointEntry::Kind::parameter ? ex.parameter(e.tensor)
                                                                : ex.values(e.tensor);
            if (!v) return v.error();
            if (v->size() != values.size())
              return make_error("checkpoint: " + e.name + " has " + std::to_string(v->size()) +
                                    " values on the device, the layout says " +
                                    std::to_string(values.size()),
                                1);
            std::copy(v->begin(), v->end(), values.begin());
            return ok_status();
          },
          state);
    if (!comm) return written;
    flags_host[4] = written ? 0.0f : 1.0f;
    cudaStream_t s = ex.stream();
    if (cudaMemcpyAsync(scalars_device + 3, flags_host + 4, sizeof(float), cudaMemcpyHostToDevice,
                        s) != cudaSuccess ||
        comm->all_reduce_sum(scalars_device + 3, 1, s) != cudaSuccess ||
        cudaMemcpyAsync(flags_host + 4, scalars_device + 3, sizeof(float), cudaMemcpyDeviceToHost,
                        s) != cudaSuccess)
      return make_error("checkpoint barrier: " + comm->last_error(), 1);
    if (auto st = comm->synchronize(s, deadline); !st) return st;
    if (!written) return written;
    if (flags_host[4] > 0.5f)
      return make_error(
          fmt("rank %d: rank 0 failed to write the checkpoint %s", rank, ckpt.c_str()), 1);
    return ok_status();
  };

  WorkerHeartbeat heartbeat;
  heartbeat.beat(state.step);
  const std::int64_t n_tokens = static_cast<std::int64_t>(data.tokens.size());
  std::vector<std::int32_t> x(static_cast<std::size_t>(local)), y(x.size());
  const std::int64_t first_step = state.step + 1;
  double tokens_timed = 0, seconds_timed = 0;  // steps after the first (capture, NCCL warm-up)
  // Logged figures are per step over the steps since the last logged one: an unlogged step only
  // enqueues (the host runs ahead), so its GPU time lands in the next step that synchronises.
  auto last_log = Clock::now();
  std::int64_t last_log_step = state.step;
  const CommBudget budget{c.budget.comm_bytes_per_step, c.budget.comm_exposed_ms_per_step,
                          CommModel{}.max_exposed_fraction};
  bool warned_bytes = false, warned_exposed = false;
  for (std::int64_t step = first_step; step <= t.steps; ++step) {
    const auto s0 = Clock::now();
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
    if (measured) measured->begin_step();
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      if (state.data_position + stride + 1 > n_tokens) state.data_position = 0;  // next epoch
      const std::int64_t base = state.data_position + static_cast<std::int64_t>(rank) * local;
      for (std::int64_t i = 0; i < local; ++i) {
        x[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(base + i)];
        y[static_cast<std::size_t>(i)] = data.tokens[static_cast<std::size_t>(base + i + 1)];
      }
      state.data_position += stride;
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
    state.step = step;
    heartbeat.beat(step);
    // Whether to stop after this step: one rank alone decides at once; several ranks decide on
    // the previous step's summed flag (every rank the same), see enqueue_stop_flag.
    bool stop = false;
    if (comm) {
      if (auto s = enqueue_stop_flag(step); !s) return fail(s.error().message, 1);
      if (step > first_step) {
        auto f = stop_flag_of(step - 1);
        if (!f) return fail(f.error().message, 1);
        stop = *f;
      }
    } else {
      stop = g_stop_signal != 0;
    }
    if (log) {
      auto mean = mean_over_ranks(loss);
      if (!mean) return fail("rank " + std::to_string(rank) + ": " + mean.error().message, 1);
      auto norm = ex.last_grad_norm();
      if (!norm) return fail(norm.error().message, 1);
      const auto now = Clock::now();
      if (step > first_step) {
        tokens_timed += static_cast<double>(stride * accum);
        seconds_timed += std::chrono::duration<double>(now - s0).count();
      }
      const double ms = std::chrono::duration<double, std::milli>(now - last_log).count() /
                        static_cast<double>(step - last_log_step);
      last_log = now;
      last_log_step = step;
      std::optional<CommStepFigures> cf;
      if (measured) {
        auto f = measured->last_step();
        if (!f) return fail(f.error().message, 1);
        cf = *f;
      }
      const bool printed = step % t.log_every == 0 || step == 1 || step == t.steps;
      if (rank == 0 && printed) {
        out << fmt("step %5lld/%lld | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s\n",
                   static_cast<long long>(step), static_cast<long long>(t.steps), *mean,
                   adamw.learning_rate, *norm, ms,
                   static_cast<double>(stride * accum) / (ms / 1e3));
        if (cf)
          out << fmt(
              "comm  %5lld/%lld | all-reduce %s in %zu buckets, %s sent per rank | %.2f ms "
              "| exposed %.2f ms | plan: %s sent, %.2f ms, exposed %.2f ms\n",
              static_cast<long long>(step), static_cast<long long>(t.steps),
              megabytes(static_cast<double>(cf->payload_bytes)).c_str(), cf->calls,
              megabytes(ring_bytes_sent(cf->payload_bytes, world)).c_str(), cf->busy_ms,
              cf->exposed_ms, megabytes(static_cast<double>(plan.comm.bytes_per_step)).c_str(),
              plan.comm.comm_ms, plan.comm.exposed_ms);
        out << std::flush;
      }
      // The budget is judged on steps after the first (NCCL connects and the graph is captured).
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
            static_cast<long long>(step), *mean, *norm, ms, static_cast<long long>(stride * accum));
        if (cf)
          metrics << fmt(
              ",\"comm_bytes\":%zu,\"comm_sent_bytes\":%.0f,\"comm_ms\":%.4f,"
              "\"comm_exposed_ms\":%.4f",
              cf->payload_bytes, ring_bytes_sent(cf->payload_bytes, world), cf->busy_ms,
              cf->exposed_ms);
        metrics << "}\n" << std::flush;
      }
    } else if (step > first_step) {  // unlogged steps are timed at their launch
      tokens_timed += static_cast<double>(stride * accum);
      seconds_timed += std::chrono::duration<double>(Clock::now() - s0).count();
    }
    if (stop) {
      if (auto s = save(); !s) return fail(s.error().message, s.error().exit_code);
      const bool requeue = g_stop_signal != SIGTERM;
      if (rank == 0)
        out << "stopped by " << (requeue ? "SIGUSR1" : "SIGTERM") << " after step " << step
            << "; checkpoint " << ckpt << (requeue ? " (exit 75: requeue and resume)" : "") << "\n";
      else
        out << "rank " << rank << " stopped after step " << step << " (rank 0 wrote " << ckpt
            << ")\n";
      out << std::flush;
      return requeue ? kExitRequeue : kExitTerminated;
    }
    if (t.checkpoint_every > 0 && step % t.checkpoint_every == 0 && step != t.steps)
      if (auto s = save(); !s) return fail(s.error().message, s.error().exit_code);
  }
  if (comm)
    if (auto s = comm->synchronize(ex.stream(), deadline); !s) return fail(s.error().message, 1);
  if (auto s = ex.synchronize(); !s) return fail(s.error().message, 1);
  if (auto s = save(); !s) return fail(s.error().message, s.error().exit_code);
  if (rank == 0) {
    if (seconds_timed > 0)
      out << fmt("throughput: %.0f tok/s over steps %lld..%lld (%d rank(s), all ranks' tokens)\n",
                 tokens_timed / seconds_timed, static_cast<long long>(first_step + 1),
                 static_cast<long long>(t.steps), world);
    out << "done: " << state.step << " steps on " << world << " GPU(s); checkpoint " << ckpt
        << "\n";
  }
  return 0;
}

}  // namespace topolaunch::kernels::cuda
