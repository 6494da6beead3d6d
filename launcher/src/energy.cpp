// RAPL energy counters from the powercap sysfs tree; see energy.hpp.
#include "topolaunch/launcher/energy.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace topolaunch::launcher {

namespace {

std::optional<std::uint64_t> read_counter(const std::string& path) {
  std::ifstream in(path);
  std::uint64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

// "intel-rapl:0", not "intel-rapl:0:1" (a subdomain: core, uncore, dram of that package).
bool is_package_domain(const std::string& name) {
  const std::string prefix = "intel-rapl:";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

RaplEnergy RaplEnergy::open(const std::string& root) {
  RaplEnergy e;
  DIR* dir = ::opendir(root.c_str());
  if (dir == nullptr) {
    e.why_not_ = "no RAPL here (" + root + " is missing)";
    return e;
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir))
    if (is_package_domain(entry->d_name)) names.emplace_back(entry->d_name);
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  bool unreadable = false;
  for (const std::string& name : names) {
    Domain d;
    d.energy_path = root + "/" + name + "/energy_uj";
    const auto now = read_counter(d.energy_path);
    if (!now) {
      unreadable = true;
      continue;
    }
    d.last_uj = *now;
    d.range_uj = read_counter(root + "/" + name + "/max_energy_range_uj").value_or(0);
    e.domains_.push_back(d);
  }
  if (e.domains_.empty())
    e.why_not_ = names.empty() ? "no RAPL package domain in " + root
                 : unreadable  ? "RAPL's energy_uj is not readable (root only since Linux 5.10)"
                               : "";
  return e;
}

void RaplEnergy::sample() {
  for (Domain& d : domains_) {
    const auto now = read_counter(d.energy_path);
    if (!now) continue;
    std::uint64_t delta = *now - d.last_uj;
    if (*now < d.last_uj) delta = d.range_uj > d.last_uj ? d.range_uj - d.last_uj + *now : *now;
    joules_ += static_cast<double>(delta) / 1e6;
    d.last_uj = *now;
  }
}

}  // namespace topolaunch::launcher
