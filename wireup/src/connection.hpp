// Private: one authenticated, blocking connection to a TCP store and its request/reply. The
// client (tcp_client.cpp) and a relay's upstream lanes (relay_lanes.cpp) are built on it.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "frame.hpp"
#include "net.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup {

// The rank a relay authenticates with: not one rank but the stand-in for a set of them (its
// fence_group / allgather_group requests name them).
inline constexpr std::int64_t kRelayRank = -2;

struct StoreConnectionOptions {
  std::string address;  // "host:port"
  std::string secret;
  std::int64_t rank = -1;  // -1: not a fence participant; kRelayRank: a relay
  int world_size = 0;
  milliseconds connect_timeout{30000};  // keep retrying refused connections until then
  milliseconds io_timeout{30000};       // for replies to non-blocking requests
};

class StoreConnection {
 public:
  static Result<std::unique_ptr<StoreConnection>> open(StoreConnectionOptions options);

  // Sends one request and returns the payload of its ok reply; an error reply becomes the
  // Error. blocking_for: how long the server may legitimately hold the reply (fence, get...).
  // An I/O error makes the connection unusable (later requests fail at once, saying why).
  Result<Bytes> request(proto::Op op, std::span<const std::byte> payload,
                        milliseconds blocking_for = milliseconds(0));

  int world_size() const { return world_size_; }
  std::uint64_t max_value_bytes() const { return max_value_bytes_; }
  const StoreConnectionOptions& options() const { return options_; }
  bool broken() const { return !broken_.empty(); }
  // From another thread: makes a request blocked in this connection fail at once (shutdown).
  void interrupt();
  // "wireup tcp store <address>: <what>"
  Error fail(std::string_view what) const;

 private:
  struct Frame {
    proto::Op op;
    Bytes payload;
  };
  // max_payload: the largest payload accepted (its buffer is allocated before it arrives).
  Result<Frame> read_frame(net::Clock::time_point deadline, std::size_t max_payload);
  Status handshake(net::Clock::time_point deadline);

  StoreConnectionOptions options_;
  net::Fd fd_;
  int world_size_ = 0;
  std::uint64_t max_value_bytes_ = std::uint64_t{64} << 20;  // the server's, from the handshake
  std::string broken_;  // non-empty: why the connection is unusable
};

}  // namespace topolaunch::wireup
