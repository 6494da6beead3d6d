// A digest of bytes that names them in caches and says "these are the bytes seen before": two
// 64-bit FNV-1a passes (the second seeded with the length), 32 hex digits. It tells changed input
// from unchanged, not an adversary's input from another (use nothing of it as a secret or a MAC).
#pragma once

#include <string>
#include <string_view>

namespace topolaunch {

std::string content_digest(std::string_view bytes);

}  // namespace topolaunch
