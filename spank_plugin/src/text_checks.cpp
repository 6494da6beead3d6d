#include "text_checks.hpp"

#include <fmt/format.h>

namespace topolaunch::spank {

std::string shown(std::string_view text, std::size_t max_chars) {
  std::string out;
  for (char c : text.substr(0, max_chars)) out += (c >= 0x21 && c <= 0x7e) ? c : '?';
  if (text.size() > max_chars) out += "...";
  return out;
}

Result<Mode> parse_mode(std::string_view text) {
  if (text == "auto") return Mode::automatic;
  if (text == "off") return Mode::off;
  if (text == "verbose") return Mode::verbose;
  return make_error(fmt::format("--topolaunch={}: use auto, off or verbose", shown(text)));
}

Result<topology::MappingPolicy> parse_policy(std::string_view text) {
  if (text == "auto") return topology::MappingPolicy::automatic;
  if (text == "block") return topology::MappingPolicy::block;
  if (text == "cyclic") return topology::MappingPolicy::cyclic;
  return make_error(fmt::format("--topolaunch-map={}: use auto, block or cyclic", shown(text)));
}

Status check_path(std::string_view text, std::string_view what) {
  if (text.empty()) return make_error(fmt::format("{}: empty path", what));
  if (text.size() > kMaxPathBytes) {
    return make_error(fmt::format("{}: path of {} bytes is longer than the limit of {}", what,
                                  text.size(), kMaxPathBytes));
  }
  for (char c : text) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '/' || c == '.' || c == '_' || c == '-' || c == '+' || c == '%' ||
                    c == ',' || c == '@' || c == '=';
    if (!ok) {
      return make_error(fmt::format(
          "{}={}: character {:#04x} is not allowed in a path (use letters, digits and ./_-+,@=)",
          what, shown(text), static_cast<unsigned char>(c)));
    }
  }
  return ok_status();
}

Result<topology::NicFilter> parse_nic_list(std::string_view text, std::string_view what) {
  if (text.size() > kMaxListBytes) {
    return make_error(fmt::format("{}: list of {} bytes is longer than the limit of {}", what,
                                  text.size(), kMaxListBytes));
  }
  for (char c : text) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '-' || c == ',' || c == '^' ||
                    c == '=';
    if (!ok) {
      return make_error(fmt::format("{}={}: character {:#04x} is not allowed in a NIC list", what,
                                    shown(text), static_cast<unsigned char>(c)));
    }
  }
  auto filter = topology::NicFilter::parse(text);
  if (!filter) return make_error(fmt::format("{}: {}", what, filter.error().message));
  return filter;
}

}  // namespace topolaunch::spank
