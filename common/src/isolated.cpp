#include "topolaunch/common/isolated.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <string_view>

namespace topolaunch {
namespace {

constexpr std::size_t kMaxMessageBytes = 4096;

// AddressSanitizer reserves terabytes of shadow address space: an RLIMIT_AS would fail it.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kLimitAddressSpace = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kLimitAddressSpace = false;
#else
constexpr bool kLimitAddressSpace = true;
#endif
#else
constexpr bool kLimitAddressSpace = true;
#endif

// The address space of this process now, from /proc/self/statm (pages), or 0 when unreadable.
std::uint64_t current_address_space_bytes() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128] = {};
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  std::uint64_t pages = 0;
  for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) {
    pages = pages * 10 + static_cast<std::uint64_t>(buf[i] - '0');
  }
  return pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// The child's report: 'O' (ok) and a zero byte, then the output; or 'E', the exit code as one
// byte, then the message.
[[noreturn]] void report_and_exit(int fd, const Result<std::string>& result) {
  std::string frame;
  if (result) {
    frame = "O";
    frame += '\0';
    frame += *result;
  } else {
    frame = "E";
    frame += static_cast<char>(result.error().exit_code & 0xff);
    frame += std::string_view(result.error().message).substr(0, kMaxMessageBytes);
  }
  write_all(fd, frame.data(), frame.size());
  ::_exit(0);
}

// Drops every privilege the child could use; false when a switch that was asked for failed.
bool become(const IsolationLimits& limits) {
  if (!limits.uid) return true;
  const bool privileged = ::getuid() == 0 || ::geteuid() == 0;
  if (!privileged) return true;  // nothing to drop: the child already runs as a user
  // slurmstepd's user_init runs with euid = the user and uid = 0: regain root first, so that
  // the supplementary groups can be cleared and all three ids set for good.
  if (::geteuid() != 0 && ::seteuid(0) != 0) return false;
  if (::setgroups(0, nullptr) != 0) return false;
  if (limits.gid && ::setresgid(*limits.gid, *limits.gid, *limits.gid) != 0) return false;
  if (::setresuid(*limits.uid, *limits.uid, *limits.uid) != 0) return false;
  return *limits.uid == 0 || ::setuid(0) != 0;  // must not be able to get root back
}

[[noreturn]] void run_child(int fd, const std::function<Result<std::string>()>& parse,
                            const IsolationLimits& limits) {
  // The parent's handlers (slurmstepd's, a test framework's) must not run for the child's
  // crash: a crash ends the child, and the parent reads it from the exit status.
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGXCPU, SIGTERM, SIGINT, SIGPIPE}) {
    ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  const auto cpu = static_cast<rlim_t>(std::max<long long>(1, limits.cpu.count()));
  const rlimit cpu_limit{cpu, cpu + 1};
  ::setrlimit(RLIMIT_CPU, &cpu_limit);
  if (kLimitAddressSpace) {
    if (const std::uint64_t now = current_address_space_bytes(); now > 0) {
      const rlimit as{static_cast<rlim_t>(now + limits.extra_memory_bytes),
                      static_cast<rlim_t>(now + limits.extra_memory_bytes)};
      ::setrlimit(RLIMIT_AS, &as);
    }
  }
  if (!become(limits)) {
    report_and_exit(fd, make_error("cannot switch to the input owner's identity to parse it", 1));
  }
  try {
    report_and_exit(fd, parse());
  } catch (const std::bad_alloc&) {
    report_and_exit(fd, make_error("the parser ran out of its memory limit"));
  } catch (const std::exception& e) {
    report_and_exit(fd, make_error(std::string("the parser failed: ") + e.what()));
  } catch (...) {
    report_and_exit(fd, make_error("the parser failed"));
  }
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig);
}

}  // namespace

Result<std::string> run_isolated_output(const std::function<Result<std::string>()>& parse,
                                        const IsolationLimits& limits, const std::string& what,
                                        std::size_t max_output_bytes) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return make_error(what + ": pipe: " + std::strerror(errno), 1);
  }
  const pid_t child = ::fork();
  if (child < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return make_error(what + ": fork: " + std::strerror(err), 1);
  }
  if (child == 0) {
    ::close(fds[0]);
    run_child(fds[1], parse, limits);
  }
  ::close(fds[1]);

  // The frame's two bytes, then the output or the message, whichever may be longer.
  const std::size_t max_frame = 2 + std::max(kMaxMessageBytes, max_output_bytes);
  std::string frame;
  bool too_long = false;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + limits.wall;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = ready == 0;
      break;
    }
    char buf[16384];
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (frame.size() + static_cast<std::size_t>(n) > max_frame) {
      too_long = true;  // the child is stopped at once, not read to its end
      break;
    }
    frame.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out || too_long) ::kill(child, SIGKILL);
  int status = 0;
  pid_t reaped = -1;
  do {
    reaped = ::waitpid(child, &status, 0);
  } while (reaped < 0 && errno == EINTR);

  if (timed_out) {
    return make_error(what + ": the parser took longer than " +
                      std::to_string(limits.wall.count()) + " ms on this input; it is refused");
  }
  if (too_long) {  // an 'E' frame never is: the child cuts its message to kMaxMessageBytes
    return make_error(what + ": the parser's result is larger than " +
                      std::to_string(max_output_bytes) + " bytes; it is refused");
  }
  if (reaped == child && WIFSIGNALED(status) && frame.empty()) {
    const int sig = WTERMSIG(status);
    if (sig == SIGXCPU || sig == SIGKILL) {
      return make_error(what + ": the parser exceeded its CPU limit on this input; it is refused");
    }
    return make_error(what + ": the parser crashed on this input (" + signal_name(sig) +
                      "); it is refused");
  }
  if (frame.size() >= 2 && frame[0] == 'O') return frame.substr(2);
  if (frame.size() >= 2 && frame[0] == 'E') {
    return make_error(frame.substr(2, kMaxMessageBytes), static_cast<unsigned char>(frame[1]));
  }
  return make_error(what + ": the parser process ended without an answer", 1);
}

Status run_isolated(const std::function<Status()>& probe, const IsolationLimits& limits,
                    const std::string& what) {
  auto answered = run_isolated_output(
      [&]() -> Result<std::string> {
        if (Status s = probe(); !s) return s.error();
        return std::string();
      },
      limits, what, 0);
  if (!answered) return answered.error();
  return ok_status();
}

}  // namespace topolaunch
