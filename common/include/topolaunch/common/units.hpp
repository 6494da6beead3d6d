// Units in job files (every table: the launcher's and the worker's), parsed once, here: sizes
// ("16GiB", "25MiB", "512KiB", "4096" bytes) and durations ("90s", "500ms", "5m", "1h", "250us").
// Binary suffixes only: "GB" is refused because half the tools that print it mean 10^9 and half
// mean 2^30, and a memory budget off by 7% is a bug.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "topolaunch/common/result.hpp"

namespace topolaunch {

// Parses "16GiB", "1.5GiB", "25MiB", "4KiB", "1TiB", "512B", "4096" (bytes). Suffixes are case
// sensitive as written by IEC (KiB, MiB, GiB, TiB, PiB; "K"/"M"/"G"/"T" are accepted as the same
// binary units). The error message is the part after "key: " ("\"16GB\" is not a size (...)").
Result<std::uint64_t> parse_size_bytes(std::string_view text);

// Parses "90s", "500ms", "250us", "5m" / "5min", "1h", "1.5s", "0s". A bare number is refused
// (ambiguous); the result is rounded to microseconds.
Result<std::chrono::microseconds> parse_duration(std::string_view text);

// For people: 17179869184 -> "16GiB", 1536 -> "1.5KiB", 0 -> "0B".
std::string format_size(std::uint64_t bytes);
// For people: 90'000'000us -> "90s", 1500ms -> "1.5s", 250us -> "250us".
std::string format_duration(std::chrono::microseconds duration);

}  // namespace topolaunch
