// The worker heartbeat: how a worker tells its agent "I am making progress".
//
// Protocol (any language can do it):
//   - The agent creates one file per rank and passes its path in TOPOLAUNCH_HEARTBEAT_FILE.
//   - The worker overwrites the file with its progress counter (e.g. the step number) as decimal
//     text, at least once per heartbeat_timeout; a beat is any change of the file's mtime or
//     content. Shell: `echo $step > "$TOPOLAUNCH_HEARTBEAT_FILE"`; Python:
//     `open(os.environ["TOPOLAUNCH_HEARTBEAT_FILE"], "w").write(str(step))`.
//   - When [job].heartbeat_timeout is set, the clock starts when the worker is started: a rank
//     that has not beaten within the timeout (first beat included) is declared hung, and the job
//     is stopped and restarted like after a crash. The last counter is named in the report, so a
//     hung rank (counter stuck) is told apart from a slow one (counter moving, slowly).
//   - Without TOPOLAUNCH_HEARTBEAT_FILE (not started by topolaunch) beating does nothing.
//
// C++ workers use the helper below (header-only; no link dependency on the launcher).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace topolaunch::launcher {

inline constexpr const char* kHeartbeatFileEnv = "TOPOLAUNCH_HEARTBEAT_FILE";

class Heartbeat {
 public:
  // Opens the file named by TOPOLAUNCH_HEARTBEAT_FILE, if any.
  Heartbeat() {
    const char* path = std::getenv(kHeartbeatFileEnv);
    if (path != nullptr && *path != '\0') fd_ = ::open(path, O_WRONLY | O_CLOEXEC);
  }
  explicit Heartbeat(const std::string& path) : fd_(::open(path.c_str(), O_WRONLY | O_CLOEXEC)) {}
  ~Heartbeat() {
    if (fd_ >= 0) ::close(fd_);
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  bool active() const { return fd_ >= 0; }

  // Records progress. Cheap (one pwrite); call it once per step. Async-signal-safe.
  void beat(std::uint64_t counter) {
    if (fd_ < 0) return;
    char text[24];
    int n = 0;
    char digits[21];
    int d = 0;
    do {
      digits[d++] = static_cast<char>('0' + counter % 10);
      counter /= 10;
    } while (counter != 0);
    while (d > 0) text[n++] = digits[--d];
    text[n++] = '\n';
    // Same length or longer than before: no truncation needed while the counter only grows.
    if (::pwrite(fd_, text, static_cast<std::size_t>(n), 0) < 0) return;
  }

 private:
  int fd_ = -1;
};

}  // namespace topolaunch::launcher
