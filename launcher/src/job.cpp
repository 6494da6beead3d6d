// Preparing a job on this node: its config, program, job dir, run id and secret, this node's
// topology and the rank map; the [rdma] preflight stage and the GPU memory watch; see job.hpp.
#include "job.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "process.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/import_cache.hpp"
#include "topolaunch/topology/serialize.hpp"

namespace topolaunch::launcher {
namespace {

std::string random_hex(std::size_t bytes) {
  std::string out;
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  for (std::size_t i = 0; i < bytes; ++i) {
    unsigned char c = static_cast<unsigned char>(urandom.get());
    out += fmt::format("{:02x}", c);
  }
  return out;
}

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

// What an earlier run left in a job dir: its report, its rank map, its attempts' directories and
// preflight logs (checkpoints stay: a resumed run reads them). Only a report or an attempt makes
// it a run worth keeping: a run refused before either (bad input) leaves at most a rank map.
std::vector<fs::path> earlier_run_files(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "report.json" || name == "rankmap.json" || name.starts_with("attempt-") ||
        (name.starts_with("preflight-") && name.ends_with(".jsonl"))) {
      found.push_back(entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string run_id_in_report(const fs::path& report) {
  std::ifstream in(report);
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = report_from_json(text.str());
  return parsed ? parsed->run_id : "";
}

// A job dir is never overwritten (see prepare_job in job.hpp).
Status claim_job_dir(const fs::path& dir, const std::string& run_id, bool resume) {
  const std::vector<fs::path> earlier = earlier_run_files(dir);
  const bool kept = std::any_of(earlier.begin(), earlier.end(), [](const fs::path& file) {
    const std::string name = file.filename().string();
    return name == "report.json" || name.starts_with("attempt-");
  });
  if (!kept) return ok_status();
  const std::string earlier_id = run_id_in_report(dir / "report.json");
  auto restarts = env_int("SLURM_RESTART_COUNT", 0, 0);
  if (!restarts) return restarts.error();
  const bool requeued = earlier_id == run_id || (earlier_id.empty() && *restarts > 0);
  int n = 1;
  while (fs::exists(dir / "earlier" / std::to_string(n))) ++n;
  const fs::path shelf = dir / "earlier" / std::to_string(n);
  if (!resume && !requeued) {
    return make_error(fmt::format(
        "job.job_dir: \"{}\" holds an earlier run{} ({}): give another job_dir, remove it, or pass "
        "--resume to continue there (its files then move to {})",
        dir.string(), earlier_id.empty() ? "" : " " + earlier_id,
        earlier.front().filename().string(), shelf.string()));
  }
  std::error_code ec;
  fs::create_directories(shelf, ec);
  for (const fs::path& file : earlier) {
    if (!ec) fs::rename(file, shelf / file.filename(), ec);
  }
  if (ec) {
    return make_error(fmt::format("job.job_dir: cannot move the earlier run to {}: {}",
                                  shelf.string(), ec.message()));
  }
  std::fprintf(stderr, "topolaunch: %s: the earlier run%s moved to %s\n",
               resume ? "--resume" : "requeued",
               earlier_id.empty() ? "" : (" " + earlier_id).c_str(), shelf.string().c_str());
  return ok_status();
}

}  // namespace

// Wall-clock seconds since the epoch: failures are ordered across nodes by it (NTP keeps a
// cluster's clocks far closer than a failure and the teardown it causes).
double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double process_cpu_s() {
  double total = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    struct rusage usage {};
    if (::getrusage(who, &usage) != 0) continue;
    for (const timeval& tv : {usage.ru_utime, usage.ru_stime})
      total += static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
  }
  return total;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Status write_file(const fs::path& path, std::string_view text) {
  // A temporary name in the same folder, renamed over the file: a reader (or a later run) sees
  // the old file or the new one, never a part; a full disk leaves the old one and no 0-byte file.
  const fs::path temp =
      path.parent_path() / fmt::format(".{}.tmp.{}", path.filename().string(), ::getpid());
  auto failed = [&](int error) {
    ::unlink(temp.c_str());
    return make_error(fmt::format("cannot write {}: {}", path.string(), std::strerror(error)), 1);
  };
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return failed(errno);
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      ::close(fd);
      return failed(error);
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  if (::close(fd) != 0) return failed(errno);  // NFS reports a full disk at close
  if (::rename(temp.c_str(), path.c_str()) != 0) return failed(errno);
  return ok_status();
}

void publish_report(const Job& job, const JobReport& report, bool summary_wanted) {
  const fs::path path = job.job_dir / "report.json";
  const std::string json = to_json(report);
  auto written = write_file(path, json);
  if (!written) std::fprintf(stderr, "topolaunch: %s\n", written.error().message.c_str());
  if (job.options.print_json) {
    std::fputs(json.c_str(), stdout);
  } else if (summary_wanted) {
    std::fputs(summarize(report, written ? "" : written.error().message).c_str(), stderr);
  }
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

Result<int> env_count(const char* name, const char* fallback_name) {
  auto fallback = env_int(fallback_name, 1, 1);
  if (!fallback) return fallback.error();
  return env_int(name, *fallback, 1);
}

TopologyCacheDir topology_cache_dir() {
  TopologyCacheDir out;
  if (auto named = env_value(kTopologyCacheVariable)) {
    out.explicit_setting = true;
    if (*named != "off") out.path = *named;
    return out;
  }
  // The XDG cache of the job user, created 0700 on the way (~/.cache may not exist yet).
  std::string base;
  if (auto xdg = env_value("XDG_CACHE_HOME"); xdg && xdg->starts_with('/')) {
    base = *xdg;
  } else if (auto home = env_value("HOME"); home && home->starts_with('/')) {
    base = *home + "/.cache";
  } else {
    return out;  // no home: no cache
  }
  ::mkdir(base.c_str(), 0700);
  ::mkdir((base + "/topolaunch").c_str(), 0700);
  out.path = base + "/topolaunch/topology-cache";
  return out;
}

Result<topology::NodeTopology> load_topology_file_cached(const std::string& path,
                                                         const topology::DiscoverOptions& options,
                                                         std::string_view nics_text,
                                                         const TopologyCacheDir& cache) {
  namespace import_cache = topology::import_cache;
  if (cache.path.empty()) return topology::load_topology_file(path, options);
  if (auto trusted = import_cache::trusted_cache_directory(cache.path); !trusted) {
    // A directory named on purpose that cannot be used is said; the default one falls back
    // quietly (a job must not fail, nor every node print a line, for its cache).
    if (cache.explicit_setting) {
      std::fprintf(stderr, "topolaunch: %s=%s: not used: %s\n", kTopologyCacheVariable,
                   cache.path.c_str(), trusted.error().message.c_str());
    }
    return topology::load_topology_file(path, options);
  }
  auto found = import_cache::lookup(cache.path, path, import_cache::salt(nics_text),
                                    [&](const std::string& bytes) {
                                      return topology::load_topology_buffer(bytes, path, options);
                                    });
  if (!found) return found.error();
  // Without `known`, lookup parsed (or imported) the topology it returns.
  if (!found->topology) return topology::load_topology_file(path, options);
  std::optional<topology::NodeTopology>& topo = found->topology;
  // The import was of the same bytes, perhaps under another path: this file's name.
  topo->sources.origin = path;
  if (!options.hostname.empty()) topo->hostname = options.hostname;
  return std::move(*topo);
}

// This node's input to the rank map: its topology (live, or a file where "%n" is the node name)
// and what the job may use here.
Result<topology::NodeInput> local_node_input(const RunOptions& options,
                                             const jobspec::JobConfig& config,
                                             const std::string& node_name) {
  topology::DiscoverOptions discover_options;
  discover_options.nics = config.rdma.nics;
  std::string topology_path = options.topology_path;
  for (std::size_t at; (at = topology_path.find("%n")) != std::string::npos;) {
    topology_path.replace(at, 2, node_name);
  }
  auto topo = topology_path.empty()
                  ? topology::discover_live(discover_options)
                  : load_topology_file_cached(topology_path, discover_options,
                                              config.rdma.nics_text, topology_cache_dir());
  if (!topo) return topo.error();
  // A NIC named that this node lacks: the preflight stage names it when it runs; without it the
  // map would leave it out (with a warning at most) and the job would run without that NIC.
  if (config.rdma.preflight == jobspec::PreflightMode::off) {
    const std::string key =
        fmt::format("{}: rdma.nics = \"{}\"", config.path, config.rdma.nics_text);
    if (auto named = topology::check_named_nics(config.rdma.nics, *topo, node_name, key); !named)
      return named.error();
  }
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

// Everything that can be refused before a worker starts (exit 2); the map comes later.
Result<Job> prepare_job(const RunOptions& options, const std::string& run_id) {
  Job job;
  job.job_start = Clock::now();
  job.options = options;
  auto config = jobspec::load_job_config(options.config_path, {}, options.probed_config_digest);
  if (!config) return config.error();
  job.config = std::move(*config);
  if (!options.command_override.empty()) job.config.worker.command = options.command_override;
  auto program = resolve_program(job.config.worker.command[0]);
  if (!program) return program.error();
  job.program = *program;
  job.argv = job.config.worker.command;
  job.builtin_worker = fs::path(job.program).filename() == "topolaunch-worker";
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
  if (run_id.empty()) {
    if (auto claimed = claim_job_dir(job.job_dir, job.run_id, options.resume); !claimed) {
      return claimed.error();
    }
  }
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

void contain(Job& job, const std::string& who) {
  std::shared_ptr<const Containment> containment = Containment::open(job.run_id);
  if (containment->kind() == ContainmentKind::process_tree || containment->watchdog_pid() < 0)
    std::fprintf(stderr, "%s: %s\n", who.c_str(), containment->description().c_str());
  job.containment = std::move(containment);
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

Status start_metrics_server(Job& job) {
  const jobspec::ObserveSection& o = job.config.observe;
  if (o.metrics_port == 0) return ok_status();
  auto server = MetricsServer::start(o.metrics_port);
  if (!server)
    return make_error(fmt::format("{}: observe.metrics_port: {} on {}; choose another (or 0: off)",
                                  o.metrics_port_at.empty() ? job.config.path : o.metrics_port_at,
                                  server.error().message, job.node_name),
                      2);
  job.metrics = std::shared_ptr<MetricsServer>(std::move(*server));
  std::fprintf(stderr, "topolaunch: %s: metrics: http://%s:%d/metrics (Prometheus text format)\n",
               job.node_name.c_str(), job.node_name.c_str(), o.metrics_port);
  return ok_status();
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
  if (job.config.rdma.preflight != jobspec::PreflightMode::off) {
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

}  // namespace topolaunch::launcher
