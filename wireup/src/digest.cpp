#include "topolaunch/wireup/digest.hpp"

#include <algorithm>
#include <span>

#include "crypto.hpp"

namespace topolaunch::wireup {

std::string sha256_hex(std::string_view data, std::size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto digest = crypto::sha256(std::as_bytes(std::span(data.data(), data.size())));
  std::string hex;
  for (std::size_t i = 0; i < std::min(bytes, digest.size()); ++i) {
    const int value = std::to_integer<int>(digest[i]);
    hex += kDigits[value >> 4];
    hex += kDigits[value & 15];
  }
  return hex;
}

}  // namespace topolaunch::wireup
