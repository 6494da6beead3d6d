// Private: how binary values travel through PMI2's string KVS. Pure; unit-tested.
//
// PMI2 limits (slurm/pmi2.h): keys up to PMI2_MAX_KEYLEN = 64 chars, values up to
// PMI2_MAX_VALLEN = 1024 chars including the NUL, text only; Slurm's wire protocol is
// "key=value;" text, so '=' and ';' are best avoided in values. Hence:
//   - values are base64url without padding (A-Z a-z 0-9 - _), 4 chars per 3 bytes;
//   - a value longer than one PMI2 value is split: "<key>" holds "<chunks>:<first chunk>",
//     "<key>#1" .. "<key>#<chunks-1>" hold the rest. A 4 KiB value takes 6 keys.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::wireup::pmi2 {

inline constexpr std::size_t kMaxKeyChars = 63;      // PMI2_MAX_KEYLEN - 1 (NUL)
inline constexpr std::size_t kMaxValueChars = 1000;  // below PMI2_MAX_VALLEN - 1, with headroom

std::string base64url_encode(std::span<const std::byte> data);
Result<Bytes> base64url_decode(std::string_view text);

struct KvEntry {
  std::string key;
  std::string value;
  bool operator==(const KvEntry&) const = default;
};

std::string chunk_key(std::string_view key, std::size_t index);  // "<key>#<index>"

Result<std::vector<KvEntry>> split_value(std::string_view key, std::span<const std::byte> value,
                                         std::size_t max_key_chars = kMaxKeyChars,
                                         std::size_t max_value_chars = kMaxValueChars);

// head: the value stored under key; get_chunk fetches "<key>#<i>" values.
Result<Bytes> join_value(std::string_view key, std::string_view head,
                         const std::function<Result<std::string>(const std::string&)>& get_chunk);

}  // namespace topolaunch::wireup::pmi2
