#include "ucx_mesh.hpp"

#include <sched.h>

#include <fmt/format.h>
#include <cstdio>
#include <cstdlib>

#include "topolaunch/rdma/blob.hpp"

namespace topolaunch::rdma::detail {
namespace {

void on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<PeerState*>(arg)->failure = status;
}

void close_ep(const UcxApi& ucx, ucp_worker_h worker, ucp_ep_h ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;  // peers may be dead: never wait for them
  void* req = ucx.ep_close_nbx(ep, &param);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (ucx.request_check_status(req) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < deadline)
    ucx.worker_progress(worker);
  ucx.request_free(req);
}

}  // namespace

Result<std::unique_ptr<UcxMesh>> UcxMesh::connect(wireup::KvStore& store,
                                                  const UcxSettings& settings,
                                                  const std::string& name,
                                                  std::chrono::milliseconds timeout) {
  std::unique_ptr<UcxMesh> mesh(new UcxMesh());
  mesh->rank_ = store.rank();
  mesh->world_ = store.size();
  mesh->name_ = name;
  auto worker = open_ucx_worker(settings, name);
  if (!worker) return worker.error();
  mesh->worker_ = std::move(*worker);

  const std::string my_key = fmt::format("{}/addr/{}", name, mesh->rank_);
  if (auto st = store.put(
          my_key, encode_blob(BlobKind::ucx_worker_address, mesh->rank_, mesh->worker_.address));
      !st)
    return st.error();
  if (auto st = store.fence(timeout); !st)
    return make_error(fmt::format("ucx address exchange \"{}\": {}", name, st.error().message),
                      st.error().exit_code);

  mesh->peers_.resize(mesh->world_);
  for (int peer = 0; peer < mesh->world_; ++peer) {
    mesh->peers_[peer].rank = peer;
    if (peer == mesh->rank_) continue;
    const std::string key = fmt::format("{}/addr/{}", name, peer);
    auto raw = store.get_string(key, timeout);
    if (!raw) return raw.error();
    auto address = decode_blob(*raw, BlobKind::ucx_worker_address, peer, key);
    if (!address) return address.error();
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(address->data());
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = on_peer_error;
    ep_params.err_handler.arg = &mesh->peers_[peer];
    ucp_ep_h ep = nullptr;
    if (ucs_status_t s = mesh->ucx().ep_create(mesh->worker(), &ep_params, &ep); s != UCS_OK)
      return make_error(
          fmt::format("ucx: cannot reach rank {} with UCX_TLS={}: {} (in peer-failure "
                      "mode shared memory needs UCX_POSIX_ERROR_HANDLING=y; tcp "
                      "always works)",
                      peer, settings.transports.empty() ? "(default)" : settings.transports,
                      status_text(s)),
          2);
    mesh->peers_[peer].ep = ep;
  }
  return mesh;
}

UcxMesh::~UcxMesh() {
  for (auto& p : peers_)
    if (p.ep) close_ep(*worker_.ucx, worker(), p.ep);
}

void* UcxMesh::send(int peer, const void* data, std::size_t bytes, std::uint64_t tag) {
  ucp_request_param_t param{};
  return ucx().tag_send_nbx(peers_[peer].ep, data, bytes, tag, &param);
}

void* UcxMesh::recv(int, void* data, std::size_t bytes, std::uint64_t tag) {
  ucp_request_param_t param{};
  return ucx().tag_recv_nbx(worker(), data, bytes, tag, ~std::uint64_t{0}, &param);
}

Status UcxMesh::wait_all(std::vector<Pending> pending, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string error;
  for (auto& p : pending) {
    if (UCS_PTR_IS_ERR(p.request)) {
      error = fmt::format("{} with rank {} failed: {}", p.what, p.peer,
                          status_text(UCS_PTR_STATUS(p.request)));
      p.request = nullptr;
    }
  }
  while (error.empty()) {
    bool all_done = true;
    for (auto& p : pending) {
      if (!p.request) continue;
      ucs_status_t s = ucx().request_check_status(p.request);
      if (s == UCS_INPROGRESS) {
        all_done = false;
        continue;
      }
      ucx().request_free(p.request);
      p.request = nullptr;
      if (s != UCS_OK) {
        error = fmt::format("{} with rank {} failed: {}", p.what, p.peer, status_text(s));
        break;
      }
    }
    if (all_done || !error.empty()) break;
    for (const auto& p : pending)
      if (p.request && peers_[p.peer].failure != UCS_OK) {
        error = fmt::format("rank {} failed ({}) during {}", p.peer,
                            status_text(peers_[p.peer].failure), p.what);
        break;
      }
    if (!error.empty()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (const auto& p : pending)
        if (p.request) {
          error = fmt::format("{} with rank {} timed out after {} ms (peer stuck or unreachable)",
                              p.what, p.peer, timeout.count());
          break;
        }
      break;
    }
    // Yield when idle: ranks often outnumber cores (CI has 2), and a spinning waiter would
    // starve the very peer it waits for.
    if (ucx().worker_progress(worker()) == 0) sched_yield();
  }
  for (auto& p : pending) {
    if (!p.request) continue;
    ucx().request_cancel(worker(), p.request);
    // A cancelled request completes on progress; free it without waiting for a dead peer.
    ucx().worker_progress(worker());
    ucx().request_free(p.request);
  }
  if (!error.empty()) return make_error(fmt::format("{}: rank {}: {}", name_, rank_, error), 3);
  return ok_status();
}

std::string UcxMesh::lanes(int peer) const {
  if (peer < 0 || peer >= world_ || !peers_[peer].ep) return "";
  return ep_lanes(peers_[peer].ep);
}

}  // namespace topolaunch::rdma::detail
