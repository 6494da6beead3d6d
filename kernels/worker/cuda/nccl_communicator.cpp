// NcclCommunicator: unique-id exchange through the wireup store, non-blocking NCCL init with a
// deadline, all-reduce on the caller's stream with per-call CUDA event timing. See the header.
#include "nccl_communicator.hpp"

#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <span>
#include <thread>

namespace topolaunch::kernels::cuda {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

ncclComm_t as_comm(void* comm) { return static_cast<ncclComm_t>(comm); }

std::string nccl_reason(ncclResult_t rc, ncclComm_t comm) {
  std::string reason = ncclGetErrorString(rc);
  // ncclGetLastError carries the detail (which peer, which transport) when NCCL has one.
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') reason += " (" + std::string(detail) + ")";
  if (rc == ncclUnhandledCudaError) {
    reason += " [cuda: " + std::string(cudaGetErrorString(cudaGetLastError())) + "]";
  }
  return reason;
}

// Polls NCCL's state of a non-blocking communicator until it leaves ncclInProgress or the deadline
// passes (then returns ncclInProgress).
ncclResult_t wait_in_progress(ncclComm_t comm, Clock::time_point deadline) {
  ncclResult_t state = ncclInProgress;
  auto pause = std::chrono::microseconds(20);
  for (int polls = 0;; ++polls) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress || Clock::now() >= deadline) return state;
    // A collective handed to NCCL's thread (first use of a channel) is usually done within
    // microseconds: yield first, sleep (up to 2 ms) only for what takes longer (init).
    if (polls < 1000) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(2));
  }
}

std::string store_key(const NcclOptions& options) {
  return "nccl/" + options.run_id + "/" + std::to_string(options.attempt) + "/" + options.name +
         "/unique-id";
}

}  // namespace

std::string NcclCommunicator::nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // Since 2.9 the code is major*10000 + minor*100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

