// A UCX worker connected to every other rank of a store (private header). Endpoints use
// UCP_ERR_HANDLING_MODE_PEER: a peer that dies flips its `failed` flag from the error callback,
// and every wait on a request involving that peer returns an error naming it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/wireup/kv_store.hpp"
#include "ucx_context.hpp"

namespace topolaunch::rdma::detail {

struct PeerState {
  ucp_ep_h ep = nullptr;
  ucs_status_t failure = UCS_OK;  // set by the error callback
  int rank = -1;
};

class UcxMesh {
 public:
  // Collective over the store's ranks. Keys: "<name>/addr/<rank>".
  static Result<std::unique_ptr<UcxMesh>> connect(wireup::KvStore& store,
                                                  const UcxSettings& settings,
                                                  const std::string& name,
                                                  std::chrono::milliseconds timeout);
  ~UcxMesh();
  UcxMesh(const UcxMesh&) = delete;
  UcxMesh& operator=(const UcxMesh&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  ucp_worker_h worker() const { return worker_.worker.get(); }
  ucp_context_h context() const { return worker_.context.get(); }
  const UcxApi& ucx() const { return *worker_.ucx; }
  ucp_ep_h ep(int peer) const { return peers_[peer].ep; }
  std::uint64_t memory_types() const { return worker_.memory_types; }
  const std::string& name() const { return name_; }

  // Tag layout: source rank (16 bits) | sequence (24) | step (24); receives match exactly.
  static std::uint64_t make_tag(int source, std::uint32_t seq, std::uint32_t step) {
    return (static_cast<std::uint64_t>(source & 0xffff) << 48) |
           (static_cast<std::uint64_t>(seq & 0xffffff) << 24) | (step & 0xffffff);
  }

  // Nonblocking; the returned request (or nullptr when complete, or an error pointer) must go
  // to wait(). `peer` is the rank the operation depends on.
  void* send(int peer, const void* data, std::size_t bytes, std::uint64_t tag);
  void* recv(int peer, void* data, std::size_t bytes, std::uint64_t tag);

  struct Pending {
    void* request;
    int peer;
    const char* what;  // "send", "recv", "put", "flush"
  };
  // Progresses until all complete, any fails, a peer fails, or the deadline passes; on error
  // cancels and frees what is left.
  Status wait_all(std::vector<Pending> pending, std::chrono::milliseconds timeout);
  Status wait(Pending p, std::chrono::milliseconds timeout) { return wait_all({p}, timeout); }

  // "tcp/lo" style summary of the lanes of the endpoint to `peer`.
  std::string lanes(int peer) const;
  bool peer_failed(int peer) const { return peers_[peer].failure != UCS_OK; }

 private:
  UcxMesh() = default;
  UcxWorker worker_;
  std::vector<PeerState> peers_;
  int rank_ = 0;
  int world_ = 1;
  std::string name_;
};

}  // namespace topolaunch::rdma::detail
