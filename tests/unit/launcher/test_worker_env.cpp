#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include "catch.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/launcher/worker_env.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/wireup/tcp_store.hpp"

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
  f.error_file = "/jobs/attempt-1/error/rank-3.json";
  f.trace_file = "/jobs/attempt-1/trace/rank-3.json";
  f.step_metrics_file = "/jobs/attempt-1/metrics/rank-3.jsonl";
  f.mpi_singleton_guard = "/jobs/attempt-1/topolaunch-run-is-not-an-mpi-launcher";
  return f;
}

}  // namespace

TEST_CASE("rank 3 of 2x2 gets torchrun's names with node-local values") {
  jobspec::JobConfig config;
  config.job.restarts = 5;
  Environment env = worker_environment({}, config, two_by_two(), 3, facts());
  CHECK(env.at("RANK") == "3");
  CHECK(env.at("TOPOLAUNCH_TRACE_FILE") == "/jobs/attempt-1/trace/rank-3.json");
  CHECK(env.at("TOPOLAUNCH_STEP_METRICS_FILE") == "/jobs/attempt-1/metrics/rank-3.jsonl");
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

TEST_CASE(
    "torchrun's error file, agent store and NCCL error handling; the user's NCCL value wins") {
  Environment env = worker_environment({}, jobspec::JobConfig{}, two_by_two(), 3, facts());
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/jobs/attempt-1/error/rank-3.json");
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
  CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  jobspec::JobConfig config;
  config.worker.env = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}};
  Environment inherited{{"NCCL_ASYNC_ERROR_HANDLING", "0"}};
  env = worker_environment(inherited, config, two_by_two(), 3, facts());
  CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "3");
}

TEST_CASE("under Slurm the worker's SLURM_PROCID/LOCALID/NTASKS are its rank's, not the agent's") {
  // The agent is task 1 of a 2-task step (one per node); its worker rank 3 is not task 1.
  Environment inherited{{"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"},
                        {"SLURM_NTASKS", "2"},  {"SLURM_NPROCS", "2"}, {"SLURM_NODEID", "1"},
                        {"SLURM_NNODES", "2"}};
  Environment env = worker_environment(inherited, jobspec::JobConfig{}, two_by_two(), 3, facts());
  CHECK(env.at("SLURM_PROCID") == "3");
  CHECK(env.at("SLURM_LOCALID") == "1");
  CHECK(env.at("SLURM_NTASKS") == "4");
  CHECK(env.at("SLURM_NPROCS") == "4");
  CHECK(env.at("SLURM_NODEID") == "1");
  CHECK(env.at("SLURM_NNODES") == "2");
  // Outside Slurm none is invented: scripts test SLURM_PROCID to know they run under Slurm.
  env = worker_environment({}, jobspec::JobConfig{}, two_by_two(), 3, facts());
  CHECK_FALSE(env.contains("SLURM_PROCID"));
  CHECK_FALSE(env.contains("SLURM_NTASKS"));
}

TEST_CASE("Open MPI singletons are refused when WORLD_SIZE > 1, allowed for one rank") {
  Environment env = worker_environment({}, jobspec::JobConfig{}, two_by_two(), 0, facts());
  CHECK(env.at("OMPI_MCA_ess_singleton_server") ==
        "file:/jobs/attempt-1/topolaunch-run-is-not-an-mpi-launcher");
  topology::RankMap one = two_by_two();
  one.world_size = 1;
  one.ranks.resize(1);
  one.nodes.resize(1);
  one.nodes[0].ranks = 1;
  CHECK_FALSE(worker_environment({}, jobspec::JobConfig{}, one, 0, facts())
                  .contains("OMPI_MCA_ess_singleton_server"));
}

TEST_CASE("the map's environment is passed, but never overrides the rank names") {
  Environment env = worker_environment({}, jobspec::JobConfig{}, two_by_two(), 2, facts());
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "0");
  CHECK(env.at("RANK") == "2");
}

