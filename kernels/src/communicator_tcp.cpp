// TCP ring all-reduce (reduce-scatter + all-gather). Each chunk is summed along the ring starting
// at one rank and then copied to all, so every rank ends with identical bits.
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

#include "topolaunch/kernels/communicator.hpp"

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
  Status all_reduce_sum(std::span<float> d) override { return reduce(d); }
  Status all_reduce_sum(std::span<double> d) override { return reduce(d); }
  Status barrier() override {
    double x = 0;
    return reduce(std::span<double>(&x, 1));
  }

 private:
  template <class T>
  Status reduce(std::span<T> data) {
    const int n = world_;
    const std::size_t count = data.size();
    auto begin = [&](int c) {
      return count * static_cast<std::size_t>(c) / static_cast<std::size_t>(n);
    };
    auto size = [&](int c) { return begin(c + 1) - begin(c); };
    std::vector<T> incoming(count / static_cast<std::size_t>(n) + 1);
    auto exchange = [&](int send_chunk, int recv_chunk, bool add) -> Status {
      bool sent = true;
      std::thread sender([&] {
        sent = send_all(next_.get(), data.data() + begin(send_chunk), size(send_chunk) * sizeof(T));
      });
      const bool got = recv_all(prev_.get(), incoming.data(), size(recv_chunk) * sizeof(T));
      sender.join();
      if (!sent || !got)
        return make_error(
            "all-reduce: rank " + std::to_string(rank_) + " lost its ring neighbour (rank " +
                std::to_string(sent ? (rank_ + n - 1) % n : (rank_ + 1) % n) + " died or closed)",
            1);
      T* dst = data.data() + begin(recv_chunk);
      if (add)
        for (std::size_t i = 0; i < size(recv_chunk); ++i) dst[i] += incoming[i];
      else
        std::memcpy(dst, incoming.data(), size(recv_chunk) * sizeof(T));
      return ok_status();
    };
    for (int s = 0; s < n - 1; ++s)
      if (auto st = exchange(((rank_ - s) % n + n) % n, ((rank_ - s - 1) % n + n) % n, true); !st)
        return st;
    for (int s = 0; s < n - 1; ++s)
      if (auto st = exchange(((rank_ + 1 - s) % n + n) % n, ((rank_ - s) % n + n) % n, false); !st)
        return st;
    return ok_status();
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

Result<std::unique_ptr<Communicator>> communicator_from_env() {
  auto env_int = [](const char* name, int fallback) -> Result<int> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 0)
      return make_error(std::string(name) + ": \"" + v + "\" is not a non-negative integer");
    return static_cast<int>(x);
  };
  // The launcher sets TOPOLAUNCH_RANK/TOPOLAUNCH_WORLD_SIZE and the torchrun names; either works.
  const bool ours = std::getenv("TOPOLAUNCH_WORLD_SIZE") != nullptr;
  auto world = env_int(ours ? "TOPOLAUNCH_WORLD_SIZE" : "WORLD_SIZE", 1);
  if (!world) return world.error();
  auto rank = env_int(ours ? "TOPOLAUNCH_RANK" : "RANK", 0);
  if (!rank) return rank.error();
  if (*world <= 1) return std::unique_ptr<Communicator>(new SingleRankCommunicator());
  if (*rank >= *world)
    return make_error("RANK " + std::to_string(*rank) + " is not below WORLD_SIZE " +
                      std::to_string(*world));
  auto port = env_int("MASTER_PORT", 0);
  if (!port) return port.error();
  if (*port == 0)
    return make_error(
        "MASTER_PORT: must be set when WORLD_SIZE > 1 (the ring uses MASTER_PORT+1+rank)");
  const char* host = std::getenv("MASTER_ADDR");
  return connect_tcp_ring(*rank, *world, host && *host ? host : "127.0.0.1", *port + 1);
}

Result<std::unique_ptr<Communicator>> communicator_for_worker() {
  const char* forced = std::getenv("TOPOLAUNCH_KERNELS_COMM");
  const std::string choice = forced ? forced : "";
  if (!choice.empty() && choice != "ucx" && choice != "tcp")
    return make_error("TOPOLAUNCH_KERNELS_COMM: \"" + choice + "\" is not one of ucx, tcp");
  const char* w = std::getenv("TOPOLAUNCH_WORLD_SIZE");
  if (w == nullptr) w = std::getenv("WORLD_SIZE");
  const bool multi = w != nullptr && std::atoi(w) > 1;
  const bool store = std::getenv("TOPOLAUNCH_STORE_ADDR") != nullptr;
  if (multi && (choice == "ucx" || (choice.empty() && store && have_ucx_communicator())))
    return connect_ucx_from_env();
  return communicator_from_env();
}

}  // namespace topolaunch::kernels
