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
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "error_file.hpp"
#include "hang_watch.hpp"
#include "step_figures.hpp"
#include "topolaunch/common/units.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/launcher/energy.hpp"
#include "topolaunch/launcher/memory_watch.hpp"
#include "topolaunch/launcher/worker_env.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::launcher {
namespace {

using namespace std::chrono_literals;

// What Open MPI 4.1 prints when a rank refuses to start as a singleton: the guard's own file
// name (OMPI_MCA_ess_singleton_server), or, inside a Slurm allocation (SLURM_NODELIST and a step
// id in the environment), its help text for an srun task without PMI.
constexpr std::string_view kOmpiSlurmDirectLaunch = "direct launched using \"srun\"";

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
  int terminal_fd = 1;    // where the merged stream goes (1 or 2)
  std::string last_line;  // the last non-blank line, printable ASCII, at most 300 characters
};

// A worker's last stderr line goes into report.json (root cause), which must stay one line of
// valid UTF-8 JSON whatever the worker wrote.
std::string report_safe_line(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  std::string out;
  for (char c : line.substr(0, 300)) {
    const auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? c : (c == '\t' ? ' ' : '?');
  }
  return out;
}

struct Worker {
  int rank = -1;
  SpawnedProcess process;
  LineStream out, err;
  Fd log;                // rank-R.log, made at the rank's first line: a silent rank leaves none
  std::string log_path;  // cleared when it cannot be made
  std::string heartbeat_path;  // made by the rank's first beat
  std::string error_path;      // TORCHELASTIC_ERROR_FILE
  Clock::time_point started;
  Clock::time_point last_beat;
  struct timespec beat_mtime {};
  off_t beat_size = -1;
  // The hang watches (hang_watch.hpp): the heartbeat's is armed from the start for
  // topolaunch-worker, else by the first beat; activity is CPU time, output or a beat.
  bool armed = false;
  Clock::time_point last_activity;
  std::uint64_t cpu_ticks = 0;
  std::optional<Clock::time_point> stopped_since;
  bool mpi_singleton = false;  // its output named the MPI singleton guard's file
  bool running = false;
  StepFiguresTail figures;                      // its TOPOLAUNCH_STEP_METRICS_FILE
  std::uint64_t host_bytes = 0, gpu_bytes = 0;  // the last memory sample
  RankOutcome outcome;
};

enum class StopKind { none, failure, signal, requeue };

}  // namespace

// Outside the unnamed namespace: StartedAttempt (attempt.hpp) holds one.
class AttemptRunner {
 public:
  AttemptRunner(const Job& job, int attempt, int signal_fd)
      : job_(job), attempt_(attempt), signal_fd_(signal_fd) {}

  // Starts the attempt's workers. An error only when it could not start (bad port...); a worker
  // that cannot be spawned fails the attempt, which supervise() then ends.
  Status start() {
    report_.attempt = attempt_;
    report_.started_s = seconds_between(job_.job_start, Clock::now());
    attempt_start_ = Clock::now();
    // Standalone: a fresh store per attempt (a fence left half-done by a dead worker must not
    // leak into the next attempt). Under Slurm the `run` process hosts it and passes its address.
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
      store_ = std::move(*started);
      store_address = store_->address();
    }
    // After the store: a run refused for its port leaves no attempt behind (job.hpp: a job dir
    // with an attempt holds an earlier run).
    fs::path attempt_dir = job_.job_dir / fmt::format("attempt-{}", attempt_);
    std::error_code ec;
    fs::create_directories(attempt_dir / "heartbeat", ec);
    if (!ec) fs::create_directories(attempt_dir / "error", ec);
    if (!ec) fs::create_directories(attempt_dir / "trace", ec);
    if (!ec) fs::create_directories(attempt_dir / "metrics", ec);
    if (ec)
      return make_error(
          fmt::format("job.job_dir: cannot create {}: {}", attempt_dir.string(), ec.message()));

