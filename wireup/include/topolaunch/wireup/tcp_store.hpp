// The TCP store: a small key-value server (one poll() loop, no thread per client) and its client.
//
// Wire format (private, see src/frame.hpp): versioned, length-prefixed binary frames; values are
// binary-safe. Every connection starts with a challenge/response: the client proves it knows the
// per-job secret with HMAC-SHA256 over a server nonce, and the server proves it back over a
// client nonce. A wrong secret is refused and logged; the server keeps serving the others.
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
  // Where the server reports refused clients and bad frames (one line each). Default: stderr.
  std::function<void(std::string_view)> log;
};

class TcpStoreServer {
 public:
  // Binds, listens and starts the serving thread. A port in use is an error naming the port.
  static Result<std::unique_ptr<TcpStoreServer>> start(TcpStoreServerOptions options);
  ~TcpStoreServer();  // stop()s
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  std::uint16_t port() const;   // the real port (useful when options.port was 0)
  std::string address() const;  // "host:port", the value for TOPOLAUNCH_STORE_ADDR
  // Closes every connection and the listening socket and joins the thread. Idempotent.
  void stop();

  struct Stats {
    std::size_t clients = 0;         // connected now
    std::size_t refused_auth = 0;    // wrong secret
    std::size_t refused_frames = 0;  // malformed / oversized / out of protocol
    std::size_t keys = 0;
  };
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
