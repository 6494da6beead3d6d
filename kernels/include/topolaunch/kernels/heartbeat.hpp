// Worker side of the launcher's heartbeat protocol (launcher/heartbeat.hpp is not included:
// kernels must not depend on the launcher): overwrite TOPOLAUNCH_HEARTBEAT_FILE with the step
// counter. Absent variable: every beat is a no-op. Shared by the CPU and the CUDA training loops.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace topolaunch::kernels {

class WorkerHeartbeat {
 public:
  WorkerHeartbeat() {
    const char* path = std::getenv("TOPOLAUNCH_HEARTBEAT_FILE");
    if (path != nullptr && *path != '\0') fd_ = ::open(path, O_WRONLY | O_CLOEXEC);
  }
  ~WorkerHeartbeat() {
    if (fd_ >= 0) ::close(fd_);
  }
  WorkerHeartbeat(const WorkerHeartbeat&) = delete;
  WorkerHeartbeat& operator=(const WorkerHeartbeat&) = delete;
  void beat(std::int64_t step) {
    if (fd_ < 0) return;
    const std::string text = std::to_string(step) + "\n";
    if (::pwrite(fd_, text.data(), text.size(), 0) < 0)
      return;  // a missed beat is the agent's to judge
  }

 private:
  int fd_ = -1;
};

}  // namespace topolaunch::kernels
