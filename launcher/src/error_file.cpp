// The error file of a failed rank; see error_file.hpp.
#include "error_file.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace topolaunch::launcher {
namespace {

// A message for a one-line summary: its first line, at most 500 bytes.
std::string one_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > 500) line = line.substr(0, 497) + "...";
  return line;
}

}  // namespace

std::optional<WorkerError> parse_error_file(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return std::nullopt;
  const auto& message = j["message"];
  WorkerError error;
  if (message.is_string()) {
    error.message = one_line(message.get<std::string>());
  } else if (message.is_object()) {
    if (message.contains("message") && message["message"].is_string())
      error.message = one_line(message["message"].get<std::string>());
    if (message.contains("extraInfo") && message["extraInfo"].is_object()) {
      const auto& extra = message["extraInfo"];
      if (extra.contains("py_callstack") && extra["py_callstack"].is_string())
        error.traceback = extra["py_callstack"].get<std::string>();
    }
  }
  if (error.message.empty() && error.traceback.empty()) return std::nullopt;
  // Bounded: the report carries it, and a runaway writer must not make it megabytes.
  constexpr std::size_t kMaxTraceback = 16 * 1024;
  if (error.traceback.size() > kMaxTraceback)
    error.traceback = "...\n" + error.traceback.substr(error.traceback.size() - kMaxTraceback);
  return error;
}

std::optional<WorkerError> read_error_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_error_file(text.str());
}

}  // namespace topolaunch::launcher
