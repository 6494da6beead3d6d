// Energy a node used while its ranks ran: the CPU packages through RAPL (the powercap sysfs
// interface: /sys/class/powercap/intel-rapl:<N>/energy_uj, which AMD's driver provides under the
// same names), and the GPUs through NVML's energy counter (memory_watch.hpp's NvmlMemoryWatch).
// RAPL is read only where readable: since Linux 5.10 energy_uj is root's alone (CVE-2020-8694),
// and virtual machines seldom have it; then the report says why and measures nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace topolaunch::launcher {

class RaplEnergy {
 public:
  // The package domains under `powercap_root` (intel-rapl:<N>, not their subdomains, which
  // the package already counts); `why_not()` says why there are none readable.
  static RaplEnergy open(const std::string& powercap_root = "/sys/class/powercap");

  bool readable() const { return !domains_.empty(); }
  const std::string& why_not() const { return why_not_; }
  std::size_t domains() const { return domains_.size(); }

  // Reads every counter and adds what it advanced since the last read. A counter wraps at its
  // max_energy_range_uj (about 262 kJ: minutes at full power), so read at least every few
  // seconds.
  void sample();
  // Joules since open().
  double joules() const { return joules_; }

 private:
  struct Domain {
    std::string energy_path;
    std::uint64_t range_uj = 0;
    std::uint64_t last_uj = 0;
  };
  std::vector<Domain> domains_;
  std::string why_not_;
  double joules_ = 0;
};

}  // namespace topolaunch::launcher
