// The TCP store client: one blocking connection, one request in flight.
#include <algorithm>

#include "backends.hpp"
#include "connection.hpp"
#include "frame.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::wireup {
namespace {

using proto::Op;

// Staged puts are sent in frames of about this size, below the server's frame limit.
constexpr std::size_t kCommitBatchBytes = std::size_t{8} << 20;

}  // namespace

class TcpStoreClient::Impl {
 public:
  TcpStoreClientOptions options;
  std::unique_ptr<StoreConnection> connection;
  std::uint64_t fence_generation = 0;
  std::vector<std::pair<std::string, Bytes>> staged;

  Status check_value_size(std::string_view key, std::size_t bytes) const {
    if (bytes <= connection->max_value_bytes()) return ok_status();
    return fail("value of key '" + std::string(key) + "' has " + std::to_string(bytes) +
                " bytes, above the store's limit of " +
                std::to_string(connection->max_value_bytes()) +
                " (TcpStoreServerOptions::max_value_bytes)");
  }
  Error fail(std::string_view what) const { return connection->fail(what); }
  Result<Bytes> request(Op op, const Bytes& payload, milliseconds blocking_for = milliseconds(0)) {
    return connection->request(op, payload, blocking_for);
  }
};

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(TcpStoreClientOptions options) {
  if (options.secret.empty())
    return make_error("wireup tcp store: empty secret (set TOPOLAUNCH_STORE_SECRET)");
  if (options.rank < -1 || (options.rank >= 0 && options.rank >= options.world_size)) {
    return make_error("wireup tcp store: rank " + std::to_string(options.rank) + " is not in 0.." +
                      std::to_string(options.world_size - 1));
  }
  auto connection =
      StoreConnection::open({options.address, options.secret, options.rank, options.world_size,
                             options.connect_timeout, options.io_timeout});
  if (!connection) return connection.error();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->connection = std::move(*connection);
  return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(std::move(impl)));
}

TcpStoreClient::TcpStoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreClient::~TcpStoreClient() = default;

int TcpStoreClient::rank() const { return impl_->options.rank; }
int TcpStoreClient::size() const { return impl_->connection->world_size(); }

Status TcpStoreClient::put(std::string_view key, std::span<const std::byte> value) {
  if (auto r = impl_->check_value_size(key, value.size()); !r) return r;
  impl_->staged.emplace_back(std::string(key), Bytes(value.begin(), value.end()));
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
  auto values = proto::decode_values(std::move(*reply), keys.size());
  if (!values) return impl_->fail("get_many: malformed reply");
  return std::move(*values);
}

Result<Gathered> TcpStoreClient::allgather(std::string_view name, std::span<const std::byte> mine,
                                           milliseconds timeout) {
  if (auto r = impl_->check_value_size(name, mine.size()); !r) return r.error();
  if (impl_->options.rank < 0) return impl_->fail("allgather: this client has no rank");
  if (auto r = commit(); !r) return r.error();  // staged puts are visible to the others after it
  auto reply = impl_->request(
      Op::allgather, proto::PayloadWriter().str(name).u64(timeout.count()).bytes(mine).take(),
      timeout);
  if (!reply) return reply.error();
  auto gathered = proto::decode_gathered(std::move(*reply), static_cast<std::size_t>(size()));
  if (!gathered) return impl_->fail("allgather '" + std::string(name) + "': malformed reply");
  return std::move(*gathered);
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

// The first of `names` that is set, strictly (common/env.hpp).
Result<int> int_from_env(const Environment& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (env_value(env, name)) return env_int(env, name, 0);
  }
  return make_error(
      std::string(*names.begin()) + " (or " + *(names.end() - 1) +
      ") is not set: the tcp wireup store needs each process's rank and the world size");
}

}  // namespace

Result<std::unique_ptr<KvStore>> connect_tcp(const Environment& env, milliseconds connect_timeout) {
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