TEST_CASE("TOPOLAUNCH_* carries the store and the binding, and no budget (the job file has them)") {
  jobspec::JobConfig config;
  config.budget.memory_bytes_per_rank = 1 << 30;
  config.budget.gpu_memory_bytes_per_rank = 1 << 30;
  config.budget.comm_bytes_per_step = 1 << 20;
  config.budget.comm_exposed_time_per_step = std::chrono::milliseconds(20);
  Environment env = worker_environment({}, config, two_by_two(), 3, facts());
  CHECK(env.at("TOPOLAUNCH_STORE_ADDR") == "10.0.0.1:40000");
  CHECK(env.at("TOPOLAUNCH_STORE_SECRET") == "s3cret");
  CHECK(env.at("TOPOLAUNCH_WIREUP") == "tcp");
  CHECK(env.at("TOPOLAUNCH_RANK") == "3");
  CHECK(env.at("TOPOLAUNCH_WORLD_SIZE") == "4");
  CHECK(env.at("TOPOLAUNCH_CPUS") == "4-7");
  CHECK(env.at("TOPOLAUNCH_NUMA_NODE") == "1");
  CHECK(env.at("TOPOLAUNCH_HEARTBEAT_FILE") == "/jobs/attempt-1/heartbeat/rank-3");
  for (const auto& [name, value] : env) CHECK(name.find("BUDGET") == std::string::npos);
}

TEST_CASE("inherited < [worker].env < the map < ours; OMP_NUM_THREADS from the rank's cores") {
  jobspec::JobConfig config;
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

namespace {

const jobspec::WorkerVariable* contract_entry(const std::string& name) {
  for (const auto& v : jobspec::kWorkerVariables) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("worker contract: the agent sets every variable the contract says it sets, no other") {
  Environment env = worker_environment({}, jobspec::JobConfig{}, two_by_two(), 3, facts());
  for (const auto& [name, value] : env) {
    INFO(name);
    const jobspec::WorkerVariable* entry = contract_entry(name);
    REQUIRE(entry != nullptr);
    CHECK((entry->set_by & (jobspec::kSetByAgent | jobspec::kFromRankMap)) != 0);
  }
  for (const auto& v : jobspec::kWorkerVariables) {
    INFO(v.name);
    if (v.set_by & jobspec::kSetByAgent) CHECK(env.contains(v.name));
  }
  Environment slurm =
      worker_environment({{"SLURM_JOB_ID", "7"}}, jobspec::JobConfig{}, two_by_two(), 3, facts());
  for (const auto& v : jobspec::kWorkerVariables) {
    INFO(v.name);
    if (v.set_by & jobspec::kSetByAgentUnderSlurm) CHECK(slurm.contains(v.name));
  }
  for (const auto& [name, value] : slurm) {
    INFO(name);
    const jobspec::WorkerVariable* entry = contract_entry(name);
    if (name == "SLURM_JOB_ID") continue;  // inherited
    REQUIRE(entry != nullptr);
  }
}

TEST_CASE("worker contract: every name the rank map exports is in the contract") {
  // A rank map of a real node, with GPUs, NICs pinned and NUMA binding: every name it can write.
  const char* dir = std::getenv("TOPOLAUNCH_SHARED_DIR");
  REQUIRE(dir != nullptr);
  auto topo =
      topology::load_topology_file(std::string(dir) + "/topologies/generated/dgx-h100.pci.xml");
  REQUIRE(topo.ok());
  topology::NodeInput node;
  node.name = "n1";
  node.topology = std::make_shared<const topology::NodeTopology>(std::move(*topo));
  topology::MappingSpec spec;
  spec.pin_nics = true;
  auto map = topology::compute_rank_map({node}, spec);
  REQUIRE(map.ok());
  std::set<std::string> names;
  for (const auto& rank : map->ranks)
    for (const auto& [name, value] : rank.env) names.insert(name);
  CHECK(names.contains("NCCL_IB_HCA"));
  CHECK(names.contains("TOPOLAUNCH_NUMA"));
  CHECK(names.contains("TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S"));
  for (const std::string& name : names) {
    INFO(name);
    const jobspec::WorkerVariable* entry = contract_entry(name);
    REQUIRE(entry != nullptr);
    CHECK((entry->set_by & jobspec::kFromRankMap) != 0);
  }
}

TEST_CASE("worker contract: the wireup store reads the names the contract gives it") {
  CHECK(std::string(wireup::kStoreAddrEnv) == jobspec::env::kStoreAddr);
  CHECK(std::string(wireup::kStoreSecretEnv) == jobspec::env::kStoreSecret);
  CHECK(std::string(wireup::kRankEnv) == jobspec::env::kTopolaunchRank);
  CHECK(std::string(wireup::kWorldSizeEnv) == jobspec::env::kTopolaunchWorldSize);
}
