// The verbs side of Transport: one device port, a PD and CQ, one RC QP per peer wired with the
// transitions of verbs_qp.hpp. GPU memory: dma-buf (CUDA driver dlopened) first, then plain
// ibv_reg_mr on the device pointer (works only with nvidia_peermem loaded).
#include <dlfcn.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "topolaunch/rdma/endpoint.hpp"
#include "topolaunch/rdma/verbs_qp.hpp"
#include "verbs_api.hpp"

namespace topolaunch::rdma {
namespace {

struct Peer {
  ibv_qp* qp = nullptr;
  QpInfo local;
  bool connected = false;
  int outstanding = 0;
  std::string failure;
};

constexpr int kMaxOutstanding = 128;
constexpr unsigned kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// cuMemGetHandleForAddressRange(fd*, ptr, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD=1, flags)
using CuGetHandle = int (*)(void*, unsigned long long, std::size_t, int, unsigned long long);

class VerbsTransport final : public Transport {
 public:
  explicit VerbsTransport(const detail::VerbsApi& verbs) : verbs_(verbs) {}
  ~VerbsTransport() override {
    for (auto& [r, p] : peers_)
      if (p.qp) verbs_.destroy_qp(p.qp);
    if (cq_) verbs_.destroy_cq(cq_);
    if (pd_) verbs_.dealloc_pd(pd_);
    if (ctx_) verbs_.close_device(ctx_);
    if (cuda_) dlclose(cuda_);
  }

  static Result<std::unique_ptr<Transport>> open(int rank, const VerbsTransportOptions& o) {
    // A node without libibverbs gets what a build without it says (verbs_absent.cpp), and why.
    const auto& loaded = detail::verbs_api();
    if (!loaded)
      return make_error(fmt::format("rdma: ibverbs cannot be loaded on this node: {}; or use the "
                                    "UCX transport (--transport ucx), or set rdma.preflight = "
                                    "\"off\"",
                                    loaded.error().message),
                        2);
    const detail::VerbsApi& verbs = *loaded;
    auto t = std::make_unique<VerbsTransport>(verbs);
    t->rank_ = rank;
    t->opts_ = o;
    int n = 0;
    ibv_device** list = verbs.get_device_list(&n);
    if (!list)
      return make_error(
          fmt::format("verbs: no RDMA devices on this node ({}); NIC \"{}\" not found",
                      std::strerror(errno), o.device),
          2);
    std::string names;
    for (int i = 0; i < n; ++i) {
      names += (names.empty() ? "" : ", ") + std::string(verbs.get_device_name(list[i]));
      if (o.device == verbs.get_device_name(list[i])) t->ctx_ = verbs.open_device(list[i]);
    }
    verbs.free_device_list(list);
    if (!t->ctx_)
      return make_error(
          fmt::format("verbs: NIC \"{}\" does not exist or cannot be opened (devices: {})",
                      o.device, names.empty() ? "none" : names),
          2);
    ibv_port_attr pa{};
    if (detail::verbs_query_port(verbs, t->ctx_, static_cast<std::uint8_t>(o.port), &pa) != 0)
      return make_error(fmt::format("verbs: {} has no port {}", o.device, o.port), 2);
    if (pa.state != IBV_PORT_ACTIVE)
      return make_error(
          fmt::format("verbs: {}:{} is {} (physical state {}), not ACTIVE: check the "
                      "link or choose another port",
                      o.device, o.port, verbs.port_state_str(pa.state), pa.phys_state),
          2);
    t->port_attr_ = pa;
    if (verbs.query_gid(t->ctx_, static_cast<std::uint8_t>(o.port), o.gid_index, &t->gid_) != 0)
      return make_error(
          fmt::format("verbs: {}:{} has no GID index {}", o.device, o.port, o.gid_index), 2);
    t->pd_ = verbs.alloc_pd(t->ctx_);
    if (!t->pd_)
      return make_error(
          fmt::format("verbs: ibv_alloc_pd on {}: {}", o.device, std::strerror(errno)), 1);
    t->cq_ = verbs.create_cq(t->ctx_, 4 * kMaxOutstanding, nullptr, nullptr, 0);
    if (!t->cq_)
      return make_error(
          fmt::format("verbs: ibv_create_cq on {}: {}", o.device, std::strerror(errno)), 1);
    return std::unique_ptr<Transport>(std::move(t));
  }

