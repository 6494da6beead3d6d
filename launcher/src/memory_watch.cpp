// Process trees from /proc and GPU memory per process from a dlopened NVML; see memory_watch.hpp.
#include "topolaunch/launcher/memory_watch.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "topolaunch/common/shared_library.hpp"

namespace topolaunch::launcher {

namespace {

// "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so parse after the
// last ')'. False when the process is gone.
bool read_stat(const std::string& proc_root, pid_t pid, ProcessEntry& e) {
  std::ifstream stat(fmt::format("{}/{}/stat", proc_root, pid));
  std::string text;
  if (!std::getline(stat, text)) return false;
  auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(text.substr(close + 1));
  std::string state;
  e.pid = pid;
  return static_cast<bool>(rest >> state >> e.ppid >> e.pgid);
}

std::vector<pid_t> numeric_entries(const std::string& path) {
  std::vector<pid_t> out;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return out;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] >= '0' && entry->d_name[0] <= '9') {
      out.push_back(static_cast<pid_t>(std::atoi(entry->d_name)));
    }
  }
  ::closedir(dir);
  return out;
}

}  // namespace

std::vector<ProcessEntry> read_process_table(const std::string& proc_root) {
  std::vector<ProcessEntry> table;
  for (pid_t pid : numeric_entries(proc_root)) {
    ProcessEntry e;
    if (read_stat(proc_root, pid, e)) table.push_back(e);
  }
  return table;
}

std::vector<ProcessEntry> read_process_subtree(pid_t root, const std::string& proc_root) {
  const auto root_tasks = numeric_entries(fmt::format("{}/{}/task", proc_root, root));
  if (root_tasks.empty() ||
      ::access(fmt::format("{}/{}/task/{}/children", proc_root, root, root_tasks.front()).c_str(),
               R_OK) != 0) {
    return read_process_table(proc_root);
  }
  std::vector<ProcessEntry> table;
  std::vector<pid_t> pending{root};
  while (!pending.empty() && table.size() < 100000) {
    const pid_t pid = pending.back();
    pending.pop_back();
    ProcessEntry e;
    if (!read_stat(proc_root, pid, e)) continue;
    table.push_back(e);
    for (pid_t tid : numeric_entries(fmt::format("{}/{}/task", proc_root, pid))) {
      std::ifstream children(fmt::format("{}/{}/task/{}/children", proc_root, pid, tid));
      for (pid_t child; children >> child;) pending.push_back(child);
    }
  }
  return table;
}

std::vector<pid_t> process_tree(pid_t root, const std::vector<ProcessEntry>& table) {
  std::vector<pid_t> tree;
  bool root_alive = std::any_of(table.begin(), table.end(),
                                [root](const ProcessEntry& e) { return e.pid == root; });
  if (!root_alive || root <= 0) return tree;
  std::multimap<pid_t, pid_t> children;
  for (const ProcessEntry& e : table) {
    children.emplace(e.ppid, e.pid);
    if (e.pgid == root) tree.push_back(e.pid);
  }
  std::vector<pid_t> pending{root};
  while (!pending.empty()) {
    pid_t pid = pending.back();
    pending.pop_back();
    tree.push_back(pid);
    auto [first, last] = children.equal_range(pid);
    for (auto it = first; it != last; ++it) pending.push_back(it->second);
  }
  std::sort(tree.begin(), tree.end());
  tree.erase(std::unique(tree.begin(), tree.end()), tree.end());
  return tree;
}

