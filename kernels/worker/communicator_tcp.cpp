// TCP ring collectives: reduce-scatter, all-gather, and all-reduce as the two in turn. Each
// segment is summed along the ring in one fixed order and then copied to all, so every rank ends
// with identical bits.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/kernels/host_communicators.hpp"

namespace topolaunch::kernels {

namespace {

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

bool send_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool recv_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

class TcpRing final : public Communicator {
 public:
  TcpRing(int rank, int world, Fd next, Fd prev)
      : rank_(rank), world_(world), next_(std::move(next)), prev_(std::move(prev)) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Status all_reduce_sum(std::span<float> d) override { return all_reduce(d); }
  Status all_reduce_sum(std::span<double> d) override { return all_reduce(d); }
  Status reduce_scatter_sum(std::span<float> d) override { return reduce_scatter(d); }
  Status reduce_scatter_sum(std::span<double> d) override { return reduce_scatter(d); }
  Status all_gather(std::span<float> d) override { return gather(d); }
  Status all_gather(std::span<double> d) override { return gather(d); }
  Status barrier() override {
    double x = 0;
    return all_reduce(std::span<double>(&x, 1));
  }

 private:
  int segment(int s) const { return ((s % world_) + world_) % world_; }

  // One ring step: send segment `send` to the next rank while receiving segment `recv` from the
  // previous one, then add it into place (reduce-scatter) or copy it there (all-gather).
  template <class T>
  Status exchange(std::span<T> data, int send, int recv, bool add, std::vector<T>& incoming) {
    const std::size_t count = data.size();
    const std::size_t s0 = segment_begin(count, world_, send),
                      s1 = segment_begin(count, world_, send + 1);
    const std::size_t r0 = segment_begin(count, world_, recv),
                      r1 = segment_begin(count, world_, recv + 1);
    incoming.resize(r1 - r0);
    bool sent = true;
    std::thread sender(
        [&] { sent = send_all(next_.get(), data.data() + s0, (s1 - s0) * sizeof(T)); });
    const bool got = recv_all(prev_.get(), incoming.data(), (r1 - r0) * sizeof(T));
    sender.join();
    if (!sent || !got)
      return make_error(
          "all-reduce: rank " + std::to_string(rank_) + " lost its ring neighbour (rank " +
              std::to_string(sent ? (rank_ + world_ - 1) % world_ : (rank_ + 1) % world_) +
              " died or closed)",
          jobspec::exit_status::kPeerFailed);
    T* dst = data.data() + r0;
    if (add)
      for (std::size_t i = 0; i < r1 - r0; ++i) dst[i] += incoming[i];
    else if (r1 > r0)  // an empty segment (fewer values than ranks) has no data() to copy
      std::memcpy(dst, incoming.data(), (r1 - r0) * sizeof(T));
    return ok_status();
  }

  // Segment c is summed along the ring from rank c + 1 to rank c, which ends owning it: at step s
  // rank r sends segment r - s - 1 and adds segment r - s - 2 into its own.
  template <class T>
  Status reduce_scatter(std::span<T> data) {
    std::vector<T> incoming;
    for (int s = 0; s < world_ - 1; ++s)
      if (auto st = exchange(data, segment(rank_ - s - 1), segment(rank_ - s - 2), true, incoming);
          !st)
        return st;
    return ok_status();
  }
  // At step s rank r passes on segment r - s (its own first) and receives segment r - s - 1.
  template <class T>
  Status gather(std::span<T> data) {
    std::vector<T> incoming;
    for (int s = 0; s < world_ - 1; ++s)
      if (auto st = exchange(data, segment(rank_ - s), segment(rank_ - s - 1), false, incoming);
          !st)
        return st;
    return ok_status();
  }
  template <class T>
  Status all_reduce(std::span<T> data) {
    if (auto st = reduce_scatter(data); !st) return st;
    return gather(data);
  }

  int rank_, world_;
  Fd next_, prev_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> connect_tcp_ring(int rank, int world, const std::string& host,
                                                       int base_port, int timeout_ms) {
  if (world <= 1) return std::unique_ptr<Communicator>(new SingleRankCommunicator());
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(base_port + rank));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener.get(), 4) != 0)
    return make_error("all-reduce: rank " + std::to_string(rank) + " cannot listen on port " +
                          std::to_string(base_port + rank) + ": " + std::strerror(errno) +
                          " (set MASTER_PORT to a free range)",
                      1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int next = (rank + 1) % world;
  if (::getaddrinfo(host.c_str(), std::to_string(base_port + next).c_str(), &hints, &res) != 0 ||
      res == nullptr)
    return make_error("all-reduce: cannot resolve MASTER_ADDR " + host, 2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  Fd out;
  for (;;) {
    Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(s.get(), res->ai_addr, res->ai_addrlen) == 0) {
      out = std::move(s);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::freeaddrinfo(res);
      return make_error("all-reduce: rank " + std::to_string(rank) + " could not reach rank " +
                            std::to_string(next) + " at " + host + ":" +
                            std::to_string(base_port + next) + " within " +
                            std::to_string(timeout_ms) + " ms",
                        1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::freeaddrinfo(res);
  ::setsockopt(out.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  pollfd p{listener.get(), POLLIN, 0};
  const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        deadline - std::chrono::steady_clock::now())
                                        .count());
  if (::poll(&p, 1, std::max(left, 1)) != 1)
    return make_error("all-reduce: rank " + std::to_string(rank) + " was not contacted by rank " +
                          std::to_string((rank + world - 1) % world) + " in time",
                      1);
  Fd in(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (in.get() < 0)
    return make_error(std::string("all-reduce: accept failed: ") + std::strerror(errno), 1);
  ::setsockopt(in.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return std::unique_ptr<Communicator>(new TcpRing(rank, world, std::move(out), std::move(in)));
}

Result<std::unique_ptr<Communicator>> tcp_ring_from_env(int rank, int world_size) {
  if (world_size <= 1) return std::unique_ptr<Communicator>(new SingleRankCommunicator());
  auto port = env_int(jobspec::env::kMasterPort, 0, 0, 65535);
  if (!port) return port.error();
  if (*port == 0)
    return make_error(
        "MASTER_PORT: must be set when WORLD_SIZE > 1 (the ring uses MASTER_PORT+1+rank)");
  const std::string host = env_value(jobspec::env::kMasterAddr).value_or("127.0.0.1");
  return connect_tcp_ring(rank, world_size, host, *port + 1);
}

Result<std::unique_ptr<Communicator>> communicator_for_worker(int rank, int world_size) {
  const std::string choice = env_value(jobspec::env::kKernelsComm).value_or("");
  if (!choice.empty() && choice != "ucx" && choice != "tcp")
    return make_error(std::string(jobspec::env::kKernelsComm) + "=" + choice +
                      ": not one of ucx, tcp");
  const bool store = env_value(jobspec::env::kStoreAddr).has_value();
  if (world_size > 1 && (choice == "ucx" || (choice.empty() && store && have_ucx_communicator())))
    return connect_ucx_from_env();
  return tcp_ring_from_env(rank, world_size);
}

}  // namespace topolaunch::kernels
