// The TCP store: a small key-value server (one poll() loop, no thread per client) and its client.
//
// Wire format (private, see src/frame.hpp): versioned, length-prefixed binary frames; values are
// binary-safe. Every connection starts with a challenge/response: the client proves it knows the
// per-job secret with HMAC-SHA256 over a server nonce, and the server proves it back over a
// client nonce. A wrong secret is refused and logged; the server keeps serving the others.
//
// Relays make the store a tree: a relay serves the clients of one node (its workers, and the
// relays of the nodes below it) and stands for all of them at its upstream store, so the root
// serves a handful of relays instead of every rank, and each value leaves the root once per
// child relay instead of once per reader. The launcher hosts one relay per agent (fan-out 16,
// agent_wireup.hpp); clients cannot tell a relay from the root.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup {

// Environment variables the launcher gives workers (and connect_from_env() reads).
inline constexpr const char* kStoreAddrEnv = "TOPOLAUNCH_STORE_ADDR";      // host:port
inline constexpr const char* kStoreSecretEnv = "TOPOLAUNCH_STORE_SECRET";  // per-job secret
inline constexpr const char* kRankEnv = "TOPOLAUNCH_RANK";
inline constexpr const char* kWorldSizeEnv = "TOPOLAUNCH_WORLD_SIZE";

struct TcpStoreServerOptions {
  std::string bind_host = "127.0.0.1";  // an address of this host ("0.0.0.0" for all)
  std::uint16_t port = 0;               // 0: the kernel picks a free port, see port()
  std::string secret;                   // required, non-empty
  int world_size = 0;                   // fence participants; 0: taken from the first client
  std::size_t max_value_bytes = std::size_t{64} << 20;
  std::size_t max_clients = 16384;
  milliseconds auth_timeout{10000};  // a connection that does not authenticate by then is closed
  // Where the server reports refused clients and bad frames. Default: stderr. A burst of hostile
  // peers does not flood the job's log: the first `refusals_in_full` refusals are one line each,
  // the rest one count every `refusal_summary_every` ("refused 1195 more peers in 10.0 s: ...");
  // after a quiet `refusal_summary_every` the next refusal is a line of its own again. stats()
  // counts every refusal.
  std::function<void(std::string_view)> log;
  std::size_t refusals_in_full = 5;
  milliseconds refusal_summary_every{10000};

  // Relay mode (upstream non-empty): forward to the store at `upstream` (host:port) as one
  // participant standing for `ranks`, the ranks below this relay (its own clients' and its child
  // relays'). Values set here are acknowledged at once (readers here see them at once) and go
  // upstream together, one set_many per round of the relay's loop, always ahead of a fence,
  // allgather, add or remove that follows them; values read are fetched once and kept until the
  // next fence; a fence or allgather goes upstream once, when all of `ranks` have arrived. A relay
  // needs world_size. Without upstream: the root, whose participants are ranks 0..world_size-1.
  std::string upstream;
  std::vector<int> ranks;
  std::size_t upstream_lanes = 8;  // requests in flight upstream at most (one connection each)
  // How long to keep trying to reach the upstream store (it may start after this relay); a
  // request that cannot reach it then fails with that reason.
  milliseconds upstream_connect_timeout{60000};
};

// A listening socket opened before its server starts, so that its address can be published
// before the server's configuration is known (a relay's, in the agents' exchange). Clients that
// connect early wait in the kernel's backlog until TcpStoreServer::start() serves them.
class TcpStoreListener {
 public:
  static Result<TcpStoreListener> open(const std::string& bind_host, std::uint16_t port = 0);
  TcpStoreListener(TcpStoreListener&& other) noexcept;
  TcpStoreListener& operator=(TcpStoreListener&& other) noexcept;
  TcpStoreListener(const TcpStoreListener&) = delete;
  TcpStoreListener& operator=(const TcpStoreListener&) = delete;
  ~TcpStoreListener();
  std::uint16_t port() const { return port_; }

