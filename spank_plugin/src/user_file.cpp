#include "user_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace topolaunch::spank {
namespace {

// Returns 0 or an errno; reads at most limit+1 bytes so "too large" is detectable.
int read_fd(int fd, std::string& out, std::size_t limit) {
  char buf[16384];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return 0;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > limit) return EFBIG;
  }
}

int open_regular(const std::string& path, int& fd) {
  fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return errno;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    fd = -1;
    return EINVAL;  // a FIFO or device could block or never end
  }
  return 0;
}

Error file_error(const std::string& path, int err) {
  if (err == EINVAL) return make_error(fmt::format("{}: not a regular file", path));
  if (err == EFBIG) {
    return make_error(fmt::format("{}: larger than {} bytes", path, kMaxUserFileBytes));
  }
  return make_error(fmt::format("{}: {} (opened as the job's user)", path, std::strerror(err)));
}

}  // namespace

Result<std::string> read_file_as_user(const std::string& path, const UserIdentity& user) {
  std::string text;
  if (geteuid() == user.uid && getegid() == user.gid) {
    int fd = -1;
    if (int err = open_regular(path, fd); err != 0) return file_error(path, err);
    const int err = read_fd(fd, text, kMaxUserFileBytes);
    close(fd);
    if (err != 0) return file_error(path, err);
    return text;
  }
  if (geteuid() != 0) {
    return make_error(fmt::format("{}: cannot switch to uid {} to read it", path, user.uid), 1);
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return make_error(fmt::format("pipe: {}", std::strerror(errno)), 1);
  }
  const pid_t child = fork();
  if (child < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return make_error(fmt::format("fork: {}", std::strerror(errno)), 1);
  }
  if (child == 0) {
    // Child: only async-signal-safe calls (the parent may be multi-threaded). The first byte
    // says whether what follows is the file ('F') or an errno ('E').
    close(pipe_fds[0]);
    int err = 0;
    if (setgroups(user.groups.size(), user.groups.data()) != 0 || setgid(user.gid) != 0 ||
        setuid(user.uid) != 0 || (user.uid != 0 && setuid(0) == 0)) {
      err = EPERM;
    }
    int fd = -1;
    if (err == 0) {
      fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
      if (fd < 0) err = errno;
    }
    struct stat st {};
    if (err == 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) err = EINVAL;
    if (err != 0) {
      char msg[1 + sizeof(int)];
      msg[0] = 'E';
      std::memcpy(msg + 1, &err, sizeof(int));
      (void)!write(pipe_fds[1], msg, sizeof(msg));
      _exit(1);
    }
    (void)!write(pipe_fds[1], "F", 1);
    char buf[16384];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (write(pipe_fds[1], buf, static_cast<std::size_t>(n)) != n) break;
    }
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string raw;
  const int err = read_fd(pipe_fds[0], raw, kMaxUserFileBytes + 1);
  close(pipe_fds[0]);
  if (err == EFBIG) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (err != 0) return file_error(path, err);
  if (raw.empty()) return make_error(fmt::format("{}: the reader process failed", path), 1);
  if (raw[0] == 'E' && raw.size() >= 1 + sizeof(int)) {
    int child_err = 0;
    std::memcpy(&child_err, raw.data() + 1, sizeof(int));
    return file_error(path, child_err);
  }
  return raw.substr(1);
}

}  // namespace topolaunch::spank
