// The CUDA backend as the training loop's executor (executor.hpp): the worker's bf16 plan run by
// cuda::CudaExecutor on one GPU (the whole step replayed as a CUDA Graph), its gradient buckets
// all-reduced through NCCL (wired up through the launcher's store) and measured with CUDA events.
// The host runs ahead of the device: the stop flag of the ranks is read one step late and the
// loss only on logged steps, so that no step waits for the previous one.
//
// Errors: 1 runtime failure (CUDA, NCCL, a peer rank that died or stopped past the 2-minute
// deadline), 2 bad input (the wireup store's rank against the environment's; a checkpoint of
// another model, torn or corrupt).

#include <cuda_runtime.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_backend.hpp"
#include "cuda_device.hpp"
#include "nccl_communicator.hpp"
#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/executor.hpp"

namespace topolaunch::kernels::cuda {

namespace {

using Clock = std::chrono::steady_clock;

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

namespace env_name = jobspec::env;

std::string env_text(const char* name, const char* fallback) {
  return env_value(name).value_or(fallback);
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
      rank, device, prop.name, busid, env_text(env_name::kCudaVisibleDevices, "unset").c_str(),
      index_list(cpus).c_str(), mode == 0 ? "any" : index_list(nodes).c_str(), policy.c_str(),
      env_text(env_name::kCpus, "unset").c_str(), env_text(env_name::kNuma, "unset").c_str());
}

// The data-parallel communicator of a worker the launcher started: the wireup store and run id of
// the environment (as nccl_communicator_from_env reads them), bound to `device`. The device is
// passed explicitly because the launcher gives each rank its own CUDA_VISIBLE_DEVICES: then the
// GPU is device 0 of the process whatever TOPOLAUNCH_LOCAL_RANK says.
Result<std::unique_ptr<NcclCommunicator>> communicator_for(int device) {
  const Environment env = current_environment();
  NcclOptions options;
  options.run_id = env_value(env, env_name::kRunId).value_or("local");
  auto attempt = env_int(env, env_name::kAttempt, 0);
  if (!attempt) return attempt.error();
  options.attempt = *attempt;
  options.device = device;
  options.time_calls = false;  // the worker's MeasuredCommunicator times the bucket all-reduces
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
    return measured(count * sizeof(float), stream,
                    [&] { return nccl_.all_reduce_sum(data, count, stream); });
  }
  cudaError_t reduce_scatter_sum(float* data, std::size_t count, cudaStream_t stream) override {
    return measured(count * sizeof(float), stream,
                    [&] { return nccl_.reduce_scatter_sum(data, count, stream); });
  }
  cudaError_t all_gather(__nv_bfloat16* data, const __nv_bfloat16* shard, std::size_t count,
                         cudaStream_t stream) override {
    return measured(count * sizeof(__nv_bfloat16), stream,
                    [&] { return nccl_.all_gather(data, shard, count, stream); });
  }

  // Before each step's launches.
  void begin_step() {
    for (auto& c : eager_) spare_.push_back(c);
    eager_.clear();
    captured_this_step_ = false;
  }

 private:
  // One collective of `bytes`, bracketed by the events of a Call.
  template <class Collective>
  cudaError_t measured(std::size_t bytes, cudaStream_t stream, Collective&& collective) {
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
    call.bytes = bytes;
    auto record = [&](cudaEvent_t e, cudaStream_t on) {
      return capturing ? cudaEventRecordWithFlags(e, on, cudaEventRecordExternal)
                       : cudaEventRecord(e, on);
    };
    (capturing ? captured_ : eager_).push_back(call);
    if (auto e = record(call.compute, compute_ != nullptr ? compute_ : stream); e != cudaSuccess)
      return e;
    if (auto e = record(call.start, stream); e != cudaSuccess) return e;
    if (auto e = collective(); e != cudaSuccess) return e;
    return record(call.done, stream);
  }

