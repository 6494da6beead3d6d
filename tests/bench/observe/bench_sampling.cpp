// The agent's sampling of each rank's memory and each node's energy, one round as the attempt's
// supervision loop makes it every 200 ms: the process subtree from /proc, each rank's tree and
// its memory (RSS, or PSS for several processes), NVML's per-process GPU memory and energy
// counters (the fake library of the integration tests, passed as argv[1], which reads a file
// like the real one reads the driver), and RAPL's package counters (a powercap tree in a
// temporary folder). Two ranks of two processes each, as the CPU example with a forked child.
// Prints one JSON object: the cost of a round, and the share of one core it takes at 5 rounds/s
// against that core (the peer), and the parts.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "topolaunch/launcher/energy.hpp"
#include "topolaunch/launcher/memory_watch.hpp"

using namespace topolaunch::launcher;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

pid_t spawn_rank() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    if (::fork() == 0) ::pause();  // the rank's child
    ::pause();
    ::_exit(0);
  }
  ::setpgid(pid, pid);
  return pid;
}

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_sampling FAKE_NVML_LIBRARY [ROUNDS]\n");
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2000;
  char tmpl[] = "/tmp/bench-sampling-XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  for (int p = 0; p < 2; ++p) {
    fs::create_directories(dir / ("intel-rapl:" + std::to_string(p)));
    std::ofstream(dir / ("intel-rapl:" + std::to_string(p)) / "energy_uj") << 1000 * p << "\n";
    std::ofstream(dir / ("intel-rapl:" + std::to_string(p)) / "max_energy_range_uj")
        << 262143328850ULL << "\n";
  }
  std::ofstream(dir / "usage") << "0 1 1048576\n1 2 1048576\n";
  ::setenv("FAKE_NVML_USAGE", (dir / "usage").c_str(), 1);
  ::setenv("FAKE_NVML_DEVICES", "2", 1);
  auto nvml = NvmlMemoryWatch::open(argv[1]);
  if (!nvml) {
    std::fprintf(stderr, "bench_sampling: %s\n", nvml.error().message.c_str());
    return 1;
  }
  RaplEnergy rapl = RaplEnergy::open(dir.string());
  const pid_t ranks[2] = {spawn_rank(), spawn_rank()};
  ::usleep(100000);
  double t_proc = 0, t_tree = 0, t_nvml = 0, t_energy = 0, t_rapl = 0;
  std::uint64_t sink = 0;
  for (int i = 0; i < rounds; ++i) {
    auto t = Clock::now();
    const auto table = read_process_subtree(::getpid());
    t_proc += us_since(t);
    t = Clock::now();
    for (pid_t r : ranks) sink += tree_memory_bytes(process_tree(r, table));
    t_tree += us_since(t);
    t = Clock::now();
    if (auto u = (*nvml)->usage()) sink += u->size();
    t_nvml += us_since(t);
    t = Clock::now();
    for (int d = 0; d < (*nvml)->device_count(); ++d) sink += (*nvml)->energy_mj(d).value_or(0);
    t_energy += us_since(t);
    t = Clock::now();
    rapl.sample();
    t_rapl += us_since(t);
  }
  for (pid_t r : ranks) {
    ::kill(-r, SIGKILL);
    ::waitpid(r, nullptr, 0);
  }
  fs::remove_all(dir);
  const double per_round = (t_proc + t_tree + t_nvml + t_energy + t_rapl) / rounds;
  const double share = per_round * 5 / 1e6;  // 5 rounds per second
  std::printf(
      "{\"bench\":\"agent_sampling_round_us\",\"value\":%.2f,\"unit\":\"us per round\","
      "\"parts_us\":{\"proc_subtree\":%.2f,\"rank_trees_memory\":%.2f,\"nvml_usage\":%.2f,"
      "\"nvml_energy\":%.2f,\"rapl\":%.2f},\"rounds\":%d,\"ranks\":2,\"processes_per_rank\":2,"
      "\"share_of_a_core_at_5_per_s\":%.6f,\"peer\":\"one core-second per second\","
      "\"peer_value\":1,\"ratio\":%.6f,\"checksum\":%llu}\n",
      per_round, t_proc / rounds, t_tree / rounds, t_nvml / rounds, t_energy / rounds,
      t_rapl / rounds, rounds, share, share, static_cast<unsigned long long>(sink % 1000));
  return 0;
}
