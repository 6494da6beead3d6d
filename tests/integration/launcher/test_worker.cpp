// The launcher's test worker. Prints its environment and binding, talks to the other ranks
// through the wireup store, beats its heartbeat, and misbehaves on request:
//   --exchange            put "greeting/<rank>", fence, read every other rank's greeting
//   --sleep S             run for S seconds (beating every 50 ms)
//   --fail-rank R         rank R exits with --exit-code (default 3) after --fail-after seconds
//   --hang-rank R         rank R stops beating after two beats (and keeps sleeping)
//   --alloc-rank R        rank R allocates and touches --alloc-mib MiB
//   --child-alloc-mib M   rank --alloc-rank forks a child that leaves the process group and
//                         allocates M MiB (the agent must count the rank's whole tree)
//   --fork-child          every rank leaves a sleeping child in its process group
//   --fail-attempt A      only misbehave in attempt A (TOPOLAUNCH_ATTEMPT; default: every attempt)
// SIGUSR1: writes <checkpoint dir>/rank-<r>.ckpt, prints "checkpointed", exits 0.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace {

volatile sig_atomic_t g_usr1 = 0;
void on_usr1(int) { g_usr1 = 1; }

std::string env_or(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  bool exchange = false, fork_child = false;
  double sleep_s = 0, fail_after_s = 0.5;
  int fail_rank = -1, hang_rank = -1, alloc_rank = -1, exit_code = 3, alloc_mib = 0;
  int fail_attempt = -1, child_alloc_mib = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--exchange")
      exchange = true;
    else if (a == "--fork-child")
      fork_child = true;
    else if (a == "--sleep")
      sleep_s = std::stod(next());
    else if (a == "--fail-rank")
      fail_rank = std::stoi(next());
    else if (a == "--fail-after")
      fail_after_s = std::stod(next());
    else if (a == "--exit-code")
      exit_code = std::stoi(next());
    else if (a == "--hang-rank")
      hang_rank = std::stoi(next());
    else if (a == "--alloc-rank")
      alloc_rank = std::stoi(next());
    else if (a == "--alloc-mib")
      alloc_mib = std::stoi(next());
    else if (a == "--child-alloc-mib")
      child_alloc_mib = std::stoi(next());
    else if (a == "--fail-attempt")
      fail_attempt = std::stoi(next());
    else {
      std::fprintf(stderr, "test_worker: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::signal(SIGUSR1, on_usr1);
  const auto rank_r = topolaunch::env_int("RANK", -1);
  const auto attempt_r = topolaunch::env_int("TOPOLAUNCH_ATTEMPT", 0);
  for (const auto* r : {&rank_r, &attempt_r}) {
    if (!*r) {
      std::fprintf(stderr, "test_worker: %s\n", r->error().message.c_str());
      return 2;
    }
  }
  const int rank = *rank_r, attempt = *attempt_r;
  const bool misbehave = fail_attempt < 0 || fail_attempt == attempt;

  for (const char* name : {"RANK",
                           "LOCAL_RANK",
                           "WORLD_SIZE",
                           "LOCAL_WORLD_SIZE",
                           "GROUP_RANK",
                           "GROUP_WORLD_SIZE",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_MAX_RESTARTS",
                           "TORCHELASTIC_RUN_ID",
                           "OMP_NUM_THREADS",
                           "TOPOLAUNCH_RANK",
                           "TOPOLAUNCH_WORLD_SIZE",
                           "TOPOLAUNCH_STORE_ADDR",
                           "TOPOLAUNCH_RANKMAP_FILE",
                           "TOPOLAUNCH_CONFIG",
                           "TOPOLAUNCH_JOB_DIR",
                           "TOPOLAUNCH_CHECKPOINT_DIR",
                           "TOPOLAUNCH_HEARTBEAT_FILE",
                           "TOPOLAUNCH_ATTEMPT",
                           "TOPOLAUNCH_CPUS",
                           "TOPOLAUNCH_MEMORY_BUDGET_BYTES",
                           "TEST_WORKER_GREETING",
                           "PMI_RANK",
                           "PMIX_RANK"}) {
    std::printf("env %s=%s\n", name, env_or(name, "<unset>").c_str());
  }
  std::printf("env TOPOLAUNCH_STORE_SECRET=%s\n",
              env_or("TOPOLAUNCH_STORE_SECRET").size() >= 32 ? "<set>" : "<missing>");
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  std::string cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
  }
  std::printf("affinity %s\n", cpus.c_str());
  std::printf("pid %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);

  if (exchange) {
    auto store = topolaunch::wireup::connect_from_env(topolaunch::current_environment());
    if (!store) {
      std::fprintf(stderr, "test_worker: store: %s\n", store.error().message.c_str());
      return 4;
    }
    auto& kv = **store;
    std::string mine = "greeting from rank " + std::to_string(rank);
    (void)kv.put(topolaunch::wireup::rank_key("greeting", rank), mine);
    if (auto s = kv.fence(std::chrono::seconds(30)); !s) {
      std::fprintf(stderr, "test_worker: fence: %s\n", s.error().message.c_str());
      return 4;
    }
    int seen = 0;
    for (int r = 0; r < kv.size(); ++r) {
      auto v = kv.get_string(topolaunch::wireup::rank_key("greeting", r), std::chrono::seconds(10));
      if (v && *v == "greeting from rank " + std::to_string(r)) ++seen;
    }
    std::printf("exchange %d/%d\n", seen, kv.size());
    std::fflush(stdout);
  }

  if (fork_child && ::fork() == 0) {
    // A grandchild that would outlive a careless launcher.
    for (;;) ::pause();
  }
  if (misbehave && alloc_rank == rank && child_alloc_mib > 0) {
    pid_t child = ::fork();
    if (child == 0) {
      ::setpgid(0, 0);  // out of the worker's group: only the parent/child links lead here
      std::vector<char> block(static_cast<std::size_t>(child_alloc_mib) << 20);
      for (std::size_t i = 0; i < block.size(); i += 4096) block[i] = 1;
      for (;;) ::pause();
    }
    std::printf("child %d allocates %d MiB\n", static_cast<int>(child), child_alloc_mib);
    std::fflush(stdout);
  }
  if (misbehave && alloc_rank == rank && alloc_mib > 0) {
    std::vector<char> block(static_cast<std::size_t>(alloc_mib) << 20);
    for (std::size_t i = 0; i < block.size(); i += 4096) block[i] = 1;
    std::printf("allocated %d MiB\n", alloc_mib);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(30));
  }

  topolaunch::jobspec::HeartbeatWriter heartbeat;
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t step = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         sleep_s) {
    if (g_usr1) {
      std::ofstream(env_or("TOPOLAUNCH_CHECKPOINT_DIR") + "/rank-" + std::to_string(rank) + ".ckpt")
          << step << "\n";
      std::printf("checkpointed at step %llu\n", static_cast<unsigned long long>(step));
      return 0;
    }
    double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (misbehave && rank == fail_rank && elapsed >= fail_after_s) {
      std::fprintf(stderr, "rank %d failing on purpose with %d\n", rank, exit_code);
      return exit_code;
    }
    // A hung rank beats twice, then stops: a program that never beat is never declared hung.
    ++step;
    if (!(misbehave && rank == hang_rank && step > 2)) heartbeat.beat(step);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (g_usr1) {
    std::printf("checkpointed at step %llu\n", static_cast<unsigned long long>(step));
    return 0;
  }
  std::printf("done after %llu steps\n", static_cast<unsigned long long>(step));
  return 0;
}