 public:
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

// How long a rank waits for the others' collectives before it gives up (a peer died or stopped).
constexpr auto kDeadline = std::chrono::minutes(2);

// A CUDA failure inside a step is a runtime failure (exit 1), whatever its error says.
Status runtime(Status s) {
  if (!s) return make_error(s.error().message, 1);
  return s;
}
template <class T>
Result<T> runtime(Result<T> r) {
  if (!r) return make_error(r.error().message, 1);
  return r;
}

class CudaTrainingExecutor final : public TrainingExecutor {
 public:
  static Result<std::unique_ptr<TrainingExecutor>> create(const ExecutorSetup& setup);
  ~CudaTrainingExecutor() override {
    if (scalars_device_ != nullptr) cudaFree(scalars_device_);
    if (scalars_host_ != nullptr) cudaFreeHost(scalars_host_);
    for (cudaEvent_t e : flag_done_)
      if (e != nullptr) cudaEventDestroy(e);
    for (auto& [begin, end] : step_events_) {
      cudaEventDestroy(begin);
      cudaEventDestroy(end);
    }
  }
  CudaTrainingExecutor(const CudaTrainingExecutor&) = delete;
  CudaTrainingExecutor& operator=(const CudaTrainingExecutor&) = delete;

  const Plan& plan() const override { return executor_->plan(); }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  std::string banner(const RunShape& s) const override {
    const Graph& g = plan().graph;
    return fmt(
        "model %s: %zu parameters, vocabulary %lld; %d rank(s), GPU %d (CUDA backend, "
        "%s, %s%s), batch %lld x seq %lld x accum %d per rank; arena %s%s\n",
        s.model_kind.c_str(), g.parameter_count(), static_cast<long long>(g.vocab), world_, device_,
        executor_->options().fp8
            ? fmt("fp8: %d GEMM ops in FP8 E4M3/E5M2 with delayed scaling, %d in bf16",
                  executor_->fp8_report().gemm_ops, executor_->fp8_report().bf16_ops)
                  .c_str()
            : "bf16",
        "whole step replayed as a CUDA Graph",
        world_ > 1 ? ("; NCCL " + NcclCommunicator::nccl_version() + ", " +
                      std::to_string(plan().comm.buckets.size()) + " gradient buckets")
                         .c_str()
                   : "",
        static_cast<long long>(s.batch), static_cast<long long>(s.seq_len), s.grad_accum,
        format_bytes(plan().memory.arena_bytes).c_str(),
        plan().memory.host_bytes == 0 ? ""
                                      : fmt(", optimizer state in host memory %s",
                                            format_bytes(plan().memory.host_bytes).c_str())
                                            .c_str());
  }
  std::string where_it_ran() const override {
    std::string s = " on " + std::to_string(world_) + " GPU(s)";
    if (!executor_->options().fp8) return s;
    // known after the first step: GEMMs cuBLASLt had no FP8 kernel for ran in bf16
    const Fp8Report r = executor_->fp8_report();
    s +=
        fmt(" (fp8: %d GEMM ops eligible, %d fell back to bf16; of their forward and dx GEMMs "
            "%d in FP8, %d faster in bf16 by measurement",
            r.gemm_ops, r.fallback_ops, r.fp8_gemms, r.bf16_by_measurement);
    if (!r.first_fallback.empty()) s += ", first: " + r.first_fallback;
    return s + ")";
  }

  Status init_parameters(std::uint64_t seed) override {
    return runtime(executor_->init_parameters(seed));
  }
  void set_loss_scale(double scale) override { executor_->set_loss_scale(scale); }

  Status load_batch(std::span<const std::int32_t> tokens,
                    std::span<const std::int32_t> targets) override {
    return runtime(executor_->set_batch(tokens, targets));
  }
  // One micro-step alone is the whole step (forward, backward, bucket all-reduces, optimizer) in
  // one graph replay; an accumulation all-reduces in its last micro-step's backward.
  Status run_micro_step(int micro, int accum, const AdamWSettings& adamw,
                        std::int64_t step) override {
    if (trace_ != nullptr) trace_step_ = step;
    return runtime(accum == 1
                       ? executor_->train_step(adamw, step)
                       : executor_->run_forward_backward(comm_ != nullptr && micro == accum - 1));
  }
  Status finish_step(const AdamWSettings& adamw, std::int64_t step) override {
    // (with one micro-step, train_step ran the optimizer)
    if (plan().comm.grad_accum != 1)
      if (auto s = runtime(executor_->run_optimizer(adamw, step)); !s) return s;
    if (step_events_open_ &&
        cudaEventRecord(step_events_[steps_pending_].second, executor_->stream()) == cudaSuccess)
      ++steps_pending_;
    step_events_open_ = false;
    return ok_status();
  }
  Result<double> mean_loss() override { return runtime(executor_->mean_loss()); }
  // The forward range alone (captured once as its own graph; the logits stay intact), then the
  // mean of its per-token losses (synchronises).
  Result<double> evaluate_loss(std::span<const std::int32_t> tokens,
                               std::span<const std::int32_t> targets) override {
    if (auto s = runtime(executor_->set_batch(tokens, targets)); !s) return s.error();
    if (auto s = runtime(executor_->run_forward()); !s) return s.error();
    return runtime(executor_->mean_loss());
  }
  Result<double> last_grad_norm() override { return runtime(executor_->last_grad_norm()); }
  Result<std::int64_t> skipped_steps() override { return runtime(executor_->skipped_steps()); }