  std::string kind() const override { return "verbs"; }
  std::string description() const override {
    return fmt::format("verbs {}:{} gid {}", opts_.device, opts_.port, opts_.gid_index);
  }

  Result<std::string> local_blob(int peer) override {
    Peer& p = peers_[peer];
    if (!p.qp) {
      ibv_qp_init_attr init{};
      init.send_cq = cq_;
      init.recv_cq = cq_;
      init.qp_type = IBV_QPT_RC;
      init.cap.max_send_wr = kMaxOutstanding;
      init.cap.max_recv_wr = 1;
      init.cap.max_send_sge = 1;
      init.cap.max_recv_sge = 1;
      p.qp = verbs_.create_qp(pd_, &init);
      if (!p.qp)
        return make_error(
            fmt::format("verbs: ibv_create_qp for rank {}: {}", peer, std::strerror(errno)), 1);
      auto t = qp_reset_to_init(static_cast<std::uint8_t>(opts_.port), kAccess);
      if (verbs_.modify_qp(p.qp, &t.attr, t.mask) != 0)
        return make_error(fmt::format("verbs: QP for rank {} RESET->INIT on {}:{}: {}", peer,
                                      opts_.device, opts_.port, std::strerror(errno)),
                          1);
      std::random_device rd;
      p.local.qp_number = p.qp->qp_num;
      p.local.psn = rd() & 0xffffff;
      p.local.lid = port_attr_.lid;
      p.local.port = static_cast<std::uint8_t>(opts_.port);
      p.local.gid_index = static_cast<std::uint8_t>(opts_.gid_index);
      std::memcpy(p.local.gid.data(), gid_.raw, 16);
      p.local.mtu = static_cast<std::uint8_t>(port_attr_.active_mtu);
      p.local.roce = port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET;
    }
    return serialize(p.local);
  }

  Status connect(int peer, std::string_view blob) override {
    auto it = peers_.find(peer);
    if (it == peers_.end() || !it->second.qp)
      return make_error(
          fmt::format("verbs: no QP made for rank {} (publish local_blob first)", peer), 1);
    Peer& p = it->second;
    auto remote = parse_qp_info(blob, peer, "qp blob");
    if (!remote) return remote.error();
    auto rtr = qp_init_to_rtr(p.local, *remote);
    if (verbs_.modify_qp(p.qp, &rtr.attr, rtr.mask) != 0)
      return make_error(fmt::format("verbs: {}:{} cannot reach rank {} (QP INIT->RTR: {})",
                                    opts_.device, opts_.port, peer, std::strerror(errno)),
                        3);
    auto rts = qp_rtr_to_rts(p.local, QpTimeouts{opts_.qp_timeout});
    if (verbs_.modify_qp(p.qp, &rts.attr, rts.mask) != 0)
      return make_error(fmt::format("verbs: {}:{} QP to rank {} RTR->RTS: {}", opts_.device,
                                    opts_.port, peer, std::strerror(errno)),
                        3);
    p.connected = true;
    return ok_status();
  }

  Result<LocalMemory> register_memory(void* address, std::size_t bytes, MemoryKind kind) override {
    ibv_mr* mr = nullptr;
    if (kind == MemoryKind::cuda) {
      auto dmabuf = register_dmabuf(address, bytes);
      if (!dmabuf) return dmabuf.error();
      mr = *dmabuf;
    } else {
      mr = verbs_.reg_mr(pd_, address, bytes, kAccess);
      if (!mr)
        return make_error(fmt::format("verbs: ibv_reg_mr of {} bytes on {}: {} (check ulimit -l)",
                                      bytes, opts_.device, std::strerror(errno)),
                          1);
    }
    std::string key(4, '\0');
    std::memcpy(key.data(), &mr->rkey, 4);
    std::shared_ptr<void> handle(
        mr, [dereg = verbs_.dereg_mr](void* m) { dereg(static_cast<ibv_mr*>(m)); });
    return LocalMemory{address, bytes, kind, key, handle};
  }