 private:
  friend class TcpStoreServer;
  TcpStoreListener(int fd, std::uint16_t port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

class TcpStoreServer {
 public:
  // Binds, listens and starts the serving thread. A port in use is an error naming the port.
  static Result<std::unique_ptr<TcpStoreServer>> start(TcpStoreServerOptions options);
  // The same on a listener opened earlier (options.bind_host and port are then ignored).
  static Result<std::unique_ptr<TcpStoreServer>> start(TcpStoreServerOptions options,
                                                       TcpStoreListener listener);
  ~TcpStoreServer();  // stop()s
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  std::uint16_t port() const;   // the real port (useful when options.port was 0)
  std::string address() const;  // "host:port", the value for TOPOLAUNCH_STORE_ADDR
  // Closes every connection and the listening socket and joins the thread. Idempotent.
  void stop();

  struct Stats {
    std::size_t clients = 0;  // connected now
    std::size_t peak_clients = 0;
    std::size_t peak_rank_clients = 0;  // authenticated with a rank (not relays, not tools)
    std::size_t refused_auth = 0;       // wrong secret
    std::size_t refused_frames = 0;     // malformed / oversized / out of protocol
    std::size_t keys = 0;
    std::size_t stored_bytes = 0;          // keys + values held now
    std::uint64_t requests = 0;            // frames served (after authentication)
    std::uint64_t bytes_in = 0;            // from all clients
    std::uint64_t bytes_out = 0;           // to all clients
    std::uint64_t relay_bytes_in = 0;      // of which from relays below (other nodes)
    std::uint64_t relay_bytes_out = 0;     // of which to relays below
    std::uint64_t upstream_bytes_in = 0;   // relay: replies from the upstream store
    std::uint64_t upstream_bytes_out = 0;  // relay: requests to it
    double cpu_seconds = 0;  // of the serving thread (the upstream lanes not included)
  };
  // Counts are updated before the reply they count is sent; clients, keys, stored_bytes and
  // cpu_seconds once per round of the serving loop, bytes as they move.
  Stats stats() const;

  class Impl;

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreClientOptions {
  std::string address;  // "host:port"
  std::string secret;
  int rank = -1;  // -1: not a fence participant (e.g. a monitoring tool)
  int world_size = 0;
  milliseconds connect_timeout{30000};  // keep retrying refused connections until then
  milliseconds io_timeout{30000};       // for replies to non-blocking requests
};

// A KvStore over one TCP connection. Blocking calls; not thread-safe (one per thread).
class TcpStoreClient final : public KvStore {
 public:
  static Result<std::unique_ptr<TcpStoreClient>> connect(TcpStoreClientOptions options);
  ~TcpStoreClient() override;

  int rank() const override;
  int size() const override;
  std::string_view backend() const override { return "tcp"; }

  using KvStore::put;
  Status put(std::string_view key, std::span<const std::byte> value) override;  // staged
  Status commit() override;                     // sends staged puts in one request
  Status fence(milliseconds timeout) override;  // commit + barrier over size() ranks
  Result<Bytes> get(std::string_view key, milliseconds timeout) override;
  Result<std::vector<Bytes>> get_many(const std::vector<std::string>& keys,
                                      milliseconds timeout) override;
  // One round trip (commits staged puts first).
  Result<Gathered> allgather(std::string_view name, std::span<const std::byte> mine,
                             milliseconds timeout) override;

  // Direct store operations (TCP backend only).
  Status set(std::string_view key, std::span<const std::byte> value);  // immediate
  Result<std::int64_t> add(std::string_view key, std::int64_t delta);  // atomic; returns new value
  Status wait(const std::vector<std::string>& keys, milliseconds timeout);  // until all exist
  Result<bool> remove(std::string_view key);                                // true if it existed

  class Impl;

 private:
  explicit TcpStoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace topolaunch::wireup
