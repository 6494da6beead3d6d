// The TCP store client: one blocking connection, one request in flight.
#include <algorithm>
#include <charconv>

#include "auth.hpp"
#include "backends.hpp"
#include "frame.hpp"
#include "net.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::wireup {
namespace {

using net::Clock;
using proto::Op;

// Replies can carry a whole value; the server's own limit is far lower (max_value_bytes).
constexpr std::size_t kMaxReplyPayload = std::size_t{1} << 31;
// Staged puts are sent in frames of about this size, below the server's frame limit.
constexpr std::size_t kCommitBatchBytes = std::size_t{8} << 20;
// A blocking request's reply may arrive this long after its own timeout (server loop latency).
constexpr milliseconds kReplyGrace{5000};
// Longer timeouts are taken as "forever" (a year), keeping deadline arithmetic in range.
constexpr milliseconds kLongestWait{365LL * 24 * 3600 * 1000};

}  // namespace

class TcpStoreClient::Impl {
 public:
  TcpStoreClientOptions options;
  net::Fd fd;
  int world_size = 0;
  std::uint64_t fence_generation = 0;
  std::vector<std::pair<std::string, Bytes>> staged;
  std::size_t staged_bytes = 0;
  std::string broken;  // non-empty: why the connection is unusable
  std::uint64_t max_value_bytes = std::uint64_t{64} << 20;  // the server's, from the handshake

  Status check_value_size(std::string_view key, std::size_t bytes) const {
    if (bytes <= max_value_bytes) return ok_status();
    return fail("value of key '" + std::string(key) + "' has " + std::to_string(bytes) +
                " bytes, above the store's limit of " + std::to_string(max_value_bytes) +
                " (TcpStoreServerOptions::max_value_bytes)");
  }

  Error fail(std::string_view what) const {
    return make_error("wireup tcp store " + options.address + ": " + std::string(what));
  }

  struct Frame {
    Op op;
    Bytes payload;
  };

  Result<Frame> read_frame(Clock::time_point deadline) {
    Bytes header(proto::kHeaderBytes);
    if (auto r = net::recv_exact(fd.get(), header, deadline); !r) return r.error();
    auto decoded = proto::decode_header(header, kMaxReplyPayload);
    if (!decoded) return decoded.error();
    Frame frame{decoded->op, Bytes(decoded->payload_bytes)};
    if (auto r = net::recv_exact(fd.get(), frame.payload, deadline); !r) return r.error();
    return frame;
  }

  // Sends one request and returns the payload of its ok reply; an error reply becomes the Error.
  Result<Bytes> request(Op op, const Bytes& payload, milliseconds blocking_for = milliseconds(0)) {
    if (!broken.empty())
      return fail(std::string(proto::op_name(op)) + ": connection unusable: " + broken);
    blocking_for = std::min(blocking_for, kLongestWait);  // milliseconds::max() must not overflow
    auto deadline = Clock::now() + options.io_timeout + blocking_for;
    auto on_io_error = [&](const Error& e) {
      broken = e.message;
      fd.reset();
      return fail(std::string(proto::op_name(op)) + ": " + e.message);
    };
    if (auto r = net::send_all(fd.get(), proto::encode_frame(op, payload), deadline); !r) {
      return on_io_error(r.error());
    }
    auto reply = read_frame(deadline + (blocking_for.count() > 0 ? kReplyGrace : milliseconds(0)));
    if (!reply) return on_io_error(reply.error());
    if (reply->op == Op::error) {
      proto::PayloadReader in(reply->payload);
      auto message = in.str();
      return fail(message ? *message : "malformed error reply");
    }
    if (reply->op != Op::ok)
      return on_io_error(make_error("unexpected reply " + std::string(proto::op_name(reply->op))));
    return std::move(reply->payload);
  }

