// No process outlives the job: the job's cgroup v2 subtree, Slurm's step cgroup, or the process
// tree by pid, and the watchdog that acts when the agent is gone; see containment.hpp.
#include "containment.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "topolaunch/launcher/memory_watch.hpp"

namespace topolaunch::launcher {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mount_field(std::string_view field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string_view digits = field.substr(i + 1, 3);
      if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out +=
            static_cast<char>((digits[0] - '0') * 64 + (digits[1] - '0') * 8 + (digits[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t at = 0;
  while (at < line.size()) {
    while (at < line.size() && line[at] == ' ') ++at;
    const std::size_t end = std::min(line.find(' ', at), line.size());
    if (end > at) words.push_back(line.substr(at, end - at));
    at = end;
  }
  return words;
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

int count_lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

bool cgroup_populated(const std::string& dir) {
  const std::string events = read_text(dir + "/cgroup.events");
  return events.find("populated 1") != std::string::npos;
}

// SIGKILL to every process of the cgroup: cgroup.kill (Linux 5.14), else each pid it lists.
void kill_cgroup(const std::string& dir) {
  const int fd = ::open((dir + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    const bool written = ::write(fd, "1", 1) == 1;
    ::close(fd);
    if (written) return;
  }
  std::istringstream procs(read_text(dir + "/cgroup.procs"));
  for (pid_t pid; procs >> pid;) ::kill(pid, SIGKILL);
}

void reap_children() {
  int status = 0;
  while (::waitpid(-1, &status, WNOHANG) > 0) {
  }
}

// Field 22 of /proc/<pid>/stat: the start time, which tells a pid's process from a later one
// that reuses the number. 0 when the process is gone.
unsigned long long start_time_of(pid_t pid) {
  const std::string text = read_text(fmt::format("/proc/{}/stat", pid));
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i < 22 && rest >> field; ++i) {
  }
  unsigned long long start = 0;
  rest >> start;
  return start;
}

// `root`'s descendants by parent pid, `root` left out. read_process_subtree may return the whole
// process table (a kernel without children files): only this walk decides what is the job's.
std::vector<ProcessEntry> descendants_of(pid_t root) {
  const std::vector<ProcessEntry> table = read_process_subtree(root);
  std::vector<ProcessEntry> out;
  std::vector<pid_t> pending{root};
  while (!pending.empty()) {
    const pid_t parent = pending.back();
    pending.pop_back();
    for (const ProcessEntry& e : table) {
      if (e.ppid != parent || e.pid == root) continue;
      out.push_back(e);
      pending.push_back(e.pid);
    }
  }
  return out;
}

struct SeenProcess {
  pid_t pid = 0;
  pid_t pgid = 0;
  unsigned long long start = 0;
};

// The watchdog: a child of the agent in a session of its own (a kill of the agent's process
// group or a terminal's Ctrl-C does not reach it), that ignores the signals a job is stopped
// with. It reads the agent's messages ("+G"/"-G": a worker's process group started/reaped,
// "end": the agent stopped the job itself) until the pipe closes, which is when the agent is
// gone, however it ended; then, without "end", it kills what is left of the job.
[[noreturn]] void run_watchdog(int control_fd, pid_t agent, ContainmentKind kind,
                               const std::string& cgroup_dir) {
  ::setsid();
  ::prctl(PR_SET_NAME, "topolaunch-wd");
  for (int sig :
       {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU})
    ::signal(sig, SIG_IGN);
  ::signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);  // `run --json`: stdout holds the report alone
  }
  if (::dup2(control_fd, 3) < 0) ::_exit(1);
  ::syscall(SYS_close_range, 4U, ~0U, 0U);  // the agent's signalfd, sockets, files
  control_fd = 3;

  std::set<pid_t> groups;
  std::vector<SeenProcess> seen;
  std::string pending;
  bool ended = false;
  while (true) {
    pollfd ready{control_fd, POLLIN, 0};
    const int n = ::poll(&ready, 1, kind == ContainmentKind::cgroup ? -1 : 1000);
    if (n < 0 && errno != EINTR) break;
    if (n > 0) {
      char buffer[4096];
      const ssize_t got = ::read(control_fd, buffer, sizeof(buffer));
      if (got == 0) break;  // the agent is gone
      if (got < 0 && errno != EINTR && errno != EAGAIN) break;
      if (got > 0) pending.append(buffer, static_cast<std::size_t>(got));
      for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (line == "end") {
          ended = true;
        } else if (line.size() > 1 && (line[0] == '+' || line[0] == '-')) {
          const pid_t group = static_cast<pid_t>(std::atol(line.c_str() + 1));
          if (group <= 1) continue;
          if (line[0] == '+') groups.insert(group);
          if (line[0] == '-') groups.erase(group);
        }
      }
    }
    if (kind != ContainmentKind::cgroup && !ended) {
      // What the job holds now: after the agent's death its orphans go to init, out of reach
      // by parent, so the watchdog keeps the last second's list (pid and start time).
      std::vector<SeenProcess> now;
      for (const ProcessEntry& e : descendants_of(agent)) {
        if (e.pid == ::getpid()) continue;
        now.push_back(SeenProcess{e.pid, e.pgid, start_time_of(e.pid)});
      }
      if (::getppid() == agent) seen = std::move(now);
    }
  }
  if (ended) ::_exit(0);

  int killed = 0;
  std::string where;
  if (kind == ContainmentKind::cgroup) {
    where = "cgroup " + cgroup_dir;
    killed = count_lines(read_text(cgroup_dir + "/cgroup.procs"));
    const auto deadline = Clock::now() + 10s;
    while (cgroup_populated(cgroup_dir) && Clock::now() < deadline) {
      kill_cgroup(cgroup_dir);
      std::this_thread::sleep_for(5ms);
    }
    ::rmdir(cgroup_dir.c_str());
  } else {
    where = "the job, tracked by pid";
    std::set<pid_t> live_groups;
    for (const SeenProcess& p : seen) {
      if (p.start == 0 || start_time_of(p.pid) != p.start) continue;  // gone, or a new process
      ::kill(p.pid, SIGKILL);
      live_groups.insert(p.pgid);
      ++killed;
    }
    // A group with a live member cannot have its number reused; a worker's tracked group may
    // hold children started after the last look.
    for (pid_t group : groups) live_groups.insert(group);
    for (pid_t group : live_groups) {
      if (group > 1 && group != ::getpgrp()) ::kill(-group, SIGKILL);
    }
  }
  if (killed > 0) {
    std::fprintf(stderr,
                 "topolaunch: watchdog: topolaunch (pid %d) ended without stopping its job: "
                 "killed %d process%s (%s)\n",
                 static_cast<int>(agent), killed, killed == 1 ? "" : "es", where.c_str());
  }
  ::_exit(0);
}

int thread_count() {
  std::istringstream status(read_text("/proc/self/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return 1;
}

// Whether a process can move itself into `procs_fd`'s cgroup: a child tries and exits (moving
// needs write access to the common ancestor's cgroup.procs as well, which mkdir does not show).
std::string try_joining(int procs_fd) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(::write(procs_fd, "0", 1) == 1 ? 0 : (errno & 0x7f));
  if (child < 0) return fmt::format("fork: {}", std::strerror(errno));
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return WIFEXITED(status) ? std::strerror(WEXITSTATUS(status)) : "the probe did not exit";
}

}  // namespace

std::optional<std::string> cgroup2_directory(std::string_view proc_cgroup,
                                             std::string_view mountinfo) {
  std::optional<std::string> path;
  for (std::string_view line : lines_of(proc_cgroup)) {
    if (line.substr(0, 3) == "0::") path = std::string(line.substr(3));
  }
  if (!path || path->empty() || path->front() != '/') return std::nullopt;
  for (std::string_view line : lines_of(mountinfo)) {
    const auto words = split_words(line);
    const auto dash = std::find(words.begin(), words.end(), std::string_view("-"));
    if (words.size() < 5 || dash == words.end() || dash + 1 == words.end() ||
        *(dash + 1) != "cgroup2")
      continue;
    const std::string root = unescape_mount_field(words[3]);
    const std::string mount_point = unescape_mount_field(words[4]);
    std::string rest;
    if (root == "/") {
      rest = *path;
    } else if (*path == root || path->rfind(root + "/", 0) == 0) {
      rest = path->substr(root.size());
    } else {
      continue;
    }
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    return mount_point + rest;
  }
  return std::nullopt;
}

bool in_slurm_step_cgroup(std::string_view proc_cgroup, std::string_view job_id) {
  if (job_id.empty()) return false;
  const std::string step = fmt::format("/job_{}/step_", job_id);
  for (std::string_view line : lines_of(proc_cgroup)) {
    if (line.find(step) != std::string_view::npos) return true;
  }
  return false;
}

std::string cgroup_name(pid_t pid, std::string_view label) {
  std::string name = fmt::format("topolaunch.{}", static_cast<int>(pid));
  std::string clean;
  for (char c : label.substr(0, 96)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    clean += ok ? c : '_';
  }
  if (!clean.empty()) name += "." + clean;
  return name;
}

std::unique_ptr<Containment> Containment::open(std::string_view label) {
  std::unique_ptr<Containment> c(new Containment());
  const std::string proc_cgroup = read_text("/proc/self/cgroup");
  std::string why_not;
  if (auto own = cgroup2_directory(proc_cgroup, read_text("/proc/self/mountinfo"))) {
    const std::string dir = *own + "/" + cgroup_name(::getpid(), label);
    if (::mkdir(dir.c_str(), 0755) != 0) {
      why_not = fmt::format("cannot make {}: {}", dir, std::strerror(errno));
    } else if ((c->procs_fd_ = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC)) < 0) {
      why_not = fmt::format("cannot open {}/cgroup.procs: {}", dir, std::strerror(errno));
      ::rmdir(dir.c_str());
    } else if (std::string refused = try_joining(c->procs_fd_); !refused.empty()) {
      why_not = fmt::format("cannot move a process into {}: {}", dir, refused);
      ::close(c->procs_fd_);
      c->procs_fd_ = -1;
      ::rmdir(dir.c_str());
    } else {
      c->kind_ = ContainmentKind::cgroup;
      c->cgroup_dir_ = dir;
    }
  } else {
    why_not = "no cgroup2 mount in /proc/self/mountinfo";
  }
  const char* slurm_job = std::getenv("SLURM_JOB_ID");
  if (c->kind_ == ContainmentKind::cgroup) {
    c->description_ = fmt::format(
        "containment: cgroup {}: every process of the job is killed with it", c->cgroup_dir_);
  } else if (slurm_job && in_slurm_step_cgroup(proc_cgroup, slurm_job)) {
    c->kind_ = ContainmentKind::slurm_step;
    c->description_ = fmt::format(
        "containment: Slurm's step cgroup of job {} (Slurm kills what is left at the step's end; "
        "{})",
        slurm_job, why_not);
  } else {
    c->description_ = fmt::format(
        "containment: no cgroup of the job ({}): processes are tracked by parent and process "
        "group, so one that leaves the node's process tree (a daemon re-parented above "
        "topolaunch) is not killed, nor, when topolaunch itself is killed with SIGKILL, one "
        "started less than a second before",
        why_not);
  }

  // The watchdog runs on in the child without exec, which is safe only while this process has
  // one thread (no lock held by another thread at fork).
  if (thread_count() != 1) {
    c->description_ += "; no watchdog (started after a thread)";
    return c;
  }
  int control[2];
  if (::pipe2(control, O_CLOEXEC) != 0) {
    c->description_ += fmt::format("; no watchdog (pipe: {})", std::strerror(errno));
    return c;
  }
  const pid_t agent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(control[1]);
    run_watchdog(control[0], agent, c->kind_, c->cgroup_dir_);
  }
  ::close(control[0]);
  if (pid < 0) {
    ::close(control[1]);
    c->description_ += fmt::format("; no watchdog (fork: {})", std::strerror(errno));
    return c;
  }
  ::fcntl(control[1], F_SETFL, O_NONBLOCK);  // a message lost is better than a blocked agent
  c->watchdog_fd_ = control[1];
  c->watchdog_pid_ = pid;
  return c;
}