std::string NcclCommunicator::where() const {
  return "nccl rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + " (" +
         (device_ >= 0 ? "device " + std::to_string(device_) + ", " : std::string()) +
         "communicator '" + options_.name + "')";
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(wireup::KvStore& store,
                                                                   const NcclOptions& options) {
  std::unique_ptr<NcclCommunicator> self(new NcclCommunicator());
  self->options_ = options;
  self->rank_ = store.rank();
  self->world_size_ = store.size();
  self->device_ = options.device;  // the current device is read once bound, below
  if (self->world_size_ < 1 || self->rank_ < 0 || self->rank_ >= self->world_size_)
    return make_error("nccl: the wireup store reports rank " + std::to_string(self->rank_) +
                          " of " + std::to_string(self->world_size_) + " (not a valid rank)",
                      1);
  // NVLink SHARP (multicast) stays off unless the job asks for it explicitly: on shared hosts a
  // program that uses it can take every GPU of the host out of service.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  // The unique id: made by rank 0, published before the fence, read after it.
  const std::string key = store_key(options);
  ncclUniqueId id{};
  if (self->rank_ == 0) {
    if (auto rc = ncclGetUniqueId(&id); rc != ncclSuccess)
      return make_error(self->where() + ": ncclGetUniqueId failed: " + nccl_reason(rc, nullptr) +
                            " (NCCL_SOCKET_IFNAME names the interface NCCL's bootstrap listens on)",
                        1);
    auto bytes = std::as_bytes(std::span(id.internal, sizeof id.internal));
    if (auto s = store.put(key, bytes); !s)
      return make_error(self->where() + ": publishing '" + key + "': " + s.error().message, 1);
    if (auto s = store.commit(); !s)
      return make_error(self->where() + ": publishing '" + key + "': " + s.error().message, 1);
  }
  if (auto s = store.fence(options.timeout); !s)
    return make_error(
        self->where() + ": waiting for the other ranks before nccl init: " + s.error().message, 1);
  if (self->rank_ != 0) {
    auto value = store.get(key, options.timeout);
    if (!value)
      return make_error(self->where() + ": reading '" + key + "': " + value.error().message, 1);
    if (value->size() != sizeof id.internal)
      return make_error(self->where() + ": '" + key + "' holds " + std::to_string(value->size()) +
                            " bytes, not an ncclUniqueId of " + std::to_string(sizeof id.internal) +
                            " (another program wrote that key?)",
                        1);
    std::memcpy(id.internal, value->data(), sizeof id.internal);
  }

  // The device is bound only now: the exchange above needs none (a host without GPUs reaches
  // the store errors too).
  if (options.device >= 0) {
    if (auto e = cudaSetDevice(options.device); e != cudaSuccess)
      return make_error(self->where() + ": cudaSetDevice(" + std::to_string(options.device) +
                            "): " + cudaGetErrorString(e) +
                            " (check TOPOLAUNCH_LOCAL_RANK against the GPUs this process sees)",
                        1);
  }
  if (auto e = cudaGetDevice(&self->device_); e != cudaSuccess)
    return make_error(self->where() + ": no CUDA device: " + cudaGetErrorString(e), 1);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that init (and abort) run against our deadline
  config.commName = self->options_.name.c_str();
  if (options.max_ctas > 0) config.maxCTAs = options.max_ctas;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, self->world_size_, id, self->rank_, &config);
  if (rc == ncclInProgress && comm != nullptr)
    rc = wait_in_progress(comm, Clock::now() + options.timeout);
  self->comm_ = comm;
  if (rc == ncclInProgress) {
    self->abort();
    return make_error(self->where() + ": ncclCommInitRank did not complete within " +
                          std::to_string(options.timeout.count()) +
                          " ms (a peer passed the id exchange but never reached nccl init, or "
                          "cannot reach this host: check NCCL_SOCKET_IFNAME and NCCL_DEBUG=INFO)",
                      1);
  }
  if (rc != ncclSuccess) {
    std::string reason = nccl_reason(rc, comm);
    if (comm != nullptr) self->abort();
    return make_error(self->where() + ": ncclCommInitRank failed: " + reason, 1);
  }
  return self;
}

NcclCommunicator::~NcclCommunicator() {
  for (auto& pair : events_) {
    if (pair.start) cudaEventDestroy(pair.start);
    if (pair.done) cudaEventDestroy(pair.done);
  }
  if (comm_ == nullptr) return;
  ncclComm_t comm = as_comm(comm_);
  ncclResult_t state = ncclSuccess;
  if (!aborted_ && !failed_ && ncclCommGetAsyncError(comm, &state) == ncclSuccess &&
      state == ncclSuccess) {
    // Finalize flushes what was enqueued; past the deadline (a peer gone) abort instead.
    ncclResult_t rc = ncclCommFinalize(comm);
    if (rc == ncclInProgress) rc = wait_in_progress(comm, Clock::now() + options_.timeout);
    if (rc == ncclSuccess) {
      ncclCommDestroy(comm);
      return;
    }
  }
  ncclCommAbort(comm);
}

void NcclCommunicator::abort() {
  if (comm_ != nullptr && !aborted_) {
    ncclComm_t comm = as_comm(comm_);
    ncclCommAbort(comm);
    comm_ = nullptr;
  }
  aborted_ = true;
}

cudaError_t NcclCommunicator::fail(std::string message, cudaError_t code) {
  last_error_ = std::move(message);
  failed_ = true;
  return code;
}

cudaError_t NcclCommunicator::all_reduce_sum(float* data, std::size_t count, cudaStream_t stream) {
  return enqueue(Collective::all_reduce, data, nullptr, count, ncclFloat32, sizeof(float), stream);
}

cudaError_t NcclCommunicator::all_reduce_sum(__nv_bfloat16* data, std::size_t count,
                                             cudaStream_t stream) {
  return enqueue(Collective::all_reduce, data, nullptr, count, ncclBfloat16, sizeof(__nv_bfloat16),
                 stream);
}

cudaError_t NcclCommunicator::reduce_scatter_sum(float* data, std::size_t count,
                                                 cudaStream_t stream) {
  return enqueue(Collective::reduce_scatter, data, nullptr, count, ncclFloat32, sizeof(float),
                 stream);
}

cudaError_t NcclCommunicator::all_gather(__nv_bfloat16* data, const __nv_bfloat16* shard,
                                         std::size_t count, cudaStream_t stream) {
  return enqueue(Collective::all_gather, data, shard, count, ncclBfloat16, sizeof(__nv_bfloat16),
                 stream);
}

cudaError_t NcclCommunicator::enqueue(Collective what, void* data, const void* shard,
                                      std::size_t count, int nccl_type, std::size_t element_bytes,
                                      cudaStream_t stream) {
  const char* name = what == Collective::all_reduce       ? "ncclAllReduce"
                     : what == Collective::reduce_scatter ? "ncclReduceScatter"
                                                          : "ncclAllGather";
  if (aborted_ || comm_ == nullptr)
    return fail(where() + ": " + name + " on an aborted communicator", cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  if (what != Collective::all_reduce && count % static_cast<std::size_t>(world_size_) != 0)
    return fail(where() + ": " + name + " of " + std::to_string(count) +
                    " elements, not a multiple of the " + std::to_string(world_size_) + " ranks",
                cudaErrorInvalidValue);
  const std::size_t bytes = count * element_bytes;

  EventPair* pair = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (options_.time_calls) {
    if (timed_bytes_.size() == events_.size()) {
      EventPair fresh;
      if (auto e = cudaEventCreate(&fresh.start); e != cudaSuccess)
        return fail(where() + ": cudaEventCreate: " + cudaGetErrorString(e), e);
      if (auto e = cudaEventCreate(&fresh.done); e != cudaSuccess) {
        cudaEventDestroy(fresh.start);
        return fail(where() + ": cudaEventCreate: " + cudaGetErrorString(e), e);
      }
      events_.push_back(fresh);
    }
    pair = &events_[timed_bytes_.size()];
    if (auto e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
      return fail(where() + ": cudaStreamIsCapturing: " + cudaGetErrorString(e), e);
  }
  // Inside a capture a plain record only orders streams; an external record is a graph node that
  // records the event on every replay, which is what timing needs.
  auto record = [&](cudaEvent_t event) {
    return capture == cudaStreamCaptureStatusActive
               ? cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal)
               : cudaEventRecord(event, stream);
  };
  if (pair != nullptr) {
    if (auto e = record(pair->start); e != cudaSuccess)
      return fail(where() + ": cudaEventRecord: " + cudaGetErrorString(e), e);
  }
  ncclComm_t comm = as_comm(comm_);
  const auto type = static_cast<ncclDataType_t>(nccl_type);
  const std::size_t segment = count / static_cast<std::size_t>(world_size_);
  char* own = static_cast<char*>(data) + static_cast<std::size_t>(rank_) * segment * element_bytes;
  // In place as NCCL defines it: the reduce-scatter's receive buffer is this rank's segment of
  // the send buffer; the all-gather's send buffer may be that segment or another.
  ncclResult_t rc = what == Collective::all_reduce
                        ? ncclAllReduce(data, data, count, type, ncclSum, comm, stream)
                    : what == Collective::reduce_scatter
                        ? ncclReduceScatter(data, own, segment, type, ncclSum, comm, stream)
                        : ncclAllGather(shard, data, segment, type, comm, stream);
  // A non-blocking communicator may return before the call is enqueued (e.g. while it connects
  // its channels on first use); it must be complete before the next NCCL call.
  if (rc == ncclInProgress) rc = wait_in_progress(comm, Clock::now() + options_.timeout);
  if (rc != ncclSuccess) {
    const bool timed_out = rc == ncclInProgress;
    std::string message =
        where() + ": " + name + " of " + std::to_string(bytes) + " bytes " +
        (timed_out ? "was not enqueued within " + std::to_string(options_.timeout.count()) + " ms"
                   : "failed: " + nccl_reason(rc, comm));
    return fail(std::move(message), rc == ncclInvalidArgument || rc == ncclInvalidUsage
                                        ? cudaErrorInvalidValue
                                        : cudaErrorUnknown);
  }
  if (pair != nullptr) {
    if (auto e = record(pair->done); e != cudaSuccess)
      return fail(where() + ": cudaEventRecord: " + cudaGetErrorString(e), e);
    timed_bytes_.push_back(bytes);
  }
  return cudaSuccess;
}

Status NcclCommunicator::check() {
  if (aborted_) return make_error(where() + ": the communicator was aborted", 1);
  ncclResult_t state = ncclSuccess;
  ncclComm_t comm = as_comm(comm_);
  if (auto rc = ncclCommGetAsyncError(comm, &state); rc != ncclSuccess) state = rc;
  if (state == ncclSuccess || state == ncclInProgress) return ok_status();
  failed_ = true;
  last_error_ = where() + ": asynchronous nccl error: " + nccl_reason(state, comm);
  return make_error(last_error_, 1);
}

Status NcclCommunicator::synchronize(cudaStream_t stream, milliseconds timeout) {
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return check();
    if (e != cudaErrorNotReady) {
      failed_ = true;
      last_error_ = where() + ": stream failed: " + cudaGetErrorString(e);
      return make_error(last_error_, 1);
    }
    if (auto s = check(); !s) {
      abort();
      return s;
    }
    if (Clock::now() - start >= timeout) {
      abort();
      last_error_ = where() + ": the stream's collectives did not complete within " +
                    std::to_string(timeout.count()) +
                    " ms (a peer stopped calling all-reduce or died); communicator aborted";
      return make_error(last_error_, 1);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

Result<std::vector<AllReduceTiming>> NcclCommunicator::timings() {
  std::vector<AllReduceTiming> out;
  out.reserve(timed_bytes_.size());
  for (std::size_t i = 0; i < timed_bytes_.size(); ++i) {
    const EventPair& pair = events_[i];
    if (auto e = cudaEventSynchronize(pair.done); e != cudaSuccess)
      return make_error(where() + ": waiting for all-reduce " + std::to_string(i) +
                            "'s done event: " + cudaGetErrorString(e),
                        1);
    AllReduceTiming t;
    t.bytes = timed_bytes_[i];
    t.start = pair.start;
    t.done = pair.done;
    if (auto e = cudaEventElapsedTime(&t.ms, pair.start, pair.done); e != cudaSuccess)
      return make_error(
          where() + ": timing all-reduce " + std::to_string(i) + ": " + cudaGetErrorString(e), 1);
    out.push_back(t);
  }
  return out;
}

void NcclCommunicator::clear_timings() { timed_bytes_.clear(); }

Result<float> NcclCommunicator::exposed_after(cudaEvent_t compute_done) {
  if (timed_bytes_.empty()) return 0.0f;
  cudaEvent_t last = events_[timed_bytes_.size() - 1].done;
  if (auto e = cudaEventSynchronize(last); e != cudaSuccess)
    return make_error(where() + ": waiting for the last all-reduce: " + cudaGetErrorString(e), 1);
  if (auto e = cudaEventSynchronize(compute_done); e != cudaSuccess)
    return make_error(where() + ": waiting for the compute event: " + cudaGetErrorString(e), 1);
  float ms = 0;
  if (auto e = cudaEventElapsedTime(&ms, compute_done, last); e != cudaSuccess)
    return make_error(where() + ": timing exposed communication: " + cudaGetErrorString(e), 1);
  return ms > 0 ? ms : 0.0f;
}

}  // namespace topolaunch::kernels::cuda
