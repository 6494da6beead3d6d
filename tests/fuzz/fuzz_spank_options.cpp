// What the SPANK plugin reads from users and from the site, inside srun and slurmstepd (root):
// the --topolaunch* option values, the plugstack.conf arguments, and Slurm's compact hostlist and
// tasks-per-node forms from the job's environment. Input: byte 0 picks the reader, the rest is
// the text it gets.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "site_config.hpp"
#include "slurm_text.hpp"
#include "text_checks.hpp"

using namespace topolaunch;
using namespace topolaunch::spank;

namespace {

template <typename R>
void refused_cleanly(const R& result) {
  if (!result) fuzz::require_one_line(result.error().message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 8) {
    case 0:
      refused_cleanly(parse_mode(text));
      break;
    case 1:
      refused_cleanly(parse_policy(text));
      break;
    case 2:
      refused_cleanly(check_path(text, "--topolaunch-config"));
      break;
    case 3:
      refused_cleanly(parse_nic_list(text, "--topolaunch-nics"));
      break;
    case 4: {
      auto hosts = expand_hostlist(text);
      refused_cleanly(hosts);
      if (hosts) {
        fuzz::require(hosts->size() <= kMaxHosts, "more hosts than kMaxHosts");
        for (const auto& h : *hosts) fuzz::require(!h.empty(), "an empty host name", text);
      }
      break;
    }
    case 5: {
      auto counts = expand_tasks_per_node(text);
      refused_cleanly(counts);
      if (counts) {
        fuzz::require(counts->size() <= kMaxHosts, "more task counts than kMaxHosts");
        for (int n : *counts) fuzz::require(n >= 0, "a negative task count", text);
      }
      break;
    }
    case 6: {
      // plugstack.conf: Slurm splits the plugin's line at blanks.
      std::vector<std::string_view> args;
      std::size_t start = 0;
      while (start < text.size()) {
        const auto end = text.find_first_of(" \t\n", start);
        if (end != start) args.push_back(text.substr(start, end - start));
        if (end == std::string_view::npos) break;
        start = end + 1;
      }
      auto site = parse_site_config(args);
      refused_cleanly(site);
      if (site && !site->topology_xml.empty())
        fuzz::require(!expand_node_pattern(site->topology_xml, "node-01").empty(),
                      "an accepted topology_xml expands to nothing");
      break;
    }
    default: {
      // topology_xml's %n with a node name from Slurm.
      const auto bar = text.find('|');
      (void)expand_node_pattern(text.substr(0, bar),
                                bar == std::string_view::npos ? "n1" : text.substr(bar + 1));
      break;
    }
  }
  return 0;
}
