// A Slurm step's report: what `run` makes of its agents' reports (attempt-N/node-<i>.json), and
// the exit status each outcome stands for.
#include <csignal>

#include "catch.hpp"
#include "report_merge.hpp"

using namespace topolaunch::launcher;

namespace {

RankOutcome rank_outcome(int rank, int node, int exit_code, int signal) {
  RankOutcome o;
  o.rank = rank;
  o.node = node;
  o.node_name = "n" + std::to_string(node);
  o.exit_code = exit_code;
  o.signal = signal;
  return o;
}

// What one agent writes: its attempt, its first failure (if any), its preflight line.
JobReport agent_report(std::string outcome, std::vector<RankOutcome> ranks,
                       double all_started_s = 0) {
  JobReport r;
  r.agent_wireup = "pmix";
  r.preflight = "rdma preflight: nothing to check";
  AttemptReport a;
  a.outcome = std::move(outcome);
  a.all_started_s = all_started_s;
  a.ranks = std::move(ranks);
  r.attempts.push_back(std::move(a));
  return r;
}

}  // namespace

TEST_CASE("step report: every agent's ranks in rank order, started when the last node was") {
  std::vector<std::optional<JobReport>> agents{
      agent_report("succeeded", {rank_outcome(2, 0, 0, 0), rank_outcome(0, 0, 0, 0)}, 0.5),
      agent_report("succeeded", {rank_outcome(3, 1, 0, 0), rank_outcome(1, 1, 0, 0)}, 1.25),
  };
  JobReport job;
  const MergedAttempt merged = merge_agent_reports(2, agents, job);
  CHECK(merged.attempt.attempt == 2);
  CHECK(merged.attempt.all_started_s == 1.25);
  REQUIRE(merged.attempt.ranks.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(merged.attempt.ranks[static_cast<std::size_t>(i)].rank == i);
  CHECK_FALSE(merged.root_cause);
  CHECK(merged.agent_outcome.empty());
  CHECK(merged.preflight_exit == 0);
  CHECK(job.agent_wireup == "pmix");
}

TEST_CASE("step report: the root cause is the failure seen first, not node 0's echo of it") {
  // rank 3 on n1 died first; n0's rank was killed by the step's teardown 0.4 s later
  JobReport n0 = agent_report("failed", {rank_outcome(0, 0, -1, SIGTERM)});
  n0.root_cause = RootCause{0, 0, "n0", "killed by SIGTERM", "", 1000.5};
  JobReport n1 = agent_report("failed", {rank_outcome(3, 1, 7, 0)});
  n1.root_cause = RootCause{0, 3, "n1", "exited 7", "", 1000.1};
  JobReport job;
  const MergedAttempt merged = merge_agent_reports(0, {n0, n1}, job);
  REQUIRE(merged.root_cause);
  CHECK(merged.root_cause->rank == 3);
  CHECK(merged.root_cause->node == "n1");
  CHECK(merged.preflight_exit == 0);
}

TEST_CASE("step report: a failed [rdma] preflight gives the job its exit status and its line") {
  JobReport n0 = agent_report("failed", {});
  n0.preflight = "rdma preflight: 2 NICs, all healthy";
  JobReport n1 = agent_report("failed", {});
  n1.preflight = "rdma preflight: mlx5_9 does not exist";
  n1.exit_code = 2;
  n1.root_cause = RootCause{0, -1, "n1", n1.preflight, "preflight", 1000.0};
  JobReport job;
  const MergedAttempt merged = merge_agent_reports(0, {n0, n1}, job);
  REQUIRE(merged.root_cause);
  CHECK(merged.root_cause->phase == "preflight");
  CHECK(merged.preflight_exit == 2);
  CHECK(job.preflight == "rdma preflight: mlx5_9 does not exist");
}

TEST_CASE("step report: node 0's preflight line of attempt 0 is the job's; later ones are not") {
  JobReport n0 = agent_report("succeeded", {rank_outcome(0, 0, 0, 0)});
  n0.preflight = "rdma preflight: 2 NICs, all healthy";
  JobReport job;
  (void)merge_agent_reports(0, {n0}, job);
  CHECK(job.preflight == "rdma preflight: 2 NICs, all healthy");
  n0.preflight = "";  // agents run the preflight in attempt 0 only
  (void)merge_agent_reports(1, {n0}, job);
  CHECK(job.preflight == "rdma preflight: 2 NICs, all healthy");
}

TEST_CASE("step report: a node that left no report is passed over") {
  JobReport n1 = agent_report("requeue", {rank_outcome(1, 1, 0, 0)});
  n1.agent_wireup = "pmi2";
  JobReport job;
  const MergedAttempt merged = merge_agent_reports(0, {std::nullopt, n1}, job);
  REQUIRE(merged.attempt.ranks.size() == 1);
  CHECK(merged.attempt.ranks[0].rank == 1);
  CHECK(job.agent_wireup == "pmi2");
  CHECK(job.preflight.empty());              // node 0 said nothing
  CHECK(merged.agent_outcome == "requeue");  // Slurm signalled that agent itself
}

TEST_CASE("exit status: 0 succeeded, 3 requeue, 128+N stopped by N (SIGTERM unknown), 1 failed") {
  CHECK(exit_code_of("succeeded", 0) == 0);
  CHECK(exit_code_of("requeue", SIGUSR1) == 3);
  CHECK(exit_code_of("stopped", SIGINT) == 128 + SIGINT);
  CHECK(exit_code_of("stopped", 0) == 128 + SIGTERM);
  CHECK(exit_code_of("failed", 0) == 1);
}
