// fork/exec of workers. After fork() in a process with threads (the TCP store server runs one)
// only async-signal-safe calls are allowed, so argv, envp, the CPU mask and the NUMA node mask
// are all built before forking.
#include "process.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace topolaunch::launcher {
namespace {

// set_mempolicy(2) without libnuma: MPOL_BIND to one node.
constexpr int kMpolBind = 2;

}  // namespace

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

ExecStrings::ExecStrings(const std::vector<std::string>& args,
                         const std::map<std::string, std::string>& env)
    : arg_strings_(args) {
  env_strings_.reserve(env.size());
  for (const auto& [k, v] : env) env_strings_.push_back(k + "=" + v);
  for (auto& s : env_strings_) envp_.push_back(s.data());
  envp_.push_back(nullptr);
  for (auto& s : arg_strings_) argv_.push_back(s.data());
  argv_.push_back(nullptr);
}

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

std::string this_node_name() {
  if (const char* slurm = std::getenv("SLURMD_NODENAME"); slurm && *slurm) return slurm;
  return host_name();
}

topology::CpuSet allowed_cpus_here() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> ids;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) ids.push_back(i);
    }
  }
  return topology::CpuSet(std::move(ids));
}

bool numa_node_exists_here(int node) {
  if (node < 0) return false;
  return std::filesystem::exists(fmt::format("/sys/devices/system/node/node{}", node));
}

Result<std::string> resolve_program(const std::string& name) {
  auto executable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (executable(name)) return name;
    return make_error(fmt::format(
        "worker.command: \"{}\" is not an executable file (check the path and its x bit)", name));
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (executable(candidate)) return candidate;
    start = end + 1;
  }
  return make_error(fmt::format(
      "worker.command: program \"{}\" not found in PATH (install it, give a path, or set "
      "[worker].command)",
      name));
}

Result<SpawnedProcess> spawn_worker(const SpawnRequest& request) {
  // Everything the child needs, prepared here.
  ExecStrings exec(request.argv, request.env);

  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  bool bind_cpus = false;
  for (int id : request.cpus.ids()) {
    if (id < CPU_SETSIZE) CPU_SET(id, &cpus), bind_cpus = true;
  }
  unsigned long nodemask[16] = {};
  bool bind_memory = request.numa_node >= 0 && request.numa_node < 16 * 64;
  if (bind_memory) nodemask[request.numa_node / 64] |= 1UL << (request.numa_node % 64);

  int out[2], err[2], status_pipe[2];
  if (::pipe2(out, O_CLOEXEC) != 0)
    return make_error(fmt::format("pipe: {}", std::strerror(errno)), 1);
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]), ::close(out[1]);
    return make_error(fmt::format("pipe: {}", std::strerror(errno)), 1);
  }
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) {
    ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
    return make_error(fmt::format("pipe: {}", std::strerror(errno)), 1);
  }
  Fd out_read(out[0]), out_write(out[1]), err_read(err[0]), err_write(err[1]);
  Fd status_read(status_pipe[0]), status_write(status_pipe[1]);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) return make_error(fmt::format("fork: {}", std::strerror(errno)), 1);
  if (pid == 0) {
    auto fail = [&](int step) {
      int payload[2] = {step, errno};
      ssize_t ignored = ::write(status_write.get(), payload, sizeof(payload));
      (void)ignored;
      ::_exit(127);
    };
    ::setpgid(0, 0);
    // Into the job's cgroup before anything runs, so that all it starts is the job's.
    if (request.cgroup_procs_fd >= 0 && ::write(request.cgroup_procs_fd, "0", 1) != 1) fail(5);
    // Die with the agent, even when it is SIGKILLed; and close the race with its death.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(128 + SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    if (::dup2(out_write.get(), 1) < 0 || ::dup2(err_write.get(), 2) < 0) fail(1);
    if (bind_cpus && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) fail(2);
    if (bind_memory &&
        ::syscall(SYS_set_mempolicy, kMpolBind, nodemask, sizeof(nodemask) * 8) != 0) {
      fail(3);
    }
    ::execve(request.program.c_str(), exec.argv(), exec.envp());
    fail(4);
  }
  // Parent: also set the group here, so signals to -pid work even before the child ran.
  ::setpgid(pid, pid);
  out_write.reset();
  err_write.reset();
  status_write.reset();
  int payload[2] = {0, 0};
  ssize_t n;
  do {
    n = ::read(status_read.get(), payload, sizeof(payload));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(payload))) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    static constexpr const char* steps[] = {
        "",     "redirecting output",      "binding CPUs", "setting the NUMA memory policy",
        "exec", "joining the job's cgroup"};
    return make_error(fmt::format("cannot start \"{}\": {} failed: {}", request.program,
                                  steps[payload[0] >= 1 && payload[0] <= 5 ? payload[0] : 0],
                                  std::strerror(payload[1])),
                      1);
  }
  SpawnedProcess spawned;
  spawned.pid = pid;
  spawned.stdout_pipe = std::move(out_read);
  spawned.stderr_pipe = std::move(err_read);
  return spawned;
}

}  // namespace topolaunch::launcher
