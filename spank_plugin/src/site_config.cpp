#include "site_config.hpp"

#include <fmt/format.h>

#include <set>

#include "text_checks.hpp"

namespace topolaunch::spank {
namespace {

Result<bool> parse_bool(std::string_view key, std::string_view value) {
  if (value == "1" || value == "yes" || value == "true") return true;
  if (value == "0" || value == "no" || value == "false") return false;
  return make_error(
      fmt::format("plugstack.conf: {}={}: not a boolean (use 0 or 1)", key, shown(value)));
}

Status check_pattern(std::string_view value) {
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '%') continue;
    if (i + 1 < value.size() && (value[i + 1] == 'n' || value[i + 1] == '%')) {
      ++i;
      continue;
    }
    return make_error(fmt::format(
        "plugstack.conf: topology_xml={}: only %n (node name) and %% may follow '%'", value));
  }
  return ok_status();
}

}  // namespace

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::off:
      return "off";
    case Mode::automatic:
      return "auto";
    case Mode::verbose:
      return "verbose";
  }
  return "off";
}

std::string expand_node_pattern(std::string_view pattern, std::string_view node_name) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'n') {
        out += node_name;
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

Result<SiteConfig> parse_site_config(const std::vector<std::string_view>& args) {
  SiteConfig config;
  std::set<std::string, std::less<>> seen;
  for (std::string_view arg : args) {
    const auto eq = arg.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return make_error(fmt::format("plugstack.conf: '{}': expected key=value", shown(arg)));
    }
    const std::string_view key = arg.substr(0, eq);
    const std::string_view value = arg.substr(eq + 1);
    if (!seen.emplace(key).second) {
      return make_error(fmt::format("plugstack.conf: {}: given twice", shown(key)));
    }
    if (key == "mode") {
      auto mode = parse_mode(value);
      if (!mode) return make_error(fmt::format("plugstack.conf: {}", mode.error().message));
      config.default_mode = *mode;
    } else if (key == "topology_xml") {
      if (auto ok = check_path(value, "topology_xml"); !ok) {
        return make_error(fmt::format("plugstack.conf: {}", ok.error().message));
      }
      if (value.empty() || value.front() != '/') {
        return make_error("plugstack.conf: topology_xml: must be an absolute path");
      }
      if (auto ok = check_pattern(value); !ok) return ok.error();
      config.topology_xml = value;
    } else if (key == "topology_cache") {
      if (value == "off") {
        config.topology_cache.clear();
        continue;
      }
      if (auto ok = check_path(value, "topology_cache"); !ok) {
        return make_error(fmt::format("plugstack.conf: {}", ok.error().message));
      }
      if (value.empty() || value.front() != '/') {
        return make_error("plugstack.conf: topology_cache: must be an absolute path or off");
      }
      config.topology_cache = value;
    } else if (key == "nics") {
      auto nics = parse_nic_list(value, "nics");
      if (!nics) return make_error(fmt::format("plugstack.conf: {}", nics.error().message));
      config.nics = *nics;
      config.nics_text = value;
    } else if (key == "enforce_binding") {
      auto b = parse_bool(key, value);
      if (!b) return b.error();
      config.enforce_binding = *b;
    } else if (key == "allow_user_config") {
      auto b = parse_bool(key, value);
      if (!b) return b.error();
      config.allow_user_config = *b;
    } else if (key == "log_level") {
      if (value == "error") {
        config.log_level = LogLevel::error;
      } else if (value == "info") {
        config.log_level = LogLevel::info;
      } else if (value == "debug") {
        config.log_level = LogLevel::debug;
      } else {
        return make_error(
            fmt::format("plugstack.conf: log_level={}: use error, info or debug", shown(value)));
      }
    } else {
      return make_error(fmt::format(
          "plugstack.conf: unknown key '{}' (known: mode, topology_xml, topology_cache, nics, "
          "enforce_binding, allow_user_config, log_level)",
          shown(key)));
    }
  }
  return config;
}

}  // namespace topolaunch::spank
