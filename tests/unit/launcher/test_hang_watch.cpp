// Which rank a hang is blamed on (launcher/src/hang_watch.hpp), and what /proc says of a rank.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "catch.hpp"
#include "hang_watch.hpp"

using namespace topolaunch::launcher;

namespace {

RankProgress rank(int r, std::optional<std::uint64_t> counter, double silent_s,
                  bool stopped = false, double stopped_for_s = 0) {
  RankProgress p;
  p.rank = r;
  p.armed = counter.has_value();
  p.counter = counter;
  p.silent_s = silent_s;
  p.stopped = stopped;
  p.stopped_for_s = stopped_for_s;
  return p;
}

}  // namespace

TEST_CASE("a SIGSTOPped rank 1 is named, not rank 0 waiting for it in the all-reduce") {
  // As found under a SIGSTOP: both stopped beating at counter 117; rank 0's watch fired first.
  const HangVerdict v =
      attribute_hang({rank(0, 117, 5.1), rank(1, 117, 5.0, true, 5.0)}, 0, 2.5, "no heartbeat");
  CHECK(v.rank == 1);
  CHECK(v.why ==
        "stopped (state T: SIGSTOP, SIGTSTP or a debugger) for 5.0s, no heartbeat for 5.0s, last "
        "counter 117; rank 0 waited for it");
  CHECK(v.waiting == std::vector<int>{0});
  CHECK(v.tied.empty());
}

TEST_CASE("the lowest counter is the rank the others wait for") {
  const HangVerdict v =
      attribute_hang({rank(0, 40, 6.0), rank(1, 39, 5.2), rank(2, 40, 6.1), rank(3, 40, 5.9)}, 2,
                     2.5, "no heartbeat");
  CHECK(v.rank == 1);
  CHECK(v.why == "lowest heartbeat counter 39, no heartbeat for 5.2s; ranks 0, 2, 3 waited for it");
}

TEST_CASE("ranks still beating are not candidates; one silent rank alone is named") {
  const HangVerdict v = attribute_hang({rank(0, 900, 0.1), rank(1, 12, 3.0), rank(2, 880, 0.05)}, 1,
                                       1.5, "no heartbeat");
  CHECK(v.rank == 1);
  CHECK(v.waiting.empty());
  CHECK(v.why == "last heartbeat counter 12, no heartbeat for 3.0s");
}

TEST_CASE("without counters the first rank to fall silent is named") {
  const HangVerdict v = attribute_hang({rank(0, std::nullopt, 10.2), rank(1, std::nullopt, 11.0)},
                                       0, 5.0, "no CPU time, output or heartbeat");
  CHECK(v.rank == 1);
  CHECK(v.why.starts_with("no CPU time, output or heartbeat for 11.0s"));
  CHECK(v.waiting == std::vector<int>{0});
}

TEST_CASE("ranks that fell silent at the same moment and counter are said to be tied") {
  const HangVerdict v = attribute_hang({rank(0, 7, 5.05), rank(1, 7, 5.0)}, 1, 2.5, "no heartbeat");
  CHECK(v.rank == 0);
  CHECK(v.tied == std::vector<int>{1});
  CHECK(v.why.find("cannot be told") != std::string::npos);
}

TEST_CASE("heartbeat counters: decimal text with a newline, anything else is no counter") {
  CHECK(parse_counter("117\n") == std::optional<std::uint64_t>(117));
  CHECK(parse_counter(" 0 ") == std::optional<std::uint64_t>(0));
  CHECK(parse_counter("18446744073709551615") ==
        std::optional<std::uint64_t>(18446744073709551615ull));
  CHECK_FALSE(parse_counter(""));
  CHECK_FALSE(parse_counter("step 3"));
  CHECK_FALSE(parse_counter("-1"));
}

TEST_CASE("activity from /proc: CPU ticks of the tree and the worker's state") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("hang-watch-proc-" + std::to_string(getpid()));
  fs::create_directories(root / "10");
  fs::create_directories(root / "11");
  // comm with a space and a parenthesis: fields are counted from the last ')'
  std::ofstream(root / "10" / "stat")
      << "10 (py thon) T 1 10 10 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 100 0 0\n";
  std::ofstream(root / "11" / "stat")
      << "11 (data)loader) S 10 10 10 0 -1 4194304 100 0 0 0 7 3 0 0 20 0 1 0 100 0 0\n";
  const RankActivity a = read_activity(10, {10, 11, 12}, root.string());
  CHECK(a.cpu_ticks == 250 + 50 + 7 + 3);
  CHECK(a.state == 'T');
  CHECK(read_activity(12, {12}, root.string()).state == '?');
  fs::remove_all(root);
}
