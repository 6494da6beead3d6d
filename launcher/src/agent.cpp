// The agent: start the workers of one attempt, stream their output, watch them, stop them.
// One thread, one poll() loop over a signalfd and the workers' pipes; see agent.hpp.
#include "topolaunch/launcher/agent.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
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
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "process.hpp"
#include "topolaunch/launcher/agent_wireup.hpp"
#include "topolaunch/launcher/job_config.hpp"
#include "topolaunch/launcher/memory_watch.hpp"
#include "topolaunch/launcher/report.hpp"
#include "topolaunch/launcher/units.hpp"
#include "topolaunch/launcher/worker_env.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/topology/serialize.hpp"
#include "topolaunch/wireup/kv_store.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

extern char** environ;

namespace topolaunch::launcher {
namespace {

// Wall-clock seconds since the epoch: failures are ordered across nodes by it (NTP keeps a
// cluster's clocks far closer than a failure and the teardown it causes).
double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

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
  int node_index = 0;                  // this agent's node in the map
  std::string external_store_address;  // "" = host a store per attempt here
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 = a free port per attempt
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
  std::shared_ptr<NvmlMemoryWatch> gpu_watch;  // null: GPU memory is not watched
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

// This node's input to the rank map: its topology (live, or a file where "%n" is the node name)
// and what the job may use here.
Result<topology::NodeInput> local_node_input(const RunOptions& options, const JobConfig& config,
                                             const std::string& node_name) {
  topology::DiscoverOptions discover_options;
  discover_options.nics = config.rdma.nics;
  std::string topology_path = options.topology_path;
  for (std::size_t at; (at = topology_path.find("%n")) != std::string::npos;) {
    topology_path.replace(at, 2, node_name);
  }
  auto topo = topology_path.empty() ? topology::discover_live(discover_options)
                                    : topology::load_topology_file(topology_path, discover_options);
  if (!topo) return topo.error();
  topology::NodeInput node;
  node.name = node_name;
  node.topology = std::make_shared<const topology::NodeTopology>(std::move(*topo));
  if (topology_path.empty()) {
    auto allocation = topology::allocation_of_this_process();
    if (!allocation) return allocation.error();
    node.allocation = *allocation;
  }
  return node;
}

std::string this_node_name() {
  if (const char* slurm = std::getenv("SLURMD_NODENAME"); slurm && *slurm) return slurm;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// Everything that can be refused before a worker starts (exit 2); the map comes later.
Result<Job> prepare_job(const RunOptions& options, const std::string& run_id) {
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
  job.node_name = this_node_name();
  job.cpus_here = allowed_cpus_here();

  job.run_id = run_id.empty() ? make_run_id(job.config.job.name) : run_id;
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
  job.secret = random_hex(32);
  job.inherited = current_environment();
  job.terminal = ::isatty(2) == 1;
  return job;
}

Status set_map(Job& job, const std::vector<topology::NodeInput>& nodes, bool write_map_file) {
  auto map = topology::compute_rank_map(nodes, job.config.mapping);
  if (!map) return map.error();
  job.map = std::move(*map);
  if (job.map.world_size <= 0) return make_error("the rank map has no rank to start");
  job.node_index = -1;
  for (std::size_t i = 0; i < job.map.nodes.size(); ++i) {
    if (job.map.nodes[i].name == job.node_name) job.node_index = static_cast<int>(i);
  }
  if (job.node_index < 0) {
    return make_error(fmt::format("node {} is not in the rank map", job.node_name), 1);
  }
  if (write_map_file) {
    if (auto s = write_file(job.rankmap_file, topology::to_json(job.map)); !s) {
      return make_error(fmt::format("job.job_dir: {}", s.error().message));
    }
  }
  return ok_status();
}

Result<Job> prepare(const RunOptions& options) {
  auto job = prepare_job(options, "");
  if (!job) return job;
  auto node = local_node_input(options, job->config, job->node_name);
  if (!node) return node.error();
  if (auto s = set_map(*job, {*node}, true); !s) return s.error();
  return job;
}

// NVML once per job. When it is absent and there is GPU memory to watch (a GPU budget, or ranks
// with GPUs here), the log says so once: not an error, the job runs without the GPU watch.
void open_gpu_watch(Job& job) {
  auto watch = NvmlMemoryWatch::open(nvml_library_name());
  if (watch) {
    job.gpu_watch = std::shared_ptr<NvmlMemoryWatch>(std::move(*watch));
    return;
  }
  bool gpus_here = false;
  for (const auto& assignment : job.map.ranks) {
    if (assignment.node == job.node_index && !assignment.gpus.empty()) gpus_here = true;
  }
  if (job.config.budget.gpu_memory_bytes_per_rank != 0 || gpus_here) {
    std::fprintf(stderr, "topolaunch: %s: GPU memory is not watched: %s\n", job.node_name.c_str(),
                 watch.error().message.c_str());
  }
}

// The [rdma] preflight stage of this node (attempt 0 only): prints its one line (nothing when
// the config turns it off) and keeps the stages' JSON lines in <job_dir>/preflight-<node>.jsonl.
PreflightStageOutcome preflight_stage(const Job& job, wireup::KvStore* store) {
  if (!job.options.preflight) {
    return PreflightStageOutcome{true, 0, "rdma preflight: not available in this program", ""};
  }
  const fs::path scratch = job.job_dir / "preflight-store";
  std::error_code ec;
  fs::remove_all(scratch, ec);  // a store left by an earlier run in this job dir
  if (store == nullptr) fs::create_directories(scratch, ec);
  PreflightStageOutcome outcome =
      job.options.preflight(job.config, job.node_name, store, scratch.string());
  if (store == nullptr) fs::remove_all(scratch, ec);
  if (job.config.rdma.preflight != PreflightMode::off) {
    std::fprintf(stderr, "topolaunch: %s\n", outcome.line.c_str());
  }
  if (!outcome.jsonl.empty()) {
    (void)write_file(job.job_dir / fmt::format("preflight-{}.jsonl", job.node_name), outcome.jsonl);
  }
  return outcome;
}

RootCause preflight_root_cause(const Job& job, int attempt, const PreflightStageOutcome& outcome) {
  return RootCause{attempt, -1, job.node_name, outcome.line, "preflight", unix_now_s()};
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

std::string node_input_to_json(const topology::NodeInput& node) {
  nlohmann::json j;
  j["name"] = node.name;
  j["topology"] = topology::to_json(*node.topology);
  j["all_gpus"] = node.allocation.all_gpus;
  j["gpus"] = node.allocation.gpus;
  j["gpu_uuids"] = node.allocation.gpu_uuids;
  j["cuda_naming"] = static_cast<int>(node.allocation.cuda_naming);
  j["cpus"] = node.allocation.cpus ? node.allocation.cpus->to_list() : std::string("*");
  return j.dump();
}

Result<topology::NodeInput> node_input_from_json(const std::string& text,
                                                 const std::string& origin) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("topology")) {
    return make_error(fmt::format("{}: not a node record", origin), 1);
  }
  auto topo = topology::from_json(j.value("topology", ""), origin);
  if (!topo) return topo.error();
  topology::NodeInput node;
  node.name = j.value("name", "");
  node.topology = std::make_shared<const topology::NodeTopology>(std::move(*topo));
  node.allocation.all_gpus = j.value("all_gpus", true);
  node.allocation.gpus = j.value("gpus", std::vector<int>{});
  node.allocation.gpu_uuids = j.value("gpu_uuids", std::vector<std::string>{});
  node.allocation.cuda_naming = static_cast<topology::CudaNaming>(j.value("cuda_naming", 0));
  std::string cpus = j.value("cpus", "*");
  if (cpus != "*") node.allocation.cpus = topology::CpuSet::parse_list(cpus);
  return node;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The address other nodes reach this one at: $TOPOLAUNCH_STORE_HOST, else the hostname's first
// IPv4 address, else loopback.
std::string advertised_host() {
  if (std::string host = env_string("TOPOLAUNCH_STORE_HOST"); !host.empty()) return host;
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  std::string out = "127.0.0.1";
  if (::getaddrinfo(name, nullptr, &hints, &found) == 0 && found) {
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(found->ai_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) out = text;
    ::freeaddrinfo(found);
  }
  return out;
}

int exit_code_of(const std::string& outcome, int stop_signal) {
  if (outcome == "succeeded") return 0;
  if (outcome == "requeue") return 3;
  if (outcome == "stopped") return 128 + (stop_signal ? stop_signal : SIGTERM);
  return 1;
}

// Starts srun with the handled signals unblocked, in its own process group, output inherited.
pid_t spawn_srun(const std::vector<std::string>& argv, const Environment& env) {
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// The MPI plugins this Slurm's srun offers (`srun --mpi=list`); empty when srun cannot say.
std::vector<std::string> srun_mpi_plugins() {
  std::string text;
  if (FILE* pipe = ::popen("srun --mpi=list 2>&1", "r")) {
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;)
      text.append(buffer, n);
    ::pclose(pipe);
  }
  return parse_srun_mpi_list(text);
}

// `run` inside a multi-node allocation: stores here, one agent per node through srun.
int run_slurm(Job& job, int nodes, int signal_fd) {
  JobReport report;
  report.job_name = job.config.job.name;
  report.run_id = job.run_id;
  report.job_dir = job.job_dir.string();
  report.max_restarts = job.config.job.restarts;
  const std::string host = advertised_host();
  // The agents' step gets the --mpi= plugin that matches [wireup].backend (agent_wireup.hpp).
  std::vector<std::string> offered;
  if (job.config.wireup.backend != WireupBackend::tcp) offered = srun_mpi_plugins();
  auto mpi = srun_mpi_for(job.config.wireup.backend, offered, wireup::compiled_backends());
  if (!mpi) {
    std::fprintf(stderr, "topolaunch: %s\n", mpi.error().message.c_str());
    return 2;
  }
  const bool agents_use_tcp = *mpi == "none";
  int exit_code = 1;
  for (int attempt = 0;; ++attempt) {
    const auto attempt_start = Clock::now();
    wireup::TcpStoreServerOptions agents_options;
    agents_options.bind_host = "0.0.0.0";
    agents_options.secret = job.secret;
    agents_options.world_size = nodes;
    Result<std::unique_ptr<wireup::TcpStoreServer>> agents_store =
        std::unique_ptr<wireup::TcpStoreServer>();
    if (agents_use_tcp) agents_store = wireup::TcpStoreServer::start(agents_options);
    wireup::TcpStoreServerOptions workers_options = agents_options;
    workers_options.port = static_cast<std::uint16_t>(job.config.wireup.port);
    workers_options.world_size = 0;  // the workers' WORLD_SIZE, from the first to connect
    auto workers_store = wireup::TcpStoreServer::start(workers_options);
    if (!agents_store || !workers_store) {
      std::fprintf(stderr, "topolaunch: wireup.port: cannot start the TCP store: %s\n",
                   (!agents_store ? agents_store.error() : workers_store.error()).message.c_str());
      return attempt == 0 ? 2 : 1;
    }
    Environment env = job.inherited;
    if (agents_use_tcp) {
      env["TOPOLAUNCH_AGENT_STORE"] = fmt::format("{}:{}", host, (*agents_store)->port());
    } else {
      env.erase("TOPOLAUNCH_AGENT_STORE");
    }
    env["TOPOLAUNCH_WORKER_STORE"] = fmt::format("{}:{}", host, (*workers_store)->port());
    env["TOPOLAUNCH_STORE_SECRET"] = job.secret;
    env["TOPOLAUNCH_MASTER_PORT"] = std::to_string(free_port());
    std::vector<std::string> argv{"srun",
                                  "--ntasks-per-node=1",
                                  "--kill-on-bad-exit=1",
                                  "--mpi=" + *mpi,
                                  fmt::format("--nodes={}", nodes),
                                  fmt::format("--ntasks={}", nodes),
                                  fs::read_symlink("/proc/self/exe").string(),
                                  "agent",
                                  fs::absolute(job.config.path).string(),
                                  "--job-dir",
                                  job.job_dir.string(),
                                  "--run-id",
                                  job.run_id,
                                  "--attempt",
                                  std::to_string(attempt)};
    if (!job.options.topology_path.empty()) {
      argv.insert(argv.end(), {"--topology", job.options.topology_path});
    }
    if (job.options.quiet) argv.push_back("-q");
    argv.push_back("--");
    argv.push_back(job.program);
    argv.insert(argv.end(), job.argv.begin() + 1, job.argv.end());
    pid_t srun = spawn_srun(argv, env);
    int status = 0, stop_signal = 0;
    std::string requested;  // "", "requeue", "stopped"
    while (true) {
      pollfd pfd{signal_fd, POLLIN, 0};
      ::poll(&pfd, 1, 200);
      signalfd_siginfo info;
      while (::read(signal_fd, &info, sizeof(info)) == sizeof(info)) {
        int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;
        if (sig == SIGUSR1) {
          ::kill(srun, SIGUSR1);  // srun relays it to every agent, which relay it to workers
          if (requested.empty()) requested = "requeue";
        } else {
          ::kill(srun, SIGTERM);
          requested = "stopped";
          stop_signal = sig;
        }
      }
      if (::waitpid(srun, &status, WNOHANG) == srun) break;
    }
    AttemptReport merged;
    merged.attempt = attempt;
    merged.started_s = seconds_between(job.job_start, attempt_start);
    merged.wall_s = seconds_between(attempt_start, Clock::now());
    std::optional<RootCause> cause;
    std::string agent_outcome;
    int preflight_exit = 0;  // an agent's [rdma] preflight stopped the job: 2 bad input, 1 fabric
    // every failed agent's first failure: the root cause is the earliest (node order is not time
    // order: the step's teardown kills workers on other nodes, which report that as theirs)
    std::vector<RootCause> failures;
    std::vector<int> failure_exit;
    std::vector<std::string> failure_preflight;
    for (int node = 0; node < nodes; ++node) {
      std::ifstream in(job.job_dir / fmt::format("attempt-{}", attempt) /
                       fmt::format("node-{}.json", node));
      std::stringstream text;
      text << in.rdbuf();
      auto fragment = report_from_json(text.str());
      if (!fragment || fragment->attempts.empty()) continue;
      const AttemptReport& a = fragment->attempts.front();
      merged.all_started_s = std::max(merged.all_started_s, a.all_started_s);
      merged.ranks.insert(merged.ranks.end(), a.ranks.begin(), a.ranks.end());
      if (report.agent_wireup.empty()) report.agent_wireup = fragment->agent_wireup;
      if (attempt == 0 && node == 0) report.preflight = fragment->preflight;
      if (fragment->root_cause && a.outcome == "failed") {
        failures.push_back(*fragment->root_cause);
        failure_exit.push_back(fragment->exit_code);
        failure_preflight.push_back(fragment->preflight);
      }
      // Agents signalled by Slurm directly (scancel --signal=USR1 JOBID, step teardown).
      if (a.outcome == "requeue" || a.outcome == "stopped") agent_outcome = a.outcome;
    }
    if (!failures.empty()) {
      const std::size_t first = earliest_root_cause(failures);
      cause = failures[first];
      if (cause->phase == "preflight") {
        preflight_exit = failure_exit[first];
        report.preflight = failure_preflight[first];
      }
    }
    std::sort(merged.ranks.begin(), merged.ranks.end(),
              [](const RankOutcome& a, const RankOutcome& b) { return a.rank < b.rank; });
    const bool srun_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    merged.outcome = !requested.empty()       ? requested
                     : srun_ok                ? "succeeded"
                     : cause                  ? "failed"
                     : !agent_outcome.empty() ? agent_outcome
                                              : "failed";
    if (merged.outcome == "stopped" && stop_signal == 0) stop_signal = SIGTERM;
    if (merged.outcome == "failed" && !cause) {
      cause =
          RootCause{attempt,
                    -1,
                    "",
                    fmt::format("srun {} before any agent reported a failure",
                                describe_wait_status(WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                                                     WIFSIGNALED(status) ? WTERMSIG(status) : 0)),
                    "",
                    unix_now_s()};
    }
    if (cause && !report.root_cause) report.root_cause = cause;
    report.attempts.push_back(merged);
    report.restarts_used = attempt;
    if (preflight_exit != 0 && requested.empty()) {
      // Nothing ran: a restart would meet the same fabric (or the same missing NIC).
      report.status = "failed";
      exit_code = preflight_exit;
      break;
    }
    if (merged.outcome == "failed" && attempt < job.config.job.restarts) {
      std::fprintf(stderr, "topolaunch: attempt %d failed (%s); restarting (%d of %d)\n", attempt,
                   cause ? cause->what.c_str() : "?", attempt + 1, job.config.job.restarts);
      continue;
    }
    report.status = merged.outcome;
    exit_code = exit_code_of(merged.outcome, stop_signal);
    break;
  }
  report.exit_code = exit_code;
  report.wall_s = seconds_between(job.job_start, Clock::now());
  (void)write_file(job.job_dir / "report.json", to_json(report));
  if (job.options.print_json) {
    std::fputs(to_json(report).c_str(), stdout);
  } else if (!job.options.quiet || exit_code != 0) {
    std::fputs(summarize(report).c_str(), stderr);
  }
  return exit_code;
}

}  // namespace

int run_job(const RunOptions& options) {
  SignalScope signals;
  // Orphaned grandchildren of workers come to us, so they can be reaped and never linger.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const int allocation_nodes = env_int("SLURM_JOB_NUM_NODES", env_int("SLURM_NNODES", 1));
  if (!options.local && std::getenv("SLURM_JOB_ID") != nullptr && allocation_nodes > 1) {
    auto job = prepare_job(options, "");
    if (!job) {
      std::fprintf(stderr, "topolaunch: %s\n", job.error().message.c_str());
      return job.error().exit_code;
    }
    int nodes = job->config.job.nodes > 0 ? job->config.job.nodes : allocation_nodes;
    if (nodes > allocation_nodes) {
      std::fprintf(stderr, "topolaunch: job.nodes: %d nodes asked, the allocation has %d\n", nodes,
                   allocation_nodes);
      return 2;
    }
    return run_slurm(*job, nodes, signals.fd());
  }
  auto prepared = prepare(options);
  if (!prepared) {
    std::fprintf(stderr, "topolaunch: %s\n", prepared.error().message.c_str());
    return prepared.error().exit_code;
  }
  Job& job = *prepared;
  for (const std::string& warning : job.map.warnings) {
    std::fprintf(stderr, "topolaunch: warning: %s\n", warning.c_str());
  }
  // One agent, in-process: no agent exchange. A PMIx/PMI2 request still has to be satisfiable.
  if (job.config.wireup.backend == WireupBackend::pmix ||
      job.config.wireup.backend == WireupBackend::pmi2) {
    auto backend = agent_backend(job.config.wireup.backend, wireup::current_environment(),
                                 wireup::compiled_backends());
    if (!backend) {
      std::fprintf(stderr, "topolaunch: %s; on one node use \"auto\" or \"tcp\"\n",
                   backend.error().message.c_str());
      return 2;
    }
  }

  JobReport report;
  report.job_name = job.config.job.name;
  report.run_id = job.run_id;
  report.job_dir = job.job_dir.string();
  report.max_restarts = job.config.job.restarts;
  report.agent_wireup = "none";
  int exit_code = 0;
  const PreflightStageOutcome preflight = preflight_stage(job, nullptr);
  report.preflight = preflight.line;
  if (!preflight.ok) {
    report.status = "failed";
    report.exit_code = preflight.exit_code;
    report.root_cause = preflight_root_cause(job, 0, preflight);
    report.wall_s = seconds_between(job.job_start, Clock::now());
    (void)write_file(job.job_dir / "report.json", to_json(report));
    if (preflight.exit_code != 2) std::fputs(summarize(report).c_str(), stderr);
    return preflight.exit_code;
  }
  open_gpu_watch(job);
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

namespace topolaunch::launcher {

int run_agent(const AgentOptions& options) {
  SignalScope signals;
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  auto prepared = prepare_job(options.run, options.run_id);
  if (!prepared) {
    std::fprintf(stderr, "topolaunch agent: %s\n", prepared.error().message.c_str());
    return prepared.error().exit_code;
  }
  Job& job = *prepared;
  const int node_id = env_int("SLURM_NODEID", 0);
  const int nodes = env_int("SLURM_STEP_NUM_NODES", env_int("SLURM_NNODES", 1));
  job.secret = env_string("TOPOLAUNCH_STORE_SECRET");
  job.external_store_address = env_string("TOPOLAUNCH_WORKER_STORE");
  job.master_addr = job.external_store_address.substr(0, job.external_store_address.rfind(':'));
  job.master_port = env_int("TOPOLAUNCH_MASTER_PORT", 0);
  auto fail = [&](const std::string& message) {
    std::fprintf(stderr, "topolaunch agent %s: %s\n", job.node_name.c_str(), message.c_str());
    return 2;
  };
  if (job.secret.empty() || job.external_store_address.empty()) {
    return fail(
        "started without TOPOLAUNCH_STORE_SECRET/TOPOLAUNCH_WORKER_STORE (use topolaunch run)");
  }
  auto node = local_node_input(options.run, job.config, job.node_name);
  if (!node) return fail(node.error().message);
  // The agents' exchange goes through the [wireup].backend store (agent_wireup.hpp).
  auto backend = agent_backend(job.config.wireup.backend, wireup::current_environment(),
                               wireup::compiled_backends());
  if (!backend) return fail(backend.error().message);
  std::unique_ptr<wireup::KvStore> store;
  if (*backend == wireup::Backend::tcp) {
    wireup::TcpStoreClientOptions client_options;
    client_options.address = env_string("TOPOLAUNCH_AGENT_STORE");
    client_options.secret = job.secret;
    client_options.rank = node_id;
    client_options.world_size = nodes;
    auto client = wireup::TcpStoreClient::connect(client_options);
    if (!client) return fail(client.error().message);
    store = std::move(*client);
  } else {
    wireup::Env env = wireup::current_environment();
    env["TOPOLAUNCH_WIREUP"] = std::string(backend_name(*backend));
    auto connected = wireup::connect_from_env(env, job.config.wireup.timeout);
    if (!connected) return fail(fmt::format("wireup.backend: {}", connected.error().message));
    store = std::move(*connected);
    // The PMI2 socket is the agent's own: workers must not inherit it.
    if (int pmi_fd = env_int("PMI_FD", -1); pmi_fd >= 0) ::fcntl(pmi_fd, F_SETFD, FD_CLOEXEC);
  }
  if (store->size() != nodes) {
    return fail(fmt::format("wireup {}: {} agents in the store, {} nodes in the step",
                            store->backend(), store->size(), nodes));
  }
  const int agent_rank = store->rank();
  std::fprintf(stderr, "topolaunch agent %s: wireup: agents exchange through %s (agent %d of %d)\n",
               job.node_name.c_str(), std::string(store->backend()).c_str(), agent_rank, nodes);
  // Workers get the TCP store; the agent's PMI variables describe the agent, not them.
  std::erase_if(job.inherited,
                [](const auto& entry) { return is_agent_pmi_variable(entry.first); });
  const auto timeout = job.config.wireup.timeout;
  if (auto s = store->put(wireup::rank_key("node", agent_rank), node_input_to_json(*node)); !s) {
    return fail(s.error().message);
  }
  if (auto s = store->fence(timeout); !s) return fail(s.error().message);
  std::vector<topology::NodeInput> inputs;
  for (int i = 0; i < nodes; ++i) {
    auto text = store->get_string(wireup::rank_key("node", i), timeout);
    if (!text) return fail(text.error().message);
    auto input = node_input_from_json(*text, fmt::format("agent {}", i));
    if (!input) return fail(input.error().message);
    inputs.push_back(std::move(*input));
  }
  if (auto s = set_map(job, inputs, agent_rank == 0); !s) return fail(s.error().message);

  JobReport fragment;
  fragment.job_name = job.config.job.name;
  fragment.run_id = job.run_id;
  fragment.job_dir = job.job_dir.string();
  fragment.agent_wireup = std::string(store->backend());
  const fs::path fragment_path = job.job_dir / fmt::format("attempt-{}", options.attempt) /
                                 fmt::format("node-{}.json", agent_rank);
  if (options.attempt == 0) {
    const PreflightStageOutcome preflight = preflight_stage(job, store.get());
    fragment.preflight = preflight.line;
    if (!preflight.ok) {
      AttemptReport failed;
      failed.attempt = options.attempt;
      failed.outcome = "failed";
      fragment.status = "failed";
      fragment.exit_code = preflight.exit_code;
      fragment.root_cause = preflight_root_cause(job, options.attempt, preflight);
      fragment.attempts.push_back(failed);
      std::error_code ec;
      fs::create_directories(fragment_path.parent_path(), ec);
      (void)write_file(fragment_path, to_json(fragment));
      return preflight.exit_code;
    }
  }
  open_gpu_watch(job);

  AttemptRunner runner(job, options.attempt, signals.fd());
  std::optional<RootCause> cause;
  int stop_signal = 0;
  auto result = runner.run(cause, stop_signal);
  if (!result) return fail(result.error().message);
  fragment.status = result->outcome;
  fragment.exit_code = exit_code_of(result->outcome, stop_signal);
  fragment.root_cause = cause;
  fragment.attempts.push_back(*result);
  (void)write_file(fragment_path, to_json(fragment));
  return fragment.exit_code;
}

}  // namespace topolaunch::launcher
