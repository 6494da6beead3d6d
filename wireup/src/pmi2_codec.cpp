#include "pmi2_codec.hpp"

#include <array>
#include <charconv>
#include <cstdio>

namespace topolaunch::wireup::pmi2 {
namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

}  // namespace

std::string base64url_encode(std::span<const std::byte> data) {
  std::string out;
  out.reserve((data.size() * 4 + 2) / 3);
  std::size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    auto v = std::to_integer<unsigned>(data[i]) << 16 |
             std::to_integer<unsigned>(data[i + 1]) << 8 | std::to_integer<unsigned>(data[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  std::size_t rest = data.size() - i;
  if (rest > 0) {
    unsigned v = std::to_integer<unsigned>(data[i]) << 16;
    if (rest == 2) v |= std::to_integer<unsigned>(data[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    if (rest == 2) out += kAlphabet[(v >> 6) & 63];
  }
  return out;
}

Result<Bytes> base64url_decode(std::string_view text) {
  if (text.size() % 4 == 1)
    return make_error("pmi2 value: base64url text has an impossible length");
  Bytes out;
  out.reserve(text.size() * 3 / 4);
  unsigned acc = 0;
  int bits = 0;
  for (char c : text) {
    int v = sextet(c);
    if (v < 0) {
      // The text came from a peer: a control byte is named, never echoed into a log line.
      const auto u = static_cast<unsigned char>(c);
      char shown[16];
      std::snprintf(shown, sizeof shown, u >= 0x21 && u <= 0x7e ? "'%c'" : "byte 0x%02x", u);
      return make_error(std::string("pmi2 value: ") + shown + " is not a base64url character");
    }
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::byte>((acc >> bits) & 0xff));
    }
  }
  if ((acc & ((1u << bits) - 1)) != 0)
    return make_error("pmi2 value: base64url text has stray trailing bits");
  return out;
}

std::string chunk_key(std::string_view key, std::size_t index) {
  return std::string(key) + "#" + std::to_string(index);
}

Result<std::vector<KvEntry>> split_value(std::string_view key, std::span<const std::byte> value,
                                         std::size_t max_key_chars, std::size_t max_value_chars) {
  if (key.empty()) return make_error("pmi2: empty key");
  if (key.find_first_of("=; #") != std::string_view::npos) {
    return make_error("pmi2: key '" + std::string(key) + "' contains one of '=', ';', ' ', '#'");
  }
  auto text = base64url_encode(value);
  constexpr std::size_t kHeadReserve = 12;  // "<chunks>:" with room for a large count
  if (max_value_chars <= kHeadReserve) return make_error("pmi2: value limit too small");
  std::size_t chunk = max_value_chars - kHeadReserve;
  std::size_t chunks = text.empty() ? 1 : (text.size() + chunk - 1) / chunk;
  auto longest_key = chunks > 1 ? chunk_key(key, chunks - 1) : std::string(key);
  if (longest_key.size() > max_key_chars) {
    return make_error("pmi2: key '" + std::string(key) + "' is too long for a " +
                      std::to_string(value.size()) +
                      "-byte value (keys with their chunk suffix must fit " +
                      std::to_string(max_key_chars) + " chars; use a shorter key)");
  }
  std::vector<KvEntry> entries;
  entries.reserve(chunks);
  for (std::size_t i = 0; i < chunks; ++i) {
    auto part = text.substr(std::min(text.size(), i * chunk), chunk);
    if (i == 0) {
      entries.push_back({std::string(key), std::to_string(chunks) + ":" + part});
    } else {
      entries.push_back({chunk_key(key, i), std::move(part)});
    }
  }
  return entries;
}

Result<Bytes> join_value(std::string_view key, std::string_view head,
                         const std::function<Result<std::string>(const std::string&)>& get_chunk) {
  auto colon = head.find(':');
  std::size_t chunks = 0;
  auto [end, ec] = std::from_chars(
      head.data(), head.data() + (colon == std::string_view::npos ? 0 : colon), chunks);
  if (colon == std::string_view::npos || ec != std::errc() || end != head.data() + colon ||
      chunks == 0 || chunks > (std::size_t{1} << 20)) {
    return make_error("pmi2: value of key '" + std::string(key) +
                      "' was not written by topolaunch (bad header)");
  }
  std::string text(head.substr(colon + 1));
  for (std::size_t i = 1; i < chunks; ++i) {
    auto part = get_chunk(chunk_key(key, i));
    if (!part) return part.error();
    text += *part;
  }
  return base64url_decode(text);
}

}  // namespace topolaunch::wireup::pmi2
