// Host-memory collectives over UCX for the CPU backend (data-parallel gradient all-reduce).
//
// A HostCommunicator connects every rank to every other rank with UCX endpoints in
// peer-failure mode (UCP_ERR_HANDLING_MODE_PEER), after exchanging worker addresses through a
// wireup::KvStore. A dead peer fails the running collective with an error naming that rank instead
// of hanging (keepalive is short; see options). All operations are blocking, in place, and must be
// called by every rank in the same order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "topolaunch/common/result.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::rdma {

struct CommunicatorOptions {
  // UCX transports (UCX_TLS). "" keeps the process environment, or UCX's default when unset.
  // Shared memory works in peer-failure mode only with UCX_POSIX_ERROR_HANDLING=y, which the
  // communicator sets (research rdma.md §1.3).
  std::string transports;
  // UCX_NET_DEVICES; "" keeps the environment/default.
  std::string net_devices;
  // How long one collective (or the address exchange) may wait for a peer.
  std::chrono::milliseconds timeout{60'000};
  // Peer liveness probe period (UCX_KEEPALIVE_INTERVAL): detection takes about this long on shm.
  std::chrono::milliseconds keepalive{500};
  // The all-reduce moves buffers in pieces of at most this many bytes per message, so a large
  // buffer needs only this much scratch and sends overlap with reductions.
  std::size_t chunk_bytes = std::size_t{4} << 20;
  // Store keys are prefixed with this, so several communicators can share one store.
  std::string name = "hostcomm";
};

class HostCommunicator {
 public:
  // Collective: every rank of `store` (rank() and size() give this rank and the world) calls it
  // with the same options. The store is used only during create().
  static Result<HostCommunicator> create(wireup::KvStore& store,
                                         const CommunicatorOptions& options = {});

  HostCommunicator(HostCommunicator&&) noexcept;
  HostCommunicator& operator=(HostCommunicator&&) noexcept;
  ~HostCommunicator();

  int rank() const;
  int world_size() const;
  // The UCX transports the endpoints actually use, e.g. "tcp" or "posix" (for reports).
  std::string transport_summary() const;

  Status barrier();
  Status broadcast(void* data, std::size_t bytes, int root);
  // Ring all-reduce (reduce-scatter then all-gather), sum, in place.
  Status allreduce_sum(float* data, std::size_t count);
  // The buffer in world_size() segments, segment s = [count*s/n, count*(s+1)/n): on return rank
  // r's segment r holds the sum over ranks (the bits allreduce_sum puts there); the rest is
  // partial. In place.
  Status reduce_scatter_sum(float* data, std::size_t count);
  // In place: every rank's segment r (as above) becomes rank r's. Elements of 1, 2, 4 or 8 bytes.
  Status allgather(void* data, std::size_t count, std::size_t element_bytes);
  // bfloat16 stored as uint16_t; summed in fp32 and rounded to nearest even once per step.
  Status allreduce_sum_bf16(std::uint16_t* data, std::size_t count);

  struct Impl;

 private:
  explicit HostCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// bf16 helpers (exposed so callers and tests use the same rounding).
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);  // round to nearest even; NaN stays NaN

}  // namespace topolaunch::rdma
