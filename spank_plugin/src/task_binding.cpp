#include "task_binding.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace topolaunch::spank {

using topology::CpuSet;

BindingChoice choose_binding(const CpuSet& intended, const CpuSet& allowed, int local_task) {
  BindingChoice choice;
  if (allowed.empty()) return choice;
  if (!intended.empty() && allowed.contains_all(intended)) {
    choice.cpus = intended;
    return choice;
  }
  choice.emulated = true;
  choice.cpus = intended & allowed;
  if (choice.cpus.empty()) {
    const auto& ids = allowed.ids();
    const auto pick = static_cast<std::size_t>(local_task < 0 ? 0 : local_task) % ids.size();
    choice.cpus = CpuSet({ids[pick]});
  }
  return choice;
}

Result<CpuSet> current_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return make_error(fmt::format("sched_getaffinity: {}", std::strerror(errno)), 1);
  }
  std::vector<int> ids;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) ids.push_back(cpu);
  }
  return CpuSet(std::move(ids));
}

Status set_affinity(const CpuSet& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus.ids()) {
    if (cpu >= CPU_SETSIZE) return make_error(fmt::format("cpu {} is beyond CPU_SETSIZE", cpu), 1);
    CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return make_error(
        fmt::format("sched_setaffinity({}): {}", cpus.to_list(), std::strerror(errno)), 1);
  }
  return ok_status();
}

Result<bool> prefer_memory_node(int numa) {
  if (numa < 0 || numa >= 1024) return false;
  if (access(fmt::format("/sys/devices/system/node/node{}", numa).c_str(), F_OK) != 0) {
    return false;
  }
  constexpr int kMpolPreferred = 1;  // <linux/mempolicy.h>; no libnuma dependency for one call
  unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {};
  mask[numa / (8 * sizeof(unsigned long))] |= 1UL << (numa % (8 * sizeof(unsigned long)));
  if (syscall(SYS_set_mempolicy, kMpolPreferred, mask, 1024UL) != 0) {
    return make_error(
        fmt::format("set_mempolicy(preferred, node {}): {}", numa, std::strerror(errno)), 1);
  }
  return true;
}

}  // namespace topolaunch::spank
