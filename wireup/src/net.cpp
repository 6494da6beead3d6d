#include "net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

namespace topolaunch::wireup::net {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

int millis_until(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000 ? 1'000'000 : static_cast<int>(left);
}

// Waits for events on fd until the deadline; false on timeout.
Result<bool> wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, millis_until(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return make_error("poll: " + errno_text(errno));
  }
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

Result<bool> resolve(const HostPort& where, int flags, AddrInfoList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  auto port = std::to_string(where.port);
  int rc = getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), port.c_str(), &hints,
                       &out.head);
  if (rc != 0) return make_error("cannot resolve host '" + where.host + "': " + gai_strerror(rc));
  return true;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<HostPort> parse_host_port(std::string_view text, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return make_error(std::string(what) + "=" + std::string(text) + ": " + std::string(why) +
                      " (expected host:port, e.g. 10.0.0.1:29400)");
  };
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad("no host:port");
  std::string_view host = text.substr(0, colon);
  std::string_view port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return bad("port is not a number in 1..65535");
  }
  return HostPort{std::string(host), static_cast<std::uint16_t>(port)};
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

Result<Fd> listen_tcp(const HostPort& where, int backlog) {
  AddrInfoList addrs;
  if (auto r = resolve(where, AI_PASSIVE, addrs); !r) return r.error();
  std::string last_error = "no address";
  for (addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last_error = errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one,
                 sizeof one);  // TIME_WAIT, not a live owner
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      int err = errno;
      if (err == EADDRINUSE) {
        return make_error("wireup tcp store: port " + std::to_string(where.port) + " on " +
                          where.host +
                          " is already in use (pick another port, or 0 for any free port)");
      }
      last_error = errno_text(err);
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      last_error = errno_text(errno);
      continue;
    }
    set_nonblocking(fd.get());
    return fd;
  }
  return make_error("wireup tcp store: cannot listen on " + where.host + ":" +
                    std::to_string(where.port) + ": " + last_error);
}

std::uint16_t local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

Result<Fd> connect_tcp(const HostPort& where, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(20);
  std::string last_error;
  do {
    AddrInfoList addrs;
    auto resolved = resolve(where, 0, addrs);
    if (!resolved) {
      last_error = resolved.error().message;
    } else {
      for (addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                       ai->ai_protocol));
        if (!fd.valid()) {
          last_error = errno_text(errno);
          continue;
        }
        int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          auto ready = wait_for(fd.get(), POLLOUT, deadline);
          if (!ready) return ready.error();
          int err = ETIMEDOUT;
          socklen_t len = sizeof err;
          if (*ready) ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (rc != 0) {
          last_error = errno_text(errno);
          continue;
        }
        ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
        int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
    }
    if (Clock::now() + pause >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  } while (Clock::now() < deadline);
  return make_error("cannot connect to " + where.host + ":" + std::to_string(where.port) + ": " +
                    last_error + " (is the store running? check TOPOLAUNCH_STORE_ADDR)");
}

Status send_all(int fd, std::span<const std::byte> data, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    auto ready = wait_for(fd, POLLOUT, deadline);
    if (!ready) return ready.error();
    if (!*ready) return make_error("timed out sending");
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return make_error("send: " + errno_text(errno));
    }
    sent += static_cast<std::size_t>(n);
  }
  return ok_status();
}

Status recv_exact(int fd, std::span<std::byte> data, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < data.size()) {
    auto ready = wait_for(fd, POLLIN, deadline);
    if (!ready) return ready.error();
    if (!*ready) return make_error("timed out waiting for the store's reply");
    ssize_t n = ::recv(fd, data.data() + got, data.size() - got, MSG_DONTWAIT);
    if (n == 0) return make_error("connection closed by the store");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return make_error("recv: " + errno_text(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  return ok_status();
}

}  // namespace topolaunch::wireup::net
