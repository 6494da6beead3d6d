// NCCL data-parallel communicator of the CUDA backend: gradient sums between the GPUs of one job,
// enqueued on a caller's CUDA stream (the executor's side stream) so they overlap the backward.
//
// Wire-up: rank 0 makes the ncclUniqueId and puts it into the wireup KV store under a key that
// names the job, the restart generation and the communicator
// ("nccl/<run_id>/<attempt>/<name>/unique-id"), so a restarted job never reads a dead
// generation's id; every rank then takes part in one fence and the others read the id. NCCL is
// initialised non-blocking and polled against a deadline, so a peer that never joins (or never
// reaches NCCL) is an error that says so instead of a hang.
//
// Measurement: each all-reduce is bracketed by two CUDA events on its stream (recorded as
// external event nodes when the stream is being captured into a CUDA graph, so a replayed graph
// re-times them). timings() reads them after the work is done: bytes and milliseconds per call,
// and exposed_after() the communication still running after a compute event (the exposed time of a
// step when that event marks the end of the backward).
//
// Worker-side only: links libnccl directly and is built only with -Dcuda=enabled on GPU hosts.
// The launcher never links it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/wireup/kv_store.hpp"

// The executor's interface (GpuCommunicator) when the backend is in the tree; the class is usable
// on its own either way.
#if __has_include("cuda_backend.hpp")
#include "cuda_backend.hpp"
#define TOPOLAUNCH_NCCL_BASE \
  final:                     \
 public                      \
  GpuCommunicator
#define TOPOLAUNCH_NCCL_OVERRIDE override
#else
#define TOPOLAUNCH_NCCL_BASE final
#define TOPOLAUNCH_NCCL_OVERRIDE
#endif

namespace topolaunch::kernels::cuda {

struct NcclOptions {
  std::string name = "dp";       // the communicator's name within the job (part of the store key)
  std::string run_id = "local";  // the job (TOPOLAUNCH_RUN_ID)
  int attempt = 0;               // the restart generation (TOPOLAUNCH_ATTEMPT)
  int device = -1;               // CUDA device to bind; -1 keeps the current one
  // Each wait: the id exchange (fence + get) and NCCL's own init, separately.
  std::chrono::milliseconds timeout{120000};
  int max_ctas = 0;        // cap on the SMs NCCL's kernels take (0: NCCL's choice); leaves SMs to
                           // the backward it overlaps
  bool time_calls = true;  // bracket each all-reduce with CUDA events (see timings())
};

// One all-reduce as measured on its stream.
struct AllReduceTiming {
  std::size_t bytes = 0;  // payload of the call (count * element size)
  float ms = 0;           // stream time between the call's start and done events
  cudaEvent_t start = nullptr, done = nullptr;  // owned by the communicator; valid until clear
};

class NcclCommunicator TOPOLAUNCH_NCCL_BASE {
 public:
  // Collective over store.size() ranks: every rank calls it with the same options.name.
  static Result<std::unique_ptr<NcclCommunicator>> create(wireup::KvStore& store,
                                                          const NcclOptions& options);
  // ncclCommAbort when an error is pending or abort() was called, else finalize + destroy
  // (bounded by options.timeout; aborts past it).
  ~NcclCommunicator() TOPOLAUNCH_NCCL_OVERRIDE;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const TOPOLAUNCH_NCCL_OVERRIDE { return rank_; }
  int world_size() const TOPOLAUNCH_NCCL_OVERRIDE { return world_size_; }
  int device() const { return device_; }

  // In-place sum over all ranks, enqueued on `stream` (graph-capturable once the communicator has
  // run one all-reduce outside capture: NCCL connects its channels lazily on first use). A failure
  // returns a CUDA error code (cudaErrorUnknown for NCCL's own) and leaves the message, naming the
  // rank, the device and NCCL's reason, in last_error().
  cudaError_t all_reduce_sum(float* data, std::size_t count,
                             cudaStream_t stream) TOPOLAUNCH_NCCL_OVERRIDE;
  cudaError_t all_reduce_sum(__nv_bfloat16* data, std::size_t count, cudaStream_t stream);
  // Sharded data parallelism: in-place reduce-scatter (this rank's segment of count/world
  // elements at rank*count/world gets the sum) and all-gather (data's segments from every rank's
  // `shard`), enqueued and reported like all_reduce_sum.
  cudaError_t reduce_scatter_sum(float* data, std::size_t count,
                                 cudaStream_t stream) TOPOLAUNCH_NCCL_OVERRIDE;
  cudaError_t all_gather(__nv_bfloat16* data, const __nv_bfloat16* shard, std::size_t count,
                         cudaStream_t stream) TOPOLAUNCH_NCCL_OVERRIDE;

  const std::string& last_error() const { return last_error_; }

  // NCCL's asynchronous error state (a peer that failed, a network error) as a Status naming this
  // rank; an error here makes the destructor abort.
  Status check();
  // Waits for `stream` without blocking forever: polls the stream and NCCL's error state; past
  // `timeout` aborts the communicator (which ends its kernels) and says which rank waited how long.
  Status synchronize(cudaStream_t stream, std::chrono::milliseconds timeout);
  // Ends the communicator now (its kernels return); every later call fails.
  void abort();

  // The calls timed since the last clear_timings(), in issue order, after waiting for their done
  // events. Under CUDA graph replay the same events are re-recorded on each replay, so calling this
  // after each replay (without clearing) reads that replay's times.
  Result<std::vector<AllReduceTiming>> timings();
  void clear_timings();
  void set_time_calls(bool on) { options_.time_calls = on; }
  // Milliseconds from `compute_done` (an event the caller recorded on its compute stream, e.g. the
  // end of the backward) to the end of the last timed all-reduce; 0 when communication finished
  // first. Waits for both events.
  Result<float> exposed_after(cudaEvent_t compute_done);

  // NCCL's version as "2.28.3" (the library linked at run time).
  static std::string nccl_version();

 private:
  NcclCommunicator() = default;
  enum class Collective { all_reduce, reduce_scatter, all_gather };
  // `count`: the whole buffer's elements; `shard`: the all-gather's source (else null).
  cudaError_t enqueue(Collective what, void* data, const void* shard, std::size_t count,
                      int nccl_type, std::size_t element_bytes, cudaStream_t stream);
  cudaError_t fail(std::string message, cudaError_t code);
  std::string where() const;  // "nccl rank 1 of 2 (device 1)"

  struct EventPair {
    cudaEvent_t start = nullptr, done = nullptr;
  };
  void* comm_ = nullptr;  // ncclComm_t (kept opaque so this header needs no nccl.h)
  int rank_ = 0, world_size_ = 1, device_ = 0;
  NcclOptions options_;
  bool aborted_ = false, failed_ = false;
  std::string last_error_;
  std::vector<EventPair> events_;  // reused pool; first `timed_` are in use
  std::vector<std::size_t> timed_bytes_;
};

// The communicator a worker started by `topolaunch run` makes: the store from the environment the
// launcher sets (wireup::connect_from_env), run_id and attempt from TOPOLAUNCH_RUN_ID and
// TOPOLAUNCH_ATTEMPT; the device is base.device when it is >= 0, else TOPOLAUNCH_LOCAL_RANK (else
// LOCAL_RANK) modulo the visible GPUs (cuda_device_for_local_rank: 0 under the launcher's
// per-rank CUDA_VISIBLE_DEVICES), else the current one. Other fields of `base` keep their values.
Result<std::unique_ptr<NcclCommunicator>> nccl_communicator_from_env(NcclOptions base = {});

}  // namespace topolaunch::kernels::cuda
