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

TEST_CASE("step outcome: a requeue an agent reported is the step's, though srun exited 0") {
  // scancel --signal=USR1 JOBID reaches the agents, not `run`: each agent whose ranks
  // checkpointed exits 0 (so srun --kill-on-bad-exit leaves the other nodes checkpointing)
  JobReport n0 = agent_report("requeue", {rank_outcome(0, 0, 0, 0)});
  JobReport n1 = agent_report("requeue", {rank_outcome(1, 1, 0, 0)});
  JobReport job;
  const MergedAttempt merged = merge_agent_reports(0, {n0, n1}, job);
  CHECK(merged.agent_outcome == "requeue");
  CHECK(step_outcome("", true, merged) == "requeue");
  CHECK(exit_code_of(step_outcome("", true, merged), 0) == 3);
}

TEST_CASE("step outcome: one node requeued, one stopped by the teardown: a requeue") {
  JobReport n0 = agent_report("stopped", {rank_outcome(0, 0, -1, SIGTERM)});
  JobReport n1 = agent_report("requeue", {rank_outcome(1, 1, 0, 0)});
  JobReport job;
  const MergedAttempt merged = merge_agent_reports(0, {n0, n1}, job);
  CHECK(merged.agent_outcome == "requeue");
  CHECK(step_outcome("", false, merged) == "requeue");
  const MergedAttempt stopped = merge_agent_reports(0, {n0, n0}, job);
  CHECK(stopped.agent_outcome == "stopped");
  CHECK(step_outcome("", false, stopped) == "stopped");
}

TEST_CASE("step outcome: what run was asked, else srun's status, else the agents' failure") {
  JobReport ok = agent_report("succeeded", {rank_outcome(0, 0, 0, 0)});
  JobReport failed = agent_report("failed", {rank_outcome(1, 1, 7, 0)});
  failed.root_cause = RootCause{0, 1, "n1", "exited 7", "", 1000.0};
  JobReport job;
  const MergedAttempt good = merge_agent_reports(0, {ok, ok}, job);
  CHECK(step_outcome("", true, good) == "succeeded");
  CHECK(step_outcome("requeue", true, good) == "requeue");
  CHECK(step_outcome("stopped", false, good) == "stopped");
  CHECK(step_outcome("", false, good) == "failed");  // srun failed, no agent said why
  const MergedAttempt bad = merge_agent_reports(0, {ok, failed}, job);
  CHECK(step_outcome("", false, bad) == "failed");
}

TEST_CASE("agent exit status: 0 for a requeue (srun must not cancel the step), else run's") {
  CHECK(agent_exit_status("requeue", SIGUSR1) == 0);
  CHECK(agent_exit_status("succeeded", 0) == 0);
  CHECK(agent_exit_status("failed", 0) == 1);
  CHECK(agent_exit_status("stopped", SIGTERM) == 128 + SIGTERM);
}

TEST_CASE("step report: a rank that exited because its peer died is not the root cause") {
  // n0's rank 0 saw its peer go (exit 4) and its agent's clock says it was first; n1's rank 3
  // is the one that died.
  JobReport n0 = agent_report("failed", {rank_outcome(0, 0, 4, 0)});
  n0.root_cause = RootCause{0, 0, "n0", "exited 4: a peer rank died", "", 1000.0};
  JobReport n1 = agent_report("failed", {rank_outcome(3, 1, -1, SIGKILL)});
  n1.root_cause = RootCause{0, 3, "n1", "killed by SIGKILL", "", 1000.3};
  JobReport job;
  MergedAttempt merged = merge_agent_reports(0, {n0, n1}, job);
  REQUIRE(merged.root_cause);
  CHECK(merged.root_cause->rank == 3);
  CHECK_FALSE(merged.root_cause_is_consequence);
  // With no other failure the echo is all there is, and said to be one.
  merged = merge_agent_reports(0, {n0}, job);
  REQUIRE(merged.root_cause);
  CHECK(merged.root_cause->rank == 0);
  CHECK(merged.root_cause_is_consequence);
}

