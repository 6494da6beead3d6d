// Benchmark: fence + exchange of a <bytes> value per rank (every rank gets every other rank's
// value) for <ranks> local processes, through each wireup backend, against Open MPI's
// MPI_Allgather of the same data in the same run.
//
//   bench_wireup <wireup_peer> <mpi_allgather> [ranks=64] [bytes=4096] [rounds=5]
//
// Per backend: exchange time = the slowest rank's KvStore::allgather per round (median over
// rounds; the backend's own bulk way: TCP one round trip, PMIx one collecting fence, PMI2
// Slurm's fence); wall time = from starting the processes to the last exit (start-up included).
// "tcp-kv" is the same exchange done by hand through the same TCP store (put, fence, get_many of
// the others), the way every exchange went before allgather.
// PMI2 and PMIx run only under the local Slurm test cluster (SLURM_CONF set, e.g. after
// `. DIR/env` from tests/slurm/cluster-start); otherwise their lines say why they were not run.
// One JSON object per line; no pass/fail on timing.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "topolaunch/wireup/tcp_store.hpp"

using namespace topolaunch::wireup;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Measured {
  std::string error;  // non-empty: not measured, and why
  double exchange_ms = 0;
  double wall_ms = 0;
  std::vector<double> rounds_ms;       // slowest rank per round
  std::vector<double> get_rounds_ms;   // of which reading the others' values (slowest rank)
  double server_cpu_ms = -1;           // tcp: CPU time of the store's serving thread
  std::uint64_t server_bytes_out = 0;  // tcp: what the store sent, start-up and all rounds
  std::uint64_t server_requests = 0;
};

Measured not_measured(std::string why) {
  Measured m;
  m.error = std::move(why);
  return m;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Slowest rank per round, from lines {"exchange_us":[...]} (one line per rank, or one line that
// already holds the slowest rank's figures).
Measured from_lines(const std::string& output, int expected_lines, double wall_ms) {
  Measured m;
  m.wall_ms = wall_ms;
  std::vector<double> slowest;
  int lines = 0;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.front() != '{') continue;
    auto parsed = json::parse(line, nullptr, false);
    if (parsed.is_discarded() || !parsed.contains("exchange_us")) continue;
    ++lines;
    const auto& times = parsed["exchange_us"];
    if (slowest.size() < times.size()) slowest.resize(times.size(), 0);
    for (std::size_t i = 0; i < times.size(); ++i)
      slowest[i] = std::max(slowest[i], times[i].get<double>() / 1000);
    if (parsed.contains("get_us")) {
      const auto& gets = parsed["get_us"];
      if (m.get_rounds_ms.size() < gets.size()) m.get_rounds_ms.resize(gets.size(), 0);
      for (std::size_t i = 0; i < gets.size(); ++i) {
        m.get_rounds_ms[i] = std::max(m.get_rounds_ms[i], gets[i].get<double>() / 1000);
      }
    }
  }
  if (lines != expected_lines) {
    m.error = "expected " + std::to_string(expected_lines) + " result lines, got " +
              std::to_string(lines);
  }
  m.exchange_ms = median(slowest);
  m.rounds_ms = slowest;
  return m;
}

std::string run_command(const std::string& command, int& status) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    status = -1;
    return "popen failed";
  }
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  status = pclose(pipe);
  return output;
}

Measured run_tcp(const std::string& peer, const std::string& mode, int ranks, int bytes,
                 int rounds) {
  TcpStoreServerOptions options;
  options.secret = "bench-secret";
  options.world_size = ranks;
  auto server = TcpStoreServer::start(options);
  if (!server) return not_measured(server.error().message);
  char pattern[] = "/tmp/wireup-bench-XXXXXX";
  std::string dir = mkdtemp(pattern);
  auto start = Clock::now();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < ranks; ++rank) {
    std::vector<std::string> args{peer, mode, std::to_string(bytes), "60000",
                                  std::to_string(rounds)};
    std::vector<std::string> env{"TOPOLAUNCH_STORE_ADDR=" + (*server)->address(),
                                 "TOPOLAUNCH_STORE_SECRET=bench-secret",
                                 "TOPOLAUNCH_RANK=" + std::to_string(rank),
                                 "TOPOLAUNCH_WORLD_SIZE=" + std::to_string(ranks)};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    auto out = dir + "/" + std::to_string(rank) + ".out";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data()) == 0)
      pids.push_back(pid);
    posix_spawn_file_actions_destroy(&actions);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  double wall = ms_since(start);
  std::string output;
  for (int rank = 0; rank < ranks; ++rank) {
    std::ifstream in(dir + "/" + std::to_string(rank) + ".out");
    std::stringstream text;
    text << in.rdbuf();
    output += text.str();
  }
  auto stats = (*server)->stats();
  (*server)->stop();
  auto server_cpu_ms = stats.cpu_seconds * 1e3;
  std::error_code ignored;  // a leftover temp dir does not change the figures
  std::filesystem::remove_all(dir, ignored);
  auto m = from_lines(output, ranks, wall);
  m.server_cpu_ms = server_cpu_ms;
  m.server_bytes_out = stats.bytes_out;
  m.server_requests = stats.requests;
  if (failed > 0) m.error = std::to_string(failed) + " ranks failed";
  return m;
}

