// Validation of every value a user (or the site) hands the plugin: length, characters, ranges.
// The plugin runs partly as root inside slurmstepd, so nothing unchecked goes further.
#pragma once

#include <string>
#include <string_view>

#include "site_config.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/mapping_spec.hpp"

namespace topolaunch::spank {

inline constexpr std::size_t kMaxPathBytes = 1024;
inline constexpr std::size_t kMaxListBytes = 256;

// A value as it may be echoed in a message: printable ASCII ('?' for anything else: a newline
// or an escape sequence would forge or garble the log lines after it), cut at max_chars ("...").
std::string shown(std::string_view text, std::size_t max_chars = 40);

// "auto" | "off" | "verbose".
Result<Mode> parse_mode(std::string_view text);
// "auto" | "block" | "cyclic".
Result<topology::MappingPolicy> parse_policy(std::string_view text);
// A file path: non-empty, at most kMaxPathBytes, printable ASCII without spaces or shell-ish
// characters that have no business in a path (so it is safe to echo in a log line).
Status check_path(std::string_view text, std::string_view what);
// A NIC list in NCCL_IB_HCA syntax, at most kMaxListBytes, names of [A-Za-z0-9_.:-].
Result<topology::NicFilter> parse_nic_list(std::string_view text, std::string_view what);

}  // namespace topolaunch::spank
