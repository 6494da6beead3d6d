#include "catch.hpp"
#include "topolaunch/launcher/worker_env.hpp"

using namespace topolaunch;
using namespace topolaunch::launcher;

namespace {

// Two nodes x two ranks, the second node's first rank is rank 2.
topology::RankMap two_by_two() {
  topology::RankMap map;
  map.world_size = 4;
  for (int n = 0; n < 2; ++n) {
    topology::RankMapNode node;
    node.name = "n" + std::to_string(n + 1);
    node.ranks = 2;
    node.rank_ids = {2 * n, 2 * n + 1};
    map.nodes.push_back(node);
  }
  for (int r = 0; r < 4; ++r) {
    topology::RankAssignment a;
    a.rank = r;
    a.node = r / 2;
    a.local_rank = r % 2;
    a.cpus = *topology::CpuSet::parse_list(r % 2 == 0 ? "0-3" : "4-7");
    a.cores = 4;
    a.numa = r % 2;
    a.env = {{"CUDA_VISIBLE_DEVICES", std::to_string(r % 2)}, {"RANK", "wrong"}};
    map.ranks.push_back(a);
  }
  return map;
}

JobFacts facts() {
  JobFacts f;
  f.run_id = "job-42";
  f.attempt = 1;
  f.master_addr = "10.0.0.1";
  f.master_port = 29501;
  f.store_address = "10.0.0.1:40000";
  f.store_secret = "s3cret";
  f.heartbeat_file = "/jobs/attempt-1/heartbeat/rank-3";
  return f;
}

}  // namespace

TEST_CASE("rank 3 of 2x2 gets torchrun's names with node-local values") {
  JobConfig config;
  config.job.restarts = 5;
  Environment env = worker_environment({}, config, two_by_two(), 3, facts());
  CHECK(env.at("RANK") == "3");
  CHECK(env.at("LOCAL_RANK") == "1");
  CHECK(env.at("WORLD_SIZE") == "4");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("GROUP_WORLD_SIZE") == "2");
  CHECK(env.at("ROLE_NAME") == "default");
  CHECK(env.at("MASTER_ADDR") == "10.0.0.1");
  CHECK(env.at("MASTER_PORT") == "29501");
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "5");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "job-42");
}

TEST_CASE("the map's environment is passed, but never overrides the rank names") {
  Environment env = worker_environment({}, JobConfig{}, two_by_two(), 2, facts());
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "0");
  CHECK(env.at("RANK") == "2");
}

TEST_CASE("TOPOLAUNCH_* carries the store, the binding and the budgets that are set") {
  JobConfig config;
  config.budget.memory_bytes_per_rank = 1 << 30;
  Environment env = worker_environment({}, config, two_by_two(), 3, facts());
  CHECK(env.at("TOPOLAUNCH_STORE_ADDR") == "10.0.0.1:40000");
  CHECK(env.at("TOPOLAUNCH_STORE_SECRET") == "s3cret");
  CHECK(env.at("TOPOLAUNCH_WIREUP") == "tcp");
  CHECK(env.at("TOPOLAUNCH_RANK") == "3");
  CHECK(env.at("TOPOLAUNCH_WORLD_SIZE") == "4");
  CHECK(env.at("TOPOLAUNCH_CPUS") == "4-7");
  CHECK(env.at("TOPOLAUNCH_NUMA_NODE") == "1");
  CHECK(env.at("TOPOLAUNCH_HEARTBEAT_FILE") == "/jobs/attempt-1/heartbeat/rank-3");
  CHECK(env.at("TOPOLAUNCH_MEMORY_BUDGET_BYTES") == "1073741824");
  CHECK_FALSE(env.contains("TOPOLAUNCH_GPU_MEMORY_BUDGET_BYTES"));
}

TEST_CASE("inherited < [worker].env < the map < ours; OMP_NUM_THREADS from the rank's cores") {
  JobConfig config;
  config.worker.env = {{"PATH", "/opt/bin"}, {"CUDA_VISIBLE_DEVICES", "7"}, {"WORLD_SIZE", "1"}};
  Environment inherited{{"PATH", "/usr/bin"}, {"HOME", "/root"}};
  Environment env = worker_environment(inherited, config, two_by_two(), 0, facts());
  CHECK(env.at("HOME") == "/root");
  CHECK(env.at("PATH") == "/opt/bin");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "0");
  CHECK(env.at("WORLD_SIZE") == "4");
  CHECK(env.at("OMP_NUM_THREADS") == "4");
  config.worker.env["OMP_NUM_THREADS"] = "1";
  CHECK(worker_environment(inherited, config, two_by_two(), 0, facts()).at("OMP_NUM_THREADS") ==
        "1");
}
