// What the agent measures to hold a rank to its memory budgets: the host RSS of the rank's whole
// process tree (the worker and everything it started), and the GPU memory NVML reports for the
// pids of that tree. NVML is dlopened (never linked): nodes without NVIDIA drivers run the same
// binary, and tests point TOPOLAUNCH_NVML_LIBRARY at a fake library.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/model.hpp"

namespace topolaunch::launcher {

// One row of the process table (/proc/<pid>/stat).
struct ProcessEntry {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
};

// Every process of /proc (`proc_root` for tests) with its parent and process group.
std::vector<ProcessEntry> read_process_table(const std::string& proc_root = "/proc");

// `root` and its descendants only, walking /proc/<pid>/task/<tid>/children (cost grows with the
// subtree, not with the node's process count). The agent is a child subreaper, so everything its
// workers started stays below it. Falls back to read_process_table() when the kernel has no
// children files (CONFIG_PROC_CHILDREN).
std::vector<ProcessEntry> read_process_subtree(pid_t root, const std::string& proc_root = "/proc");

// A rank's processes: `root` and its descendants, plus every process in the process group that
// `root` leads (a worker is a group leader; a grandchild orphaned to the agent, which is a child
// subreaper, stays in the group). Sorted, without duplicates; empty when `root` is gone.
std::vector<pid_t> process_tree(pid_t root, const std::vector<ProcessEntry>& table);

// Resident bytes of one process (/proc/<pid>/statm), 0 when it is gone.
std::uint64_t rss_bytes_of(pid_t pid, const std::string& proc_root = "/proc");
// Proportional set size (/proc/<pid>/smaps_rollup "Pss:"): shared pages split among their
// sharers; falls back to RSS when smaps_rollup is unreadable. 0 when the process is gone.
std::uint64_t pss_bytes_of(pid_t pid, const std::string& proc_root = "/proc");
// Host memory of a rank's tree: RSS for a single process; for several, the sum of their PSS, so
// pages a forked child shares with its parent (copy-on-write) are not counted twice.
std::uint64_t tree_memory_bytes(const std::vector<pid_t>& tree,
                                const std::string& proc_root = "/proc");

// GPU memory NVML attributes to one process on one device.
struct GpuProcessMemory {
  int device = -1;  // NVML index
  std::uint32_t pid = 0;
  std::uint64_t bytes = 0;
};

// Per device, the bytes held by the pids in `tree` (devices holding nothing are left out).
std::map<int, std::uint64_t> gpu_bytes_of_tree(const std::vector<GpuProcessMemory>& usage,
                                               const std::vector<pid_t>& tree);

// The library dlopen()ed: $TOPOLAUNCH_NVML_LIBRARY when set, else "libnvidia-ml.so.1".
std::string nvml_library_name();

// NVML, dlopened: init once, list each device's compute processes on demand, shut down at the
// end. Uses nvmlDeviceGetComputeRunningProcesses_v3, else _v2, else the unversioned call. Also
// each device's energy counter (nvmlDeviceGetTotalEnergyConsumption, Volta and later) and PCI
// address (nvmlDeviceGetPciInfo_v3), when the library has them.
class NvmlMemoryWatch {
 public:
  // An error (exit code 1) says why NVML is not usable: the library is missing, a symbol is
  // missing, or nvmlInit failed. Callers treat it as "GPU memory is not watched".
  static Result<std::unique_ptr<NvmlMemoryWatch>> open(const std::string& library);
  ~NvmlMemoryWatch();
  NvmlMemoryWatch(const NvmlMemoryWatch&) = delete;
  NvmlMemoryWatch& operator=(const NvmlMemoryWatch&) = delete;

  int device_count() const { return static_cast<int>(devices_.size()); }
  // Every compute process on every device. Usage NVML cannot report is left out.
  Result<std::vector<GpuProcessMemory>> usage();
  // Millijoules the device used since the driver loaded; nullopt when NVML cannot say.
  std::optional<std::uint64_t> energy_mj(int device);
  // The device at this PCI address (domain, bus and device), -1 when none (or NVML gave none).
  int device_at(const topology::PciAddress& address) const;

 private:
  struct Api;
  NvmlMemoryWatch() = default;
  void* library_ = nullptr;
  std::unique_ptr<Api> api_;
  std::vector<void*> devices_;
  std::vector<std::optional<topology::PciAddress>> addresses_;
};

}  // namespace topolaunch::launcher
