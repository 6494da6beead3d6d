// The agent: start the workers of one attempt, stream their output, watch them, stop them.
// One thread, one poll() loop over a signalfd and the workers' pipes; see agent.hpp.
#include "topolaunch/launcher/agent.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "process.hpp"
#include "topolaunch/launcher/job_config.hpp"
#include "topolaunch/launcher/report.hpp"
#include "topolaunch/launcher/units.hpp"
#include "topolaunch/launcher/worker_env.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

extern char** environ;

namespace topolaunch::launcher {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

Status write_file(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return make_error(fmt::format("cannot write {}", path.string()), 1);
  return ok_status();
}

std::string random_hex(std::size_t bytes) {
  std::string out;
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  for (std::size_t i = 0; i < bytes; ++i) {
    unsigned char c = static_cast<unsigned char>(urandom.get());
    out += fmt::format("{:02x}", c);
  }
  return out;
}

// A free TCP port for the workers' own store (torch's MASTER_PORT); a different port from ours.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

Environment current_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string_view::npos) env[std::string(entry.substr(0, eq))] = entry.substr(eq + 1);
  }
  return env;
}

std::uint64_t rss_bytes(pid_t pid) {
  std::ifstream statm(fmt::format("/proc/{}/statm", pid));
  std::uint64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
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

// Signals the agent handles; blocked and read from a signalfd.
sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD}) sigaddset(&set, sig);
  return set;
}

enum class StopKind { none, failure, signal, requeue };

struct Job {
  JobConfig config;
  RunOptions options;
  topology::RankMap map;
  std::string node_name;
  std::string run_id;
  fs::path job_dir;
  fs::path checkpoint_dir;
  fs::path rankmap_file;
  std::string secret;
  std::string program;
  std::vector<std::string> argv;
  topology::CpuSet cpus_here;
  Environment inherited;
  Clock::time_point job_start;
  bool terminal = false;
};

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

    wireup::TcpStoreServerOptions store_options;
    store_options.bind_host = "127.0.0.1";
    store_options.port = static_cast<std::uint16_t>(job_.config.wireup.port);
    store_options.secret = job_.secret;
    store_options.world_size = job_.map.world_size;
    auto store = wireup::TcpStoreServer::start(store_options);
    if (!store) {
      return make_error(
          fmt::format("wireup.port: cannot start the TCP store: {}", store.error().message));
    }

    JobFacts facts;
    facts.run_id = job_.run_id;
    facts.attempt = attempt_;
    facts.master_addr = "127.0.0.1";
    facts.master_port = free_port();
    facts.store_address = (*store)->address();
    facts.store_secret = job_.secret;
    facts.rankmap_file = job_.rankmap_file.string();
    facts.config_file = fs::absolute(job_.config.path).string();
    facts.job_dir = job_.job_dir.string();
    facts.checkpoint_dir = job_.checkpoint_dir.string();

    for (const auto& assignment : job_.map.ranks) {
      Worker w;
      w.rank = assignment.rank;
      w.outcome.rank = assignment.rank;
      w.outcome.local_rank = assignment.local_rank;
      w.outcome.node = assignment.node;
      w.outcome.node_name = job_.node_name;
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

    (*store)->stop();
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
        if (!pipes_open || Clock::now() > drain_deadline()) break;
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
      first_failure_ = RootCause{attempt_, w.rank, job_.node_name, what};
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

  void check_workers(Clock::time_point now) {
    const auto timeout = job_.config.job.heartbeat_timeout;
    const auto budget = job_.config.budget.memory_bytes_per_rank;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      std::uint64_t rss = rss_bytes(w.process.pid);
      w.outcome.peak_rss_bytes = std::max(w.outcome.peak_rss_bytes, rss);
      if (budget != 0 && rss > budget && stop_ == StopKind::none) {
        ::kill(-w.process.pid, SIGKILL);
        w.outcome.cause = "over memory budget";
        fail(w,
             fmt::format("over its memory budget: RSS {} > budget.memory {}", format_size(rss),
                         format_size(budget)),
             -1, SIGKILL);
        continue;
      }
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
};

std::string make_run_id(const std::string& name) {
  if (const char* slurm_job = std::getenv("SLURM_JOB_ID"))
    return fmt::format("{}-{}", name, slurm_job);
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  return fmt::format("{}-{}-{}", name, stamp, random_hex(2));
}

// Everything that can be refused before a worker starts (exit 2).
Result<Job> prepare(const RunOptions& options) {
  Job job;
  job.job_start = Clock::now();
  job.options = options;
  auto config = load_job_config(options.config_path);
  if (!config) return config.error();
  job.config = std::move(*config);
  if (!options.command_override.empty()) job.config.worker.command = options.command_override;
  auto program = resolve_program(job.config.worker.command[0]);
  if (!program) return program.error();
  job.program = *program;
  job.argv = job.config.worker.command;

  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  job.node_name = host;
  topology::DiscoverOptions discover_options;
  discover_options.nics = job.config.rdma.nics;
  auto topo = options.topology_path.empty()
                  ? topology::discover_live(discover_options)
                  : topology::load_topology_file(options.topology_path, discover_options);
  if (!topo) return topo.error();
  topology::NodeInput node;
  node.name = job.node_name;
  node.topology = std::make_shared<const topology::NodeTopology>(std::move(*topo));
  if (options.topology_path.empty()) {
    auto allocation = topology::allocation_of_this_process();
    if (!allocation) return allocation.error();
    node.allocation = *allocation;
  }
  auto map = topology::compute_rank_map({node}, job.config.mapping);
  if (!map) return map.error();
  job.map = std::move(*map);
  if (job.map.world_size <= 0) return make_error("the rank map has no rank to start");
  job.cpus_here = allowed_cpus_here();

  job.run_id = make_run_id(job.config.job.name);
  std::string dir = !options.job_dir_override.empty() ? options.job_dir_override
                    : !job.config.job.job_dir.empty() ? job.config.job.job_dir
                                                      : "topolaunch-jobs/" + job.run_id;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return make_error(fmt::format("job.job_dir: cannot create \"{}\": {}", dir,
                                  ec ? ec.message() : "not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return make_error(
        fmt::format("job.job_dir: \"{}\" is not writable ({})", dir, std::strerror(errno)));
  }
  job.job_dir = fs::absolute(dir);
  job.checkpoint_dir = job.config.job.checkpoint_dir.empty()
                           ? job.job_dir / "checkpoints"
                           : fs::absolute(job.config.job.checkpoint_dir);
  fs::create_directories(job.checkpoint_dir, ec);
  if (ec) {
    return make_error(fmt::format("job.checkpoint_dir: cannot create \"{}\": {}",
                                  job.checkpoint_dir.string(), ec.message()));
  }
  job.rankmap_file = job.job_dir / "rankmap.json";
  if (auto s = write_file(job.rankmap_file, topology::to_json(job.map)); !s) {
    return make_error(fmt::format("job.job_dir: {}", s.error().message));
  }
  job.secret = random_hex(32);
  job.inherited = current_environment();
  job.terminal = ::isatty(2) == 1;
  return job;
}

// Blocks the handled signals for the agent's lifetime (threads started later inherit the mask)
// and restores the previous mask at the end.
class SignalScope {
 public:
  SignalScope() {
    sigset_t set = handled_signals();
    ::pthread_sigmask(SIG_BLOCK, &set, &previous_);
    fd_.reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
    ::signal(SIGPIPE, SIG_IGN);
  }
  ~SignalScope() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  int fd() const { return fd_.get(); }

 private:
  sigset_t previous_{};
  Fd fd_;
};

}  // namespace

