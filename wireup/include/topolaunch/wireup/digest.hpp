// SHA-256, from the same library as the store's secret check (wireup/src/crypto.hpp), so that a
// process links one crypto library at most.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace topolaunch::wireup {

// The first `bytes` bytes (at most 32) of the SHA-256 of `data`, as lower-case hex.
std::string sha256_hex(std::string_view data, std::size_t bytes = 32);

}  // namespace topolaunch::wireup