  // Through small device buffers, as fp32 (NCCL's all-reduce of the communicator); waits for the
  // result within the deadline.
  Status sum_over_ranks(std::span<double> values, const std::string& what) override {
    if (!comm_) return ok_status();
    if (values.size() > kSummed)
      return make_error(what + ": " + std::to_string(values.size()) + " values, at most " +
                            std::to_string(kSummed) + " at once",
                        1);
    float* host = scalars_host_ + kHostSums;
    float* device = scalars_device_ + kDeviceSums;
    for (std::size_t i = 0; i < values.size(); ++i) host[i] = static_cast<float>(values[i]);
    const std::size_t bytes = values.size() * sizeof(float);
    cudaStream_t s = executor_->stream();
    if (cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s) != cudaSuccess ||
        comm_->all_reduce_sum(device, values.size(), s) != cudaSuccess ||
        cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s) != cudaSuccess)
      return make_error(what + ": " + comm_->last_error(), 1);
    if (auto st = comm_->synchronize(s, kDeadline); !st) return st;
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(host[i]);
    return ok_status();
  }
  // With NCCL, bounded by the deadline (a dead peer's all-reduce never completes).
  Status synchronize() override {
    if (comm_) return comm_->synchronize(executor_->stream(), kDeadline);
    return executor_->synchronize();
  }

  // The checkpoint file of the CPU backend (checkpoint.hpp's backend-neutral view): the fp32
  // master weights under the parameters' names, grad_norm, AdamW m and v; values copied out of
  // the arena between steps (graph replay is untouched).
  ReadCheckpointTensor checkpoint_reader() override {
    return [this](const CheckpointEntry& e, std::span<float> values) -> Status {
      auto v = e.kind == CheckpointEntry::Kind::parameter ? executor_->parameter(e.tensor)
                                                          : executor_->values(e.tensor);
      if (!v) return v.error();
      if (v->size() != values.size())
        return make_error("checkpoint: " + e.name + " has " + std::to_string(v->size()) +
                              " values on the device, the layout says " +
                              std::to_string(values.size()),
                          1);
      std::copy(v->begin(), v->end(), values.begin());
      return ok_status();
    };
  }
  WriteCheckpointTensor checkpoint_writer() override {
    if (plan().comm.shard != ShardMode::none) return sharded_writer();
    return [this](const CheckpointEntry& e, std::span<const float> v) {
      return e.kind == CheckpointEntry::Kind::parameter ? executor_->set_parameter(e.tensor, v)
                                                        : executor_->set_values(e.tensor, v);
    };
  }
  // A sharded plan's parts (checkpoint_parts): parameters from the fp32 master shards, .m and .v
  // from theirs.
  ReadCheckpointPart checkpoint_part_reader() override {
    auto layout = std::make_shared<std::vector<CheckpointEntry>>(checkpoint_layout(plan().graph));
    return [this, layout](const CheckpointPart& part, std::span<float> out) -> Status {
      if (part.source == CheckpointPart::Source::whole) {
        auto v = executor_->values((*layout)[part.entry].tensor);
        if (!v) return v.error();
        std::copy_n(v->begin() + static_cast<std::ptrdiff_t>(part.begin), part.count, out.begin());
        return ok_status();
      }
      return executor_->read_values(shard_of(part), part.shard_offset, out);
    };
  }

  // --- the GPU's hooks ---

  bool runs_ahead() const override { return true; }
  void begin_step() override {
    if (measured_) measured_->begin_step();
    // The step's span on the compute stream, for the step-time split (two events a step).
    if (steps_pending_ == step_events_.size()) {
      cudaEvent_t begin = nullptr, end = nullptr;
      if (cudaEventCreate(&begin) != cudaSuccess) return;
      if (cudaEventCreate(&end) != cudaSuccess) {
        cudaEventDestroy(begin);
        return;
      }
      step_events_.emplace_back(begin, end);
    }
    step_events_open_ =
        cudaEventRecord(step_events_[steps_pending_].first, executor_->stream()) == cudaSuccess;
  }
  // One rank alone decides at once. Several ranks enqueue this step's flag into a sum over ranks
  // and decide on the previous step's sum, read back now: the host keeps running one step ahead,
  // and every rank reads the same sum after the same step, so all stop after the same step.
  Result<bool> stop_after(std::int64_t step, bool signalled) override {
    if (!comm_) return signalled;
    const bool previous_enqueued = flag_enqueued_for_ == step - 1;
    if (auto s = enqueue_stop_flag(step, signalled); !s) return s.error();
    flag_enqueued_for_ = step;
    if (!previous_enqueued) return false;  // the first step of this process
    return stop_flag_of(step - 1);
  }
  Result<std::optional<CommStepFigures>> step_communication() override {
    if (!measured_) return std::optional<CommStepFigures>();
    auto f = measured_->last_step();
    if (!f) return make_error(f.error().message, 1);
    return std::optional<CommStepFigures>(*f);
  }

  // --- [observe] ---

  std::string backend_name() const override { return "cuda"; }
  void trace_ops(StepTrace* trace) override {
    trace_ = trace;
    trace_status_ = executor_->set_tracing(trace != nullptr);
  }
  // The traced step's ops and bucket all-reduces from their CUDA events, placed on the host's
  // wall clock at the moment the step is seen complete (the synchronisation's return: the device
  // time of the last event).
  Status finish_trace() override {
    if (trace_ == nullptr) return ok_status();
    if (!trace_status_) return runtime(trace_status_);
    auto times = executor_->traced_times();
    const double host_end_us = StepTrace::now_us();
    if (!times) return runtime(Status(times.error()));
    auto at_us = [&](double ms) { return host_end_us - (times->end_ms - ms) * 1e3; };
    const Graph& g = plan().graph;
    std::vector<int> fused_in(g.ops.size(), 0);
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      const auto e = executor_->execution_of(i);
      if (e.runs_in != CudaExecutor::kNotRun && e.runs_in != i) ++fused_in[e.runs_in];
    }
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      const auto [start, end] = times->ops[i];
      // an all-reduce op only enqueues on the compute stream: its bucket's span is below; an op
      // run inside another's launch (or skipped) is named on that launch's span
      if (start < 0 || g.ops[i].kind == OpKind::all_reduce ||
          executor_->execution_of(i).runs_in != i)
        continue;
      TraceSpan span;
      span.name = g.ops[i].name.empty() ? std::string(op_name(g.ops[i].kind)) : g.ops[i].name;
      if (fused_in[i] > 0) span.name += " (+" + std::to_string(fused_in[i]) + " fused)";
      span.category = std::string(phase_name(g.ops[i].phase));
      span.track = TraceTrack::compute;
      span.start_us = at_us(start);
      span.duration_us = (end - start) * 1e3;
      span.step = trace_step_;
      span.op = static_cast<int>(i);
      trace_->add(std::move(span));
    }
    for (std::size_t b = 0; b < times->buckets.size(); ++b) {
      const auto [start, end] = times->buckets[b];
      if (start < 0) continue;
      const Bucket& bucket = plan().comm.buckets[b];
      TraceSpan span;
      span.name = "all-reduce bucket " + std::to_string(b);
      span.category = "all-reduce";
      span.track = TraceTrack::communication;
      span.start_us = at_us(start);
      span.duration_us = (end - start) * 1e3;
      span.step = trace_step_;
      span.op = bucket.issue_after_op;
      span.bucket = static_cast<int>(b);
      span.bytes = bucket.bytes;
      trace_->add(std::move(span));
    }
    return ok_status();
  }
  // The steps' spans on the compute stream since the last call (their work is complete by now: a
  // logged step read its loss), less the exposed all-reduce time: the last step's, per step.
  Result<StepTimeSplit> step_time_split() override {
    StepTimeSplit split;
    double busy_ms = 0;
    for (std::size_t i = 0; i < steps_pending_; ++i) {
      auto& [begin, end] = step_events_[i];
      float ms = 0;
      if (cudaEventSynchronize(end) != cudaSuccess ||
          cudaEventElapsedTime(&ms, begin, end) != cudaSuccess)
        return make_error("timing a step on the compute stream failed", 1);
      busy_ms += ms;
    }
    const double steps = static_cast<double>(steps_pending_);
    steps_pending_ = 0;
    if (measured_ && steps > 0) {
      auto f = measured_->last_step();
      if (!f) return make_error(f.error().message, 1);
      split.comm_exposed_ms = f->exposed_ms * steps;
      split.comm_busy_ms = f->busy_ms * steps;
      split.comm_bytes = f->payload_bytes * static_cast<std::size_t>(steps);
      split.comm_calls = f->calls * static_cast<std::size_t>(steps);
    }
    split.compute_ms = std::max(0.0, busy_ms - split.comm_exposed_ms);
    return split;
  }
  AllocatedMemory allocated_memory() const override {
    const DeviceMemory m = executor_->memory();
    AllocatedMemory a;
    a.arena_bytes = m.arena_bytes;
    a.outside_arena_bytes = m.workspace_bytes + m.attention_workspace_bytes;
    a.device_used_bytes = m.used_bytes;
    a.device_total_bytes = m.total_bytes;
    a.device_name = device_name_;
    return a;
  }

 private:
  CudaTrainingExecutor(int rank, int world, int device)
      : rank_(rank), world_(world), device_(device) {}

  TensorId shard_of(const CheckpointPart& part) const {
    const Bucket& b = plan().comm.buckets[static_cast<std::size_t>(part.bucket)];
    return part.source == CheckpointPart::Source::parameter ? b.master_shard
           : part.source == CheckpointPart::Source::m       ? b.m_shard
                                                            : b.v_shard;
  }
  // Loading into a sharded plan: each parameter through set_parameter (this rank's part of the
  // master, the working copy as the plan holds it), .m and .v by this rank's parts, the rest
  // (grad_norm) whole.
  WriteCheckpointTensor sharded_writer() {
    auto parts =
        std::make_shared<std::vector<CheckpointPart>>(checkpoint_parts(plan().graph, plan().comm));
    auto layout = std::make_shared<std::vector<CheckpointEntry>>(checkpoint_layout(plan().graph));
    return [this, parts, layout](const CheckpointEntry& e, std::span<const float> v) -> Status {
      if (e.kind == CheckpointEntry::Kind::parameter) return executor_->set_parameter(e.tensor, v);
      if (executor_->device_pointer(e.tensor) != nullptr) return executor_->set_values(e.tensor, v);
      for (const auto& part : *parts)
        if ((*layout)[part.entry].tensor == e.tensor && part.bucket >= 0)
          if (auto s = executor_->write_values(shard_of(part), part.shard_offset,
                                               v.subspan(part.begin, part.count));
              !s)
            return s;
      return ok_status();
    };
  }

  Status enqueue_stop_flag(std::int64_t step, bool signalled) {
    const int slot = static_cast<int>(step & 1);
    scalars_host_[kHostFlagIn + slot] = signalled ? 1.0f : 0.0f;
    cudaStream_t s = executor_->stream();
    if (cudaMemcpyAsync(scalars_device_ + kDeviceFlags + slot, scalars_host_ + kHostFlagIn + slot,
                        sizeof(float), cudaMemcpyHostToDevice, s) != cudaSuccess ||
        comm_->all_reduce_sum(scalars_device_ + kDeviceFlags + slot, 1, s) != cudaSuccess ||
        cudaMemcpyAsync(scalars_host_ + kHostFlagOut + slot, scalars_device_ + kDeviceFlags + slot,
                        sizeof(float), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaEventRecord(flag_done_[slot], s) != cudaSuccess)
      return make_error("stop-flag all-reduce: " + comm_->last_error(), 1);
    return ok_status();
  }
  Result<bool> stop_flag_of(std::int64_t step) {
    const int slot = static_cast<int>(step & 1);
    if (auto s = wait_for(
            flag_done_[slot], comm_.get(), kDeadline,
            fmt("rank %d: step %lld's stop-flag all-reduce", rank_, static_cast<long long>(step)));
        !s)
      return make_error(s.error().message, 1);
    return scalars_host_[kHostFlagOut + slot] > 0.5f;
  }

  const int rank_, world_, device_;
  std::string device_name_;
  // [observe]: the traced step, and each step's begin and end events on the compute stream.
  StepTrace* trace_ = nullptr;
  Status trace_status_ = ok_status();
  std::int64_t trace_step_ = 0;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> step_events_;
  std::size_t steps_pending_ = 0;
  bool step_events_open_ = false;
  // Declared before the executor, which must not outlive them.
  std::unique_ptr<NcclCommunicator> comm_;
  std::unique_ptr<MeasuredCommunicator> measured_;
  std::unique_ptr<CudaExecutor> executor_;
  // The collective scalars (world > 1): on the device [0..1] the stop flag of even/odd steps,
  // [2..) the values of sum_over_ranks; pinned on the host [0..1] the flags in, [2..3] the flags
  // out, [4..) the sums.
  static constexpr std::size_t kSummed = 4;
  static constexpr std::size_t kDeviceFlags = 0, kDeviceSums = 2;
  static constexpr std::size_t kHostFlagIn = 0, kHostFlagOut = 2, kHostSums = 4;
  float* scalars_device_ = nullptr;
  float* scalars_host_ = nullptr;
  cudaEvent_t flag_done_[2] = {nullptr, nullptr};
  std::int64_t flag_enqueued_for_ = -1;  // the step whose stop flag was enqueued last
};