  // Page-aligned host memory registered here. The handle owns both (the registration goes
  // before the memory) but keeps pointing at the ibv_mr, where write() finds the lkey; the
  // Transport default would hide the MR behind the memory block.
  Result<LocalMemory> allocate_memory(std::size_t bytes) override {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t rounded = std::max(page, (bytes + page - 1) / page * page);
    void* memory = std::aligned_alloc(page, rounded);
    if (!memory)
      return make_error(fmt::format("verbs: cannot allocate {} bytes on {}", bytes, opts_.device),
                        1);
    auto m = register_memory(memory, bytes, MemoryKind::host);
    if (!m) {
      std::free(memory);
      return m.error();
    }
    struct Allocation {
      std::shared_ptr<void> registration;
      void* memory = nullptr;
      ~Allocation() {
        registration.reset();
        std::free(memory);
      }
    };
    auto owner = std::make_shared<Allocation>();
    owner->memory = memory;
    void* mr = m->handle.get();
    owner->registration = std::move(m->handle);
    m->handle = std::shared_ptr<void>(owner, mr);  // aliasing: owns `owner`, points at the MR
    return m;
  }

  Status write(int peer, const LocalMemory& local, std::size_t offset, const RemoteMemory& remote,
               std::size_t remote_offset, std::size_t bytes) override {
    auto it = peers_.find(peer);
    if (it == peers_.end() || !it->second.connected)
      return make_error(fmt::format("verbs: rank {} is not connected", peer), 1);
    Peer& p = it->second;
    if (!p.failure.empty()) return make_error(p.failure, 3);
    if (remote.packed_key.size() != 4 || offset + bytes > local.bytes ||
        remote_offset + bytes > remote.bytes)
      return make_error(fmt::format("verbs: bad write of {} bytes to rank {}", bytes, peer), 1);
    // The handle must be one of our registrations covering the source (a wrapped handle that
    // no longer points at the ibv_mr gave the kernel a garbage lkey: "local QP operation error").
    const auto* mr = static_cast<const ibv_mr*>(local.handle.get());
    const auto src = reinterpret_cast<std::uintptr_t>(local.address) + offset;
    if (!mr || mr->pd != pd_ || src < reinterpret_cast<std::uintptr_t>(mr->addr) ||
        src + bytes > reinterpret_cast<std::uintptr_t>(mr->addr) + mr->length)
      return make_error(fmt::format("verbs: source of a write to rank {} is not memory registered "
                                    "on {}:{} by this transport",
                                    peer, opts_.device, opts_.port),
                        1);
    if (p.outstanding >= kMaxOutstanding) {
      // A full send queue waits for one completion, but not forever: the QP's retries should
      // end a dead path with an error CQE, yet Soft-RoCE on Linux 6.1 was seen never to
      // complete writes whose packets went nowhere (the rdma suite's unreachable peer).
      const auto deadline = std::chrono::steady_clock::now() + completion_wait();
      while (p.outstanding >= kMaxOutstanding && p.failure.empty()) {
        if (std::chrono::steady_clock::now() > deadline)
          return make_error(
              fmt::format("verbs: rank {} on {}:{} acknowledged none of {} writes "
                          "within {} ms: the path to it is dead",
                          peer, opts_.device, opts_.port, p.outstanding, completion_wait().count()),
              3);
        poll();
      }
    }
    if (!p.failure.empty()) return make_error(p.failure, 3);
    ibv_sge sge{};
    sge.addr = src;
    sge.length = static_cast<std::uint32_t>(bytes);
    sge.lkey = mr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = static_cast<std::uint64_t>(peer);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote.address + remote_offset;
    std::memcpy(&wr.wr.rdma.rkey, remote.packed_key.data(), 4);
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(p.qp, &wr, &bad); rc != 0)
      return make_error(fmt::format("verbs: post RDMA WRITE to rank {} on {}:{}: {}", peer,
                                    opts_.device, opts_.port, std::strerror(rc)),
                        3);
    ++p.outstanding;
    return ok_status();
  }

