#include "topolaunch/rdma/blob.hpp"

#include <fmt/format.h>
#include <array>
#include <cstring>

namespace topolaunch::rdma {
namespace {

constexpr std::size_t kHeaderBytes = 4 + 2 + 2 + 4 + 4;  // magic, version, kind, rank, length
constexpr std::size_t kTrailerBytes = 4;                 // crc32

template <class T>
void append(std::string& out, T value) {
  char buf[sizeof(T)];
  std::memcpy(buf, &value, sizeof(T));  // little endian: every supported host is
  out.append(buf, sizeof(T));
}

template <class T>
T read_at(std::string_view s, std::size_t offset) {
  T v;
  std::memcpy(&v, s.data() + offset, sizeof(T));
  return v;
}

std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

std::uint32_t crc32(std::string_view bytes) {
  static const auto table = make_table();
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

std::string encode_blob(BlobKind kind, int rank, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size() + kTrailerBytes);
  append<std::uint32_t>(out, kBlobMagic);
  append<std::uint16_t>(out, kBlobVersion);
  append<std::uint16_t>(out, static_cast<std::uint16_t>(kind));
  append<std::uint32_t>(out, static_cast<std::uint32_t>(rank));
  append<std::uint32_t>(out, static_cast<std::uint32_t>(payload.size()));
  out.append(payload);
  append<std::uint32_t>(out, crc32(out));
  return out;
}

Result<std::string> decode_blob(std::string_view bytes, BlobKind expected_kind, int expected_rank,
                                std::string_view key) {
  auto fail = [&](const std::string& what) {
    return make_error(fmt::format("corrupted blob from rank {} (store key \"{}\"): {}; the peer "
                                  "runs a different topolaunch version or the store is damaged",
                                  expected_rank, key, what),
                      2);
  };
  if (bytes.size() < kHeaderBytes + kTrailerBytes)
    return fail(fmt::format("{} bytes, shorter than the {}-byte envelope", bytes.size(),
                            kHeaderBytes + kTrailerBytes));
  if (read_at<std::uint32_t>(bytes, 0) != kBlobMagic) return fail("bad magic");
  const auto version = read_at<std::uint16_t>(bytes, 4);
  if (version != kBlobVersion)
    return fail(fmt::format("version {} (this build reads {})", version, kBlobVersion));
  const auto length = read_at<std::uint32_t>(bytes, 12);
  if (bytes.size() != kHeaderBytes + length + kTrailerBytes)
    return fail(
        fmt::format("length field {} does not match the {} bytes received", length, bytes.size()));
  const auto stored_crc = read_at<std::uint32_t>(bytes, kHeaderBytes + length);
  if (crc32(bytes.substr(0, kHeaderBytes + length)) != stored_crc) return fail("checksum mismatch");
  const auto kind = read_at<std::uint16_t>(bytes, 6);
  if (kind != static_cast<std::uint16_t>(expected_kind))
    return fail(
        fmt::format("kind {} where {} was expected", kind, static_cast<int>(expected_kind)));
  const auto rank = read_at<std::uint32_t>(bytes, 8);
  if (static_cast<int>(rank) != expected_rank)
    return fail(fmt::format("published by rank {}", rank));
  return std::string(bytes.substr(kHeaderBytes, length));
}

}  // namespace topolaunch::rdma