    start_energy();

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
    facts.mpi_singleton_guard = (attempt_dir / jobspec::env::kMpiSingletonMarker).string();
    if (attempt_ == 0 && job_.node_index == 0) {
      const std::string watch = describe_hang_watch();
      if (!watch.empty()) std::fprintf(stderr, "topolaunch: %s\n", watch.c_str());
    }

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
      fs::remove(w.heartbeat_path, ec);  // the file that appears is this rank's first beat
      // Not created: torch's @record writes it only when the rank raises.
      w.error_path =
          (attempt_dir / "error" / fmt::format("rank-{}.json", assignment.rank)).string();
      fs::remove(w.error_path, ec);
      w.figures = StepFiguresTail(
          (attempt_dir / "metrics" / fmt::format("rank-{}.jsonl", assignment.rank)).string());
      fs::remove(w.figures.path(), ec);
      // Files are made when there is something to put in them, not before the rank starts: a
      // job dir on a parallel file system pays a metadata round trip per file, two per rank.
      w.log_path = (attempt_dir / fmt::format("rank-{}.log", assignment.rank)).string();
      workers_.push_back(std::move(w));
    }
    for (Worker& w : workers_) {
      if (stop_ != StopKind::none) break;
      const auto& assignment = job_.map.ranks[static_cast<std::size_t>(w.rank)];
      facts.heartbeat_file = w.heartbeat_path;
      facts.error_file = w.error_path;
      facts.trace_file = (attempt_dir / "trace" / fmt::format("rank-{}.json", w.rank)).string();
      facts.step_metrics_file = w.figures.path();
      SpawnRequest request;
      request.program = job_.program;
      request.argv = job_.argv;
      request.env = worker_environment(job_.inherited, job_.config, job_.map, w.rank, facts);
      request.cpus = assignment.cpus & job_.cpus_here;
      if (job_.containment) request.cgroup_procs_fd = job_.containment->procs_fd();
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
      // With --json, stdout holds the report alone: the ranks' stdout goes to stderr.
      w.out.terminal_fd = job_.options.print_json ? 2 : 1;
      w.err.fd = std::move(w.process.stderr_pipe);
      w.err.terminal_fd = 2;
      w.outcome.pid = w.process.pid;
      if (job_.containment) job_.containment->track(w.process.pid);
      w.started = w.last_beat = w.last_activity = Clock::now();
      w.armed = job_.builtin_worker;
      w.running = true;
      ++running_;
    }
    report_.all_started_s = seconds_between(attempt_start_, Clock::now());
    if (running_ == static_cast<int>(workers_.size())) {
      workers_started_unix_s_ = unix_now_s();
      workers_started_cpu_s_ = process_cpu_s();
      workers_started_after_marks_ = job_.start_marks.size();
    }
    return ok_status();
  }

  // The agent found, after the workers started, that the attempt cannot go on (job.start =
  // "early": the exchange failed, or the whole map gives this node other ranks): the attempt
  // fails with `what` as its root cause, and every worker gets SIGTERM, then SIGKILL after
  // job.stop_grace; supervise() reaps them.
  void fail_from_agent(const std::string& what, const std::string& phase) {
    if (!first_failure_ || first_failure_is_consequence_) {
      first_failure_ = RootCause{attempt_, -1, job_.node_name, what, phase, unix_now_s()};
      first_failure_is_consequence_ = false;
    }
    for (Worker& w : workers_) {
      if (w.running && w.outcome.cause.empty()) w.outcome.cause = "stopped";
    }
    stop_for_failure(job_.config.job.stop_grace);
  }

  // The attempt's first failure stops every worker: SIGTERM now, SIGKILL after `grace`.
  void stop_for_failure(Clock::duration grace) {
    if (stop_ != StopKind::none) return;
    stop_ = StopKind::failure;
    kill_groups(SIGTERM);
    kill_deadline_ = Clock::now() + grace;
  }

  // Supervises the started workers to the attempt's end and reports it.
  AttemptReport finish(std::optional<RootCause>& root_cause, int& stop_signal) {
    supervise();

    if (store_) store_->stop();
    for (Worker& w : workers_) {
      w.figures.poll(w.outcome.figures);
      report_.ranks.push_back(w.outcome);
    }
    report_.nodes.push_back(node_usage(seconds_between(attempt_start_, Clock::now())));
    publish_metrics(Clock::now());
    report_.wall_s = seconds_between(attempt_start_, Clock::now());
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
        // Every worker is reaped: kill what is left of their groups and of the job (children
        // that left their group: setsid, double forks), drain the pipes, done.
        kill_groups(SIGKILL);
        if (job_.containment && !contained_) {
          contained_ = true;
          (void)job_.containment->kill_all(std::chrono::seconds(1));
          for (Worker& w : workers_) job_.containment->untrack(w.process.pid);
        }
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
        for (Worker& w : workers_) w.figures.poll(w.outcome.figures);
        if (now - last_rapl_ >= 5s) {
          last_rapl_ = now;
          rapl_.sample();
        }
        if (job_.metrics && now - last_publish_ >= 500ms) publish_metrics(now);
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
        for (LineStream* s : {&w.out, &w.err}) any = read_if_ready(*s) || any;
      }
      if (!any) return;
    }
  }

  // What one stream holds now (an exited worker's last words), without waiting.
  void drain_ready(LineStream& s) {
    for (int round = 0; round < 4096; ++round)
      if (!read_if_ready(s)) return;
  }

  bool read_if_ready(LineStream& s) {
    if (!s.fd.valid()) return false;
    pollfd ready{s.fd.get(), POLLIN, 0};
    if (::poll(&ready, 1, 0) <= 0 || !(ready.revents & (POLLIN | POLLHUP | POLLERR))) return false;
    read_stream(s);
    return true;
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
    w.last_activity = Clock::now();
    if (job_.map.world_size > 1 &&
        (line.find(jobspec::env::kMpiSingletonMarker) != std::string_view::npos ||
         line.find(kOmpiSlurmDirectLaunch) != std::string_view::npos))
      w.mpi_singleton = true;
    if (&s == &w.err && line.find_first_not_of(" \t\r\n") != std::string_view::npos)
      s.last_line = report_safe_line(line);
    if (!w.log.valid() && !w.log_path.empty()) {
      w.log.reset(::open(w.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (!w.log.valid()) w.log_path.clear();
    }
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
    // Every status there is now, then each in turn (a rank that exited because its peer died,
    // kPeerFailed, gives the root cause up to that peer: replaces_consequence).
    std::vector<std::pair<pid_t, int>> exited;
    int reaped_status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &reaped_status, WNOHANG)) > 0;)
      exited.emplace_back(pid, reaped_status);
    for (const auto& [pid, status] : exited) {
      for (Worker& w : workers_) {
        if (w.process.pid != pid || !w.running) continue;
        w.running = false;
        --running_;
        w.outcome.wall_s = seconds_between(w.started, Clock::now());
        if (WIFEXITED(status)) w.outcome.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) w.outcome.signal = WTERMSIG(status);
        read_heartbeat_counter(w);
        bool failed = w.outcome.signal != 0 || w.outcome.exit_code != 0;
        if (failed) {
          read_worker_error(w);
          drain_worker(w);  // its last lines, which may name the MPI singleton guard
        }
        if (failed && stop_ == StopKind::none && w.mpi_singleton) {
          fail(w, mpi_singleton_line(w), w.outcome.exit_code, w.outcome.signal);
          if (first_failure_ && first_failure_->rank == w.rank)
            first_failure_->phase = kMpiWithoutLauncherPhase;
        } else if (failed && (stop_ == StopKind::none || replaces_consequence(w))) {
          // The exception the error file holds, else what a worker that exits non-zero has
          // usually said as its last line on stderr (topolaunch-worker always does).
          std::string what = describe_wait_status(w.outcome.exit_code, w.outcome.signal);
          if (!w.outcome.error.empty())
            what += ": " + w.outcome.error;
          else if (w.outcome.signal == 0 && !w.err.last_line.empty())
            what += ": " + w.err.last_line;
          fail(w, what, w.outcome.exit_code, w.outcome.signal);
        } else if (failed && w.outcome.cause.empty() && stop_ != StopKind::none) {
          w.outcome.cause = "stopped";
        }
      }
      // Other pids are orphans of the workers, reparented to us (child subreaper): just reaped.
    }
  }

  // The exception and traceback torch's @record wrote, if it did.
  void read_worker_error(Worker& w) {
    if (auto error = read_error_file(w.error_path)) {
      w.outcome.error = error->message;
      w.outcome.traceback = error->traceback;
    }
  }

  // What an exited worker wrote is all in its pipes: read what is there now (bounded, and only
  // what poll says is ready, so a pipe a stray child holds open cannot block us).
  void drain_worker(Worker& w) {
    for (int round = 0; round < 64; ++round) {
      bool any = false;
      for (LineStream* s : {&w.out, &w.err}) {
        if (!s->fd.valid()) continue;
        pollfd ready{s->fd.get(), POLLIN, 0};
        if (::poll(&ready, 1, 0) > 0 && (ready.revents & POLLIN)) {
          read_stream(*s);
          any = true;
        }
      }
      if (!any) return;
    }
  }

  std::string mpi_singleton_line(const Worker& w) const {
    return fmt::format(
        "an MPI program started without an MPI launcher: MPI_Init of rank {} (of WORLD_SIZE={}) "
        "was refused, as each rank would have been an MPI job of its own; topolaunch run is not "
        "an MPI launcher: run MPI programs with srun --mpi=pmix --topolaunch=auto",
        w.rank, job_.map.world_size);
  }

  std::string describe_hang_watch() const {
    const auto& j = job_.config.job;
    if (j.heartbeat_timeout.count() == 0 && j.progress_timeout.count() == 0) return "";
    std::string line = "hang watch: ";
    if (j.heartbeat_timeout.count() == 0) {
      line += "job.heartbeat_timeout off";
    } else if (job_.builtin_worker) {
      line += fmt::format(
          "job.heartbeat_timeout {} from each rank's start (topolaunch-worker beats every step)",
          format_duration(j.heartbeat_timeout));
    } else {
      line += fmt::format(
          "job.heartbeat_timeout {}, armed at each rank's first beat of "
          "$TOPOLAUNCH_HEARTBEAT_FILE (a rank of {} that never beats is not watched)",
          format_duration(j.heartbeat_timeout), fs::path(job_.program).filename().string());
    }
    if (j.progress_timeout.count() == 0) {
      line += "; job.progress_timeout off";
    } else {
      line += fmt::format("; job.progress_timeout {}: no CPU time, output or heartbeat",
                          format_duration(j.progress_timeout));
    }
    return line;
  }

  // Records the first failure and stops every worker: SIGTERM now, SIGKILL shortly after.
  // A rank that failed on its own after the first failure was only its echo (kPeerFailed: the
  // rank that waited for it exited first, in an earlier wakeup): it is the root cause instead.
  // Not a rank that ended in the teardown (a signal, or the checkpointed stop's status).
  bool replaces_consequence(const Worker& w) const {
    const int code = w.outcome.exit_code;
    return stop_ == StopKind::failure && first_failure_is_consequence_ && w.outcome.signal == 0 &&
           code != 0 && code != jobspec::exit_status::kPeerFailed &&
           code != jobspec::exit_status::kTerminated;
  }

  void fail(Worker& w, const std::string& what, int exit_code, int) {
    const bool consequence = exit_code == jobspec::exit_status::kPeerFailed;
    if (!first_failure_ || (first_failure_is_consequence_ && !consequence)) {
      if (first_failure_) {
        for (Worker& echo : workers_)
          if (echo.rank == first_failure_->rank)
            echo.outcome.cause = fmt::format("waiting for rank {}", w.rank);
      }
      first_failure_ = RootCause{attempt_, w.rank, job_.node_name, what, "", unix_now_s()};
      first_failure_is_consequence_ = consequence;
    }
    if (w.outcome.cause.empty()) w.outcome.cause = "root cause";
    stop_for_failure(std::min<Clock::duration>(job_.config.job.stop_grace, 2s));
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
      note_activity(w, tree);
      const std::uint64_t host_bytes = tree_memory_bytes(tree);
      w.host_bytes = host_bytes;
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
        energy_devices_.insert(device);
        devices += fmt::format("{}GPU {} holds {}", devices.empty() ? "" : ", ", device,
                               format_size(bytes));
      }
      w.gpu_bytes = gpu_bytes;
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
    // The same scan feeds the progress watch (note_activity): on a loaded node the stretched
    // interval delayed a hang's detection by seconds, so it stays within a quarter of that watch.
    const auto progress = job_.config.job.progress_timeout;
    if (progress.count() > 0)
      memory_check_interval_ = std::min<Clock::duration>(
          memory_check_interval_, std::max<Clock::duration>(200ms, progress / 4));
  }

  // CPU time of the rank's processes and the worker's state, for the progress watch and for
  // naming the rank a hang is blamed on.
  void note_activity(Worker& w, const std::vector<pid_t>& tree) {
    if (job_.config.job.heartbeat_timeout.count() == 0 &&
        job_.config.job.progress_timeout.count() == 0)
      return;
    const auto now = Clock::now();
    const RankActivity activity = read_activity(w.process.pid, tree);
    // Busy: more CPU time since the rank's last activity than 2% of a core over that time (and
    // 50 ms). A rank waiting in a collective still ticks now and then (its runtime's threads);
    // counting every tick as progress delayed a hang's detection by a minute.
    static const double ticks_per_s = static_cast<double>(::sysconf(_SC_CLK_TCK));
    const double busy_s = static_cast<double>(activity.cpu_ticks - w.cpu_ticks) / ticks_per_s;
    const double idle_for_s = std::chrono::duration<double>(now - w.last_activity).count();
    if (activity.cpu_ticks < w.cpu_ticks || busy_s > 0.05 + 0.02 * idle_for_s) {
      w.cpu_ticks = activity.cpu_ticks;
      w.last_activity = now;
    }
    const bool stopped = activity.state == 'T' || activity.state == 't';
    if (stopped && !w.stopped_since) w.stopped_since = now;
    if (!stopped) w.stopped_since.reset();
  }

  void check_workers(Clock::time_point now) {
    const auto heartbeat_timeout = job_.config.job.heartbeat_timeout;
    const auto progress_timeout = job_.config.job.progress_timeout;
    if (now - last_memory_check_ >= memory_check_interval_) {
      last_memory_check_ = now;
      check_memory();
    }
    if (heartbeat_timeout.count() == 0 && progress_timeout.count() == 0) return;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      struct stat st {};
      if (::stat(w.heartbeat_path.c_str(), &st) == 0 &&
          (st.st_mtim.tv_sec != w.beat_mtime.tv_sec || st.st_mtim.tv_nsec != w.beat_mtime.tv_nsec ||
           st.st_size != w.beat_size)) {
        w.last_beat = w.last_activity = now;
        w.beat_mtime = st.st_mtim;
        w.beat_size = st.st_size;
        w.armed = true;
      }
    }
    if (stop_ != StopKind::none) return;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      if (heartbeat_timeout.count() != 0 && w.armed && now - w.last_beat > heartbeat_timeout) {
        return declare_hung(w, true, now);
      }
    }
    // The progress watch fires only when every rank here has been silent that long: a rank that
    // waits for a peer still busy (importing, loading data, compiling) is not hung, and a
    // collective hang silences the waiting ranks too. (NCCL's waiters spin: their hangs are
    // NCCL's watchdog's, which TORCH_NCCL_ASYNC_ERROR_HANDLING=1 turns on.)
    if (progress_timeout.count() == 0) return;
    Worker* first_silent = nullptr;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      if (now - w.last_activity <= progress_timeout) return;
      if (!first_silent || w.last_activity < first_silent->last_activity) first_silent = &w;
    }
    if (first_silent) declare_hung(*first_silent, false, now);
  }

  // `fired`'s watch fired; the rank named is the one the others wait for (hang_watch.hpp).
  void declare_hung(Worker& fired, bool by_heartbeat, Clock::time_point now) {
    const auto timeout =
        by_heartbeat ? job_.config.job.heartbeat_timeout : job_.config.job.progress_timeout;
    std::vector<RankProgress> ranks;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      read_heartbeat_counter(w);
      RankProgress p;
      p.rank = w.rank;
      p.stopped = w.stopped_since.has_value();
      if (w.stopped_since) p.stopped_for_s = seconds_between(*w.stopped_since, now);
      p.armed = w.armed;
      p.counter = parse_counter(w.outcome.heartbeat);
      p.silent_s = seconds_between(by_heartbeat && w.armed ? w.last_beat : w.last_activity, now);
      ranks.push_back(p);
    }
    const HangVerdict verdict =
        attribute_hang(ranks, fired.rank, std::chrono::duration<double>(timeout).count() / 2,
                       by_heartbeat ? "no heartbeat" : "no CPU time, output or heartbeat");
    Worker* hung = &fired;
    for (Worker& w : workers_) {
      if (w.rank == verdict.rank) hung = &w;
    }
    ::kill(-hung->process.pid, SIGKILL);
    hung->outcome.cause = "hung";
    for (Worker& w : workers_) {
      for (int r : verdict.waiting) {
        if (w.rank == r) w.outcome.cause = fmt::format("waiting for rank {}", hung->rank);
      }
    }
    fail(*hung,
         fmt::format("hung: {} (job.{} {})", verdict.why,
                     by_heartbeat ? "heartbeat_timeout" : "progress_timeout",
                     format_duration(timeout)),
         -1, SIGKILL);
  }

  // The energy counters at the attempt's start: every NVML device (the ones the job's ranks use
  // are known only as they use them), the RAPL packages; and the job's GPUs here from the map.
  void start_energy() {
    rapl_ = RaplEnergy::open();
    last_rapl_ = Clock::now();
    if (job_.gpu_watch) {
      for (int d = 0; d < job_.gpu_watch->device_count(); ++d)
        energy_start_mj_.push_back(job_.gpu_watch->energy_mj(d));
    }
    std::set<int> map_gpus;
    for (const auto& a : job_.map.ranks) {
      if (a.node != job_.node_index) continue;
      for (int g : a.gpus) map_gpus.insert(g);
      const auto busids = a.env.find(jobspec::env::kGpuBusids);
      if (busids == a.env.end() || !job_.gpu_watch) continue;
      std::string list = busids->second;
      for (std::size_t start = 0; start <= list.size();) {
        std::size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        if (auto address = topology::PciAddress::parse(list.substr(start, comma - start))) {
          const int device = job_.gpu_watch->device_at(*address);
          if (device >= 0) energy_devices_.insert(device);
        }
        start = comma + 1;
      }
    }
    allocated_gpus_ = static_cast<int>(map_gpus.size());
  }

  // What this node held during the attempt and the energy it used.
  NodeUsage node_usage(double wall_s) {
    NodeUsage n;
    n.attempt = attempt_;
    n.node = job_.node_name;
    n.gpus = allocated_gpus_;
    n.cores = static_cast<int>(job_.cpus_here.size());
    n.wall_s = wall_s;
    // The agent's start led to the first attempt's workers; a restart's start is not one.
    if (attempt_ == 0 && !job_.start_marks.empty()) {
      // "workers_started" where it happened among the agent's own steps: after them all, or
      // (job.start = "early") before the exchange's.
      for (std::size_t i = 0; i <= job_.start_marks.size(); ++i) {
        if (i == workers_started_after_marks_ && workers_started_unix_s_ > 0) {
          n.start_marks_unix_s.emplace_back("workers_started", workers_started_unix_s_);
          n.start_marks_cpu_s.emplace_back("workers_started", workers_started_cpu_s_);
        }
        if (i == job_.start_marks.size()) break;
        const Job::StartMark& m = job_.start_marks[i];
        n.start_marks_unix_s.emplace_back(m.name, m.unix_s);
        n.start_marks_cpu_s.emplace_back(m.name, m.cpu_s);
      }
    }
    if (!job_.gpu_watch) {
      if (allocated_gpus_ > 0) n.gpu_energy_note = "GPU energy not measured: NVML not loaded";
    } else if (energy_devices_.empty()) {
      if (allocated_gpus_ > 0) n.gpu_energy_note = "no GPU of the job's ranks found in NVML";
    } else {
      for (int d : energy_devices_) {
        const auto end = job_.gpu_watch->energy_mj(d);
        const auto start = static_cast<std::size_t>(d) < energy_start_mj_.size()
                               ? energy_start_mj_[static_cast<std::size_t>(d)]
                               : std::nullopt;
        if (!start || !end || *end < *start) {
          n.gpu_energy_note = fmt::format(
              "GPU {}: NVML has no energy counter (nvmlDeviceGetTotalEnergyConsumption)", d);
          n.gpu_energy_j.clear();
          break;
        }
        n.gpu_energy_j.push_back(static_cast<double>(*end - *start) / 1e3);
      }
    }
    if (rapl_.readable()) {
      rapl_.sample();
      n.cpu_energy_j = rapl_.joules();
    } else {
      n.cpu_energy_note = "CPU energy not measured: " + rapl_.why_not();
    }
    return n;
  }

  // The snapshot the metrics endpoint serves: each rank's last figures, memory and heartbeat.
  void publish_metrics(Clock::time_point now) {
    if (!job_.metrics) return;
    last_publish_ = now;
    MetricsSnapshot snapshot;
    snapshot.job = job_.run_id;
    snapshot.node = job_.node_name;
    snapshot.restarts = attempt_;
    const double unix_now = unix_now_s();
    for (Worker& w : workers_) {
      RankMetrics r;
      r.rank = w.rank;
      r.running = w.running;
      r.host_bytes = w.running ? w.host_bytes : 0;
      r.gpu_bytes = w.running ? w.gpu_bytes : 0;
      struct stat st {};
      if (::stat(w.heartbeat_path.c_str(), &st) == 0 && st.st_size > 0) {
        r.heartbeat_age_s = unix_now - static_cast<double>(st.st_mtim.tv_sec) -
                            static_cast<double>(st.st_mtim.tv_nsec) / 1e9;
        std::ifstream in(w.heartbeat_path);
        long long counter = 0;
        if (in >> counter) r.step = counter;
      }
      const StepFigures& f = w.outcome.figures;
      if (f.last_wall_ms > 0 && f.last_steps > 0) {
        r.has_step_figures = true;
        r.tokens_per_s = static_cast<double>(f.last_tokens) / (f.last_wall_ms / 1e3);
        r.step_s = f.last_wall_ms / 1e3 / static_cast<double>(f.last_steps);
        for (int p = 0; p < kStepPartCount; ++p)
          r.part_s[p] = f.last_parts_ms[p] / 1e3 / static_cast<double>(f.last_steps);
        r.comm_bytes_total = f.comm_bytes;
        r.comm_exposed_s_total = f.comm_exposed_ms / 1e3;
      }
      r.loss = f.last_loss;
      snapshot.ranks.push_back(r);
    }
    job_.metrics->publish(std::move(snapshot));
  }

  const Job& job_;
  int attempt_;
  int signal_fd_;
  std::vector<Worker> workers_;
  int running_ = 0;
  StopKind stop_ = StopKind::none;
  int stop_signal_ = 0;
  bool killed_ = false;
  bool contained_ = false;  // the job's leftovers killed once every worker was reaped
  Clock::time_point kill_deadline_ = Clock::time_point::max();
  std::optional<Clock::time_point> all_reaped_at_;
  std::optional<RootCause> first_failure_;
  bool first_failure_is_consequence_ = false;  // first_failure_ exited kPeerFailed
  AttemptReport report_;
  // When the last worker of this node was spawned; 0: not all of them were.
  double workers_started_unix_s_ = 0;
  double workers_started_cpu_s_ = 0;
  std::size_t workers_started_after_marks_ = 0;  // how many of job_.start_marks came before
  Clock::time_point attempt_start_{};
  // Standalone: this attempt's store (under Slurm `run` hosts it).
  std::unique_ptr<wireup::TcpStoreServer> store_;
  Clock::time_point last_memory_check_{};
  Clock::duration memory_check_interval_ = 200ms;
  bool gpu_error_said_ = false;
  RaplEnergy rapl_;
  Clock::time_point last_rapl_{}, last_publish_{};
  std::vector<std::optional<std::uint64_t>> energy_start_mj_;
  std::set<int> energy_devices_;  // NVML devices the job's ranks use here
  int allocated_gpus_ = 0;
};

