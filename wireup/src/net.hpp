// Private: sockets with RAII and deadlines (POSIX).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup::net {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
};
// "host:port", "[v6addr]:port". what names the source in the error (e.g. TOPOLAUNCH_STORE_ADDR).
Result<HostPort> parse_host_port(std::string_view text, std::string_view what);

Result<Fd> listen_tcp(const HostPort& where, int backlog);  // non-blocking listener
std::uint16_t local_port(int fd);
// Retries refused/unreachable connections until the deadline (the server may start later).
Result<Fd> connect_tcp(const HostPort& where, Clock::time_point deadline);

void set_nonblocking(int fd);
// Blocking-with-deadline I/O on a blocking socket. Errors say what happened ("timed out",
// "closed by peer", strerror).
Status send_all(int fd, std::span<const std::byte> data, Clock::time_point deadline);
Status recv_exact(int fd, std::span<std::byte> data, Clock::time_point deadline);

}  // namespace topolaunch::wireup::net
