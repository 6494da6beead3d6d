// Starting one worker: a child that shares the agent's memory until its exec (process.cpp says
// why), a process-group leader bound to its cores and NUMA memory, with its own environment and
// stdout/stderr pipes. Private to the launcher.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/cpuset.hpp"

namespace topolaunch::launcher {

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// execve's argv and envp ("NAME=value"), both null-terminated, built before fork(): after it, in
// a process with threads, only async-signal-safe calls are allowed. The pointers point into the
// strings held here, hence neither copied nor moved.
class ExecStrings {
 public:
  ExecStrings(const std::vector<std::string>& args, const std::map<std::string, std::string>& env);
  ExecStrings(const ExecStrings&) = delete;
  ExecStrings& operator=(const ExecStrings&) = delete;
  char** argv() { return argv_.data(); }
  char** envp() { return envp_.data(); }

 private:
  std::vector<std::string> arg_strings_;
  std::vector<std::string> env_strings_;
  std::vector<char*> argv_;
  std::vector<char*> envp_;
};

struct SpawnRequest {
  std::string program;  // resolved path
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  topology::CpuSet cpus;     // empty = do not bind
  int numa_node = -1;        // -1 = no memory policy
  int cgroup_procs_fd = -1;  // the job's cgroup.procs: the child moves itself there (-1 = none)
};

struct SpawnedProcess {
  pid_t pid = -1;  // also the process group id
  Fd stdout_pipe;
  Fd stderr_pipe;
};

// Errors name the program and errno text (exit code 1: the machine, not the input).
Result<SpawnedProcess> spawn_worker(const SpawnRequest& request);

// "python3" -> "/usr/bin/python3" through PATH; a name with '/' must exist and be executable.
Result<std::string> resolve_program(const std::string& name);

// This machine's name (gethostname).
std::string host_name();
// SLURMD_NODENAME, else host_name(): the node's one name in the map, the report, the logs and
// `topolaunch map` / `preflight`.
std::string this_node_name();

// PUs this process may run on (sched_getaffinity), and NUMA nodes with memory on this machine.
topology::CpuSet allowed_cpus_here();
bool numa_node_exists_here(int node);

}  // namespace topolaunch::launcher
