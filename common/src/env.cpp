#include "topolaunch/common/env.hpp"

#include <charconv>
#include <cstdlib>

extern char** environ;  // NOLINT: POSIX

namespace topolaunch {
namespace {

std::string allowed(int min, int max) {
  if (max == std::numeric_limits<int>::max()) return "at least " + std::to_string(min);
  return "allowed " + std::to_string(min) + ".." + std::to_string(max);
}

Result<int> parse_int(std::string_view name, const std::string& text, int min, int max) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  const std::string shown = std::string(name) + "=" + text;
  const bool overflowed = ec == std::errc::result_out_of_range && stop == end;
  if (ec != std::errc() && !overflowed) return make_error(shown + ": not an integer");
  if (stop != end) return make_error(shown + ": not an integer");
  if (overflowed || value < min || value > max) {
    return make_error(shown + ": out of range (" + allowed(min, max) + ")");
  }
  return value;
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const auto eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return env;
}

std::optional<std::string> env_value(const Environment& env, std::string_view name) {
  const auto it = env.find(std::string(name));
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

Result<int> env_int(const Environment& env, std::string_view name, int absent, int min, int max) {
  const auto text = env_value(env, name);
  if (!text) return absent;
  return parse_int(name, *text, min, max);
}

Result<int> env_int(const char* name, int absent, int min, int max) {
  const auto text = env_value(name);
  if (!text) return absent;
  return parse_int(name, *text, min, max);
}

}  // namespace topolaunch
