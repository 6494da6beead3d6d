// Starting a worker (process.hpp): the child is its own process group, bound to the CPUs it was
// given, with the environment it was given, stdin from /dev/null, its output on the pipes, no
// signal blocked and the agent's ignored SIGPIPE back at its default; a failed
// exec is reported as such. The child shares the agent's memory until its exec, so these are
// the properties that sharing must not change.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "process.hpp"

using namespace topolaunch::launcher;

namespace {

std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  return text;
}

// "Name:\tvalue" of /proc/PID/status as the child printed it.
std::string status_field(const std::string& status, const std::string& name) {
  std::istringstream in(status);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":", 0) == 0) {
      const auto value = line.find_first_not_of(" \t", name.size() + 1);
      return value == std::string::npos ? "" : line.substr(value);
    }
  }
  return "<absent>";
}

}  // namespace

TEST_CASE("spawn_worker: group, CPUs, environment, streams and signals of the child") {
  // The agent's own state that must not reach the worker (exec keeps both): an ignored SIGPIPE
  // and a blocked SIGTERM.
  struct sigaction old_pipe {};
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  REQUIRE(::sigaction(SIGPIPE, &ignore, &old_pipe) == 0);
  sigset_t term, old_mask;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  REQUIRE(::sigprocmask(SIG_BLOCK, &term, &old_mask) == 0);

  cpu_set_t allowed;
  REQUIRE(::sched_getaffinity(0, sizeof(allowed), &allowed) == 0);
  int first_cpu = 0;
  while (!CPU_ISSET(first_cpu, &allowed)) ++first_cpu;

  SpawnRequest request;
  request.program = "/bin/sh";
  // The shell's status is read with builtins, before it starts any command: while it waits for
  // a child, dash blocks every signal itself (and `cat /proc/$$/status` saw that mask).
  request.argv = {"sh", "-c",
                  "while IFS= read -r l; do printf '%s\\n' \"$l\"; done < /proc/$$/status; "
                  "echo \"pgid $(cut -d' ' -f5 /proc/$$/stat)\"; "
                  "echo \"var $SPAWN_TEST_VAR\"; echo \"stdin $(readlink /proc/$$/fd/0)\"; "
                  "echo err >&2"};
  request.env = {{"SPAWN_TEST_VAR", "value with spaces"}, {"PATH", "/usr/bin:/bin"}};
  request.cpus = topolaunch::topology::CpuSet(std::vector<int>{first_cpu});
  auto spawned = spawn_worker(request);

  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  REQUIRE(spawned);
  const std::string out = read_all(spawned->stdout_pipe.get());
  const std::string err = read_all(spawned->stderr_pipe.get());
  int status = 0;
  REQUIRE(::waitpid(spawned->pid, &status, 0) == spawned->pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  CHECK(status_field(out, "Pid") == std::to_string(spawned->pid));
  CHECK(out.find("pgid " + std::to_string(spawned->pid) + "\n") != std::string::npos);
  CHECK(status_field(out, "Cpus_allowed_list") == std::to_string(first_cpu));
  CHECK(status_field(out, "SigBlk") == "0000000000000000");
  const unsigned long ignored = std::stoul(status_field(out, "SigIgn"), nullptr, 16);
  CHECK((ignored & (1UL << (SIGPIPE - 1))) == 0);
  CHECK(out.find("var value with spaces\n") != std::string::npos);
  CHECK(out.find("stdin /dev/null\n") != std::string::npos);
  CHECK(err == "err\n");
}

TEST_CASE("spawn_worker: a program that cannot be executed is an error naming exec") {
  SpawnRequest request;
  request.program = "/nonexistent/topolaunch-test-program";
  request.argv = {"topolaunch-test-program"};
  auto spawned = spawn_worker(request);
  REQUIRE_FALSE(spawned);
  CHECK(spawned.error().message.find("exec failed") != std::string::npos);
  CHECK(spawned.error().message.find("/nonexistent/topolaunch-test-program") != std::string::npos);
}