Measured run_srun(const std::string& mpi, const std::string& peer, int ranks, int bytes,
                  int rounds) {
  if (std::getenv("SLURM_CONF") == nullptr) {
    return not_measured(
        "not run: no Slurm test cluster (start tests/slurm/cluster-start DIR, source DIR/env)");
  }
  auto command = "timeout 300 srun -N4 -n" + std::to_string(ranks) + " --mpi=" + mpi + " " + peer +
                 " exchange " + std::to_string(bytes) + " 60000 " + std::to_string(rounds);
  int status = 0;
  auto start = Clock::now();
  auto output = run_command(command, status);
  auto m = from_lines(output, ranks, ms_since(start));
  if (status != 0) m.error = "srun failed: " + output.substr(0, 300);
  return m;
}

Measured run_mpi(const std::string& program, int ranks, int bytes, int rounds) {
  auto command = "timeout 300 mpirun -np " + std::to_string(ranks) +
                 " --oversubscribe --allow-run-as-root " + program + " " + std::to_string(bytes) +
                 " " + std::to_string(rounds);
  int status = 0;
  auto start = Clock::now();
  auto output = run_command(command, status);
  auto m = from_lines(output, 1, ms_since(start));
  if (status != 0) m.error = "mpirun failed: " + output.substr(0, 300);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: bench_wireup <wireup_peer> <mpi_allgather> [ranks] [bytes] [rounds]\n");
    return 2;
  }
  std::string peer = argv[1], mpi_program = argv[2];
  int ranks = argc > 3 ? std::atoi(argv[3]) : 64;
  int bytes = argc > 4 ? std::atoi(argv[4]) : 4096;
  int rounds = argc > 5 ? std::atoi(argv[5]) : 5;

  auto mpi = run_mpi(mpi_program, ranks, bytes, rounds);
  struct Run {
    const char* backend;
    Measured measured;
  };
  std::vector<Run> runs{{"tcp", run_tcp(peer, "exchange", ranks, bytes, rounds)},
                        {"tcp-kv", run_tcp(peer, "exchange-kv", ranks, bytes, rounds)},
                        {"pmi2", run_srun("pmi2", peer, ranks, bytes, rounds)},
                        {"pmix", run_srun("pmix", peer, ranks, bytes, rounds)}};
  // The host's load during the run: these are wall-clock figures on shared cores.
  double load_1m = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load_1m) != 1) load_1m = 0;
    std::fclose(f);
  }
  int failures = 0;
  for (const auto& run : runs) {
    json line{{"benchmark", "wireup_fence_exchange"},
              {"backend", run.backend},
              {"ranks", ranks},
              {"value_bytes", bytes},
              {"rounds", rounds},
              {"peer", "openmpi_mpirun_allgather"},
              {"host_cpus", std::thread::hardware_concurrency()},
              {"host_load_1m", load_1m}};
    if (!mpi.error.empty()) {
      line["peer_error"] = mpi.error;
      ++failures;
    } else {
      line["peer_exchange_ms_median"] = mpi.exchange_ms;
      line["peer_exchange_ms_rounds"] = mpi.rounds_ms;
      line["peer_wall_ms"] = mpi.wall_ms;
    }
    if (!run.measured.error.empty()) {
      line["error"] = run.measured.error;
      if (run.measured.error.rfind("not run", 0) != 0) ++failures;
    } else {
      line["exchange_ms_median"] = run.measured.exchange_ms;
      line["exchange_ms_rounds"] = run.measured.rounds_ms;
      if (!run.measured.get_rounds_ms.empty()) line["get_ms_rounds"] = run.measured.get_rounds_ms;
      if (run.measured.server_cpu_ms >= 0) {
        line["server_cpu_ms"] = run.measured.server_cpu_ms;
        line["server_bytes_out"] = run.measured.server_bytes_out;
        line["server_requests"] = run.measured.server_requests;
      }
      line["wall_ms"] = run.measured.wall_ms;
      if (mpi.error.empty()) {
        line["ratio_exchange"] =
            run.measured.exchange_ms / mpi.exchange_ms;  // < 1: faster than the peer
        line["ratio_wall"] = run.measured.wall_ms / mpi.wall_ms;
      }
    }
    std::printf("%s\n", line.dump().c_str());
  }
  return failures == 0 ? 0 : 1;
}