std::uint64_t rss_bytes_of(pid_t pid, const std::string& proc_root) {
  std::ifstream statm(fmt::format("{}/{}/statm", proc_root, pid));
  std::uint64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

std::uint64_t pss_bytes_of(pid_t pid, const std::string& proc_root) {
  std::ifstream rollup(fmt::format("{}/{}/smaps_rollup", proc_root, pid));
  for (std::string line; std::getline(rollup, line);) {
    if (line.rfind("Pss:", 0) == 0) return std::strtoull(line.c_str() + 4, nullptr, 10) * 1024;
  }
  return rss_bytes_of(pid, proc_root);
}

std::uint64_t tree_memory_bytes(const std::vector<pid_t>& tree, const std::string& proc_root) {
  if (tree.size() == 1) return rss_bytes_of(tree.front(), proc_root);
  std::uint64_t total = 0;
  for (pid_t pid : tree) total += pss_bytes_of(pid, proc_root);
  return total;
}

std::map<int, std::uint64_t> gpu_bytes_of_tree(const std::vector<GpuProcessMemory>& usage,
                                               const std::vector<pid_t>& tree) {
  std::map<int, std::uint64_t> per_device;
  for (const GpuProcessMemory& u : usage) {
    if (std::binary_search(tree.begin(), tree.end(), static_cast<pid_t>(u.pid))) {
      per_device[u.device] += u.bytes;
    }
  }
  return per_device;
}

std::string nvml_library_name() {
  return library_path("TOPOLAUNCH_NVML_LIBRARY", "libnvidia-ml.so.1");
}

// The few NVML declarations used, as nvml.h (not installed on CPU hosts) spells them.
namespace {
using nvmlReturn = int;
using nvmlDevice = void*;
constexpr nvmlReturn kNvmlSuccess = 0;
constexpr nvmlReturn kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
struct NvmlProcessInfoV1 {  // nvmlDeviceGetComputeRunningProcesses
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
struct NvmlProcessInfoV2 {  // _v2 and _v3 (nvmlProcessInfo_t)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
struct NvmlPciInfo {  // nvmlPciInfo_t (v3), as topology/src/discover_nvml.cpp declares it
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
}  // namespace

struct NvmlMemoryWatch::Api {
  nvmlReturn (*init)() = nullptr;
  nvmlReturn (*shutdown)() = nullptr;
  nvmlReturn (*count)(unsigned int*) = nullptr;
  nvmlReturn (*handle_by_index)(unsigned int, nvmlDevice*) = nullptr;
  nvmlReturn (*processes_v2)(nvmlDevice, unsigned int*, NvmlProcessInfoV2*) = nullptr;  // v3/v2
  nvmlReturn (*processes_v1)(nvmlDevice, unsigned int*, NvmlProcessInfoV1*) = nullptr;
  nvmlReturn (*energy)(nvmlDevice, unsigned long long*) = nullptr;  // optional
  nvmlReturn (*pci_info)(nvmlDevice, NvmlPciInfo*) = nullptr;       // optional
  bool initialised = false;
};

Result<std::unique_ptr<NvmlMemoryWatch>> NvmlMemoryWatch::open(const std::string& library) {
  std::unique_ptr<NvmlMemoryWatch> watch(new NvmlMemoryWatch());
  watch->api_ = std::make_unique<Api>();
  watch->library_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (watch->library_ == nullptr) {
    const char* why = ::dlerror();
    return make_error(fmt::format("cannot load {} ({})", library, why ? why : "dlopen failed"), 1);
  }
  Api& api = *watch->api_;
  auto symbol = [&](const char* name) { return ::dlsym(watch->library_, name); };
  api.init = reinterpret_cast<decltype(api.init)>(symbol("nvmlInit_v2"));
  api.shutdown = reinterpret_cast<decltype(api.shutdown)>(symbol("nvmlShutdown"));
  api.count = reinterpret_cast<decltype(api.count)>(symbol("nvmlDeviceGetCount_v2"));
  api.handle_by_index =
      reinterpret_cast<decltype(api.handle_by_index)>(symbol("nvmlDeviceGetHandleByIndex_v2"));
  void* v3 = symbol("nvmlDeviceGetComputeRunningProcesses_v3");
  if (v3 == nullptr) v3 = symbol("nvmlDeviceGetComputeRunningProcesses_v2");
  api.processes_v2 = reinterpret_cast<decltype(api.processes_v2)>(v3);
  if (v3 == nullptr) {
    api.processes_v1 = reinterpret_cast<decltype(api.processes_v1)>(
        symbol("nvmlDeviceGetComputeRunningProcesses"));
  }
  api.energy =
      reinterpret_cast<decltype(api.energy)>(symbol("nvmlDeviceGetTotalEnergyConsumption"));
  api.pci_info = reinterpret_cast<decltype(api.pci_info)>(symbol("nvmlDeviceGetPciInfo_v3"));
  if (!api.init || !api.shutdown || !api.count || !api.handle_by_index ||
      (!api.processes_v2 && !api.processes_v1)) {
    return make_error(fmt::format("{} lacks the NVML functions needed (nvmlInit_v2, "
                                  "nvmlDeviceGetComputeRunningProcesses...)",
                                  library),
                      1);
  }
  if (nvmlReturn rc = api.init(); rc != kNvmlSuccess) {
    return make_error(fmt::format("nvmlInit_v2 failed (NVML error {})", rc), 1);
  }
  api.initialised = true;
  unsigned int count = 0;
  if (nvmlReturn rc = api.count(&count); rc != kNvmlSuccess) {
    return make_error(fmt::format("nvmlDeviceGetCount_v2 failed (NVML error {})", rc), 1);
  }
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice device = nullptr;
    if (nvmlReturn rc = api.handle_by_index(i, &device); rc != kNvmlSuccess) {
      return make_error(
          fmt::format("nvmlDeviceGetHandleByIndex_v2({}) failed (NVML error {})", i, rc), 1);
    }
    watch->devices_.push_back(device);
    NvmlPciInfo pci{};
    if (api.pci_info && api.pci_info(device, &pci) == kNvmlSuccess)
      watch->addresses_.push_back(topology::PciAddress{pci.domain,
                                                       static_cast<std::uint8_t>(pci.bus),
                                                       static_cast<std::uint8_t>(pci.device), 0});
    else
      watch->addresses_.push_back(std::nullopt);
  }
  return watch;
}

NvmlMemoryWatch::~NvmlMemoryWatch() {
  if (api_ && api_->initialised) api_->shutdown();
  if (library_ != nullptr) ::dlclose(library_);
}

namespace {

// Asks with a buffer that grows while NVML answers "insufficient size" (processes come and go).
template <typename Info, typename Fn>
Result<std::vector<Info>> list_processes(Fn fn, nvmlDevice device, int index) {
  std::vector<Info> infos(32);
  for (int tries = 0; tries < 8; ++tries) {
    unsigned int count = static_cast<unsigned int>(infos.size());
    nvmlReturn rc = fn(device, &count, infos.data());
    if (rc == kNvmlSuccess) {
      infos.resize(std::min<std::size_t>(count, infos.size()));
      return infos;
    }
    if (rc != kNvmlInsufficientSize) {
      return make_error(
          fmt::format("nvmlDeviceGetComputeRunningProcesses(GPU {}) failed (NVML error {})", index,
                      rc),
          1);
    }
    infos.resize(std::max<std::size_t>(count, infos.size()) * 2);
  }
  return make_error(fmt::format("GPU {}: the process list kept growing", index), 1);
}

template <typename Info>
void append_usage(const std::vector<Info>& infos, int device, std::vector<GpuProcessMemory>& out) {
  for (const Info& info : infos) {
    if (info.usedGpuMemory == kNvmlValueNotAvailable) continue;
    out.push_back({device, info.pid, static_cast<std::uint64_t>(info.usedGpuMemory)});
  }
}

}  // namespace

std::optional<std::uint64_t> NvmlMemoryWatch::energy_mj(int device) {
  if (!api_->energy || device < 0 || device >= device_count()) return std::nullopt;
  unsigned long long mj = 0;
  if (api_->energy(devices_[static_cast<std::size_t>(device)], &mj) != kNvmlSuccess)
    return std::nullopt;
  return static_cast<std::uint64_t>(mj);
}

int NvmlMemoryWatch::device_at(const topology::PciAddress& address) const {
  for (std::size_t i = 0; i < addresses_.size(); ++i)
    if (addresses_[i] && addresses_[i]->domain == address.domain &&
        addresses_[i]->bus == address.bus && addresses_[i]->device == address.device)
      return static_cast<int>(i);
  return -1;
}

Result<std::vector<GpuProcessMemory>> NvmlMemoryWatch::usage() {
  std::vector<GpuProcessMemory> out;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const int index = static_cast<int>(i);
    if (api_->processes_v2) {
      auto infos = list_processes<NvmlProcessInfoV2>(api_->processes_v2, devices_[i], index);
      if (!infos) return infos.error();
      append_usage(*infos, index, out);
    } else {
      auto infos = list_processes<NvmlProcessInfoV1>(api_->processes_v1, devices_[i], index);
      if (!infos) return infos.error();
      append_usage(*infos, index, out);
    }
  }
  return out;
}

}  // namespace topolaunch::launcher
