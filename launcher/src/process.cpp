// Starting workers. The child shares the agent's memory until its exec (clone with CLONE_VM |
// CLONE_VFORK, as posix_spawn does): no page tables are copied and no page is copied on write,
// which fork() of a process holding a rank map and a store server costs at every rank's start.
// Sharing memory with a process that has threads allows only async-signal-safe calls that
// write nothing the agent owns, so argv, envp, the CPU mask and the NUMA node mask are all built
// before the clone, and the child runs on a stack of its own with every signal blocked until
// their handlers are reset.
#include "process.hpp"

#include <fcntl.h>
#include <pthread.h>
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
#include <memory>

namespace topolaunch::launcher {
namespace {

// set_mempolicy(2) without libnuma: MPOL_BIND to one node.
constexpr int kMpolBind = 2;

// What the child needs, all prepared by the agent; the child only reads it.
struct ChildSetup {
  const char* program = nullptr;
  char** argv = nullptr;
  char** envp = nullptr;
  pid_t agent = -1;
  int status_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  int cgroup_procs_fd = -1;
  bool bind_cpus = false;
  cpu_set_t cpus{};
  bool bind_memory = false;
  unsigned long nodemask[16] = {};
};

// The failed step (1..5, the parent's table) and errno go to the agent through the status pipe.
[[noreturn]] void child_failed(const ChildSetup& setup, int step) {
  int payload[2] = {step, errno};
  ssize_t ignored = ::write(setup.status_fd, payload, sizeof(payload));
  (void)ignored;
  ::_exit(127);
}

int child_main(void* arg) {
  const ChildSetup& setup = *static_cast<const ChildSetup*>(arg);
  // The agent's handlers are its code on its memory: every caught signal goes back to its
  // default before any is unblocked; the agent's own signals are the worker's defaults even
  // where the agent ignores them (SIGPIPE).
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0) continue;
    const bool own = sig == SIGINT || sig == SIGTERM || sig == SIGUSR1 || sig == SIGHUP ||
                     sig == SIGPIPE || sig == SIGCHLD;
    if (current.sa_handler == SIG_DFL || (current.sa_handler == SIG_IGN && !own)) continue;
    struct sigaction reset {};
    reset.sa_handler = SIG_DFL;
    ::sigaction(sig, &reset, nullptr);
  }
  ::setpgid(0, 0);
  // Into the job's cgroup before anything runs, so that all it starts is the job's.
  if (setup.cgroup_procs_fd >= 0 && ::write(setup.cgroup_procs_fd, "0", 1) != 1)
    child_failed(setup, 5);
  // Die with the agent, even when it is SIGKILLed; and close the race with its death.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != setup.agent) ::_exit(128 + SIGKILL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, 0);
  if (::dup2(setup.stdout_fd, 1) < 0 || ::dup2(setup.stderr_fd, 2) < 0) child_failed(setup, 1);
  if (setup.bind_cpus && ::sched_setaffinity(0, sizeof(setup.cpus), &setup.cpus) != 0)
    child_failed(setup, 2);
  if (setup.bind_memory &&
      ::syscall(SYS_set_mempolicy, kMpolBind, setup.nodemask, sizeof(setup.nodemask) * 8) != 0) {
    child_failed(setup, 3);
  }
  ::execve(setup.program, setup.argv, setup.envp);
  child_failed(setup, 4);
}

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
  ChildSetup setup;
  setup.program = request.program.c_str();
  setup.argv = exec.argv();
  setup.envp = exec.envp();
  setup.agent = ::getpid();
  setup.cgroup_procs_fd = request.cgroup_procs_fd;
  CPU_ZERO(&setup.cpus);
  for (int id : request.cpus.ids()) {
    if (id < CPU_SETSIZE) CPU_SET(id, &setup.cpus), setup.bind_cpus = true;
  }
  setup.bind_memory = request.numa_node >= 0 && request.numa_node < 16 * 64;
  if (setup.bind_memory) setup.nodemask[request.numa_node / 64] |= 1UL << (request.numa_node % 64);

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
  setup.stdout_fd = out_write.get();
  setup.stderr_fd = err_write.get();
  setup.status_fd = status_write.get();

  // The child's own stack; this thread waits (CLONE_VFORK) until the child has exec'd or exited.
  constexpr std::size_t kChildStack = 64 * 1024;
  std::unique_ptr<char[]> stack(new char[kChildStack]);
  sigset_t all, before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  const pid_t pid =
      ::clone(child_main, stack.get() + kChildStack, CLONE_VM | CLONE_VFORK | SIGCHLD, &setup);
  const int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) return make_error(fmt::format("clone: {}", std::strerror(clone_errno)), 1);
  // The child ran up to its exec (or its failure) before this thread went on: its process
  // group is set and the status pipe says how it went.
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
