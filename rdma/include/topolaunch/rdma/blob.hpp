// The binary envelope of everything rdma puts in the store (UCX worker addresses, verbs QP info,
// memory keys): magic, version, kind, the publishing rank, payload length, payload, CRC-32.
// A value that was truncated, corrupted or published by the wrong rank is an error that names
// the peer and the key, never a crash or a connection to garbage.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "topolaunch/common/result.hpp"

namespace topolaunch::rdma {

inline constexpr std::uint32_t kBlobMagic = 0x42524c54;  // "TLRB"
inline constexpr std::uint16_t kBlobVersion = 1;

enum class BlobKind : std::uint16_t {
  ucx_worker_address = 1,
  verbs_qp = 2,
  memory_key = 3,
  preflight = 4,
};

std::string encode_blob(BlobKind kind, int rank, std::string_view payload);
// `key` only names the value in errors ("hostcomm/addr/3").
Result<std::string> decode_blob(std::string_view bytes, BlobKind expected_kind, int expected_rank,
                                std::string_view key);

std::uint32_t crc32(std::string_view bytes);

}  // namespace topolaunch::rdma