int run_job(const RunOptions& options) {
  SignalScope signals;
  // Orphaned grandchildren of workers come to us, so they can be reaped and never linger.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  auto prepared = prepare(options);
  if (!prepared) {
    std::fprintf(stderr, "topolaunch: %s\n", prepared.error().message.c_str());
    return prepared.error().exit_code;
  }
  Job& job = *prepared;
  for (const std::string& warning : job.map.warnings) {
    std::fprintf(stderr, "topolaunch: warning: %s\n", warning.c_str());
  }

  JobReport report;
  report.job_name = job.config.job.name;
  report.run_id = job.run_id;
  report.job_dir = job.job_dir.string();
  report.max_restarts = job.config.job.restarts;
  int exit_code = 0;
  for (int attempt = 0;; ++attempt) {
    AttemptRunner runner(job, attempt, signals.fd());
    int stop_signal = 0;
    auto result = runner.run(report.root_cause, stop_signal);
    if (!result) {
      std::fprintf(stderr, "topolaunch: %s\n", result.error().message.c_str());
      if (attempt == 0) return result.error().exit_code;
      report.status = "failed";
      exit_code = 1;
      break;
    }
    report.attempts.push_back(*result);
    report.restarts_used = attempt;
    const std::string& outcome = result->outcome;
    if (outcome == "succeeded") {
      report.status = "succeeded";
      exit_code = 0;
    } else if (outcome == "requeue") {
      report.status = "requeue";
      exit_code = 3;
    } else if (outcome == "stopped") {
      report.status = "stopped";
      exit_code = 128 + stop_signal;
    } else if (attempt < job.config.job.restarts) {
      std::fprintf(stderr, "topolaunch: attempt %d failed (%s); restarting (%d of %d)\n", attempt,
                   report.root_cause ? report.root_cause->what.c_str() : "?", attempt + 1,
                   job.config.job.restarts);
      continue;
    } else {
      report.status = "failed";
      exit_code = 1;
    }
    break;
  }
  report.exit_code = exit_code;
  report.wall_s = seconds_between(job.job_start, Clock::now());
  if (auto s = write_file(job.job_dir / "report.json", to_json(report)); !s) {
    std::fprintf(stderr, "topolaunch: %s\n", s.error().message.c_str());
  }
  if (options.print_json) {
    std::fputs(to_json(report).c_str(), stdout);
  } else if (!options.quiet || exit_code != 0) {
    std::fputs(summarize(report).c_str(), stderr);
  }
  return exit_code;
}

}  // namespace topolaunch::launcher
