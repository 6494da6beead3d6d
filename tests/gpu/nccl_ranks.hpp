// Starts the ranks of a GPU test the way `topolaunch run` starts workers: our TCP store (wireup)
// in this process, then one process per rank (this same executable, re-executed) with the
// environment the launcher gives workers (TOPOLAUNCH_STORE_ADDR/SECRET, RANK, WORLD_SIZE,
// LOCAL_RANK, RUN_ID, ATTEMPT; see launcher/src/worker_env.cpp). Each rank's output goes to a log
// file; wait_ranks() enforces a wall-clock deadline and kills what is still running past it, so
// a test never hangs. Header-only, shared by tests/gpu/test_nccl.cpp and
// tests/bench/kernels/allreduce_bench.cpp.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "topolaunch/wireup/tcp_store.hpp"

extern char** environ;  // NOLINT: POSIX

namespace topolaunch::testing {

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  std::string log_path;
  int exit_code = -1;      // valid when finished
  int signal = 0;          // killed by this signal
  bool timed_out = false;  // still running at the deadline (then killed)
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::string random_secret() {
  std::random_device rd;
  std::string secret;
  for (int i = 0; i < 32; ++i) secret += "0123456789abcdef"[rd() % 16];
  return secret;
}

// The store of one test job: world_size ranks fence on it.
inline std::unique_ptr<wireup::TcpStoreServer> start_store(int world_size,
                                                           const std::string& secret) {
  wireup::TcpStoreServerOptions options;
  options.secret = secret;
  options.world_size = world_size;
  options.log = [](std::string_view line) {
    std::fprintf(stderr, "store: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  auto server = wireup::TcpStoreServer::start(std::move(options));
  if (!server) {
    std::fprintf(stderr, "FATAL cannot start the tcp store: %s\n", server.error().message.c_str());
    std::exit(100);
  }
  return std::move(*server);
}

// Starts `self args...` as rank `rank` of `world_size` with the launcher's worker environment
// plus `extra_env`. Output (stdout and stderr) goes to log_path.
inline RankProcess spawn_rank(const std::string& self, const std::vector<std::string>& args,
                              int rank, int world_size, const std::string& store_address,
                              const std::string& secret, const std::string& run_id,
                              const std::map<std::string, std::string>& extra_env,
                              const std::string& log_path) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  env["TOPOLAUNCH_WIREUP"] = "tcp";
  env["TOPOLAUNCH_STORE_ADDR"] = store_address;
  env["TOPOLAUNCH_STORE_SECRET"] = secret;
  env["TOPOLAUNCH_RANK"] = env["RANK"] = std::to_string(rank);
  env["TOPOLAUNCH_WORLD_SIZE"] = env["WORLD_SIZE"] = std::to_string(world_size);
  env["TOPOLAUNCH_LOCAL_RANK"] = env["LOCAL_RANK"] = std::to_string(rank);
  env["TOPOLAUNCH_RUN_ID"] = run_id;
  env["TOPOLAUNCH_ATTEMPT"] = "0";
  for (const auto& [k, v] : extra_env) env[k] = v;
  // Everything execve needs is built before fork (the store's thread runs in this process).
  std::vector<std::string> env_strings, arg_strings{self};
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  arg_strings.insert(arg_strings.end(), args.begin(), args.end());
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  for (auto& s : arg_strings) argv.push_back(s.data());
  envp.push_back(nullptr);
  argv.push_back(nullptr);
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr) {
    std::fprintf(stderr, "FATAL cannot write %s: %s\n", log_path.c_str(), std::strerror(errno));
    std::exit(100);
  }
  const int log_fd = fileno(log);
  RankProcess p;
  p.rank = rank;
  p.log_path = log_path;
  p.pid = ::fork();
  if (p.pid == 0) {
    ::setpgid(0, 0);  // its own group: a kill at the deadline takes its helpers too
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    std::fprintf(stderr, "execve %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  std::fclose(log);
  if (p.pid < 0) {
    std::fprintf(stderr, "FATAL fork: %s\n", std::strerror(errno));
    std::exit(100);
  }
  return p;
}

// Waits for every rank until `deadline`; those still running then are killed (SIGKILL to the
// group) and marked timed_out. Returns when all are reaped.
inline void wait_ranks(std::vector<RankProcess>& ranks,
                       std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    bool running = false;
    for (auto& p : ranks) {
      if (p.pid <= 0) continue;
      int status = 0;
      pid_t r = ::waitpid(p.pid, &status, WNOHANG);
      if (r == p.pid) {
        if (WIFEXITED(status)) p.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) p.signal = WTERMSIG(status);
        p.pid = 0;
      } else {
        running = true;
      }
    }
    if (!running) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (auto& p : ranks) {
        if (p.pid <= 0) continue;
        p.timed_out = true;
        ::kill(-p.pid, SIGKILL);
        ::kill(p.pid, SIGKILL);
        int status = 0;
        ::waitpid(p.pid, &status, 0);
        p.pid = 0;
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Kills (SIGKILL, whole group) one rank that is expected to be still running, and reaps it.
inline void kill_rank(RankProcess& p) {
  if (p.pid <= 0) return;
  ::kill(-p.pid, SIGKILL);
  ::kill(p.pid, SIGKILL);
  int status = 0;
  ::waitpid(p.pid, &status, 0);
  p.pid = 0;
  p.signal = SIGKILL;
}

inline std::string self_path() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) {
    std::fprintf(stderr, "FATAL readlink /proc/self/exe: %s\n", std::strerror(errno));
    std::exit(100);
  }
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace topolaunch::testing