namespace {

// A map of three nodes, two ranks each, as agent 0 writes it to <job_dir>/rankmap.json.
const char* const kThreeNodeMap = R"({"nodes": [
  {"name": "n1", "ranks": 2, "rank_ids": [0, 1], "allowed_gpus": []},
  {"name": "n2", "ranks": 2, "rank_ids": [2, 3], "allowed_gpus": []},
  {"name": "n3", "ranks": 2, "rank_ids": [4, 5], "allowed_gpus": []}]})";

}  // namespace

TEST_CASE("step report: an agent that left no report is the root cause of its peers' failures") {
  // n2's agent was killed (or n2 lost): no node-1.json; n1's and n3's ranks saw their peers go.
  JobReport n1 = agent_report("failed", {rank_outcome(0, 0, 4, 0), rank_outcome(1, 0, 4, 0)});
  n1.root_cause = RootCause{0, 1, "n1", "exited 4: a peer rank died", "", 1000.1};
  JobReport n3 = agent_report("stopped", {rank_outcome(4, 2, 143, 0), rank_outcome(5, 2, 143, 0)});
  JobReport job;
  const MergedAttempt merged = merge_agent_reports(0, {n1, std::nullopt, n3}, job);
  CHECK(merged.silent_agents == std::vector<int>{1});
  const auto cause = silent_agents_cause(merged, 3, kThreeNodeMap, "killed by SIGKILL", false);
  REQUIRE(cause);
  CHECK(cause->node == "n2");
  CHECK(cause->rank == -1);
  CHECK(cause->phase == "agent-lost");
  CHECK(cause->what.starts_with("node n2: its agent ended without a report"));
  CHECK(cause->what.ends_with("srun killed by SIGKILL"));
  // srun still waited for n2's task after the others had reported: the node is lost.
  const auto lost = silent_agents_cause(merged, 3, kThreeNodeMap, "stopped", true);
  REQUIRE(lost);
  CHECK(lost->phase == "node-lost");
  CHECK(lost->what.starts_with("node n2 lost: its agent never reported"));
  // Without the map the agent is named by its index.
  const auto unnamed = silent_agents_cause(merged, 3, "", "exited 1", false);
  REQUIRE(unnamed);
  CHECK(unnamed->what.starts_with("agent 1 of 3: "));
}

TEST_CASE("step report: no silent agent is blamed for a failure of its own, nor when none spoke") {
  JobReport n1 = agent_report("failed", {rank_outcome(0, 0, 1, 0), rank_outcome(1, 0, 4, 0)});
  n1.root_cause = RootCause{0, 0, "n1", "exited 1: out of memory", "", 1000.1};
  JobReport job;
  MergedAttempt merged = merge_agent_reports(0, {n1, std::nullopt, std::nullopt}, job);
  CHECK_FALSE(silent_agents_cause(merged, 3, kThreeNodeMap, "exited 1", false));
  merged = merge_agent_reports(0, {std::nullopt, std::nullopt, std::nullopt}, job);
  CHECK_FALSE(silent_agents_cause(merged, 3, kThreeNodeMap, "exited 1", false));  // srun's own line
  merged = merge_agent_reports(0, {n1}, job);
  CHECK_FALSE(silent_agents_cause(merged, 1, kThreeNodeMap, "exited 1", false));
}

TEST_CASE("exit status: 0 succeeded, 3 requeue, 128+N stopped by N (SIGTERM unknown), 1 failed") {
  CHECK(exit_code_of("succeeded", 0) == 0);
  CHECK(exit_code_of("requeue", SIGUSR1) == 3);
  CHECK(exit_code_of("stopped", SIGINT) == 128 + SIGINT);
  CHECK(exit_code_of("stopped", 0) == 128 + SIGTERM);
  CHECK(exit_code_of("failed", 0) == 1);
}
