// What every harness asserts besides "no crash": a refused input comes back as one specific line
// (STYLE.md), which the plugin writes into slurmstepd's log and the programs print on stderr. A
// violated property aborts, so libFuzzer and the replay test report it like a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace topolaunch::fuzz {

[[noreturn]] inline void fail(std::string_view what, std::string_view detail) {
  std::fprintf(stderr, "fuzz property violated: %.*s: [%.*s]\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(detail.size()), detail.data());
  std::abort();
}

inline void require(bool holds, std::string_view what, std::string_view detail = {}) {
  if (!holds) fail(what, detail);
}

// An error message: non-empty, one line, no control characters (an input's newline or escape
// sequence copied into a log line would forge or garble the lines after it).
inline void require_one_line(std::string_view message) {
  require(!message.empty(), "empty error message");
  for (char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) fail("error message with a control character", message);
  }
}

}  // namespace topolaunch::fuzz
