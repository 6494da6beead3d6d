// Sizes and durations as written in job configs and on command lines. One parser, one set of
// error messages.
#include "topolaunch/common/units.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace topolaunch {
namespace {

struct Split {
  double number = 0;
  std::string_view suffix;
  bool ok = false;
};

// "1.5GiB" -> {1.5, "GiB"}. Digits with at most one '.', no sign, no exponent, optional spaces
// between number and suffix ("16 GiB" is what people type).
Split split_number(std::string_view text) {
  Split out;
  std::size_t i = 0;
  bool digits = false, dot = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return out;
  std::string number(text.substr(0, i));
  out.number = std::strtod(number.c_str(), nullptr);
  while (i < text.size() && text[i] == ' ') ++i;
  out.suffix = text.substr(i);
  out.ok = std::isfinite(out.number);
  return out;
}

std::string quoted(std::string_view text) { return fmt::format("\"{}\"", text); }

}  // namespace

Result<std::uint64_t> parse_size_bytes(std::string_view text) {
  const std::string hint = "(use binary units B, KiB, MiB, GiB, TiB, e.g. \"16GiB\")";
  if (!text.empty() && text.front() == '-') {
    return make_error(fmt::format("{} is negative (a size is at least \"0B\")", quoted(text)));
  }
  Split s = split_number(text);
  if (!s.ok) return make_error(fmt::format("{} is not a size {}", quoted(text), hint));
  struct Unit {
    std::string_view name;
    int shift;
  };
  static constexpr std::array<Unit, 11> units{{{"", 0},
                                               {"B", 0},
                                               {"KiB", 10},
                                               {"MiB", 20},
                                               {"GiB", 30},
                                               {"TiB", 40},
                                               {"PiB", 50},
                                               {"K", 10},
                                               {"M", 20},
                                               {"G", 30},
                                               {"T", 40}}};
  for (const Unit& unit : units) {
    if (s.suffix != unit.name) continue;
    long double bytes = static_cast<long double>(s.number) * std::ldexp(1.0L, unit.shift);
    if (bytes > static_cast<long double>(std::numeric_limits<std::uint64_t>::max() / 2)) {
      return make_error(fmt::format("{} is too large", quoted(text)));
    }
    if (bytes != std::floor(bytes)) {
      return make_error(fmt::format("{} is not a whole number of bytes", quoted(text)));
    }
    return static_cast<std::uint64_t>(bytes);
  }
  std::string_view why = "";
  if (s.suffix == "GB" || s.suffix == "MB" || s.suffix == "KB" || s.suffix == "TB" ||
      s.suffix == "kB") {
    why = " (decimal units are ambiguous here)";
  }
  return make_error(fmt::format("{} is not a size{} {}", quoted(text), why, hint));
}

Result<std::chrono::microseconds> parse_duration(std::string_view text) {
  const std::string hint = "(use us, ms, s, m or h, e.g. \"90s\" or \"500ms\")";
  if (!text.empty() && text.front() == '-') {
    return make_error(fmt::format("{} is negative (a duration is at least \"0s\")", quoted(text)));
  }
  Split s = split_number(text);
  if (!s.ok) return make_error(fmt::format("{} is not a duration {}", quoted(text), hint));
  if (s.suffix.empty()) {
    return make_error(fmt::format("{} has no unit {}", quoted(text), hint));
  }
  struct Unit {
    std::string_view name;
    double us;
  };
  static constexpr std::array<Unit, 7> units{{{"us", 1.0},
                                              {"ms", 1e3},
                                              {"s", 1e6},
                                              {"m", 60e6},
                                              {"min", 60e6},
                                              {"h", 3600e6},
                                              {"d", 86400e6}}};
  for (const Unit& unit : units) {
    if (s.suffix != unit.name) continue;
    double us = std::round(s.number * unit.us);
    if (us > 1e15) return make_error(fmt::format("{} is too long", quoted(text)));
    return std::chrono::microseconds(static_cast<std::int64_t>(us));
  }
  return make_error(fmt::format("{} is not a duration {}", quoted(text), hint));
}

std::string format_size(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 6> names{"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t unit = 0;
  while (unit + 1 < names.size() && bytes >= (std::uint64_t{1} << (10 * (unit + 1)))) ++unit;
  if (unit == 0) return fmt::format("{}B", bytes);
  double value = static_cast<double>(bytes) / static_cast<double>(std::uint64_t{1} << (10 * unit));
  return fmt::format("{:.4g}{}", value, names[unit]);
}

std::string format_duration(std::chrono::microseconds duration) {
  const auto us = static_cast<double>(duration.count());
  if (duration.count() == 0) return "0s";
  if (us < 1e3) return fmt::format("{}us", duration.count());
  if (us < 1e6) return fmt::format("{:.4g}ms", us / 1e3);
  if (us < 600e6) return fmt::format("{:.4g}s", us / 1e6);
  if (us < 36000e6) return fmt::format("{:.4g}m", us / 60e6);
  return fmt::format("{:.4g}h", us / 3600e6);
}

}  // namespace topolaunch
