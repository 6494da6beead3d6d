// The UCX side of Transport: one worker, peer-failure endpoints, ucp_mem_map'ed memory, puts.
// GPU memory only when the context reports CUDA *and* the mapped memh says CUDA: Debian's UCX
// returns UCS_OK for a CUDA mapping it cannot do (rdma.md §0.2).
#include <sched.h>

#include <fmt/format.h>
#include <map>
#include <vector>

#include "topolaunch/rdma/endpoint.hpp"
#include "ucx_context.hpp"

namespace topolaunch::rdma {
namespace {

using detail::status_text;

constexpr std::size_t kMaxPendingWrites = 64;  // in flight per peer (see retire())

struct Peer {
  ucp_ep_h ep = nullptr;
  ucs_status_t failure = UCS_OK;
  std::vector<void*> pending;               // put requests not yet complete
  std::map<std::string, ucp_rkey_h> rkeys;  // unpacked per endpoint
  ucp_rkey_h last_rkey = nullptr;           // the key of the last write (owned by rkeys)
  std::string last_packed_key;
};

void on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<Peer*>(arg)->failure = status;
}

class UcxTransport final : public Transport {
 public:
  UcxTransport(int rank, detail::UcxWorker worker, std::string tls)
      : rank_(rank), w_(std::move(worker)), ucx_(*w_.ucx), tls_(std::move(tls)) {}

  ~UcxTransport() override {
    for (auto& [rank, p] : peers_) {
      for (void* r : p->pending) {
        ucx_.request_cancel(w_.worker.get(), r);
        ucx_.request_free(r);
      }
      for (auto& [k, rkey] : p->rkeys) ucx_.rkey_destroy(rkey);
      if (p->ep) {
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
        void* req = ucx_.ep_close_nbx(p->ep, &param);
        if (req && !UCS_PTR_IS_ERR(req)) {
          while (ucx_.request_check_status(req) == UCS_INPROGRESS)
            ucx_.worker_progress(w_.worker.get());
          ucx_.request_free(req);
        }
      }
    }
  }

  std::string kind() const override { return "ucx"; }
  std::string description() const override {
    return "ucx " + (tls_.empty() ? std::string("(default)") : tls_) +
           (lanes_.empty() ? "" : " over " + lanes_);
  }

  Result<std::string> local_blob(int) override { return w_.address; }