  Status handshake(Clock::time_point deadline) {
    auto challenge = read_frame(deadline);
    if (!challenge) return fail("handshake: " + challenge.error().message);
    proto::PayloadReader in(challenge->payload);
    auto server_nonce = in.bytes();
    if (challenge->op != Op::challenge || !server_nonce)
      return fail("handshake: not a topolaunch store");
    auto client_nonce = auth::random_nonce();
    proto::PayloadWriter hello;
    hello.i64(options.rank)
        .i64(options.world_size)
        .bytes(client_nonce)
        .bytes(auth::client_proof(options.secret, *server_nonce, options.rank, options.world_size));
    if (auto r = net::send_all(fd.get(), proto::encode_frame(Op::auth, hello.data()), deadline);
        !r) {
      return fail("handshake: " + r.error().message);
    }
    auto reply = read_frame(deadline);
    if (!reply) return fail("handshake: " + reply.error().message);
    proto::PayloadReader answer(reply->payload);
    if (reply->op == Op::error) {
      auto message = answer.str();
      return fail("refused: " + (message ? *message : std::string("no reason given")));
    }
    auto server_world_size = answer.i64();
    auto server_mac = answer.bytes();
    auto server_max_value = answer.u64();
    if (reply->op != Op::auth_ok || !server_world_size || !server_mac)
      return fail("handshake: malformed reply");
    if (!auth::equal_constant_time(auth::server_proof(options.secret, client_nonce), *server_mac)) {
      return fail(
          "the server does not know the job secret (a different job's store on this port?)");
    }
    world_size = static_cast<int>(*server_world_size);
    max_value_bytes = server_max_value ? *server_max_value : max_value_bytes;
    return ok_status();
  }
};

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(TcpStoreClientOptions options) {
  if (options.secret.empty())
    return make_error("wireup tcp store: empty secret (set TOPOLAUNCH_STORE_SECRET)");
  if (options.rank < -1 || (options.rank >= 0 && options.rank >= options.world_size)) {
    return make_error("wireup tcp store: rank " + std::to_string(options.rank) + " is not in 0.." +
                      std::to_string(options.world_size - 1));
  }
  auto where = net::parse_host_port(options.address, "store address");
  if (!where) return where.error();
  auto deadline = Clock::now() + options.connect_timeout;
  auto fd = net::connect_tcp(*where, deadline);
  if (!fd) return make_error("wireup tcp store: " + fd.error().message);
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->fd = std::move(*fd);
  if (auto r = impl->handshake(std::max(deadline, Clock::now() + impl->options.io_timeout)); !r)
    return r.error();
  return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(std::move(impl)));
}

TcpStoreClient::TcpStoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreClient::~TcpStoreClient() = default;

int TcpStoreClient::rank() const { return impl_->options.rank; }
int TcpStoreClient::size() const { return impl_->world_size; }

Status TcpStoreClient::put(std::string_view key, std::span<const std::byte> value) {
  if (auto r = impl_->check_value_size(key, value.size()); !r) return r;
  impl_->staged.emplace_back(std::string(key), Bytes(value.begin(), value.end()));
  impl_->staged_bytes += key.size() + value.size();
  return ok_status();
}

Status TcpStoreClient::commit() {
  auto& staged = impl_->staged;
  std::size_t begin = 0;
  while (begin < staged.size()) {
    proto::PayloadWriter batch;
    std::size_t end = begin, bytes = 0;
    while (end < staged.size() &&
           (end == begin || bytes + staged[end].second.size() < kCommitBatchBytes)) {
      bytes += staged[end].first.size() + staged[end].second.size();
      ++end;
    }
    batch.u64(end - begin);
    for (std::size_t i = begin; i < end; ++i) batch.str(staged[i].first).bytes(staged[i].second);
    auto reply = impl_->request(Op::set_many, batch.data());
    if (!reply) return reply.error();
    begin = end;
  }
  staged.clear();
  impl_->staged_bytes = 0;
  return ok_status();
}

Status TcpStoreClient::fence(milliseconds timeout) {
  if (auto r = commit(); !r) return r;
  auto generation = impl_->fence_generation++;
  auto reply = impl_->request(
      Op::fence, proto::PayloadWriter().u64(generation).u64(timeout.count()).take(), timeout);
  if (!reply) return reply.error();
  return ok_status();
}

Result<Bytes> TcpStoreClient::get(std::string_view key, milliseconds timeout) {
  auto reply =
      impl_->request(Op::get, proto::PayloadWriter().str(key).u64(timeout.count()).take(), timeout);
  if (!reply) return reply.error();
  proto::PayloadReader in(*reply);
  auto value = in.bytes();
  if (!value) return impl_->fail("get: malformed reply");
  return Bytes(value->begin(), value->end());
}

