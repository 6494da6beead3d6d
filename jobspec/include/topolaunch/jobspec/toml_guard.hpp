// What must be refused before toml++ sees a job file.
//
// toml++ 3.3.0 (Debian 12) asserts in parse_key() when a table header's first character is
// neither a bare-key character nor a quote: "[+]", "[*]", "[.]", "[[[", "[[=", "[" at the end of
// a line. With assertions on that aborts the process (slurmstepd, as root, in the plugin); with
// them off the assertion is an optimiser assumption, so the behaviour is undefined. Upstream
// fixed it in tomlplusplus#301, which Debian's package lacks (research/hostile-inputs.md).
// Its is_non_ascii_horizontal_whitespace() reaches __builtin_unreachable() for most code points
// from U+00A1 on; the parser asks it about characters outside strings and after a backslash in
// a multi-line basic string (tomlplusplus#190, #295; docs/fuzzing-findings.md).
#pragma once

#include <string>
#include <string_view>

#include "topolaunch/common/result.hpp"

namespace topolaunch::jobspec {

// Scans `text` as the TOML grammar does (strings, comments, multi-line arrays) and refuses the
// first table header that toml++ 3.3 would crash on, and the first non-ASCII byte outside a
// string or comment (never valid TOML 1.0) or right after a multi-line string's backslash and
// its blanks, as "<path>:<line>:<col>: TOML syntax error: ...". Text that is not TOML at all is
// left for the parser to refuse.
Status check_toml_text(std::string_view text, const std::string& path);

}  // namespace topolaunch::jobspec
