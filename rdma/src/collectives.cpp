// Host collectives on a UcxMesh. Algorithms (all ranks call in the same order; `seq_` numbers
// the operation so its messages can never match another operation's):
//   barrier:    dissemination (log2 n rounds of send right-by-2^k, receive left-by-2^k)
//   broadcast:  a chain from the root, cut into chunk_bytes pieces so the chain pipelines
//   reduce-scatter: a ring pass that leaves rank r the sum of segment r (each rank sends
//               (n-1)/n of the buffer); segments are moved in chunk_bytes pieces, received into
//               one scratch piece and added in place
//   all-gather: a ring pass of the segments, received straight into place
//   all-reduce: the two in turn (each rank sends 2(n-1)/n of the buffer: bus bandwidth =
//               algorithm bandwidth * 2(n-1)/n)
#include "topolaunch/rdma/collectives.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cstring>
#include <vector>

#include "ucx_mesh.hpp"

namespace topolaunch::rdma {

struct HostCommunicator::Impl {
  std::unique_ptr<detail::UcxMesh> mesh;
  CommunicatorOptions options;
  std::uint32_t seq = 0;
  std::vector<char> scratch;

  int rank() const { return mesh->rank(); }
  int world() const { return mesh->world_size(); }

  // One exchange step: receive `recv_bytes` from `from` and send `send_bytes` to `to`.
  Status exchange(int to, const void* send_buf, std::size_t send_bytes, int from, void* recv_buf,
                  std::size_t recv_bytes, std::uint32_t step) {
    std::vector<detail::UcxMesh::Pending> pending;
    // Empty pieces are skipped on both sides: the sender's piece is the receiver's piece.
    if (from >= 0 && recv_bytes > 0)
      pending.push_back(
          {mesh->recv(from, recv_buf, recv_bytes, detail::UcxMesh::make_tag(from, seq, step)), from,
           "recv"});
    if (to >= 0 && send_bytes > 0)
      pending.push_back(
          {mesh->send(to, send_buf, send_bytes, detail::UcxMesh::make_tag(rank(), seq, step)), to,
           "send"});
    return mesh->wait_all(std::move(pending), options.timeout);
  }

  // Segment s of `count` elements: [count*s/n, count*(s+1)/n) (kernels/cpu/communicator.hpp
  // cuts buffers the same way). Rank r owns segment r.
  std::size_t seg_begin(std::size_t count, int s) const {
    return count * static_cast<std::size_t>(s) / static_cast<std::size_t>(world());
  }
  int seg(int s) const { return ((s % world()) + world()) % world(); }

  // One ring pass of n - 1 steps; at step s rank r sends segment send_of(s) to the right and
  // receives segment recv_of(s) from the left, in pieces of chunk_bytes, each received piece
  // added into place (`add`) or received straight into place (all-gather).
  template <class Element, class Add, class SendOf, class RecvOf>
  Status ring_pass(Element* data, std::size_t count, SendOf send_of, RecvOf recv_of, bool reduce,
                   Add add) {
    const int n = world();
    ++seq;
    if (n == 1 || count == 0) return ok_status();
    const int right = (rank() + 1) % n;
    const int left = (rank() + n - 1) % n;
    auto seg_count = [&](int s) { return seg_begin(count, s + 1) - seg_begin(count, s); };
    const std::size_t piece = std::max<std::size_t>(1, options.chunk_bytes / sizeof(Element));
    if (reduce) scratch.resize(std::min(piece, count) * sizeof(Element));
    Element* tmp = reinterpret_cast<Element*>(scratch.data());
    // Every rank uses the same piece count per ring step, so step numbers (tags) agree.
    const std::size_t pieces = (seg_count(n - 1) + piece - 1) / piece;  // the largest segment
    std::uint32_t step = 0;
    for (int s = 0; s < n - 1; ++s) {
      const int send_seg = send_of(s), recv_seg = recv_of(s);
      for (std::size_t p = 0; p < pieces; ++p, ++step) {
        const std::size_t so = std::min(seg_count(send_seg), p * piece);
        const std::size_t sn = std::min(piece, seg_count(send_seg) - so);
        const std::size_t ro = std::min(seg_count(recv_seg), p * piece);
        const std::size_t rn = std::min(piece, seg_count(recv_seg) - ro);
        Element* dst = data + seg_begin(count, recv_seg) + ro;
        if (auto st = exchange(right, data + seg_begin(count, send_seg) + so, sn * sizeof(Element),
                               left, reduce ? tmp : dst, rn * sizeof(Element), step);
            !st)
          return st;
        if (reduce)
          for (std::size_t i = 0; i < rn; ++i) dst[i] = add(dst[i], tmp[i]);
      }
    }
    return ok_status();
  }