Result<std::vector<Bytes>> TcpStoreClient::get_many(const std::vector<std::string>& keys,
                                                    milliseconds timeout) {
  proto::PayloadWriter request;
  request.u64(keys.size());
  for (const auto& key : keys) request.str(key);
  request.u64(timeout.count());
  auto reply = impl_->request(Op::get_many, request.data(), timeout);
  if (!reply) return reply.error();
  proto::PayloadReader in(*reply);
  auto count = in.u64();
  if (!count || *count != keys.size()) return impl_->fail("get_many: malformed reply");
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto value = in.bytes();
    if (!value) return impl_->fail("get_many: malformed reply");
    values.emplace_back(value->begin(), value->end());
  }
  return values;
}

Status TcpStoreClient::set(std::string_view key, std::span<const std::byte> value) {
  if (auto r = impl_->check_value_size(key, value.size()); !r) return r;
  auto reply = impl_->request(Op::set, proto::PayloadWriter().str(key).bytes(value).take());
  if (!reply) return reply.error();
  return ok_status();
}

Result<std::int64_t> TcpStoreClient::add(std::string_view key, std::int64_t delta) {
  auto reply = impl_->request(Op::add, proto::PayloadWriter().str(key).i64(delta).take());
  if (!reply) return reply.error();
  auto value = proto::PayloadReader(*reply).i64();
  if (!value) return impl_->fail("add: malformed reply");
  return *value;
}

Status TcpStoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  proto::PayloadWriter request;
  request.u64(keys.size());
  for (const auto& key : keys) request.str(key);
  request.u64(timeout.count());
  auto reply = impl_->request(Op::wait, request.data(), timeout);
  if (!reply) return reply.error();
  return ok_status();
}

Result<bool> TcpStoreClient::remove(std::string_view key) {
  auto reply = impl_->request(Op::remove, proto::PayloadWriter().str(key).take());
  if (!reply) return reply.error();
  auto existed = proto::PayloadReader(*reply).u64();
  if (!existed) return impl_->fail("remove: malformed reply");
  return *existed != 0;
}

namespace detail {
namespace {

Result<int> int_from_env(const Env& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) continue;
    int value = 0;
    const auto& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
      return make_error(std::string(name) + "=" + text + ": not a non-negative integer");
    }
    return value;
  }
  return make_error(
      std::string(*names.begin()) + " (or " + *(names.end() - 1) +
      ") is not set: the tcp wireup store needs each process's rank and the world size");
}

}  // namespace

Result<std::unique_ptr<KvStore>> connect_tcp(const Env& env, milliseconds connect_timeout) {
  TcpStoreClientOptions options;
  auto addr = env.find(kStoreAddrEnv);
  if (addr == env.end() || addr->second.empty()) {
    return make_error(std::string(kStoreAddrEnv) +
                      " is not set: the tcp wireup store needs host:port");
  }
  options.address = addr->second;
  if (auto where = net::parse_host_port(options.address, kStoreAddrEnv); !where)
    return where.error();
  auto secret = env.find(kStoreSecretEnv);
  if (secret == env.end() || secret->second.empty()) {
    return make_error(std::string(kStoreSecretEnv) +
                      " is not set: the tcp wireup store refuses clients without the job secret");
  }
  options.secret = secret->second;
  auto rank = int_from_env(env, {kRankEnv, "RANK"});
  if (!rank) return rank.error();
  auto size = int_from_env(env, {kWorldSizeEnv, "WORLD_SIZE"});
  if (!size) return size.error();
  if (*rank >= *size) {
    return make_error("rank " + std::to_string(*rank) + " is not below the world size " +
                      std::to_string(*size));
  }
  options.rank = *rank;
  options.world_size = *size;
  options.connect_timeout = connect_timeout;
  auto client = TcpStoreClient::connect(std::move(options));
  if (!client) return client.error();
  return std::unique_ptr<KvStore>(std::move(*client));
}

}  // namespace detail
}  // namespace topolaunch::wireup
