// The worker contract: a worker's place from its environment (strict, ours before torchrun's),
// the heartbeat file's format, and the table of names being complete and unambiguous.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"

using namespace topolaunch;
using namespace topolaunch::jobspec;

namespace {

std::string refusal(const Environment& env) {
  auto place = worker_place(env);
  if (place.ok()) return "(accepted)";
  CHECK(place.error().exit_code == exit_status::kBadInput);
  return place.error().message;
}

}  // namespace

TEST_CASE("worker place: nothing set is one process alone") {
  auto place = worker_place({});
  REQUIRE(place.ok());
  CHECK(place->rank == 0);
  CHECK(place->world_size == 1);
  CHECK(place->local_rank == 0);
}

TEST_CASE("worker place: torchrun's names, and ours where the launcher set them") {
  auto torchrun = worker_place({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}});
  REQUIRE(torchrun.ok());
  CHECK(torchrun->rank == 3);
  CHECK(torchrun->world_size == 4);
  CHECK(torchrun->local_rank == 1);
  auto ours = worker_place({{"RANK", "0"},
                            {"WORLD_SIZE", "1"},
                            {"TOPOLAUNCH_RANK", "5"},
                            {"TOPOLAUNCH_WORLD_SIZE", "8"},
                            {"TOPOLAUNCH_LOCAL_RANK", "1"}});
  REQUIRE(ours.ok());
  CHECK(ours->rank == 5);
  CHECK(ours->world_size == 8);
  CHECK(ours->local_rank == 1);
}

TEST_CASE("worker place: a malformed variable is refused naming it and its value, exit 2") {
  CHECK(refusal({{"LOCAL_RANK", "1x"}}) == "LOCAL_RANK=1x: not an integer");
  CHECK(refusal({{"WORLD_SIZE", "two"}}) == "WORLD_SIZE=two: not an integer");
  CHECK(refusal({{"WORLD_SIZE", "0"}}) == "WORLD_SIZE=0: out of range (at least 1)");
  CHECK(refusal({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}) == "RANK=-1: out of range (at least 0)");
  // Ours set does not hide a broken torchrun name: both are checked.
  CHECK(refusal({{"RANK", "1 "}, {"TOPOLAUNCH_RANK", "1"}, {"TOPOLAUNCH_WORLD_SIZE", "2"}}) ==
        "RANK=1 : not an integer");
  CHECK(refusal({{"TOPOLAUNCH_LOCAL_RANK", "a"}}) == "TOPOLAUNCH_LOCAL_RANK=a: not an integer");
}

TEST_CASE("worker place: the rank must be below the world size") {
  CHECK(refusal({{"RANK", "4"}, {"WORLD_SIZE", "4"}}) ==
        "RANK=4: not below WORLD_SIZE=4 (set both, or start the worker with topolaunch run)");
  CHECK(refusal({{"TOPOLAUNCH_RANK", "2"}, {"TOPOLAUNCH_WORLD_SIZE", "2"}})
            .find("TOPOLAUNCH_RANK=2: not below TOPOLAUNCH_WORLD_SIZE=2") == 0);
  CHECK(refusal({{"RANK", "1"}}).find("RANK=1: not below WORLD_SIZE=1") == 0);
}

TEST_CASE("heartbeat: the counter as decimal text and a newline, overwritten in place") {
  char path[] = "/tmp/tl-heartbeat-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  auto content = [&] {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  {
    HeartbeatWriter heartbeat{std::string(path)};
    REQUIRE(heartbeat.active());
    heartbeat.beat(0);
    CHECK(content() == "0\n");
    heartbeat.beat(9);
    CHECK(content() == "9\n");
    heartbeat.beat(1234567890123ull);
    CHECK(content() == "1234567890123\n");
  }
  ::setenv(env::kHeartbeatFile, path, 1);
  {
    HeartbeatWriter from_env;
    CHECK(from_env.active());
    from_env.beat(18446744073709551615ull);
    CHECK(content() == "18446744073709551615\n");
  }
  ::unsetenv(env::kHeartbeatFile);
  HeartbeatWriter none;
  CHECK_FALSE(none.active());
  none.beat(3);  // a no-op, not a crash
  CHECK(content() == "18446744073709551615\n");
  std::remove(path);
}

TEST_CASE("heartbeat: the first beat makes the file the agent named") {
  char dir[] = "/tmp/tl-heartbeat-dir-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/rank-0";
  {
    HeartbeatWriter heartbeat{path};
    REQUIRE(heartbeat.active());
    heartbeat.beat(7);
  }
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  CHECK(text == "7");
  std::remove(path.c_str());
  ::rmdir(dir);
}

TEST_CASE("contract: every name once, with who sets it; exit statuses as documented") {
  std::set<std::string> names;
  for (const auto& v : kWorkerVariables) {
    INFO(v.name);
    CHECK(names.insert(v.name).second);
    CHECK(v.set_by != 0);
    CHECK(std::string(v.meaning).size() > 3);
  }
  CHECK(names.contains("TOPOLAUNCH_HEARTBEAT_FILE"));
  CHECK(names.contains("LOCAL_RANK"));
  CHECK(exit_status::kRequeue == 75);
  CHECK(exit_status::kTerminated == 128 + 15);
  CHECK(exit_status::kBadInput == 2);
  CHECK(exit_status::kJobRequeue == 3);
  // A worker whose peer died must not say "requeue": its status differs from every
  // status of topolaunch run (0 1 2 3, 128 + N) and from the worker's own others.
  for (int taken : {0, 1, 2, 3, 75, 143}) CHECK(exit_status::kPeerFailed != taken);
  CHECK(exit_status::kPeerFailed < exit_status::kJobSignalled);
}