Result<std::unique_ptr<TrainingExecutor>> CudaTrainingExecutor::create(const ExecutorSetup& setup) {
  const int world = setup.place.world_size, rank = setup.place.rank;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  auto device_r = cuda_device_for_local_rank(setup.place.local_rank, devices);
  const bool fp8 = setup.config.train.precision == jobspec::TrainPrecision::fp8;
  if (!device_r)
    return make_error(std::string("train.precision: \"") + (fp8 ? "fp8" : "bf16") +
                          "\": " + device_r.error().message,
                      1);
  const int device = *device_r;
  if (cudaSetDevice(device) != cudaSuccess)
    return make_error("cudaSetDevice(" + std::to_string(device) + ") failed", 1);
  // Under the launcher every rank says where it runs (checked against the map by
  // tests/gpu/run_launcher_on_gpu_host.sh).
  if (world > 1 || env_value(env_name::kRankmapFile))
    setup.out << binding_line(rank, device) << std::flush;

  std::unique_ptr<CudaTrainingExecutor> self(new CudaTrainingExecutor(rank, world, device));
  {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) self->device_name_ = prop.name;
  }
  // Data parallel: the bucket all-reduces of the plan go through NCCL, wired up through the
  // launcher's store.
  if (world > 1) {
    auto comm_r = communicator_for(device);
    if (!comm_r)
      return make_error("rank " + std::to_string(rank) + ": " + comm_r.error().message,
                        comm_r.error().exit_code);
    self->comm_ = std::move(*comm_r);
    if (self->comm_->world_size() != world || self->comm_->rank() != rank)
      return make_error(fmt("the wireup store says rank %d of %d, the environment rank %d of %d",
                            self->comm_->rank(), self->comm_->world_size(), rank, world),
                        2);
    self->measured_ = std::make_unique<MeasuredCommunicator>(*self->comm_);
  }
  CudaExecutorOptions options;
  options.fp8 = fp8;
  auto ex_r = CudaExecutor::create(setup.plan, options, self->measured_.get());
  if (!ex_r) return ex_r.error();
  self->executor_ = std::move(*ex_r);
  if (self->measured_) self->measured_->set_compute_stream(self->executor_->stream());
  if (self->comm_) {
    if (cudaMalloc(&self->scalars_device_, (kDeviceSums + kSummed) * sizeof(float)) !=
            cudaSuccess ||
        cudaMallocHost(&self->scalars_host_, (kHostSums + kSummed) * sizeof(float)) != cudaSuccess)
      return make_error("allocating the stop-flag buffers failed", 1);
    for (auto& e : self->flag_done_)
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
        return make_error("creating the stop-flag events failed", 1);
  }
  return std::unique_ptr<TrainingExecutor>(std::move(self));
}

}  // namespace

}  // namespace topolaunch::kernels::cuda

namespace topolaunch::kernels {

ExecutorFactory linked_cuda_executor() { return &cuda::CudaTrainingExecutor::create; }

}  // namespace topolaunch::kernels