  // Reduce-scatter: segment c is summed from rank c + 1 around to rank c, which ends owning it
  // (at step s rank r sends segment r - s - 1 and adds segment r - s - 2).
  template <class Element, class Add>
  Status ring_reduce_scatter(Element* data, std::size_t count, Add add) {
    const int r = rank();
    return ring_pass(
        data, count, [&](int s) { return seg(r - s - 1); }, [&](int s) { return seg(r - s - 2); },
        true, add);
  }
  // All-gather: at step s rank r passes on segment r - s (its own first), receives r - s - 1.
  template <class Element>
  Status ring_allgather(Element* data, std::size_t count) {
    const int r = rank();
    return ring_pass(
        data, count, [&](int s) { return seg(r - s); }, [&](int s) { return seg(r - s - 1); },
        false, [](Element a, Element) { return a; });
  }
  template <class Element, class Add>
  Status ring_allreduce(Element* data, std::size_t count, Add add) {
    if (auto st = ring_reduce_scatter(data, count, add); !st) return st;
    return ring_allgather(data, count);
  }
};

HostCommunicator::HostCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostCommunicator::HostCommunicator(HostCommunicator&&) noexcept = default;
HostCommunicator& HostCommunicator::operator=(HostCommunicator&&) noexcept = default;
HostCommunicator::~HostCommunicator() = default;

Result<HostCommunicator> HostCommunicator::create(wireup::KvStore& store,
                                                  const CommunicatorOptions& options) {
  if (store.size() > 0xffff)
    return make_error(
        fmt::format("host collectives support up to 65535 ranks, got {}", store.size()));
  if (options.chunk_bytes < 64)
    return make_error(
        fmt::format("host collectives: chunk_bytes {} is too small (>= 64)", options.chunk_bytes));
  detail::UcxSettings settings;
  settings.transports = options.transports;
  settings.net_devices = options.net_devices;
  settings.keepalive = options.keepalive;
  settings.rma = false;
  auto mesh = detail::UcxMesh::connect(store, settings, options.name, options.timeout);
  if (!mesh) return mesh.error();
  auto impl = std::make_unique<Impl>();
  impl->mesh = std::move(*mesh);
  impl->options = options;
  HostCommunicator comm(std::move(impl));
  // Endpoints wire up lazily: one barrier makes every connection real before create() returns.
  if (auto st = comm.barrier(); !st) return st.error();
  return comm;
}

int HostCommunicator::rank() const { return impl_->rank(); }
int HostCommunicator::world_size() const { return impl_->world(); }

std::string HostCommunicator::transport_summary() const {
  if (impl_->world() < 2) return "self";
  return impl_->mesh->lanes((impl_->rank() + 1) % impl_->world());
}

Status HostCommunicator::barrier() {
  auto& m = *impl_;
  ++m.seq;
  const int n = m.world();
  char token = 0, sink = 0;
  std::uint32_t step = 0;
  for (int k = 1; k < n; k <<= 1, ++step) {
    if (auto st = m.exchange((m.rank() + k) % n, &token, 1, (m.rank() - k + n) % n, &sink, 1, step);
        !st)
      return st;
  }
  return ok_status();
}

Status HostCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  auto& m = *impl_;
  const int n = m.world();
  if (root < 0 || root >= n)
    return make_error(fmt::format("broadcast: root {} is not a rank (0..{})", root, n - 1));
  ++m.seq;
  if (n == 1 || bytes == 0) return ok_status();
  const int pos = (m.rank() - root + n) % n;  // position in the chain starting at the root
  const int next = pos == n - 1 ? -1 : (m.rank() + 1) % n;
  const int prev = pos == 0 ? -1 : (m.rank() - 1 + n) % n;
  char* p = static_cast<char*>(data);
  std::uint32_t step = 0;
  for (std::size_t off = 0; off < bytes; off += m.options.chunk_bytes, ++step) {
    const std::size_t len = std::min(m.options.chunk_bytes, bytes - off);
    if (prev >= 0 && len > 0)
      if (auto st = m.exchange(-1, nullptr, 0, prev, p + off, len, step); !st) return st;
    if (next >= 0)
      if (auto st = m.exchange(next, p + off, len, -1, nullptr, 0, step); !st) return st;
  }
  return ok_status();
}

Status HostCommunicator::allreduce_sum(float* data, std::size_t count) {
  return impl_->ring_allreduce(data, count, [](float a, float b) { return a + b; });
}

Status HostCommunicator::reduce_scatter_sum(float* data, std::size_t count) {
  return impl_->ring_reduce_scatter(data, count, [](float a, float b) { return a + b; });
}

Status HostCommunicator::allgather(void* data, std::size_t count, std::size_t element_bytes) {
  switch (element_bytes) {
    case 1:
      return impl_->ring_allgather(static_cast<std::uint8_t*>(data), count);
    case 2:
      return impl_->ring_allgather(static_cast<std::uint16_t*>(data), count);
    case 4:
      return impl_->ring_allgather(static_cast<std::uint32_t*>(data), count);
    case 8:
      return impl_->ring_allgather(static_cast<std::uint64_t*>(data), count);
  }
  return make_error(fmt::format("allgather: elements of {} bytes (1, 2, 4 or 8)", element_bytes));
}

Status HostCommunicator::allreduce_sum_bf16(std::uint16_t* data, std::size_t count) {
  return impl_->ring_allreduce(data, count, [](std::uint16_t a, std::uint16_t b) {
    return float_to_bf16(bf16_to_float(a) + bf16_to_float(b));
  });
}

}  // namespace topolaunch::rdma
