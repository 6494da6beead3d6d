#include "slurm_text.hpp"

#include <fmt/format.h>

#include <charconv>
#include <limits>

#include "text_checks.hpp"

namespace topolaunch::spank {
namespace {

Result<long> to_number(std::string_view text, std::string_view whole) {
  long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    return make_error(fmt::format("'{}': '{}' is not a number", shown(whole, 80), shown(text)));
  }
  return value;
}

// Expands one host expression without top-level commas, e.g. "rack[1-2]-n[01-02]".
Status expand_one(std::string_view expr, std::string_view whole, std::vector<std::string>& out) {
  const auto open = expr.find('[');
  if (open == std::string_view::npos) {
    out.emplace_back(expr);
    return ok_status();
  }
  const auto close = expr.find(']', open);
  if (close == std::string_view::npos)
    return make_error(fmt::format("'{}': missing ']'", shown(whole, 80)));
  const std::string_view prefix = expr.substr(0, open);
  const std::string_view ranges = expr.substr(open + 1, close - open - 1);
  const std::string_view rest = expr.substr(close + 1);
  std::size_t start = 0;
  while (start <= ranges.size()) {
    auto comma = ranges.find(',', start);
    if (comma == std::string_view::npos) comma = ranges.size();
    const std::string_view range = ranges.substr(start, comma - start);
    const auto dash = range.find('-');
    const std::string_view lo_text = range.substr(0, dash);
    const std::string_view hi_text =
        dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
    auto lo = to_number(lo_text, whole);
    auto hi = to_number(hi_text, whole);
    if (!lo) return lo.error();
    if (!hi) return hi.error();
    if (*hi < *lo)
      return make_error(fmt::format("'{}': descending range '{}'", shown(whole, 80), shown(range)));
    // lo >= 0 (no sign before the dash), so hi - lo cannot overflow; counting from lo keeps
    // "n[9223372036854775807]" from stepping past LONG_MAX.
    if (*hi - *lo >= static_cast<long>(kMaxHosts))
      return make_error(fmt::format("'{}': too many hosts", shown(whole, 80)));
    const int width = static_cast<int>(lo_text.size());
    for (long k = 0; k <= *hi - *lo; ++k) {
      const long i = *lo + k;
      if (out.size() >= kMaxHosts)
        return make_error(fmt::format("'{}': too many hosts", shown(whole, 80)));
      std::vector<std::string> tails;
      if (auto ok = expand_one(rest, whole, tails); !ok) return ok;
      for (auto& tail : tails) out.push_back(fmt::format("{}{:0{}}{}", prefix, i, width, tail));
    }
    start = comma + 1;
  }
  return ok_status();
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view text) {
  std::vector<std::string> hosts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      if (i > start) {
        if (auto ok = expand_one(text.substr(start, i - start), text, hosts); !ok)
          return ok.error();
      }
      start = i + 1;
    }
  }
  if (depth != 0) return make_error(fmt::format("'{}': unbalanced brackets", shown(text, 80)));
  if (hosts.empty()) return make_error("empty host list");
  return hosts;
}

Result<std::vector<int>> expand_tasks_per_node(std::string_view text) {
  std::vector<int> counts;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    long repeat = 1;
    if (const auto paren = item.find("(x"); paren != std::string_view::npos) {
      if (item.back() != ')') return make_error(fmt::format("'{}': missing ')'", shown(text, 80)));
      auto r = to_number(item.substr(paren + 2, item.size() - paren - 3), text);
      if (!r) return r.error();
      repeat = *r;
      item = item.substr(0, paren);
    }
    auto n = to_number(item, text);
    if (!n) return n.error();
    if (*n < 0 || *n > std::numeric_limits<int>::max() || repeat < 1 ||
        counts.size() + repeat > kMaxHosts) {
      return make_error(fmt::format("'{}': count out of range", shown(text, 80)));
    }
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), static_cast<int>(*n));
    start = comma + 1;
  }
  return counts;
}

}  // namespace topolaunch::spank
