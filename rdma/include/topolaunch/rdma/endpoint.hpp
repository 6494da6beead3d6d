// One interface over UCX (ucp worker + endpoints) and verbs RC queue pairs: register memory,
// publish a blob per peer, connect, RDMA-write into a peer's registered memory, flush.
// Preflight is written against this, so each stage runs the same way on both.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::rdma {

enum class MemoryKind { host, cuda };

struct LocalMemory {
  void* address = nullptr;
  std::size_t bytes = 0;
  MemoryKind kind = MemoryKind::host;
  std::string packed_key;        // what a peer needs to write here (rkey)
  std::shared_ptr<void> handle;  // the registration (ucp memh / ibv_mr); released with it
};

struct RemoteMemory {
  std::uint64_t address = 0;
  std::size_t bytes = 0;
  std::string packed_key;
};

// {address, bytes, packed key} as bytes for the store (inside a blob).
std::string serialize(const RemoteMemory& m);
Result<RemoteMemory> parse_remote_memory(std::string_view payload, int peer, std::string_view key);
RemoteMemory describe(const LocalMemory& m);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string kind() const = 0;         // "ucx" or "verbs"
  virtual std::string description() const = 0;  // "ucx tcp/lo", "verbs rxe0:1 gid 1"
  // What `peer` needs to connect to us (UCX: the worker address; verbs: a QP made for it).
  virtual Result<std::string> local_blob(int peer) = 0;
  virtual Status connect(int peer, std::string_view peer_blob) = 0;
  virtual Result<LocalMemory> register_memory(void* address, std::size_t bytes,
                                              MemoryKind kind) = 0;
  // Allocates `bytes` of host memory in the form the transport moves fastest and registers it;
  // released with the handle. UCX: ucp_mem_map(UCP_MEM_MAP_ALLOCATE), which shared memory maps
  // straight into the peer (puts become stores, as in ucx_perftest); default: page-aligned
  // memory passed to register_memory().
  virtual Result<LocalMemory> allocate_memory(std::size_t bytes) {
    constexpr std::size_t page = 4096;
    const std::size_t rounded = (bytes + page - 1) / page * page;
    std::shared_ptr<void> memory(std::aligned_alloc(page, rounded == 0 ? page : rounded),
                                 [](void* p) { std::free(p); });
    if (!memory) return make_error("rdma: cannot allocate " + std::to_string(bytes) + " bytes", 1);
    auto m = register_memory(memory.get(), bytes, MemoryKind::host);
    if (!m) return m.error();
    // One owner of both, the registration released first (pair members go in reverse order);
    // the handle still points at the registration (verbs reads its ibv_mr from it).
    void* registration = m->handle.get();
    auto both = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
        std::move(memory), std::move(m->handle));
    m->handle = std::shared_ptr<void>(std::move(both), registration);
    return m;
  }
  // Starts an RDMA write of local [offset, offset+bytes) to remote [remote_offset, ...).
  virtual Status write(int peer, const LocalMemory& local, std::size_t offset,
                       const RemoteMemory& remote, std::size_t remote_offset,
                       std::size_t bytes) = 0;
  // Gets ready to write into `remote` of `peer` (UCX: unpacks the memory key now, while the peer
  // is known to be alive; see ucx_transport.cpp). Optional: write() does it on first use.
  virtual Status prepare_remote(int /*peer*/, const RemoteMemory& /*remote*/) {
    return ok_status();
  }
  // Waits until every write to `peer` is complete at the peer (or fails naming it).
  virtual Status flush(int peer, std::chrono::milliseconds timeout) = 0;
  // Lets the transport make progress (UCX over tcp needs the target to progress too).
  virtual void progress() = 0;
  // An error when the transport knows `peer` failed (UCX: the endpoint's error callback ran),
  // so a wait for that peer's writes ends at once instead of at its timeout.
  virtual Status check_peer(int /*peer*/) { return ok_status(); }
  // False when the peer's one-sided writes land without this side doing anything (verbs RC: the
  // NIC, or rxe's kernel threads, place the data). A receiver that only waits for them can then
  // sleep between polls and leave the cores to whatever moves the data.
  virtual bool target_needs_progress() const { return true; }
};

struct UcxTransportOptions {
  std::string transports;   // UCX_TLS
  std::string net_devices;  // UCX_NET_DEVICES
  // UCX_KEEPALIVE_INTERVAL: 1 s detects a dead shm peer in about a second (rdma.md §1.3) without
  // failing live peers that an overloaded host schedules late.
  std::chrono::milliseconds keepalive{1000};
};
Result<std::unique_ptr<Transport>> open_ucx_transport(int rank, const UcxTransportOptions& options);

struct VerbsTransportOptions {
  std::string device;  // "mlx5_0", "rxe0"
  int port = 1;
  int gid_index = 0;
  std::uint8_t qp_timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
};
// Fails with an error naming device and port when the device does not exist or the port is
// not ACTIVE.
Result<std::unique_ptr<Transport>> open_verbs_transport(int rank,
                                                        const VerbsTransportOptions& options);

// Publishes local_blob(peer) for every peer in `peers`, fences, reads the peers' blobs for us
// and connects. Keys: "<name>/ep/<from>/<to>". A corrupted blob is an error naming the peer.
Status connect_peers(Transport& transport, wireup::KvStore& store, const std::vector<int>& peers,
                     const std::string& name, std::chrono::milliseconds timeout);

}  // namespace topolaunch::rdma
