// topolaunch-worker as a child process for the kernels integration tests: spawn with an
// environment and a log, wait, read the metrics file's losses.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"

namespace worker_process {

namespace fs = std::filesystem;

inline std::string worker_path() {
  const char* p = std::getenv("TOPOLAUNCH_WORKER");
  if (p == nullptr) FAIL("TOPOLAUNCH_WORKER is not set (meson passes the built topolaunch-worker)");
  return p;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tl-kernels-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

using Env = std::vector<std::pair<std::string, std::string>>;

// Starts the worker with stdout+stderr into `log`; returns its pid.
inline pid_t spawn(const std::vector<std::string>& args, const Env& env, const fs::path& log) {
  std::string exe = worker_path();  // in the parent: a failure must not happen in the child
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

inline int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

// The exit status and the peak resident set of the process (getrusage's ru_maxrss, bytes).
struct Exit {
  int code = 0;
  std::size_t peak_rss_bytes = 0;
};
inline Exit wait_exit_with_rss(pid_t pid) {
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return {code, static_cast<std::size_t>(usage.ru_maxrss) * 1024};
}

struct Result {
  int exit_code;
  std::string output;
};

inline Result run(const std::vector<std::string>& args, const Env& env, const fs::path& log) {
  const int code = wait_exit(spawn(args, env, log));
  return {code, read_file(log)};
}

// The "loss" of each step line of a metrics file, as written (%.17g: equal strings, equal
// doubles); validation lines ("val_loss") are not step lines.
inline std::vector<std::string> metric_losses(const fs::path& metrics) {
  std::vector<std::string> losses;
  std::istringstream in(read_file(metrics));
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("\"loss\":");
    if (at == std::string::npos) continue;
    const auto a = at + 7;
    losses.push_back(line.substr(a, line.find(',', a) - a));
  }
  return losses;
}

inline std::size_t count_lines(const fs::path& p) {
  const std::string s = read_file(p);
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

// A MASTER_PORT for `world` ranks (the ring listens on MASTER_PORT+1+rank): ports below the
// kernel's ephemeral range (where no outgoing connection takes them), each of which binds now.
// Successive calls move on, so a run never reuses the ports of the one before it.
inline int free_port_base(int world = 8) {
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  const int low = 10000, span = std::max(1000, ephemeral_low - low - 64);
  static int next = static_cast<int>(::getpid() % span);
  auto binds = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as the ring does
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return ok;
  };
  for (int tries = 0; tries < span; tries += world + 1) {
    const int base = low + next;
    next = (next + world + 1) % span;
    bool all = true;
    for (int p = base; p <= base + world && all; ++p) all = binds(p);
    if (all) return base;
  }
  FAIL("no " << world + 1 << " consecutive free ports between " << low << " and " << low + span);
  return 0;
}

inline void require_janeaustenr() {
  if (!fs::exists("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"))
    FAIL("Debian package r-cran-janeaustenr is not installed (apt-get install r-cran-janeaustenr)");
}

}  // namespace worker_process
