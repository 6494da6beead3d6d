// A stand-in for libnvidia-ml.so.1 in tests (loaded through TOPOLAUNCH_NVML_LIBRARY): the few
// NVML entry points the agent's GPU memory watch calls, reporting the usage written in the file
// $FAKE_NVML_USAGE, one "<device> <pid> <bytes>" line per process (re-read on every call, so a
// test changes it while the job runs). $FAKE_NVML_DEVICES devices (default 2). Each device's
// energy counter advances at $FAKE_NVML_POWER_W watts (default 100) from the monotonic clock, and
// device i sits at PCI 0000:(0x10 + i):00.
#include <time.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <vector>

namespace {

struct ProcessInfo {  // nvmlProcessInfo_t as _v3 fills it
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kInsufficientSize = 7;

unsigned int device_count() {
  const char* text = std::getenv("FAKE_NVML_DEVICES");
  return text != nullptr ? static_cast<unsigned int>(std::atoi(text)) : 2U;
}

}  // namespace

extern "C" {

int nvmlInit_v2() { return kSuccess; }
int nvmlShutdown() { return kSuccess; }

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (count == nullptr) return kInvalidArgument;
  *count = device_count();
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (device == nullptr || index >= device_count()) return kInvalidArgument;
  *device = reinterpret_cast<void*>(static_cast<std::uintptr_t>(index) + 1);
  return kSuccess;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count, ProcessInfo* infos) {
  if (count == nullptr) return kInvalidArgument;
  const auto index = reinterpret_cast<std::uintptr_t>(device) - 1;
  std::vector<ProcessInfo> found;
  if (const char* path = std::getenv("FAKE_NVML_USAGE")) {
    std::ifstream in(path);
    std::uintptr_t dev = 0;
    unsigned int pid = 0;
    unsigned long long bytes = 0;
    while (in >> dev >> pid >> bytes) {
      if (dev == index) found.push_back({pid, bytes, 0xFFFFFFFFU, 0xFFFFFFFFU});
    }
  }
  if (*count < found.size() || (infos == nullptr && !found.empty())) {
    *count = static_cast<unsigned int>(found.size());
    return kInsufficientSize;
  }
  for (std::size_t i = 0; i < found.size(); ++i) infos[i] = found[i];
  *count = static_cast<unsigned int>(found.size());
  return kSuccess;
}

struct PciInfo {  // nvmlPciInfo_t (v3)
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};

int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* millijoules) {
  if (millijoules == nullptr || device == nullptr) return kInvalidArgument;
  const char* text = std::getenv("FAKE_NVML_POWER_W");
  const double watts = text != nullptr ? std::atof(text) : 100.0;
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const double seconds = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  *millijoules = static_cast<unsigned long long>(seconds * watts * 1e3);
  return kSuccess;
}

int nvmlDeviceGetPciInfo_v3(void* device, PciInfo* info) {
  if (info == nullptr || device == nullptr) return kInvalidArgument;
  *info = PciInfo{};
  info->bus = 0x10 + static_cast<unsigned int>(reinterpret_cast<std::uintptr_t>(device) - 1);
  return kSuccess;
}

}  // extern "C"
