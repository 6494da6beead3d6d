// run_isolated: a parser's crash, hang or runaway allocation in the child is one error line in
// the parent, and what the probe returns comes back unchanged.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "catch.hpp"
#include "topolaunch/common/isolated.hpp"

using namespace topolaunch;
using namespace std::chrono_literals;

TEST_CASE("run_isolated: a probe that succeeds is ok") {
  const Status s = run_isolated([] { return ok_status(); }, {}, "job.toml");
  CHECK(s.ok());
}

TEST_CASE("run_isolated: the probe's own error comes back with its exit code") {
  const Status s =
      run_isolated([] { return Status(make_error("job.toml:3:1: bad key", 2)); }, {}, "job.toml");
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message == "job.toml:3:1: bad key");
  CHECK(s.error().exit_code == 2);
}

TEST_CASE("run_isolated: a probe that aborts is refused as a crash, and the caller lives") {
  const Status s = run_isolated([]() -> Status { std::abort(); }, {}, "x.toml");
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message == "x.toml: the parser crashed on this input (SIGABRT); it is refused");
  CHECK(s.error().exit_code == 2);
}

TEST_CASE("run_isolated: a probe that hangs is killed at the wall-clock limit") {
  IsolationLimits limits;
  limits.wall = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = run_isolated(
      []() -> Status {
        for (;;) ::pause();
      },
      limits, "x.toml");
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message.find("took longer than 300 ms") != std::string::npos);
  CHECK(took < 5s);
}

#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("run_isolated: a probe that allocates without bound hits its memory limit") {
  IsolationLimits limits;
  limits.extra_memory_bytes = 64ull << 20;
  const Status s = run_isolated(
      []() -> Status {
        std::vector<std::vector<char>> hoard;
        for (;;) hoard.emplace_back(16 << 20, 'x');
      },
      limits, "x.toml");
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message == "the parser ran out of its memory limit");
}
#endif

TEST_CASE("run_isolated: an identity switch is skipped when there is nothing to drop") {
  if (::getuid() == 0 || ::geteuid() == 0) {
    // As root the child really switches: it must then be unable to regain root.
    IsolationLimits limits;
    limits.uid = 65534;
    limits.gid = 65534;
    const Status s = run_isolated(
        []() -> Status {
          if (::getuid() != 65534 || ::geteuid() != 65534) return make_error("still privileged");
          if (::setuid(0) == 0) return make_error("regained root");
          return ok_status();
        },
        limits, "x.toml");
    CHECK(s.ok());
  } else {
    IsolationLimits limits;
    limits.uid = ::getuid();
    const Status s = run_isolated([] { return ok_status(); }, limits, "x.toml");
    CHECK(s.ok());
  }
}

TEST_CASE("run_isolated_output: the child's result comes back whole, past one pipe buffer") {
  const std::string big(200'000, 'x');  // larger than a pipe's 64 KiB: the parent reads as it comes
  const auto out = run_isolated_output([&]() -> Result<std::string> { return big + "end"; }, {},
                                       "node.xml", 1 << 20);
  REQUIRE(out);
  CHECK(*out == big + "end");
}

TEST_CASE("run_isolated_output: the parser's error comes back, not a result") {
  const auto out = run_isolated_output(
      []() -> Result<std::string> { return make_error("node.xml: not hwloc xml", 2); }, {},
      "node.xml", 1 << 20);
  REQUIRE_FALSE(out);
  CHECK(out.error().message == "node.xml: not hwloc xml");
  CHECK(out.error().exit_code == 2);
}

TEST_CASE("run_isolated_output: a result larger than its limit is refused, and the child stopped") {
  const auto out = run_isolated_output(
      []() -> Result<std::string> { return std::string(1 << 20, 'x'); }, {}, "node.xml", 4096);
  REQUIRE_FALSE(out);
  CHECK(out.error().message ==
        "node.xml: the parser's result is larger than 4096 bytes; it is "
        "refused");
}

TEST_CASE("run_isolated_output: a parser that crashes is refused as a crash") {
  const auto out =
      run_isolated_output([]() -> Result<std::string> { std::abort(); }, {}, "node.xml", 1 << 20);
  REQUIRE_FALSE(out);
  CHECK(out.error().message.find("crashed on this input (SIGABRT)") != std::string::npos);
}
