// RAII owners of UCX handles and the settings every rdma UCX user shares (private header).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "topolaunch/common/result.hpp"
#include "ucx_api.hpp"

namespace topolaunch::rdma::detail {

struct UcxSettings {
  std::string transports;   // UCX_TLS, "" = environment/default
  std::string net_devices;  // UCX_NET_DEVICES, "" = environment/default
  std::chrono::milliseconds keepalive{250};
  bool rma = true;  // UCP_FEATURE_RMA (puts with rkeys) besides TAG
};

struct ContextDeleter {
  const UcxApi* ucx = nullptr;
  void operator()(ucp_context* c) const { ucx->cleanup(c); }
};
struct WorkerDeleter {
  const UcxApi* ucx = nullptr;
  void operator()(ucp_worker* w) const { ucx->worker_destroy(w); }
};
using ContextPtr = std::unique_ptr<ucp_context, ContextDeleter>;
using WorkerPtr = std::unique_ptr<ucp_worker, WorkerDeleter>;

struct UcxWorker {
  const UcxApi* ucx = nullptr;  // ucx_api(), loaded
  ContextPtr context;
  WorkerPtr worker;
  std::string address;             // this worker's address blob
  std::uint64_t memory_types = 0;  // ucp_context_query: bit per ucs_memory_type_t
};

// UCX 1.13's default UCX_ALLOC_PRIO with posix before sysv (see open_ucx_worker).
inline constexpr const char* kPosixFirstAllocPrio = "md:posix,md:sysv,huge,thp,md:*,mmap,heap";

// Creates context + worker in single-thread mode; loads UCX first (ucx_api()), and a node
// without it gets an error naming the library. Peer-failure endpoints over shared memory
// need UCX_POSIX_ERROR_HANDLING=y in UCX 1.13 (rdma.md §1.3); set unless the user set it.
Result<UcxWorker> open_ucx_worker(const UcxSettings& settings, const std::string& name);

// ucs_status_string, or the number when UCX is not loaded.
std::string status_text(ucs_status_t s);

// "posix/memory" or "tcp/lo,tcp/eth0": the transports/devices of an endpoint's lanes, from
// ucp_ep_print_info (for reports; "" when it cannot be read).
std::string ep_lanes(ucp_ep_h ep);

}  // namespace topolaunch::rdma::detail
