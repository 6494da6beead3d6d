// topodiag vs `lstopo-no-graphics --of xml` on the same input, in the same run: wall time of the
// whole process (load + analyse + print), median of N interleaved runs. One JSON object per
// measurement on stdout (wall and CPU time); the goal is ratio <= 1 (not slower than lstopo),
// never a pass/fail.
//
//   bench_topodiag TOPODIAG DGX_H100_XML [REPEATS]
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Timing {
  double wall_ms = -1;  // < 0: the program could not start or failed
  double cpu_ms = -1;   // user + system of the child: robust on a loaded build host
};

// Runs argv with stdout and stderr to /dev/null. Accepted exit statuses: 0 and 3 (topodiag
// warnings only).
Timing run_ms(const std::vector<std::string>& args) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> storage = args;
  std::vector<char*> argv;
  for (std::string& a : storage) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    std::fprintf(stderr, "bench_topodiag: cannot start %s: %s\n", argv[0], std::strerror(rc));
    return {};
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  const auto stop = std::chrono::steady_clock::now();
  if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3)) {
    std::fprintf(stderr, "bench_topodiag: %s failed (status %d)\n", argv[0], status);
    return {};
  }
  auto ms = [](const timeval& tv) { return tv.tv_sec * 1e3 + tv.tv_usec / 1e3; };
  return {std::chrono::duration<double, std::milli>(stop - start).count(),
          ms(usage.ru_utime) + ms(usage.ru_stime)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

bool measure(const std::string& name, const std::string& input_label,
             const std::vector<std::string>& ours, const std::vector<std::string>& peer,
             int repeats) {
  // One warm-up each (page cache, dynamic loader), then interleaved runs so drift hits both.
  if (run_ms(ours).wall_ms < 0 || run_ms(peer).wall_ms < 0) {
    return false;
  }
  std::vector<double> ours_ms, peer_ms, ours_cpu, peer_cpu;
  for (int i = 0; i < repeats; ++i) {
    const Timing a = run_ms(ours);
    const Timing b = run_ms(peer);
    if (a.wall_ms < 0 || b.wall_ms < 0) {
      return false;
    }
    ours_ms.push_back(a.wall_ms);
    peer_ms.push_back(b.wall_ms);
    ours_cpu.push_back(a.cpu_ms);
    peer_cpu.push_back(b.cpu_ms);
  }
  auto join = [](const std::vector<std::string>& args) {
    std::string s;
    for (std::size_t i = 0; i < args.size(); ++i) {
      s += (i ? " " : "") + (i == 0 ? args[i].substr(args[i].rfind('/') + 1) : args[i]);
    }
    return s;
  };
  const double o = median(ours_ms);
  const double p = median(peer_ms);
  const double oc = median(ours_cpu);
  const double pc = median(peer_cpu);
  nlohmann::ordered_json j{{"benchmark", name},
                           {"input", input_label},
                           {"repeats", repeats},
                           {"statistic", "median wall ms per process"},
                           {"ours", join(ours)},
                           {"ours_ms", o},
                           {"peer", join(peer)},
                           {"peer_ms", p},
                           {"ratio", p > 0 ? o / p : 0.0},
                           {"ours_cpu_ms", oc},
                           {"peer_cpu_ms", pc},
                           {"cpu_ratio", pc > 0 ? oc / pc : 0.0}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_topodiag TOPODIAG DGX_H100_XML [REPEATS]\n");
    return 2;
  }
  const std::string topodiag = argv[1];
  const std::string fixture = argv[2];
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 21;
  const std::string lstopo = "lstopo-no-graphics";
  bool ok = true;
  ok &= measure("topodiag_json_dgx_h100", "dgx-h100.full.xml",
                {topodiag, "--input", fixture, "--json"},
                {lstopo, "--input", fixture, "--of", "xml", "-"}, repeats);
  ok &= measure("topodiag_report_dgx_h100", "dgx-h100.full.xml", {topodiag, "--input", fixture},
                {lstopo, "--input", fixture, "--of", "xml", "-"}, repeats);
  ok &= measure("topodiag_json_live", "live host", {topodiag, "--json"},
                {lstopo, "--of", "xml", "-"}, repeats);
  return ok ? 0 : 1;
}
