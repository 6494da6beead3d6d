#include "connection.hpp"

#include <sys/socket.h>

#include <algorithm>

#include "auth.hpp"

namespace topolaunch::wireup {
namespace {

using net::Clock;
using proto::Op;

// Replies can carry a whole value; the server's own limit is far lower (max_value_bytes). Until
// the server has proved the secret its frames are held to 64 KiB (a challenge, an auth_ok or a
// refusal naming a relay's ranks), so that an impostor cannot make the client allocate and zero
// 2 GiB with one header.
constexpr std::size_t kMaxReplyPayload = std::size_t{1} << 31;
constexpr std::size_t kMaxHandshakePayload = std::size_t{64} << 10;

// A message from the server, as it may go into this process's error line: printable ASCII only
// ('?' otherwise), at most 200 characters.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 200)) out += (c >= 0x20 && c <= 0x7e) ? c : '?';
  if (text.size() > 200) out += "...";
  return out;
}
// A blocking request's reply may arrive this long after its own timeout (server loop latency).
constexpr milliseconds kReplyGrace{5000};
// Longer timeouts are taken as "forever" (a year), keeping deadline arithmetic in range.
constexpr milliseconds kLongestWait{365LL * 24 * 3600 * 1000};

}  // namespace

Error StoreConnection::fail(std::string_view what) const {
  return make_error("wireup tcp store " + options_.address + ": " + std::string(what));
}

void StoreConnection::interrupt() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

Result<StoreConnection::Frame> StoreConnection::read_frame(Clock::time_point deadline,
                                                           std::size_t max_payload) {
  Bytes header(proto::kHeaderBytes);
  if (auto r = net::recv_exact(fd_.get(), header, deadline); !r) return r.error();
  auto decoded = proto::decode_header(header, max_payload);
  if (!decoded) return decoded.error();
  Frame frame{decoded->op, Bytes(decoded->payload_bytes)};
  if (auto r = net::recv_exact(fd_.get(), frame.payload, deadline); !r) return r.error();
  return frame;
}

Result<Bytes> StoreConnection::request(Op op, std::span<const std::byte> payload,
                                       milliseconds blocking_for) {
  if (!broken_.empty())
    return fail(std::string(proto::op_name(op)) + ": connection unusable: " + broken_);
  blocking_for = std::min(blocking_for, kLongestWait);  // milliseconds::max() must not overflow
  auto deadline = Clock::now() + options_.io_timeout + blocking_for;
  auto on_io_error = [&](const Error& e) {
    broken_ = e.message;
    fd_.reset();
    return fail(std::string(proto::op_name(op)) + ": " + e.message);
  };
  if (auto r = net::send_all(fd_.get(), proto::encode_frame(op, payload), deadline); !r) {
    return on_io_error(r.error());
  }
  auto reply = read_frame(deadline + (blocking_for.count() > 0 ? kReplyGrace : milliseconds(0)),
                          kMaxReplyPayload);
  if (!reply) return on_io_error(reply.error());
  if (reply->op == Op::error) {
    proto::PayloadReader in(reply->payload);
    auto message = in.str();
    return fail(message ? printable(*message) : "malformed error reply");
  }
  if (reply->op != Op::ok)
    return on_io_error(make_error("unexpected reply " + std::string(proto::op_name(reply->op))));
  return std::move(reply->payload);
}

Status StoreConnection::handshake(Clock::time_point deadline) {
  auto challenge = read_frame(deadline, kMaxHandshakePayload);
  if (!challenge) return fail("handshake: " + challenge.error().message);
  proto::PayloadReader in(challenge->payload);
  auto server_nonce = in.bytes();
  if (challenge->op != Op::challenge || !server_nonce)
    return fail("handshake: not a topolaunch store");
  auto client_nonce = auth::random_nonce();
  proto::PayloadWriter hello;
  hello.i64(options_.rank)
      .i64(options_.world_size)
      .bytes(client_nonce)
      .bytes(
          auth::client_proof(options_.secret, *server_nonce, options_.rank, options_.world_size));
  if (auto r = net::send_all(fd_.get(), proto::encode_frame(Op::auth, hello.data()), deadline);
      !r) {
    return fail("handshake: " + r.error().message);
  }
  auto reply = read_frame(deadline, kMaxHandshakePayload);
  if (!reply) return fail("handshake: " + reply.error().message);
  proto::PayloadReader answer(reply->payload);
  if (reply->op == Op::error) {
    auto message = answer.str();
    return fail("refused: " + (message ? printable(*message) : std::string("no reason given")));
  }
  auto server_world_size = answer.i64();
  auto server_mac = answer.bytes();
  auto server_max_value = answer.u64();
  if (reply->op != Op::auth_ok || !server_world_size || !server_mac)
    return fail("handshake: malformed reply");
  if (!auth::equal_constant_time(auth::server_proof(options_.secret, client_nonce), *server_mac)) {
    return fail("the server does not know the job secret (a different job's store on this port?)");
  }
  world_size_ = static_cast<int>(*server_world_size);
  max_value_bytes_ = server_max_value ? *server_max_value : max_value_bytes_;
  return ok_status();
}

Result<std::unique_ptr<StoreConnection>> StoreConnection::open(StoreConnectionOptions options) {
  if (options.secret.empty())
    return make_error("wireup tcp store: empty secret (set TOPOLAUNCH_STORE_SECRET)");
  auto where = net::parse_host_port(options.address, "store address");
  if (!where) return where.error();
  auto deadline = Clock::now() + options.connect_timeout;
  auto fd = net::connect_tcp(*where, deadline);
  if (!fd) return make_error("wireup tcp store: " + fd.error().message);
  std::unique_ptr<StoreConnection> connection(new StoreConnection());
  connection->options_ = std::move(options);
  connection->fd_ = std::move(*fd);
  auto handshake_deadline = std::max(deadline, Clock::now() + connection->options_.io_timeout);
  if (auto r = connection->handshake(handshake_deadline); !r) return r.error();
  return connection;
}

}  // namespace topolaunch::wireup
