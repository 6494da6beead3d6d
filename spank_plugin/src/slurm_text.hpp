// Slurm's compact text forms, expanded without libslurm (the plugin must not link it):
// hostlists "n[1-3,7],gpu-a[01-02]" and task counts "8(x2),4".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::spank {

inline constexpr std::size_t kMaxHosts = 65536;

Result<std::vector<std::string>> expand_hostlist(std::string_view text);
Result<std::vector<int>> expand_tasks_per_node(std::string_view text);

}  // namespace topolaunch::spank
