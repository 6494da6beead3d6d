// Site options: the plugstack.conf arguments of the topolaunch line, parsed once into plain data.
// Only the admin writes plugstack.conf; nothing a user passes changes these values.
//
//   required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_topolaunch.so mode=off
//       topology_xml=/etc/topolaunch/%n.xml topology_cache=/var/cache/topolaunch
//       nics=^mlx5_1,mlx5_2 enforce_binding=1 log_level=info
// (one line in the file; wrapped here).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/discover.hpp"

namespace topolaunch::spank {

enum class Mode { off, automatic, verbose };
enum class LogLevel { error, info, debug };

struct SiteConfig {
  Mode default_mode = Mode::off;  // when the user gives no --topolaunch
  std::string topology_xml;       // "" = discover the live node; %n = Slurm node name
  // Imported topology_xml files, kept between steps on each node (topology_cache.hpp); "" = off.
  std::string topology_cache = "/var/cache/topolaunch";
  std::string nics_text;  // NCCL_IB_HCA syntax; "" = every compute NIC
  topology::NicFilter nics;
  bool enforce_binding = true;    // a failed sched_setaffinity fails the task
  bool allow_user_config = true;  // --topolaunch-config accepted
  LogLevel log_level = LogLevel::info;
};

// Strict: unknown keys, missing '=', repeated keys and bad values are errors naming the key.
Result<SiteConfig> parse_site_config(const std::vector<std::string_view>& args);

// topology_xml with %n replaced by the node name and %% by %; any other %x is rejected at parse.
std::string expand_node_pattern(std::string_view pattern, std::string_view node_name);

std::string_view to_string(Mode mode);

}  // namespace topolaunch::spank
