// The ranks' step timelines merged into one job trace: clocks aligned from the clock-sync points
// (another node's clock moved by its median offset, rank 0's node left alone), the skew stated.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "trace_merge.hpp"

using namespace topolaunch::launcher;
namespace fs = std::filesystem;

TEST_CASE("clocks: another node's offset is its median difference; rank 0's node is not moved") {
  // rank 1 shares rank 0's clock (node a), ranks 2 and 3 (node b) run 5000 us ahead; one point of
  // rank 3 was read late (descheduled after the collective)
  std::vector<SyncPoints> ranks{{0, "a", {{1, 100}, {2, 200}, {3, 300}}},
                                {1, "a", {{1, 101}, {2, 203}, {3, 300}}},
                                {2, "b", {{1, 5100}, {2, 5201}, {3, 5299}}},
                                {3, "b", {{1, 5101}, {2, 5200}, {3, 9000}}}};
  const auto c = align_clocks(ranks);
  REQUIRE(c.size() == 4);
  CHECK(c[0].offset_us == 0);
  CHECK(c[1].offset_us == 0);
  CHECK(c[1].residual_us == 1);  // median of 1, 3, 0
  CHECK(c[1].worst_us == 3);
  CHECK(c[2].offset_us == 5000.5);  // median over both of node b's ranks
  CHECK(c[3].offset_us == 5000.5);
  CHECK(c[3].worst_us == Approx(3699.5));
  CHECK(c[3].residual_us == Approx(0.5));
  CHECK(c[3].points == 3);
}

TEST_CASE("merge: one process per rank, times on rank 0's clock from zero, the skew in the line") {
  char tmpl[] = "/tmp/topolaunch-trace-XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  fs::create_directories(dir / "attempt-0" / "trace");
  for (int rank = 0; rank < 2; ++rank) {
    const double shift = rank == 1 ? 1000.0 : 0.0;  // another node, 1 ms ahead
    nlohmann::json t;
    t["traceEvents"] = {{{"ph", "M"},
                         {"pid", rank},
                         {"tid", 0},
                         {"name", "process_name"},
                         {"args", {{"name", "rank " + std::to_string(rank)}}}},
                        {{"ph", "X"},
                         {"pid", rank},
                         {"tid", 1},
                         {"ts", 5000.0 + shift},
                         {"dur", 10.0},
                         {"name", "h0.attention"},
                         {"cat", "forward"},
                         {"args", {{"step", 3}, {"op", 7}}}}};
    t["otherData"] = {{"rank", rank},
                      {"node", rank == 0 ? "a" : "b"},
                      {"steps", {3}},
                      {"sync_points",
                       {{{"step", 3}, {"index", 0}, {"t_us", 6000.0 + shift}},
                        {{"step", 3}, {"index", 1}, {"t_us", 6010.0 + shift + (rank ? 2 : 0)}}}}};
    std::ofstream(dir / "attempt-0" / "trace" / ("rank-" + std::to_string(rank) + ".json"))
        << t.dump();
  }
  auto merged = merge_traces(dir / "attempt-0", dir / "trace.json");
  REQUIRE(merged.ok());
  REQUIRE(*merged);
  CHECK((*merged)->ranks == std::vector<int>{0, 1});
  CHECK((*merged)->spans == 2);
  CHECK((*merged)->clocks[1].offset_us == 1001);
  std::ifstream in(dir / "trace.json");
  const auto j = nlohmann::json::parse(in);
  std::vector<double> ts;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") ts.push_back(e["ts"].get<double>());
  REQUIRE(ts.size() == 2);
  CHECK(ts[0] == 1);  // rank 1's span lands 1 us before rank 0's, from zero
  CHECK(ts[1] == 0);
  CHECK(j["otherData"]["clock_alignment"]["ranks"][1]["offset_us"] == 1001.0);
  CHECK((*merged)->line.find("2 rank(s), step(s) 3, 2 spans; clock skew 1.0 us") !=
        std::string::npos);
  CHECK((*merged)->line.find("rank 1 moved -1001 us") != std::string::npos);
  std::ofstream(dir / "attempt-0" / "trace" / "rank-2.json") << "{\"truncated";
  auto bad = merge_traces(dir / "attempt-0", dir / "trace.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("rank-2.json: not a step trace of topolaunch-worker") !=
        std::string::npos);
  CHECK_FALSE(*merge_traces(dir / "attempt-9", dir / "none.json"));
  fs::remove_all(dir);
}
