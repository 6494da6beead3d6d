// The agent: start the workers of one attempt, stream their output, watch them, stop them.
// One thread, one poll() loop over a signalfd and the workers' pipes; see agent.hpp.
#include "attempt.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/launcher/memory_watch.hpp"
#include "topolaunch/launcher/units.hpp"
#include "topolaunch/launcher/worker_env.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::launcher {
namespace {

using namespace std::chrono_literals;

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

// Splits a pipe's bytes into whole lines for the log file and the merged stream.
struct LineStream {
  Fd fd;
  std::string partial;
  int terminal_fd = 1;  // where the merged stream goes (1 or 2)
};

struct Worker {
  int rank = -1;
  SpawnedProcess process;
  LineStream out, err;
  Fd log;
  std::string heartbeat_path;
  Clock::time_point started;
  Clock::time_point last_beat;
  struct timespec beat_mtime {};
  off_t beat_size = -1;
  bool running = false;
  RankOutcome outcome;
};

enum class StopKind { none, failure, signal, requeue };

class AttemptRunner {
 public:
  AttemptRunner(const Job& job, int attempt, int signal_fd)
      : job_(job), attempt_(attempt), signal_fd_(signal_fd) {}

  // Runs the attempt to its end. Returns an error only when it could not start (bad port...).
  Result<AttemptReport> run(std::optional<RootCause>& root_cause, int& stop_signal) {
    report_.attempt = attempt_;
    report_.started_s = seconds_between(job_.job_start, Clock::now());
    const auto attempt_start = Clock::now();
    fs::path attempt_dir = job_.job_dir / fmt::format("attempt-{}", attempt_);
    std::error_code ec;
    fs::create_directories(attempt_dir / "heartbeat", ec);
    if (ec)
      return make_error(
          fmt::format("job.job_dir: cannot create {}: {}", attempt_dir.string(), ec.message()));

    // Standalone: a fresh store per attempt (a fence left half-done by a dead worker must not
    // leak into the next attempt). Under Slurm the `run` process hosts it and passes its address.
    std::unique_ptr<wireup::TcpStoreServer> store;
    std::string store_address = job_.external_store_address;
    if (store_address.empty()) {
      wireup::TcpStoreServerOptions store_options;
      store_options.bind_host = "127.0.0.1";
      store_options.port = static_cast<std::uint16_t>(job_.config.wireup.port);
      store_options.secret = job_.secret;
      store_options.world_size = job_.map.world_size;
      auto started = wireup::TcpStoreServer::start(store_options);
      if (!started) {
        return make_error(
            fmt::format("wireup.port: cannot start the TCP store: {}", started.error().message));
      }
      store = std::move(*started);
      store_address = store->address();
    }

    JobFacts facts;
    facts.run_id = job_.run_id;
    facts.attempt = attempt_;
    facts.master_addr = job_.master_addr;
    facts.master_port = job_.master_port != 0 ? job_.master_port : free_port();
    facts.store_address = store_address;
    facts.store_secret = job_.secret;
    facts.rankmap_file = job_.rankmap_file.string();
    facts.config_file = fs::absolute(job_.config.path).string();
    facts.job_dir = job_.job_dir.string();
    facts.checkpoint_dir = job_.checkpoint_dir.string();

    for (const auto& assignment : job_.map.ranks) {
      if (assignment.node != job_.node_index) continue;
      Worker w;
      w.rank = assignment.rank;
      w.outcome.rank = assignment.rank;
      w.outcome.local_rank = assignment.local_rank;
      w.outcome.node = assignment.node;
      w.outcome.node_name = job_.map.nodes[static_cast<std::size_t>(assignment.node)].name;
      w.heartbeat_path =
          (attempt_dir / "heartbeat" / fmt::format("rank-{}", assignment.rank)).string();
      { std::ofstream create(w.heartbeat_path, std::ios::trunc); }
      struct stat created {};
      if (::stat(w.heartbeat_path.c_str(), &created) == 0) {
        w.beat_mtime = created.st_mtim;
        w.beat_size = created.st_size;
      }
      w.log.reset(::open((attempt_dir / fmt::format("rank-{}.log", assignment.rank)).c_str(),
                         O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      workers_.push_back(std::move(w));
    }
    for (Worker& w : workers_) {
      if (stop_ != StopKind::none) break;
      const auto& assignment = job_.map.ranks[static_cast<std::size_t>(w.rank)];
      facts.heartbeat_file = w.heartbeat_path;
      SpawnRequest request;
      request.program = job_.program;
      request.argv = job_.argv;
      request.env = worker_environment(job_.inherited, job_.config, job_.map, w.rank, facts);
      request.cpus = assignment.cpus & job_.cpus_here;
      if (job_.config.mapping.bind_memory && numa_node_exists_here(assignment.numa)) {
        request.numa_node = assignment.numa;
      }
      auto spawned = spawn_worker(request);
      if (!spawned) {
        fail(w, spawned.error().message, -1, 0);
        break;
      }
      w.process = std::move(*spawned);
      w.out.fd = std::move(w.process.stdout_pipe);
      w.out.terminal_fd = 1;
      w.err.fd = std::move(w.process.stderr_pipe);
      w.err.terminal_fd = 2;
      w.outcome.pid = w.process.pid;
      w.started = w.last_beat = Clock::now();
      w.running = true;
      ++running_;
    }
    report_.all_started_s = seconds_between(attempt_start, Clock::now());

    supervise();

    if (store) store->stop();
    for (Worker& w : workers_) report_.ranks.push_back(w.outcome);
    report_.wall_s = seconds_between(attempt_start, Clock::now());
    switch (stop_) {
      case StopKind::none:
        report_.outcome = "succeeded";
        break;
      case StopKind::failure:
        report_.outcome = "failed";
        break;
      case StopKind::signal:
        report_.outcome = "stopped";
        break;
      case StopKind::requeue:
        report_.outcome = "requeue";
        break;
    }
    if (first_failure_ && !root_cause) root_cause = first_failure_;
    stop_signal = stop_signal_;
    return report_;
  }

 private:
  void supervise() {
    auto last_check = Clock::now();
    auto last_status = Clock::now() - 1h;
    while (true) {
      bool pipes_open = false;
      std::vector<pollfd> fds;
      std::vector<LineStream*> streams;
      fds.push_back({signal_fd_, POLLIN, 0});
      for (Worker& w : workers_) {
        for (LineStream* s : {&w.out, &w.err}) {
          if (!s->fd.valid()) continue;
          fds.push_back({s->fd.get(), POLLIN, 0});
          streams.push_back(s);
          pipes_open = true;
        }
      }
      if (running_ == 0) {
        // Every worker is reaped: kill what is left of their groups, drain the pipes, done.
        kill_groups(SIGKILL);
        if (!pipes_open || Clock::now() > drain_deadline()) {
          drain_ready_pipes();
          break;
        }
      }
      int n = ::poll(fds.data(), fds.size(), 100);
      if (n < 0 && errno != EINTR) break;
      if (n > 0) {
        if (fds[0].revents & POLLIN) handle_signals();
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(*streams[i - 1]);
        }
      }
      auto now = Clock::now();
      if (now - last_check >= 100ms) {
        last_check = now;
        check_workers(now);
        if (stop_ != StopKind::none && !killed_ && now >= kill_deadline_) {
          kill_groups(SIGKILL);
          killed_ = true;
        }
      }
      if (job_.terminal && !job_.options.quiet && now - last_status >= 1s) {
        last_status = now;
        status_line(now);
      }
    }
    if (job_.terminal && !job_.options.quiet) write_all(2, "\r\033[K");
    for (Worker& w : workers_) {
      flush_partial(w, w.out);
      flush_partial(w, w.err);
    }
  }

  // What a worker wrote before it exited is already in its pipe: read all of it before giving
  // up on the pipes, even when this agent was descheduled past the drain deadline (a loaded CI
  // host lost a rank's last line that way). Reads only what poll says is ready, so a pipe still
  // held open by a stray process cannot block us.
  void drain_ready_pipes() {
    for (int round = 0; round < 4096; ++round) {
      bool any = false;
      for (Worker& w : workers_) {
        for (LineStream* s : {&w.out, &w.err}) {
          if (!s->fd.valid()) continue;
          pollfd ready{s->fd.get(), POLLIN, 0};
          if (::poll(&ready, 1, 0) > 0 && (ready.revents & (POLLIN | POLLHUP | POLLERR))) {
            read_stream(*s);
            any = true;
          }
        }
      }
      if (!any) return;
    }
  }

  Clock::time_point drain_deadline() {
    if (!all_reaped_at_) all_reaped_at_ = Clock::now();
    return *all_reaped_at_ + 300ms;
  }

  void status_line(Clock::time_point now) {
    std::string line =
        fmt::format("\r\033[K[topolaunch] attempt {}: {}/{} running, {:.0f}s{}", attempt_, running_,
                    workers_.size(), seconds_between(job_.job_start, now),
                    stop_ == StopKind::none ? "" : ", stopping");
    write_all(2, line);
  }

  Worker* worker_of_stream(LineStream& s) {
    for (Worker& w : workers_) {
      if (&w.out == &s || &w.err == &s) return &w;
    }
    return nullptr;
  }

  void emit_line(Worker& w, LineStream& s, std::string_view line) {
    if (w.log.valid()) write_all(w.log.get(), line);
    if (job_.options.quiet) return;
    std::string merged = fmt::format("[rank {}] {}", w.rank, line);
    if (job_.terminal) merged = "\r\033[K" + merged;
    write_all(s.terminal_fd, merged);
  }

  void read_stream(LineStream& s) {
    Worker* w = worker_of_stream(s);
    char buffer[65536];
    ssize_t n = ::read(s.fd.get(), buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      flush_partial(*w, s);
      s.fd.reset();
      return;
    }
    s.partial.append(buffer, static_cast<std::size_t>(n));
    std::size_t start = 0;
    for (std::size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      emit_line(*w, s, std::string_view(s.partial).substr(start, nl + 1 - start));
    }
    s.partial.erase(0, start);
    // A worker that never prints a newline still gets its output shown, in 64 KiB pieces.
    if (s.partial.size() > 65536) flush_partial(*w, s);
  }

  void flush_partial(Worker& w, LineStream& s) {
    if (s.partial.empty()) return;
    s.partial += '\n';
    emit_line(w, s, s.partial);
    s.partial.clear();
  }

  void handle_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
      } else if (sig == SIGUSR1) {
        // Preemption notice: workers checkpoint and exit; we wait up to stop_grace.
        kill_groups(SIGUSR1);
        if (stop_ == StopKind::none) {
          stop_ = StopKind::requeue;
          kill_deadline_ = Clock::now() + job_.config.job.stop_grace;
        }
      } else {
        if (stop_ == StopKind::signal && stop_signal_ == sig && sig == SIGINT) {
          kill_groups(SIGKILL);  // a second Ctrl-C: no more waiting
          killed_ = true;
          continue;
        }
        kill_groups(sig);
        if (stop_ != StopKind::signal) {
          stop_ = StopKind::signal;
          stop_signal_ = sig;
          kill_deadline_ = Clock::now() + job_.config.job.stop_grace;
        }
      }
    }
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (Worker& w : workers_) {
        if (w.process.pid != pid || !w.running) continue;
        w.running = false;
        --running_;
        w.outcome.wall_s = seconds_between(w.started, Clock::now());
        if (WIFEXITED(status)) w.outcome.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) w.outcome.signal = WTERMSIG(status);
        read_heartbeat_counter(w);
        bool failed = w.outcome.signal != 0 || w.outcome.exit_code != 0;
        if (failed && stop_ == StopKind::none) {
          fail(w, describe_wait_status(w.outcome.exit_code, w.outcome.signal), w.outcome.exit_code,
               w.outcome.signal);
        } else if (failed && w.outcome.cause.empty() && stop_ != StopKind::none) {
          w.outcome.cause = "stopped";
        }
      }
      // Other pids are orphans of the workers, reparented to us (child subreaper): just reaped.
    }
  }

  // Records the first failure and stops every worker: SIGTERM now, SIGKILL shortly after.
  void fail(Worker& w, const std::string& what, int, int) {
    if (w.outcome.cause.empty()) w.outcome.cause = "root cause";
    if (!first_failure_) {
      first_failure_ = RootCause{attempt_, w.rank, job_.node_name, what, "", unix_now_s()};
    }
    if (stop_ == StopKind::none) {
      stop_ = StopKind::failure;
      kill_groups(SIGTERM);
      kill_deadline_ = Clock::now() + std::min<Clock::duration>(job_.config.job.stop_grace, 2s);
    }
  }

  void kill_groups(int sig) {
    for (Worker& w : workers_) {
      if (w.process.pid > 0) ::kill(-w.process.pid, sig);
    }
  }

  void read_heartbeat_counter(Worker& w) {
    std::ifstream in(w.heartbeat_path);
    std::string counter;
    if (in >> counter) w.outcome.heartbeat = counter;
  }

  // Host memory of each rank's process tree and, through NVML, the GPU memory of its pids.
  void check_memory() {
    const auto budget = job_.config.budget.memory_bytes_per_rank;
    const auto gpu_budget = job_.config.budget.gpu_memory_bytes_per_rank;
    const auto scan_start = Clock::now();
    const auto table = read_process_subtree(::getpid());
    std::vector<GpuProcessMemory> gpu_usage;
    if (job_.gpu_watch) {
      auto usage = job_.gpu_watch->usage();
      if (usage) {
        gpu_usage = std::move(*usage);
      } else if (!gpu_error_said_) {
        gpu_error_said_ = true;
        std::fprintf(stderr, "topolaunch: %s: GPU memory not watched this attempt: %s\n",
                     job_.node_name.c_str(), usage.error().message.c_str());
      }
    }
    for (Worker& w : workers_) {
      if (!w.running || stop_ != StopKind::none) continue;
      const auto tree = process_tree(w.process.pid, table);
      const std::uint64_t host_bytes = tree_memory_bytes(tree);
      w.outcome.peak_rss_bytes = std::max(w.outcome.peak_rss_bytes, host_bytes);
      if (budget != 0 && host_bytes > budget) {
        ::kill(-w.process.pid, SIGKILL);
        for (pid_t pid : tree) ::kill(pid, SIGKILL);  // children that left the group too
        w.outcome.cause = "over memory budget";
        fail(w,
             fmt::format("over its memory budget: RSS {} of {} process{} > budget.memory {}",
                         format_size(host_bytes), tree.size(), tree.size() == 1 ? "" : "es",
                         format_size(budget)),
             -1, SIGKILL);
        continue;
      }
      const auto per_device = gpu_bytes_of_tree(gpu_usage, tree);
      std::uint64_t gpu_bytes = 0;
      std::string devices;
      for (const auto& [device, bytes] : per_device) {
        gpu_bytes += bytes;
        devices += fmt::format("{}GPU {} holds {}", devices.empty() ? "" : ", ", device,
                               format_size(bytes));
      }
      w.outcome.peak_gpu_bytes = std::max(w.outcome.peak_gpu_bytes, gpu_bytes);
      if (gpu_budget != 0 && gpu_bytes > gpu_budget) {
        ::kill(-w.process.pid, SIGKILL);
        for (pid_t pid : tree) ::kill(pid, SIGKILL);
        w.outcome.cause = "over GPU memory budget";
        fail(w,
             fmt::format("over its GPU memory budget on node {}: {} ({} in all) > "
                         "budget.gpu_memory {}",
                         job_.node_name, devices, format_size(gpu_bytes), format_size(gpu_budget)),
             -1, SIGKILL);
      }
    }
    // Without children files the whole /proc is read: on a node with thousands of processes
    // that is costly, so the watch slows down to spend at most ~5% of a core on it.
    memory_check_interval_ = std::max<Clock::duration>(200ms, 20 * (Clock::now() - scan_start));
  }

  void check_workers(Clock::time_point now) {
    const auto timeout = job_.config.job.heartbeat_timeout;
    if (now - last_memory_check_ >= memory_check_interval_) {
      last_memory_check_ = now;
      check_memory();
    }
    for (Worker& w : workers_) {
      if (!w.running) continue;
      if (timeout.count() == 0) continue;
      struct stat st {};
      if (::stat(w.heartbeat_path.c_str(), &st) == 0 &&
          (st.st_mtim.tv_sec != w.beat_mtime.tv_sec || st.st_mtim.tv_nsec != w.beat_mtime.tv_nsec ||
           st.st_size != w.beat_size)) {
        w.last_beat = now;
        w.beat_mtime = st.st_mtim;
        w.beat_size = st.st_size;
      }
      if (stop_ == StopKind::none && now - w.last_beat > timeout) {
        read_heartbeat_counter(w);
        ::kill(-w.process.pid, SIGKILL);
        w.outcome.cause = "hung (no heartbeat)";
        fail(w,
             fmt::format("hung: no heartbeat for {} (heartbeat_timeout {}, last counter {})",
                         format_duration(std::chrono::duration_cast<std::chrono::microseconds>(
                             now - w.last_beat)),
                         format_duration(timeout),
                         w.outcome.heartbeat.empty() ? "none" : w.outcome.heartbeat),
             -1, SIGKILL);
      }
    }
  }

  const Job& job_;
  int attempt_;
  int signal_fd_;
  std::vector<Worker> workers_;
  int running_ = 0;
  StopKind stop_ = StopKind::none;
  int stop_signal_ = 0;
  bool killed_ = false;
  Clock::time_point kill_deadline_ = Clock::time_point::max();
  std::optional<Clock::time_point> all_reaped_at_;
  std::optional<RootCause> first_failure_;
  AttemptReport report_;
  Clock::time_point last_memory_check_{};
  Clock::duration memory_check_interval_ = 200ms;
  bool gpu_error_said_ = false;
};

}  // namespace

// Signals the agent handles; blocked and read from a signalfd.
sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD}) sigaddset(&set, sig);
  return set;
}

Result<AttemptReport> run_attempt(const Job& job, int attempt, int signal_fd,
                                  std::optional<RootCause>& root_cause, int& stop_signal) {
  AttemptRunner runner(job, attempt, signal_fd);
  return runner.run(root_cause, stop_signal);
}

}  // namespace topolaunch::launcher