  Status connect(int peer, std::string_view blob) override {
    auto& p = peers_[peer];
    if (!p) p = std::make_unique<Peer>();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(blob.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_error;
    params.err_handler.arg = p.get();
    if (ucs_status_t s = ucx_.ep_create(w_.worker.get(), &params, &p->ep); s != UCS_OK)
      return make_error(
          fmt::format("ucx: rank {} cannot reach rank {}: {}", rank_, peer, status_text(s)), 2);
    if (lanes_.empty()) lanes_ = detail::ep_lanes(p->ep);
    return ok_status();
  }

  Result<LocalMemory> register_memory(void* address, std::size_t bytes, MemoryKind kind) override {
    const bool cuda = kind == MemoryKind::cuda;
    if (cuda && !(w_.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
      return make_error(
          "ucx: this UCX build cannot register GPU memory (its context reports no "
          "CUDA memory type); use the verbs transport with dma-buf or host staging",
          2);
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = address;
    params.length = bytes;
    params.memory_type = cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    ucp_mem_h memh = nullptr;
    if (ucs_status_t s = ucx_.mem_map(w_.context.get(), &params, &memh); s != UCS_OK)
      return make_error(
          fmt::format("ucx: ucp_mem_map of {} bytes failed: {}", bytes, status_text(s)), 1);
    ucp_context_h ctx = w_.context.get();
    std::shared_ptr<void> handle(
        memh, [ctx, ucx = &ucx_](void* m) { ucx->mem_unmap(ctx, static_cast<ucp_mem_h>(m)); });
    if (cuda) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_MEM_TYPE;
      if (ucx_.mem_query(memh, &attr) != UCS_OK || attr.mem_type != UCS_MEMORY_TYPE_CUDA)
        return make_error(
            "ucx: ucp_mem_map accepted GPU memory but mapped it as host memory; "
            "refusing (use verbs dma-buf)",
            2);
    }
    void* packed = nullptr;
    std::size_t packed_len = 0;
    if (ucs_status_t s = ucx_.rkey_pack(ctx, memh, &packed, &packed_len); s != UCS_OK)
      return make_error("ucx: ucp_rkey_pack failed: " + status_text(s), 1);
    LocalMemory m{address, bytes, kind, std::string(static_cast<char*>(packed), packed_len),
                  handle};
    ucx_.rkey_buffer_release(packed);
    return m;
  }

  // What ucx_perftest does: UCX allocates the memory (posix shared memory when UCX_TLS allows),
  // so a peer on the same host maps it and an 8-byte put is a store instead of a
  // process_vm_writev() (cma) or an active message the target has to apply.
  Result<LocalMemory> allocate_memory(std::size_t bytes) override {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = nullptr;
    params.length = bytes;
    params.flags = UCP_MEM_MAP_ALLOCATE;
    params.memory_type = UCS_MEMORY_TYPE_HOST;
    ucp_mem_h memh = nullptr;
    ucp_context_h ctx = w_.context.get();
    if (ucs_status_t s = ucx_.mem_map(ctx, &params, &memh); s != UCS_OK)
      return make_error(
          fmt::format("ucx: ucp_mem_map(ALLOCATE) of {} bytes failed: {}", bytes, status_text(s)),
          1);
    std::shared_ptr<void> handle(
        memh, [ctx, ucx = &ucx_](void* m) { ucx->mem_unmap(ctx, static_cast<ucp_mem_h>(m)); });
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if (ucs_status_t s = ucx_.mem_query(memh, &attr); s != UCS_OK || attr.length < bytes)
      return make_error("ucx: ucp_mem_query of allocated memory failed: " + status_text(s), 1);
    void* packed = nullptr;
    std::size_t packed_len = 0;
    if (ucs_status_t s = ucx_.rkey_pack(ctx, memh, &packed, &packed_len); s != UCS_OK)
      return make_error("ucx: ucp_rkey_pack failed: " + status_text(s), 1);
    LocalMemory m{attr.address, bytes, MemoryKind::host,
                  std::string(static_cast<char*>(packed), packed_len), handle};
    ucx_.rkey_buffer_release(packed);
    return m;
  }

  Status write(int peer, const LocalMemory& local, std::size_t offset, const RemoteMemory& remote,
               std::size_t remote_offset, std::size_t bytes) override {
    auto it = peers_.find(peer);
    if (it == peers_.end())
      return make_error(fmt::format("ucx: rank {} is not connected", peer), 1);
    Peer& p = *it->second;
    if (p.failure != UCS_OK)
      return make_error(fmt::format("ucx: rank {} failed: {}", peer, status_text(p.failure)), 3);
    if (offset + bytes > local.bytes || remote_offset + bytes > remote.bytes)
      return make_error(fmt::format("ucx: write of {} bytes outside the registered buffers", bytes),
                        1);
    // The ping-pong writes the same remote buffer thousands of times: remember the last key
    // unpacked for this peer instead of looking the packed bytes up in the map every time.
    ucp_rkey_h rkey = p.last_rkey && p.last_packed_key == remote.packed_key ? p.last_rkey : nullptr;
    if (!rkey) {
      auto cached = unpack(p, peer, remote);
      if (!cached) return cached.error();
      rkey = p.last_rkey = *cached;
      p.last_packed_key = remote.packed_key;
    }
    ucp_request_param_t param{};
    void* req = ucx_.put_nbx(p.ep, static_cast<char*>(local.address) + offset, bytes,
                             remote.address + remote_offset, rkey, &param);
    if (UCS_PTR_IS_ERR(req))
      return make_error(
          fmt::format("ucx: put to rank {} failed: {}", peer, status_text(UCS_PTR_STATUS(req))), 3);
    if (req) p.pending.push_back(req);
    return retire(p, peer, kMaxPendingWrites);
  }

  // Bounds the writes in flight to a peer like a send queue would (verbs does the same): frees
  // completed requests and progresses while `limit` or more are pending. Puts that complete at
  // once (shared memory: a memcpy into the peer's mapped buffer) never get here, so a stream of
  // writes needs no flush until its end, as in ucx_perftest; a flush every N writes cost ~half
  // the shm bandwidth on a loaded host (each waited for the peer to be scheduled).
  Status retire(Peer& p, int peer, std::size_t limit) {
    if (p.pending.size() < limit) return ok_status();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (p.pending.size() >= limit) {
      for (std::size_t i = 0; i < p.pending.size();) {
        ucs_status_t s = ucx_.request_check_status(p.pending[i]);
        if (s == UCS_INPROGRESS) {
          ++i;
          continue;
        }
        ucx_.request_free(p.pending[i]);
        p.pending.erase(p.pending.begin() + static_cast<long>(i));
        if (s != UCS_OK)
          return make_error(fmt::format("ucx: write to rank {} failed: {}", peer, status_text(s)),
                            3);
      }
      if (p.failure != UCS_OK)
        return make_error(fmt::format("ucx: rank {} failed: {}", peer, status_text(p.failure)), 3);
      if (std::chrono::steady_clock::now() > deadline)
        return make_error(fmt::format("ucx: {} writes to rank {} not complete after 60 s",
                                      p.pending.size(), peer),
                          3);
      ucx_.worker_progress(w_.worker.get());
    }
    return ok_status();
  }

  Status prepare_remote(int peer, const RemoteMemory& remote) override {
    auto it = peers_.find(peer);
    if (it == peers_.end())
      return make_error(fmt::format("ucx: rank {} is not connected", peer), 1);
    auto rkey = unpack(*it->second, peer, remote);
    if (!rkey) return rkey.error();
    return ok_status();
  }

  // Unpacking a posix (shared memory) key opens the owner's /proc/<pid>/fd/<n>: if the owner is
  // gone, UCX 1.13 logs "failed to unpack remote key" and then crashes in its own cleanup
  // (uct_posix_rkey_release on a NULL handle, seen in rdma_preflight_peer_dies_shm). So keys are
  // unpacked in prepare_remote() during connectivity, while the peer is alive, and a peer known
  // to have failed is refused here before UCX is asked.
  Result<ucp_rkey_h> unpack(Peer& p, int peer, const RemoteMemory& remote) {
    auto& cached = p.rkeys[remote.packed_key];
    if (cached) return cached;
    if (p.failure != UCS_OK)
      return make_error(fmt::format("ucx: rank {} failed: {}", peer, status_text(p.failure)), 3);
    if (ucs_status_t s = ucx_.ep_rkey_unpack(p.ep, remote.packed_key.data(), &cached);
        s != UCS_OK) {
      p.rkeys.erase(remote.packed_key);
      return make_error(
          fmt::format("ucx: memory key of rank {} unusable: {}", peer, status_text(s)), 2);
    }
    return cached;
  }

  Status flush(int peer, std::chrono::milliseconds timeout) override {
    auto it = peers_.find(peer);
    if (it == peers_.end())
      return make_error(fmt::format("ucx: rank {} is not connected", peer), 1);
    Peer& p = *it->second;
    ucp_request_param_t param{};
    void* req = ucx_.ep_flush_nbx(p.ep, &param);
    if (UCS_PTR_IS_ERR(req))
      return make_error(
          fmt::format("ucx: flush to rank {} failed: {}", peer, status_text(UCS_PTR_STATUS(req))),
          3);
    if (req) p.pending.push_back(req);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string error;
    while (!p.pending.empty()) {
      for (std::size_t i = 0; i < p.pending.size();) {
        ucs_status_t s = ucx_.request_check_status(p.pending[i]);
        if (s == UCS_INPROGRESS) {
          ++i;
          continue;
        }
        ucx_.request_free(p.pending[i]);
        p.pending.erase(p.pending.begin() + static_cast<long>(i));
        if (s != UCS_OK && error.empty()) error = status_text(s);
      }
      if (!error.empty()) break;
      if (p.failure != UCS_OK) {
        error = status_text(p.failure);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        error = fmt::format("no completion within {} ms", timeout.count());
        break;
      }
      if (ucx_.worker_progress(w_.worker.get()) == 0) sched_yield();
    }
    if (!error.empty()) {
      for (void* r : p.pending) {
        ucx_.request_cancel(w_.worker.get(), r);
        ucx_.request_free(r);
      }
      p.pending.clear();
      return make_error(
          fmt::format("ucx: writes from rank {} to rank {} failed: {}", rank_, peer, error), 3);
    }
    return ok_status();
  }

  void progress() override { ucx_.worker_progress(w_.worker.get()); }

  Status check_peer(int peer) override {
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second->failure != UCS_OK)
      return make_error(
          fmt::format("ucx: rank {} failed: {}", peer, status_text(it->second->failure)), 3);
    return ok_status();
  }

 private:
  int rank_;
  detail::UcxWorker w_;
  const detail::UcxApi& ucx_;
  std::string tls_;
  std::string lanes_;  // of the first endpoint, for description()
  std::map<int, std::unique_ptr<Peer>> peers_;
};

}  // namespace

Result<std::unique_ptr<Transport>> open_ucx_transport(int rank,
                                                      const UcxTransportOptions& options) {
  // A node without UCX gets what a build without it says (ucx_absent.cpp), and why.
  if (const auto& ucx = detail::ucx_api(); !ucx)
    return make_error(fmt::format("rdma: UCX cannot be loaded on this node: {}; or use the verbs "
                                  "transport (--transport verbs), or set rdma.preflight = \"off\"",
                                  ucx.error().message),
                      2);
  detail::UcxSettings s;
  s.transports = options.transports;
  s.net_devices = options.net_devices;
  s.keepalive = options.keepalive;
  s.rma = true;
  auto worker = detail::open_ucx_worker(s, fmt::format("topolaunch-{}", rank));
  if (!worker) return worker.error();
  return std::unique_ptr<Transport>(
      std::make_unique<UcxTransport>(rank, std::move(*worker), options.transports));
}

}  // namespace topolaunch::rdma
