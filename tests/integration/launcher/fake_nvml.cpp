// A stand-in for libnvidia-ml.so.1 in tests (loaded through TOPOLAUNCH_NVML_LIBRARY): the few
// NVML entry points the agent's GPU memory watch calls, reporting the usage written in the file
// $FAKE_NVML_USAGE, one "<device> <pid> <bytes>" line per process (re-read on every call, so a
// test changes it while the job runs). $FAKE_NVML_DEVICES devices (default 2).
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

}  // extern "C"
