#include "topolaunch/common/digest.hpp"

#include <fmt/format.h>

#include <cstdint>

namespace topolaunch {

std::string content_digest(std::string_view bytes) {
  auto fnv = [&](std::uint64_t hash) {
    for (const unsigned char c : bytes) {
      hash ^= c;
      hash *= 0x100000001b3ULL;
    }
    return hash;
  };
  return fmt::format("{:016x}{:016x}", fnv(0xcbf29ce484222325ULL),
                     fnv(0x6c62272e07bb0142ULL ^ bytes.size()));
}

}  // namespace topolaunch
