// Private to the launcher: no process of a job outlives it. Each agent (and a standalone `run`)
// puts its workers into a cgroup v2 subtree of its own when it can make one, and forks a
// watchdog that kills whatever is left of the job when the agent dies, SIGKILL included
// (PR_SET_PDEATHSIG reaches only a worker itself, not the children of a shell-script worker).
// See docs/architecture.md, "No process outlives the job".
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace topolaunch::launcher {

// How a node's processes are held.
enum class ContainmentKind {
  cgroup,       // a cgroup v2 subtree of ours: killed whole (cgroup.kill), by us or the watchdog
  slurm_step,   // Slurm's step cgroup (proctrack/cgroup): Slurm kills the step's processes
  process_tree  // neither: the agent's descendants and the workers' process groups, by pid
};

// The cgroup v2 directory of this process: the cgroup2 mount of `mountinfo`
// (/proc/self/mountinfo) joined with the "0::" line of `proc_cgroup` (/proc/self/cgroup), the
// mount's own root taken off (a container's view). nullopt without a cgroup2 mount or "0::".
std::optional<std::string> cgroup2_directory(std::string_view proc_cgroup,
                                             std::string_view mountinfo);

// Whether a line of `proc_cgroup` (v1 or v2) is a Slurm step cgroup of job `job_id`
// (".../job_<id>/step_..." as Slurm's cgroup plugins name them).
bool in_slurm_step_cgroup(std::string_view proc_cgroup, std::string_view job_id);

// A name for the job's cgroup: "topolaunch.<pid>.<label>", the label cut to [A-Za-z0-9._-].
std::string cgroup_name(pid_t pid, std::string_view label);

class Containment {
 public:
  // Makes the job's cgroup (else finds Slurm's step cgroup) and forks the watchdog. Call before
  // this process starts a thread: the watchdog runs on after fork() without exec. `label`: the
  // run id, part of the cgroup's name.
  static std::unique_ptr<Containment> open(std::string_view label);
  // Kills what is left of the job, removes its cgroup and lets the watchdog go.
  ~Containment();
  Containment(const Containment&) = delete;
  Containment& operator=(const Containment&) = delete;

  ContainmentKind kind() const { return kind_; }
  // The cgroup directory (kind cgroup), else "".
  const std::string& cgroup_dir() const { return cgroup_dir_; }
  // One line for the job's log: what holds the job's processes, and with process_tree what
  // cannot be guaranteed and why no cgroup was made.
  const std::string& description() const { return description_; }
  // cgroup.procs of the job's cgroup, open for writing: a worker writes "0" into it between
  // fork and exec (async-signal-safe). -1 when there is no cgroup of ours.
  int procs_fd() const { return procs_fd_; }
  pid_t watchdog_pid() const { return watchdog_pid_; }

  // A worker started (its pid is its process group) / reaped: the watchdog kills the groups
  // still known when the agent dies.
  void track(pid_t group) const;
  void untrack(pid_t group) const;

  // The end of an attempt: kills every process of the job still alive (the cgroup; else every
  // descendant of this process but the watchdog: orphans that left their process group
  // (setsid) come to us as child subreaper) and reaps the ones that are our children, for at
  // most `wait`. Returns how many processes were still there.
  int kill_all(std::chrono::milliseconds wait) const;

 private:
  Containment() = default;
  void tell_watchdog(std::string_view message) const;

  ContainmentKind kind_ = ContainmentKind::process_tree;
  std::string cgroup_dir_;
  std::string description_;
  int procs_fd_ = -1;
  int watchdog_fd_ = -1;  // write end of the watchdog's pipe (non-blocking, close-on-exec)
  pid_t watchdog_pid_ = -1;
};

}  // namespace topolaunch::launcher
