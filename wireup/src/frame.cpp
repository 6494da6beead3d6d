#include "frame.hpp"

#include <cstring>

namespace topolaunch::wireup::proto {
namespace {

void put_le(Bytes& out, std::uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
}

std::uint64_t get_le(std::span<const std::byte> in, std::size_t at, int width) {
  std::uint64_t value = 0;
  for (int i = 0; i < width; ++i) value |= std::to_integer<std::uint64_t>(in[at + i]) << (8 * i);
  return value;
}

}  // namespace

bool is_known_op(std::uint16_t op) {
  switch (static_cast<Op>(op)) {
    case Op::challenge:
    case Op::auth:
    case Op::auth_ok:
    case Op::set:
    case Op::set_many:
    case Op::get:
    case Op::add:
    case Op::wait:
    case Op::fence:
    case Op::remove:
    case Op::get_many:
    case Op::allgather:
    case Op::allgather_group:
    case Op::fence_group:
    case Op::ok:
    case Op::error:
      return true;
  }
  return false;
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::challenge:
      return "challenge";
    case Op::auth:
      return "auth";
    case Op::auth_ok:
      return "auth_ok";
    case Op::set:
      return "set";
    case Op::set_many:
      return "set_many";
    case Op::get:
      return "get";
    case Op::add:
      return "add";
    case Op::wait:
      return "wait";
    case Op::fence:
      return "fence";
    case Op::remove:
      return "remove";
    case Op::get_many:
      return "get_many";
    case Op::allgather:
      return "allgather";
    case Op::allgather_group:
      return "allgather_group";
    case Op::fence_group:
      return "fence_group";
    case Op::ok:
      return "ok";
    case Op::error:
      return "error";
  }
  return "unknown";
}

Bytes encode_frame(Op op, std::span<const std::byte> payload) {
  Bytes out;
  out.reserve(kHeaderBytes + payload.size());
  put_le(out, kMagic, 4);
  put_le(out, kVersion, 2);
  put_le(out, static_cast<std::uint16_t>(op), 2);
  put_le(out, payload.size(), 4);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Result<FrameHeader> decode_header(std::span<const std::byte> header,
                                  std::size_t max_payload_bytes) {
  if (header.size() < kHeaderBytes) return make_error("short frame header");
  if (get_le(header, 0, 4) != kMagic)
    return make_error("bad frame magic (not a topolaunch wireup peer)");
  auto version = get_le(header, 4, 2);
  if (version != kVersion) {
    return make_error("unsupported wireup protocol version " + std::to_string(version) +
                      " (this build speaks " + std::to_string(kVersion) + ")");
  }
  auto op = static_cast<std::uint16_t>(get_le(header, 6, 2));
  if (!is_known_op(op)) return make_error("unknown frame op " + std::to_string(op));
  auto payload_bytes = get_le(header, 8, 4);
  if (payload_bytes > max_payload_bytes) {
    return make_error("frame payload of " + std::to_string(payload_bytes) +
                      " bytes exceeds the limit of " + std::to_string(max_payload_bytes));
  }
  return FrameHeader{static_cast<Op>(op), static_cast<std::uint32_t>(payload_bytes)};
}

PayloadWriter& PayloadWriter::u64(std::uint64_t value) {
  put_le(out_, value, 8);
  return *this;
}

PayloadWriter& PayloadWriter::bytes(std::span<const std::byte> value) {
  put_le(out_, value.size(), 4);
  out_.insert(out_.end(), value.begin(), value.end());
  return *this;
}

std::optional<std::uint64_t> PayloadReader::u64() {
  if (in_.size() - pos_ < 8) return std::nullopt;
  auto value = get_le(in_, pos_, 8);
  pos_ += 8;
  return value;
}

std::optional<std::int64_t> PayloadReader::i64() {
  auto value = u64();
  if (!value) return std::nullopt;
  return static_cast<std::int64_t>(*value);
}

std::optional<std::span<const std::byte>> PayloadReader::bytes() {
  if (in_.size() - pos_ < 4) return std::nullopt;
  auto length = get_le(in_, pos_, 4);
  if (in_.size() - pos_ - 4 < length) return std::nullopt;
  auto value = in_.subspan(pos_ + 4, length);
  pos_ += 4 + length;
  return value;
}

std::optional<std::string> PayloadReader::str() {
  auto value = bytes();
  if (!value) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(value->data()), value->size());
}

Bytes encode_gathered(const std::vector<const Bytes*>& values) {
  std::size_t total = 8;
  for (const Bytes* value : values) total += 4 + value->size();
  PayloadWriter out;
  out.reserve(total);
  out.u64(values.size());
  for (const Bytes* value : values) out.bytes(*value);
  return out.take();
}

std::optional<Gathered> decode_gathered(Bytes payload, std::size_t expected_count) {
  PayloadReader in(payload);
  auto count = in.u64();
  if (!count || *count != expected_count) return std::nullopt;
  // Each value moves down over the length fields before it; it never overlaps what is unread.
  std::vector<std::size_t> offsets;
  offsets.reserve(expected_count + 1);
  offsets.push_back(0);
  std::byte* packed = payload.data();
  for (std::size_t i = 0; i < expected_count; ++i) {
    auto value = in.bytes();
    if (!value) return std::nullopt;
    std::memmove(packed, value->data(), value->size());
    packed += value->size();
    offsets.push_back(static_cast<std::size_t>(packed - payload.data()));
  }
  if (!in.at_end()) return std::nullopt;
  payload.resize(offsets.back());
  return Gathered(std::move(payload), std::move(offsets));
}

std::optional<std::vector<Bytes>> decode_values(Bytes payload, std::size_t expected_count) {
  auto gathered = decode_gathered(std::move(payload), expected_count);
  if (!gathered) return std::nullopt;
  std::vector<Bytes> values;
  values.reserve(gathered->size());
  for (std::size_t i = 0; i < gathered->size(); ++i) {
    auto value = (*gathered)[i];
    values.emplace_back(value.begin(), value.end());
  }
  return values;
}

}  // namespace topolaunch::wireup::proto