// Signals the agent handles; blocked and read from a signalfd.
sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD}) sigaddset(&set, sig);
  return set;
}

Result<StartedAttempt> StartedAttempt::start(const Job& job, int attempt, int signal_fd) {
  auto runner = std::make_unique<AttemptRunner>(job, attempt, signal_fd);
  if (auto started = runner->start(); !started) return started.error();
  return StartedAttempt(std::move(runner));
}

StartedAttempt::StartedAttempt(std::unique_ptr<AttemptRunner> runner)
    : runner_(std::move(runner)) {}
StartedAttempt::StartedAttempt(StartedAttempt&&) noexcept = default;
StartedAttempt& StartedAttempt::operator=(StartedAttempt&&) noexcept = default;
StartedAttempt::~StartedAttempt() = default;

void StartedAttempt::fail(const std::string& what, const std::string& phase) {
  runner_->fail_from_agent(what, phase);
}

AttemptReport StartedAttempt::supervise(std::optional<RootCause>& root_cause, int& stop_signal) {
  return runner_->finish(root_cause, stop_signal);
}

Result<AttemptReport> run_attempt(const Job& job, int attempt, int signal_fd,
                                  std::optional<RootCause>& root_cause, int& stop_signal) {
  auto started = StartedAttempt::start(job, attempt, signal_fd);
  if (!started) return started.error();
  return started->supervise(root_cause, stop_signal);
}

}  // namespace topolaunch::launcher
