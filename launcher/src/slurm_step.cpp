// The Slurm step: `run` starts one agent per node with srun and merges what they report;
// `topolaunch agent` (run_agent) is one of those agents: it exchanges this node's topology with
// the others, computes the same rank map and runs one attempt of this node's ranks.
#include "slurm_step.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "attempt.hpp"
#include "early_start.hpp"
#include "process.hpp"
#include "report_merge.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/launcher/agent_wireup.hpp"
#include "topolaunch/launcher/report.hpp"
#include "topolaunch/wireup/kv_store.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

namespace topolaunch::launcher {
namespace {

// The address other nodes reach this one at: $TOPOLAUNCH_STORE_HOST, else the hostname's first
// IPv4 address, else loopback. Resolved once per process (an agent names it for its relay and
// its tree link; each lookup reads the resolver's files).
std::string resolve_advertised_host() {
  if (auto host = env_value("TOPOLAUNCH_STORE_HOST")) return *host;
  const std::string name = host_name();
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  std::string out = "127.0.0.1";
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &found) == 0 && found) {
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(found->ai_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) out = text;
    ::freeaddrinfo(found);
  }
  return out;
}

const std::string& advertised_host() {
  static const std::string host = resolve_advertised_host();
  return host;
}

// Starts srun with the handled signals unblocked, in its own process group, output inherited
// (stdout onto stderr when `run --json` keeps stdout for the report).
pid_t spawn_srun(const std::vector<std::string>& argv, const Environment& env,
                 bool stdout_to_stderr) {
  ExecStrings exec(argv, env);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    if (stdout_to_stderr) ::dup2(2, 1);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(exec.argv()[0], exec.argv(), exec.envp());
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

}  // namespace

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
  if (job.config.wireup.backend != jobspec::WireupBackend::tcp) offered = srun_mpi_plugins();
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
    env[jobspec::env::kStoreSecret] = job.secret;
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
                                  std::to_string(attempt),
                                  "--config-digest",
                                  job.config.digest};
    if (!job.options.topology_path.empty()) {
      argv.insert(argv.end(), {"--topology", job.options.topology_path});
    }
    if (job.options.quiet) argv.push_back("-q");
    argv.push_back("--");
    argv.push_back(job.program);
    argv.insert(argv.end(), job.argv.begin() + 1, job.argv.end());
    pid_t srun = spawn_srun(argv, env, job.options.print_json);
    int status = 0, stop_signal = 0;
    std::string requested;  // "", "requeue", "stopped"
    // A node lost with its slurmd and slurmstepd never reports, and srun waits for its task
    // until Slurm declares the node down (SlurmdTimeout, 300 s by default). Once some agents
    // have reported and no other has for stop_grace + 10 s, srun is stopped: the step is over.
    const fs::path attempt_dir = job.job_dir / fmt::format("attempt-{}", attempt);
    const auto lost_after = job.config.job.stop_grace + std::chrono::seconds(10);
    int reports = 0;
    auto last_count = Clock::now();
    std::optional<Clock::time_point> reports_since;
    double waited_for_silent_s = 0;
    while (true) {
      pollfd pfd{signal_fd, POLLIN, 0};
      ::poll(&pfd, 1, 200);
      if (const auto now = Clock::now(); now - last_count >= std::chrono::seconds(1)) {
        last_count = now;
        int n = 0;
        std::error_code ec;
        for (int node = 0; node < nodes; ++node)
          n += fs::exists(attempt_dir / fmt::format("node-{}.json", node), ec) ? 1 : 0;
        if (n != reports || n == 0 || n == nodes) reports_since = now;
        reports = n;
        if (waited_for_silent_s == 0 && now - *reports_since > lost_after) {
          waited_for_silent_s = seconds_between(*reports_since, now);
          std::fprintf(stderr,
                       "topolaunch: %d of %d agents reported %.0f s ago, the others never did: "
                       "stopping srun\n",
                       reports, nodes, waited_for_silent_s);
          ::kill(-srun, SIGKILL);
        }
      }
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
    const double wall_s = seconds_between(attempt_start, Clock::now());
    std::vector<std::optional<JobReport>> agent_reports;
    for (int node = 0; node < nodes; ++node) {
      std::ifstream in(job.job_dir / fmt::format("attempt-{}", attempt) /
                       fmt::format("node-{}.json", node));
      std::stringstream text;
      text << in.rdbuf();
      agent_reports.push_back(report_from_json(text.str()));
    }
    MergedAttempt step = merge_agent_reports(attempt, agent_reports, report);
    AttemptReport& merged = step.attempt;
    merged.started_s = seconds_between(job.job_start, attempt_start);
    merged.wall_s = wall_s;
    std::optional<RootCause>& cause = step.root_cause;
    const int preflight_exit = step.preflight_exit;
    const bool srun_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    merged.outcome = step_outcome(requested, srun_ok, step);
    if (merged.outcome == "stopped" && stop_signal == 0) stop_signal = SIGTERM;
    bool node_lost = false;
    if (!srun_ok && requested.empty()) {
      // An agent that died without a report (killed, or its node lost) is the cause of what
      // the others report (their ranks' peers died, the step's teardown).
      std::ifstream map_file(job.job_dir / "rankmap.json");
      std::stringstream map_text;
      map_text << map_file.rdbuf();
      const std::string srun_end =
          waited_for_silent_s > 0
              ? fmt::format("stopped, still waiting for it {:.0f} s after the others' reports",
                            waited_for_silent_s)
              : describe_wait_status(WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                                     WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      if (auto lost = silent_agents_cause(step, static_cast<std::size_t>(nodes), map_text.str(),
                                          srun_end, waited_for_silent_s > 0)) {
        cause = lost;
        merged.outcome = "failed";
        node_lost = waited_for_silent_s > 0;
      }
    }
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
    if (cause && requested.empty() &&
        (cause->phase == kMpiWithoutLauncherPhase || cause->phase == kEarlyStartMismatchPhase)) {
      // An MPI program without an MPI launcher, or an early start on nodes whose maps differ,
      // fails the same way every time: bad input.
      report.status = "failed";
      exit_code = jobspec::exit_status::kBadInput;
      break;
    }
    if (preflight_exit != 0 && requested.empty()) {
      // Nothing ran: a restart would meet the same fabric (or the same missing NIC).
      report.status = "failed";
      exit_code = preflight_exit;
      break;
    }
    if (node_lost && attempt < job.config.job.restarts) {
      // The allocation still holds the lost node: a new step would wait for it again.
      std::fprintf(stderr, "topolaunch: attempt %d failed (%s); not restarted: a node is lost\n",
                   attempt, cause->what.c_str());
    } else if (merged.outcome == "failed" && attempt < job.config.job.restarts) {
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
  report.training = read_training_figures(job.config.train.metrics_file,
                                          (job.job_dir / "validation.jsonl").string());
  finish_observation(job, report);
  publish_report(job, report, !job.options.quiet || exit_code != 0);
  return exit_code;
}

int run_agent(const AgentOptions& options) {
  const double main_unix_s = unix_now_s();
  const double main_cpu_s = process_cpu_s();  // the exec and the dynamic loader's work
  SignalScope signals;
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  auto prepared = prepare_job(options.run, options.run_id);
  if (!prepared) {
    std::fprintf(stderr, "topolaunch agent: %s\n", prepared.error().message.c_str());
    return prepared.error().exit_code;
  }
  Job& job = *prepared;
  auto mark = [&](const char* phase) {
    job.start_marks.push_back({phase, unix_now_s(), process_cpu_s()});
  };
  job.start_marks.push_back({"main", main_unix_s, main_cpu_s});
  mark("config");
  auto fail = [&](const std::string& message) {
    std::fprintf(stderr, "topolaunch agent %s: %s\n", job.node_name.c_str(), message.c_str());
    return 2;
  };
  contain(job, "topolaunch agent " + job.node_name);
  mark("contained");
  const auto node_id = env_int("SLURM_NODEID", 0);
  if (!node_id) return fail(node_id.error().message);
  const auto step_nodes = env_count("SLURM_STEP_NUM_NODES", "SLURM_NNODES");
  if (!step_nodes) return fail(step_nodes.error().message);
  const int nodes = *step_nodes;
  const auto master_port = env_int("TOPOLAUNCH_MASTER_PORT", 0, 0, 65535);
  if (!master_port) return fail(master_port.error().message);
  job.secret = env_value(jobspec::env::kStoreSecret).value_or("");
  job.external_store_address = env_value("TOPOLAUNCH_WORKER_STORE").value_or("");
  job.master_addr = job.external_store_address.substr(0, job.external_store_address.rfind(':'));
  job.master_port = *master_port;
  if (job.secret.empty() || job.external_store_address.empty()) {
    return fail(
        "started without TOPOLAUNCH_STORE_SECRET/TOPOLAUNCH_WORKER_STORE (use topolaunch run)");
  }
  auto node = local_node_input(options.run, job.config, job.node_name);
  if (!node) return fail(node.error().message);
  mark("topology");
  const std::string root_store_address = job.external_store_address;  // `run`'s workers' store
  JobReport fragment;
  fragment.job_name = job.config.job.name;
  fragment.run_id = job.run_id;
  fragment.job_dir = job.job_dir.string();
  // This node's report for `run` (attempt-N/node-<agent>.json).
  auto write_fragment = [&](int agent) {
    const fs::path path = job.job_dir / fmt::format("attempt-{}", options.attempt) /
                          fmt::format("node-{}.json", agent);
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    return write_file(path, to_json(fragment));
  };
  // This node's workers reach the store through its relay: the socket listens from here on, its
  // address travels in the agents' exchange, and the relay serves once the map says which ranks
  // each node has.
  auto workers_listener = wireup::TcpStoreListener::open("0.0.0.0");
  if (!workers_listener) return fail(workers_listener.error().message);
  const std::string relay_address =
      fmt::format("{}:{}", advertised_host(), workers_listener->port());
  // Workers get the TCP store; the agent's PMI variables describe the agent, not them, and its
  // PMI2 socket stays its own. Before any worker is forked.
  auto keep_pmi_from_workers = [&] {
    std::erase_if(job.inherited,
                  [](const auto& entry) { return is_agent_pmi_variable(entry.first); });
    if (auto pmi_fd = env_int("PMI_FD", -1, -1); pmi_fd && *pmi_fd >= 0) {
      ::fcntl(*pmi_fd, F_SETFD, FD_CLOEXEC);
    }
  };
  // job.start = "early" (early_start.hpp): this node's workers start here, from the map of a
  // step whose nodes are all like this one, with the relay as their store address.
  std::optional<StartedAttempt> early;
  if (job.config.job.start == jobspec::StartMode::early) {
    auto refused = [&](const std::string& why) {
      return fail(fmt::format("job.start = \"early\": {}; use start = \"checked\"", why));
    };
    auto names = step_node_names(current_environment(), nodes, job.node_name);
    if (!names) return refused(names.error().message);
    if (auto s = set_map(job, nodes_like(*node, *names), false); !s)
      return refused("the map of this node's topology alone: " + s.error().message);
    keep_pmi_from_workers();
    job.external_store_address = relay_address;
    if (auto s = start_metrics_server(job); !s) return fail(s.error().message);
    open_gpu_watch(job);
    auto started = StartedAttempt::start(job, options.attempt, signals.fd());
    if (!started) return fail(started.error().message);
    early.emplace(std::move(*started));
  }
  // After an early start nothing may end the agent before its workers are stopped and reaped:
  // the attempt fails with `what` (one line naming job.start), supervised to its end, and this
  // node's report says so (exit 2 for a map that differs: the same nodes would differ again).
  auto fail_started = [&](const std::string& what, const char* phase, int agent) {
    const std::string line = fmt::format("job.start = \"early\": {}", what);
    std::fprintf(stderr, "topolaunch agent %s: %s\n", job.node_name.c_str(), line.c_str());
    early->fail(line, phase);
    std::optional<RootCause> cause;
    int stop_signal = 0;
    AttemptReport attempt = early->supervise(cause, stop_signal);
    const bool mismatch = std::string_view(phase) == kEarlyStartMismatchPhase;
    fragment.status = attempt.outcome;
    fragment.exit_code = attempt.outcome == "failed" && mismatch
                             ? jobspec::exit_status::kBadInput
                             : exit_code_of(attempt.outcome, stop_signal);
    fragment.root_cause = cause;
    fragment.attempts.push_back(attempt);
    (void)write_fragment(agent);
    return fragment.exit_code != 0 ? fragment.exit_code : 1;
  };
  // `step`: what failed ("the agents' exchange"). Its phase: "wireup" for what may pass on a
  // restart (a peer gone, a timeout); a map that cannot be made is bad input as a map that
  // differs is (kEarlyStartMismatchPhase).
  auto fail_after_start = [&](const std::string& message, int agent,
                              const char* step = "the agents' exchange",
                              const char* phase = "wireup") {
    if (!early) return fail(message);
    return fail_started(
        fmt::format("{} failed after this node's workers started: {}", step, message), phase,
        agent);
  };
  // The agents' exchange goes through the [wireup].backend store (agent_wireup.hpp).
  auto backend =
      agent_backend(job.config.wireup.backend, current_environment(), wireup::compiled_backends());
  if (!backend) return fail_after_start(backend.error().message, *node_id);
  std::unique_ptr<wireup::KvStore> store;
  AgentTreeStore agents_tree;  // TCP: the agents' store through a relay tree (agent_wireup.hpp)
  if (*backend == wireup::Backend::tcp) {
    auto tree = connect_agents_tree(env_value("TOPOLAUNCH_AGENT_STORE").value_or(""), job.secret,
                                    *node_id, nodes, advertised_host(), job.config.wireup.timeout);
    if (!tree) return fail_after_start(tree.error().message, *node_id);
    agents_tree = std::move(*tree);
    store = std::move(agents_tree.store);
  } else {
    Environment env = current_environment();
    env[jobspec::env::kWireup] = std::string(backend_name(*backend));
    auto connected = wireup::connect_from_env(env, job.config.wireup.timeout);
    if (!connected)
      return fail_after_start(fmt::format("wireup.backend: {}", connected.error().message),
                              *node_id);
    store = std::move(*connected);
  }
  if (store->size() != nodes) {
    return fail_after_start(fmt::format("wireup {}: {} agents in the store, {} nodes in the step",
                                        store->backend(), store->size(), nodes),
                            *node_id);
  }
  const int agent_rank = store->rank();
  mark("agents_connected");
  std::fprintf(stderr, "topolaunch agent %s: wireup: agents exchange through %s (agent %d of %d)\n",
               job.node_name.c_str(), std::string(store->backend()).c_str(), agent_rank, nodes);
  if (!early) keep_pmi_from_workers();
  // Records and distinct topologies (agent_wireup.hpp); the workers' relay's address travels in
  // the record.
  auto exchange = exchange_node_inputs(*store, *node, relay_address, job.config.wireup.timeout);
  if (!exchange) return fail_after_start(exchange.error().message, agent_rank);
  mark("exchange");
  // The map the workers started from, kept for the check against the whole map.
  std::optional<topology::RankMap> started_map;
  if (early) started_map = std::move(job.map);
  if (auto s = set_map(job, exchange->nodes, agent_rank == 0); !s)
    return fail_after_start(s.error().message, agent_rank, "the rank map",
                            kEarlyStartMismatchPhase);
  if (early) {
    const std::string difference =
        early_start_difference(*started_map, job.map, job.node_name, job.config);
    if (!difference.empty()) {
      return fail_started(
          fmt::format("the agents' map differs from the one node {}'s workers started from (its "
                      "own topology taken for every node): {}; its workers were stopped (nodes "
                      "that differ need start = \"checked\")",
                      job.node_name, difference),
          kEarlyStartMismatchPhase, agent_rank);
    }
  }
  mark("map");
  auto workers_relay = start_workers_relay(std::move(*workers_listener), job.map, *exchange,
                                           agent_rank, root_store_address, job.secret);
  if (!workers_relay)
    return fail_after_start(workers_relay.error().message, agent_rank, "the workers' relay");
  job.external_store_address = relay_address;  // this node's workers reach the store through it
  mark("relay");

  fragment.agent_wireup = std::string(store->backend());
  if (options.attempt == 0) {
    // With job.start = "early" the preflight is off (job_config.hpp): this writes its line.
    const PreflightStageOutcome preflight = preflight_stage(job, store.get());
    fragment.preflight = preflight.line;
    if (!preflight.ok && early) return fail_started(preflight.line, "preflight", agent_rank);
    if (!preflight.ok) {
      AttemptReport failed;
      failed.attempt = options.attempt;
      failed.outcome = "failed";
      fragment.status = "failed";
      fragment.exit_code = preflight.exit_code;
      fragment.root_cause = preflight_root_cause(job, options.attempt, preflight);
      fragment.attempts.push_back(failed);
      (void)write_fragment(agent_rank);
      return preflight.exit_code;
    }
  }
  std::optional<RootCause> cause;
  int stop_signal = 0;
  if (!early) {  // an early start did both before its workers
    if (auto s = start_metrics_server(job); !s) return fail(s.error().message);
    open_gpu_watch(job);
  }
  mark("ready");
  Result<AttemptReport> result =
      early ? Result<AttemptReport>(early->supervise(cause, stop_signal))
            : run_attempt(job, options.attempt, signals.fd(), cause, stop_signal);
  if (!result) return fail(result.error().message);
  fragment.status = result->outcome;
  fragment.exit_code = exit_code_of(result->outcome, stop_signal);
  fragment.root_cause = cause;
  fragment.attempts.push_back(*result);
  if (auto written = write_fragment(agent_rank); !written) {
    // `run` then has no report of this node: a requeue must not pass for success
    std::fprintf(stderr, "topolaunch agent %s: %s\n", job.node_name.c_str(),
                 written.error().message.c_str());
    return fragment.exit_code != 0 ? fragment.exit_code : 1;
  }
  return agent_exit_status(result->outcome, stop_signal);
}

}  // namespace topolaunch::launcher