void Containment::tell_watchdog(std::string_view message) const {
  if (watchdog_fd_ < 0) return;
  const std::string line = std::string(message) + "\n";
  ssize_t ignored = ::write(watchdog_fd_, line.data(), line.size());
  (void)ignored;
}

void Containment::track(pid_t group) const {
  if (kind_ != ContainmentKind::cgroup) tell_watchdog(fmt::format("+{}", group));
}

void Containment::untrack(pid_t group) const {
  if (kind_ != ContainmentKind::cgroup) tell_watchdog(fmt::format("-{}", group));
}

int Containment::kill_all(std::chrono::milliseconds wait) const {
  const auto deadline = Clock::now() + wait;
  int left = 0;
  if (kind_ == ContainmentKind::cgroup) {
    left = count_lines(read_text(cgroup_dir_ + "/cgroup.procs"));
    if (left == 0) return 0;
    do {
      kill_cgroup(cgroup_dir_);
      reap_children();
      if (!cgroup_populated(cgroup_dir_)) break;
      std::this_thread::sleep_for(2ms);
    } while (Clock::now() < deadline);
    reap_children();
    return left;
  }
  const pid_t self = ::getpid();
  bool first = true;
  do {
    int alive = 0;
    for (const ProcessEntry& e : descendants_of(self)) {
      if (e.pid == watchdog_pid_) continue;
      ::kill(e.pid, SIGKILL);
      ++alive;
    }
    if (first) left = alive;
    first = false;
    reap_children();
    if (alive == 0) break;
    std::this_thread::sleep_for(2ms);
  } while (Clock::now() < deadline);
  return left;
}

Containment::~Containment() {
  (void)kill_all(2s);
  // "end" only when nothing is left: else the watchdog, once the pipe closes, goes on killing
  // (a process in uninterruptible sleep can take longer than the wait above to die).
  bool clean = true;
  if (kind_ == ContainmentKind::cgroup) {
    if (procs_fd_ >= 0) ::close(procs_fd_);
    clean = ::rmdir(cgroup_dir_.c_str()) == 0 || errno == ENOENT;
  } else {
    for (const ProcessEntry& e : descendants_of(::getpid())) {
      if (e.pid != watchdog_pid_) clean = false;
    }
  }
  if (clean) tell_watchdog("end");
  if (watchdog_fd_ >= 0) ::close(watchdog_fd_);
  if (watchdog_pid_ > 0) {
    int status = 0;
    // It exits at once on "end"; reap it so that no zombie outlives us either.
    for (int i = 0; i < 200 && ::waitpid(watchdog_pid_, &status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(5ms);
  }
}

}  // namespace topolaunch::launcher