  Status flush(int peer, std::chrono::milliseconds timeout) override {
    auto it = peers_.find(peer);
    if (it == peers_.end())
      return make_error(fmt::format("verbs: rank {} is not connected", peer), 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (it->second.outstanding > 0 && it->second.failure.empty()) {
      if (std::chrono::steady_clock::now() > deadline)
        return make_error(
            fmt::format("verbs: writes to rank {} on {}:{} not acknowledged within {} ms", peer,
                        opts_.device, opts_.port, timeout.count()),
            3);
      poll();
    }
    if (!it->second.failure.empty()) return make_error(it->second.failure, 3);
    return ok_status();
  }

  void progress() override { poll(); }

  // How long one completion may take: 16 x the QP's worst case (4.096 us x 2^timeout per try,
  // retry_count + 1 tries), at least a second.
  std::chrono::milliseconds completion_wait() const {
    const double worst_ms = 4.096e-3 *
                            static_cast<double>(1ull << std::min<int>(opts_.qp_timeout, 31)) *
                            (QpTimeouts{}.retry_count + 1);
    return std::chrono::milliseconds(
        std::max<long long>(1000, static_cast<long long>(16 * worst_ms)));
  }

  bool target_needs_progress() const override { return false; }

  // A failed completion on the QP to `peer` (retry counter exceeded: the path is dead) ends a
  // wait for that peer at once.
  Status check_peer(int peer) override {
    poll();
    auto it = peers_.find(peer);
    if (it != peers_.end() && !it->second.failure.empty()) return make_error(it->second.failure, 3);
    return ok_status();
  }

 private:
  void poll() {
    ibv_wc wc[16];
    int n = ibv_poll_cq(cq_, 16, wc);
    for (int i = 0; i < n; ++i) {
      auto it = peers_.find(static_cast<int>(wc[i].wr_id));
      if (it == peers_.end()) continue;
      --it->second.outstanding;
      if (wc[i].status != IBV_WC_SUCCESS && it->second.failure.empty())
        it->second.failure =
            fmt::format("verbs: RDMA WRITE from rank {} to rank {} on {}:{} failed: {}", rank_,
                        it->first, opts_.device, opts_.port, verbs_.wc_status_str(wc[i].status));
    }
  }

  Result<ibv_mr*> register_dmabuf(void* address, std::size_t bytes) {
    if (!cuda_) cuda_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    auto get_handle =
        cuda_ && verbs_.reg_dmabuf_mr
            ? reinterpret_cast<CuGetHandle>(dlsym(cuda_, "cuMemGetHandleForAddressRange"))
            : nullptr;
    if (get_handle) {
      const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      const auto start = reinterpret_cast<std::uintptr_t>(address) & ~(page - 1);
      const auto end = (reinterpret_cast<std::uintptr_t>(address) + bytes + page - 1) & ~(page - 1);
      int fd = -1;
      int rc = get_handle(&fd, start, end - start, 1, 1);  // PCIe mapping type first (CUDA >= 12.8)
      if (rc != 0) rc = get_handle(&fd, start, end - start, 1, 0);
      if (rc == 0 && fd >= 0) {
        ibv_mr* mr =
            verbs_.reg_dmabuf_mr(pd_, reinterpret_cast<std::uintptr_t>(address) - start, bytes,
                                 reinterpret_cast<std::uintptr_t>(address), fd, kAccess);
        const int err = errno;
        close(fd);
        if (mr) return mr;
        if (err != EOPNOTSUPP && err != EPROTONOSUPPORT)
          return make_error(fmt::format("verbs: dma-buf registration on {}: {}", opts_.device,
                                        std::strerror(err)),
                            1);
      }
    }
    // peermem: the kernel module lets ibv_reg_mr pin GPU pages directly.
    ibv_mr* mr = verbs_.reg_mr(pd_, address, bytes, kAccess);
    if (mr) return mr;
    return make_error(
        fmt::format("verbs: GPU memory cannot be registered on {} (no dma-buf support and no "
                    "nvidia_peermem: {}); use host staging",
                    opts_.device, std::strerror(errno)),
        2);
  }

  const detail::VerbsApi& verbs_;
  int rank_ = 0;
  VerbsTransportOptions opts_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_port_attr port_attr_{};
  ibv_gid gid_{};
  void* cuda_ = nullptr;
  std::map<int, Peer> peers_;
};

}  // namespace

Result<std::unique_ptr<Transport>> open_verbs_transport(int rank,
                                                        const VerbsTransportOptions& options) {
  return VerbsTransport::open(rank, options);
}

}  // namespace topolaunch::rdma
