// The TCP store's wire protocol from both ends, over loopback in this process.
//
// Byte 0 (mode) < 0x80: the server. A fresh TcpStoreServer per input (so no state crosses
// inputs); the harness connects and, by mode bits 1-2, either sends the rest raw from the first
// byte (unauthenticated: the auth frame itself is fuzzed) or first authenticates as rank -1, 0
// or a relay with the right secret, then sends the rest as frames of an authenticated client.
// Bit 3 picks world size 1 or 2. Then it half-closes and reads until the server closes: a store
// that keeps a half-closed connection open forever is a hang, reported like a crash.
//
// Byte 0 >= 0x80: the client. A listening socket answers StoreConnection::open's connection
// with the rest (what an impostor or a broken store could send during the handshake).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>

#include "auth.hpp"
#include "connection.hpp"
#include "frame.hpp"
#include "fuzz_check.hpp"
#include "net.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

using namespace topolaunch;
using namespace topolaunch::wireup;

namespace {

constexpr const char* kSecret = "fuzz-secret";
constexpr int kCloseTimeoutMs = 10000;  // far above any refusal path; a hang otherwise

// libFuzzer's timer (SIGALRM, every second) interrupts blocking calls: net:: retries on EINTR.
int connect_loopback(std::uint16_t port) {
  auto where = net::parse_host_port("127.0.0.1:" + std::to_string(port), "fuzz");
  fuzz::require(where.ok(), "bad loopback address");
  auto fd = net::connect_tcp(*where, net::Clock::now() + std::chrono::seconds(10));
  fuzz::require(fd.ok(), "cannot connect to the store",
                fd ? std::string_view{} : std::string_view(fd.error().message));
  return fd->release();
}

void send_bytes(int fd, std::span<const std::byte> data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the peer refused and closed: what it read is what counts
    data = data.subspan(static_cast<std::size_t>(n));
  }
}

// Reads until the peer closes; false when it does not within kCloseTimeoutMs.
bool drain_until_closed(int fd) {
  std::byte buf[4096];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kCloseTimeoutMs);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
  }
}

// Reads one frame from the server (blocking); false on EOF or a bad frame.
bool read_frame(int fd, proto::Op& op, Bytes& payload) {
  const auto deadline = net::Clock::now() + std::chrono::seconds(10);
  Bytes header(proto::kHeaderBytes);
  if (!net::recv_exact(fd, header, deadline)) return false;
  auto decoded = proto::decode_header(header, 1 << 20);
  if (!decoded) return false;
  op = decoded->op;
  payload.assign(decoded->payload_bytes, std::byte{0});
  return net::recv_exact(fd, payload, deadline).ok();
}

void fuzz_server(std::uint8_t mode, std::span<const std::byte> rest) {
  TcpStoreServerOptions options;
  options.secret = kSecret;
  options.world_size = (mode & 0x08) ? 2 : 1;
  options.max_value_bytes = 1 << 16;
  options.log = [](std::string_view line) { fuzz::require_one_line(line); };
  auto server = TcpStoreServer::start(options);
  fuzz::require(server.ok(), "the store does not start",
                server ? std::string_view{} : std::string_view(server.error().message));
  const int fd = connect_loopback((*server)->port());
  const int who = (mode >> 1) & 3;  // 0: raw, 1: rank -1, 2: rank 0, 3: a relay
  if (who != 0) {
    proto::Op op;
    Bytes challenge;
    fuzz::require(read_frame(fd, op, challenge) && op == proto::Op::challenge, "no challenge");
    proto::PayloadReader in(challenge);
    auto nonce = in.bytes();
    fuzz::require(nonce.has_value(), "a challenge without a nonce");
    const std::int64_t rank = who == 1 ? -1 : who == 2 ? 0 : kRelayRank;
    const Bytes client_nonce(proto::kNonceBytes, std::byte{7});
    proto::PayloadWriter hello;
    hello.i64(rank)
        .i64(options.world_size)
        .bytes(client_nonce)
        .bytes(auth::client_proof(kSecret, *nonce, rank, options.world_size));
    send_bytes(fd, proto::encode_frame(proto::Op::auth, hello.data()));
    Bytes reply;
    fuzz::require(read_frame(fd, op, reply) && op == proto::Op::auth_ok,
                  "the right secret was not accepted");
  }
  send_bytes(fd, rest);
  ::shutdown(fd, SHUT_WR);
  fuzz::require(drain_until_closed(fd), "the store kept a half-closed connection open");
  // Reset rather than close: no TIME_WAIT entry per input (thousands a second would use up the
  // ephemeral ports).
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  ::close(fd);
  (*server)->stop();
}

void fuzz_client(std::span<const std::byte> rest) {
  static const int listener = [] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fuzz::require(fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                      ::listen(fd, 16) == 0,
                  "cannot listen on loopback", std::strerror(errno));
    return fd;
  }();
  const std::uint16_t port = net::local_port(listener);
  std::thread impostor([&] {
    int fd;
    do {
      fd = ::accept(listener, nullptr, nullptr);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return;
    send_bytes(fd, rest);
    ::shutdown(fd, SHUT_WR);
    drain_until_closed(fd);
    ::close(fd);
  });
  StoreConnectionOptions options;
  options.address = "127.0.0.1:" + std::to_string(port);
  options.secret = kSecret;
  options.rank = 0;
  options.world_size = 1;
  options.connect_timeout = milliseconds(5000);
  options.io_timeout = milliseconds(5000);
  auto connection = StoreConnection::open(options);
  // Only a store that knows the secret can prove it; the input cannot.
  fuzz::require(!connection.ok(), "the client accepted a store that does not know the secret");
  fuzz::require_one_line(connection.error().message);
  impostor.join();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  if (data[0] & 0x80) {
    fuzz_client(rest);
  } else {
    fuzz_server(data[0], rest);
  }
  return 0;
}
