// The job report's root cause: its JSON round trip and which agent's first failure is the cause.
#include "catch.hpp"
#include "topolaunch/launcher/report.hpp"

using namespace topolaunch::launcher;

TEST_CASE("root cause: at_unix_s survives the report's JSON round trip") {
  JobReport r;
  r.root_cause = RootCause{0, 5, "n3", "killed by SIGKILL", "", 1764460000.125};
  const auto back = report_from_json(to_json(r));
  REQUIRE(back);
  REQUIRE(back->root_cause);
  CHECK(back->root_cause->rank == 5);
  CHECK(back->root_cause->node == "n3");
  CHECK(back->root_cause->what == "killed by SIGKILL");
  CHECK(back->root_cause->at_unix_s == 1764460000.125);
}

TEST_CASE("root cause: the agents' first failure seen first, not the first node's") {
  // node n1's worker was killed by the step's teardown 0.3 s after rank 5 died on n3
  const std::vector<RootCause> failures{
      {0, 0, "n1", "killed by SIGTERM", "", 1000.4},
      {0, 5, "n3", "killed by SIGKILL", "", 1000.1},
      {0, 6, "n4", "killed by SIGTERM", "", 1000.5},
  };
  CHECK(earliest_root_cause(failures) == 1);
}

TEST_CASE("root cause: unknown times lose to known ones; ties keep the node order") {
  CHECK(earliest_root_cause({{0, 0, "n1", "a", "", 0}, {0, 1, "n2", "b", "", 5.0}}) == 1);
  CHECK(earliest_root_cause({{0, 0, "n1", "a", "", 0}, {0, 1, "n2", "b", "", 0}}) == 0);
  CHECK(earliest_root_cause({{0, 0, "n1", "a", "", 7.0}, {0, 1, "n2", "b", "", 7.0}}) == 0);
  CHECK(earliest_root_cause({{0, 3, "n1", "a", "", 2.0}}) == 0);
}

TEST_CASE("a failed rank's error file: in the rank, the root cause and the summary's last lines") {
  JobReport r;
  r.run_id = "ddp-1";
  r.status = "failed";
  r.root_cause = RootCause{0, 1, "vm", "exited 1: RuntimeError: boom", "", 1000.0};
  AttemptReport a;
  a.outcome = "failed";
  RankOutcome rank0, rank1;
  rank0.rank = 0;
  rank1.rank = 1;
  rank1.exit_code = 1;
  rank1.error = "RuntimeError: boom";
  std::string traceback = "Traceback (most recent call last):\n";
  for (int i = 0; i < 20; ++i) traceback += "  File \"train.py\", line " + std::to_string(i) + "\n";
  traceback += "RuntimeError: boom\n";
  rank1.traceback = traceback;
  a.ranks = {rank0, rank1};
  r.attempts.push_back(a);
  const std::string json = to_json(r);
  CHECK(json.find("\"error\": \"RuntimeError: boom\"") != std::string::npos);
  const auto back = report_from_json(json);
  REQUIRE(back);
  REQUIRE(root_cause_rank(*back) != nullptr);
  CHECK(root_cause_rank(*back)->traceback == traceback);
  const std::string summary = summarize(r);
  CHECK(summary.find("    RuntimeError: boom\n") != std::string::npos);
  CHECK(summary.find("line 19") != std::string::npos);
  CHECK(summary.find("line 5\n") == std::string::npos);  // the last 12 lines only
  CHECK(summary.find("lines more in report.json") != std::string::npos);
  r.root_cause->rank = 0;  // a rank without an error file: no traceback
  CHECK(summarize(r).find("Traceback") == std::string::npos);
}
