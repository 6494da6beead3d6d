// Private: the TCP store's wire format. Pure functions, unit-tested in tests/unit/wireup.
//
// A frame is a 12-byte header followed by a payload:
//   u32 magic "TLKV" | u16 version | u16 op | u32 payload_bytes     (all little-endian)
// Payload fields are u64 integers and u32-length-prefixed byte strings (binary-safe).
// A reader never trusts a length: every field is bounds-checked against the payload.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup::proto {

inline constexpr std::uint32_t kMagic = 0x564b4c54;  // "TLKV" in memory order
inline constexpr std::uint16_t kVersion = 2;         // 2: allgather, relays (fence_group, ...)
inline constexpr std::size_t kHeaderBytes = 12;
inline constexpr std::size_t kNonceBytes = 32;
// Before authentication a peer may only send a small auth frame.
inline constexpr std::size_t kMaxUnauthenticatedPayload = 1024;

enum class Op : std::uint16_t {
  challenge = 1,  // server -> client: nonce
  auth = 2,       // client -> server: rank, world size, client nonce, mac
  auth_ok = 3,    // server -> client: world size, mac over the client nonce, max value bytes
  set = 10,       // key, value
  set_many = 11,  // count, (key, value)*
  get = 12,       // key, timeout_ms -> value
  add = 13,       // key, delta -> new value
  wait = 14,      // count, key*, timeout_ms
  fence = 15,     // generation, timeout_ms
  remove = 16,    // key -> existed
  get_many = 17,  // count, key*, timeout_ms -> count, value*
  // Collective: every rank sends its value under a name, each gets all (rank order) in one
  // round trip; afterwards rank_key(name, r) holds rank r's value.
  allgather = 18,  // name, timeout_ms, value -> count, value* (gathered)
  // From a relay (authenticated as kRelayRank), standing for the ranks below it.
  allgather_group = 19,  // name, timeout_ms, count, (rank, value)* -> gathered
  fence_group = 20,      // generation, timeout_ms, count, rank* -> ok
  ok = 100,              // reply; payload depends on the request
  error = 101,           // reply: message
};
bool is_known_op(std::uint16_t op);
std::string_view op_name(Op op);

struct FrameHeader {
  Op op;
  std::uint32_t payload_bytes;
};

Bytes encode_frame(Op op, std::span<const std::byte> payload);
// Checks magic, version, op and payload_bytes <= max_payload_bytes.
Result<FrameHeader> decode_header(std::span<const std::byte> header, std::size_t max_payload_bytes);

class PayloadWriter {
 public:
  PayloadWriter& u64(std::uint64_t value);
  PayloadWriter& i64(std::int64_t value) { return u64(static_cast<std::uint64_t>(value)); }
  PayloadWriter& bytes(std::span<const std::byte> value);
  PayloadWriter& str(std::string_view value) {
    return bytes(std::as_bytes(std::span(value.data(), value.size())));
  }
  void reserve(std::size_t bytes) { out_.reserve(bytes); }
  const Bytes& data() const { return out_; }
  Bytes take() { return std::move(out_); }

 private:
  Bytes out_;
};

class PayloadReader {
 public:
  explicit PayloadReader(std::span<const std::byte> payload) : in_(payload) {}
  std::optional<std::uint64_t> u64();
  std::optional<std::int64_t> i64();
  std::optional<std::span<const std::byte>> bytes();
  std::optional<std::string> str();
  bool at_end() const { return pos_ == in_.size(); }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

// The reply of allgather / allgather_group / get_many: u64 count, then count values (rank order).
Bytes encode_gathered(const std::vector<const Bytes*>& values);
// Decodes in place: the values are moved together inside the payload's own buffer, so a reply
// of W values costs no allocation per value. nullopt when malformed or when the count is not
// expected_count.
std::optional<Gathered> decode_gathered(Bytes payload, std::size_t expected_count);
// The same reply as one vector per value (get_many's result).
std::optional<std::vector<Bytes>> decode_values(Bytes payload, std::size_t expected_count);

}  // namespace topolaunch::wireup::proto
