// The agents' wireup: srun's --mpi= for [wireup].backend and what an agent connects to; their
// exchange of records and distinct topologies; the relay tree's shape.
#include <atomic>
#include <barrier>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "catch.hpp"
#include "topolaunch/launcher/agent_wireup.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/topology/serialize.hpp"

using namespace topolaunch::launcher;
using topolaunch::jobspec::WireupBackend;
using topolaunch::wireup::Backend;

namespace {
// Plain find (Catch2 2.13 and 3.x spell their string matchers differently).
bool has(const std::string& text, const char* needle) {
  return text.find(needle) != std::string::npos;
}
const std::vector<std::string> kAll{"tcp", "pmix", "pmi2"};
const std::vector<std::string> kTcpOnly{"tcp"};
// What Debian's Slurm 22.05 prints for `srun --mpi=list`.
const char* kDebianList =
    "MPI plugin types are...\n\tcray_shasta\n\tnone\n\tpmi2\n\tpmix\n"
    "specific pmix plugin versions available: pmix_v4\n";
}  // namespace

TEST_CASE("srun --mpi=list is parsed into plugin names") {
  CHECK(parse_srun_mpi_list(kDebianList) ==
        std::vector<std::string>{"cray_shasta", "none", "pmi2", "pmix"});
  CHECK(parse_srun_mpi_list("srun: error: Could not establish a configuration source\n").empty());
}

TEST_CASE("srun --mpi= follows wireup.backend") {
  const auto offered = parse_srun_mpi_list(kDebianList);
  CHECK(*srun_mpi_for(WireupBackend::automatic, offered, kAll) == "pmix");
  CHECK(*srun_mpi_for(WireupBackend::automatic, {"none", "pmi2"}, kAll) == "pmi2");
  CHECK(*srun_mpi_for(WireupBackend::automatic, offered, kTcpOnly) == "none");
  CHECK(*srun_mpi_for(WireupBackend::automatic, {}, kAll) == "none");
  CHECK(*srun_mpi_for(WireupBackend::tcp, offered, kAll) == "none");
  CHECK(*srun_mpi_for(WireupBackend::pmi2, offered, kAll) == "pmi2");
  CHECK(*srun_mpi_for(WireupBackend::pmix, offered, kAll) == "pmix");

  auto not_offered = srun_mpi_for(WireupBackend::pmix, {"none", "pmi2"}, kAll);
  REQUIRE(!not_offered);
  CHECK(not_offered.error().exit_code == 2);
  CHECK(has(not_offered.error().message, "wireup.backend"));
  CHECK(has(not_offered.error().message, "no pmix plugin"));
  CHECK(has(not_offered.error().message, "none, pmi2"));
  auto not_built = srun_mpi_for(WireupBackend::pmi2, offered, kTcpOnly);
  REQUIRE(!not_built);
  CHECK(not_built.error().exit_code == 2);
  CHECK(has(not_built.error().message, "wireup.backend"));
  CHECK(has(not_built.error().message, "without PMI2"));
}

TEST_CASE("an agent takes the backend its srun gave it") {
  const topolaunch::Environment pmix{{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "slurm.pmix.7.0"}};
  const topolaunch::Environment pmi2{{"PMI_FD", "5"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "4"}};
  const topolaunch::Environment tcp{{"TOPOLAUNCH_AGENT_STORE", "10.0.0.1:4000"}};
  CHECK(*agent_backend(WireupBackend::automatic, pmix, kAll) == Backend::pmix);
  CHECK(*agent_backend(WireupBackend::automatic, pmi2, kAll) == Backend::pmi2);
  CHECK(*agent_backend(WireupBackend::automatic, tcp, kAll) == Backend::tcp);
  CHECK(*agent_backend(WireupBackend::pmi2, pmi2, kAll) == Backend::pmi2);
  CHECK(*agent_backend(WireupBackend::tcp, tcp, kAll) == Backend::tcp);
  // auto without PMIx compiled in: PMI2 is not there either, so the TCP store must be.
  CHECK(!agent_backend(WireupBackend::automatic, pmix, kTcpOnly));

  auto missing = agent_backend(WireupBackend::pmix, pmi2, kAll);
  REQUIRE(!missing);
  CHECK(missing.error().exit_code == 2);
  CHECK(has(missing.error().message, "wireup.backend = \"pmix\""));
  CHECK(has(missing.error().message, "PMIX_RANK"));
  auto missing2 = agent_backend(WireupBackend::pmi2, tcp, kAll);
  REQUIRE(!missing2);
  CHECK(has(missing2.error().message, "wireup.backend = \"pmi2\""));
  CHECK(has(missing2.error().message, "PMI_FD"));
}

TEST_CASE("the agent's PMI variables are not the workers'") {
  CHECK(is_agent_pmi_variable("PMI_FD"));
  CHECK(is_agent_pmi_variable("PMIX_NAMESPACE"));
  CHECK(is_agent_pmi_variable("PMIX_SERVER_URI41"));
  CHECK_FALSE(is_agent_pmi_variable("PMIX_MCA_gds"));
  CHECK_FALSE(is_agent_pmi_variable("SLURM_PROCID"));
  CHECK_FALSE(is_agent_pmi_variable("TOPOLAUNCH_STORE_ADDR"));
}

// --- the agents' exchange and the relay tree ---------------------------------------------------
namespace {

namespace tt = topolaunch::topology;
namespace tw = topolaunch::wireup;

// An in-process KvStore for N agent threads: one table, a barrier for fence; counts what every
// rank reads, so a test can say how much travelled.
struct SharedTable {
  explicit SharedTable(int n) : size(n), arrivals(n) {}
  const int size;
  std::mutex mutex;
  std::map<std::string, tw::Bytes> values;
  std::barrier<> arrivals;
  std::atomic<std::size_t> bytes_read{0};
};

class TableStore final : public tw::KvStore {
 public:
  TableStore(SharedTable& table, int rank) : table_(table), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return table_.size; }
  std::string_view backend() const override { return "table"; }
  using tw::KvStore::put;
  topolaunch::Status put(std::string_view key, std::span<const std::byte> value) override {
    staged_.emplace_back(std::string(key), tw::Bytes(value.begin(), value.end()));
    return topolaunch::ok_status();
  }
  topolaunch::Status commit() override {
    std::lock_guard lock(table_.mutex);
    for (auto& [key, value] : staged_) table_.values[key] = std::move(value);
    staged_.clear();
    return topolaunch::ok_status();
  }
  topolaunch::Status fence(tw::milliseconds) override {
    (void)commit();
    table_.arrivals.arrive_and_wait();
    return topolaunch::ok_status();
  }
  topolaunch::Result<tw::Bytes> get(std::string_view key, tw::milliseconds) override {
    std::lock_guard lock(table_.mutex);
    auto it = table_.values.find(std::string(key));
    if (it == table_.values.end()) return topolaunch::make_error("no key " + std::string(key));
    table_.bytes_read += it->second.size();
    return it->second;
  }

 private:
  SharedTable& table_;
  int rank_;
  std::vector<std::pair<std::string, tw::Bytes>> staged_;
};

std::shared_ptr<const tt::NodeTopology> fixture(const char* type) {
  auto path = std::string(TOPOLAUNCH_SOURCE_ROOT) + "/tests/fixtures/slurm/" + type + ".pci.xml";
  auto topo = tt::load_topology_file(path);
  if (!topo) FAIL(topo.error().message);
  return std::make_shared<const tt::NodeTopology>(std::move(*topo));
}

// Every agent's exchange on its own thread over one table; `relay` gives each agent's address.
std::vector<topolaunch::Result<AgentExchange>> exchange_all(
    SharedTable& table, const std::vector<tt::NodeInput>& inputs,
    const std::function<std::string(int)>& relay = [](int) { return std::string(); }) {
  const int agents = static_cast<int>(inputs.size());
  std::vector<topolaunch::Result<AgentExchange>> results(agents, topolaunch::make_error("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < agents; ++rank) {
    threads.emplace_back([&, rank] {
      TableStore store(table, rank);
      results[rank] =
          exchange_node_inputs(store, inputs[rank], relay(rank), std::chrono::seconds(5));
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace

TEST_CASE("the relay tree has fan-out 16: parents, and subtrees that cover every agent once") {
  CHECK(relay_parent(0) == -1);
  CHECK(relay_parent(1) == 0);
  CHECK(relay_parent(16) == 0);
  CHECK(relay_parent(17) == 1);
  CHECK(relay_parent(1023) == 63);
  CHECK(relay_subtree(0, 5) == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(relay_subtree(1, 40) ==
        std::vector<int>{1, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32});
  CHECK(relay_subtree(2, 40) == std::vector<int>{2, 33, 34, 35, 36, 37, 38, 39});
  // 1,024 agents: the tree is four levels deep and every agent is in agent 0's subtree once.
  CHECK(relay_subtree(0, 1024).size() == 1024);
  int depth = 0;
  for (int a = 1023; a >= 0; a = relay_parent(a)) ++depth;
  CHECK(depth == 4);
}

TEST_CASE("a topology fingerprint is equal for equal descriptions and differs otherwise") {
  auto h100 = tt::to_json(*fixture("dgx-h100"));
  auto a100 = tt::to_json(*fixture("dgx-a100"));
  CHECK(topology_fingerprint(h100) == topology_fingerprint(tt::to_json(*fixture("dgx-h100"))));
  CHECK(topology_fingerprint(h100) != topology_fingerprint(a100));
  CHECK(topology_fingerprint(h100).size() == 32);
}

TEST_CASE("agents exchange records and each distinct topology once, sharing identical ones") {
  const std::vector<const char*> types{"dgx-h100", "dgx-h100", "pcie-l40s-8gpu", "dgx-a100",
                                       "dgx-h100", "dgx-h100", "pcie-l40s-8gpu", "dgx-a100"};
  const int agents = static_cast<int>(types.size());
  std::map<std::string, std::shared_ptr<const tt::NodeTopology>> loaded;
  for (const char* type : types) loaded.try_emplace(type, fixture(type));
  std::vector<tt::NodeInput> inputs(agents);
  for (int rank = 0; rank < agents; ++rank) {
    inputs[rank].name = "n" + std::to_string(rank + 1);
    inputs[rank].topology = loaded.at(types[rank]);
  }
  SharedTable table(agents);
  const auto results =
      exchange_all(table, inputs, [](int rank) { return "10.0.0." + std::to_string(rank) + ":9"; });
  for (int rank = 0; rank < agents; ++rank) {
    INFO("agent " << rank);
    REQUIRE(results[rank].ok());
    const AgentExchange& x = *results[rank];
    CHECK(x.distinct_topologies == 3);
    REQUIRE(x.nodes.size() == static_cast<std::size_t>(agents));
    for (int a = 0; a < agents; ++a) {
      CHECK(x.nodes[a].name == "n" + std::to_string(a + 1));
      CHECK(x.relay_addresses[a] == "10.0.0." + std::to_string(a) + ":9");
      if (a == rank) {
        CHECK(x.nodes[a].topology == loaded.at(types[a]));  // its own, names and all
      } else {
        // The others' descriptions: the hardware's shape, without the hostname, the file's path,
        // GPU UUIDs and port GIDs, NUMA memory in whole GiB.
        tt::NodeTopology expected = *loaded.at(types[a]);
        expected.hostname.clear();
        expected.sources.origin.clear();
        for (auto& gpu : expected.gpus) gpu.uuid.clear();
        for (auto& nic : expected.nics)
          for (auto& port : nic.ports) port.gids.clear();
        for (auto& numa : expected.numa_nodes) numa.memory_bytes = numa.memory_bytes >> 30 << 30;
        CHECK(*x.nodes[a].topology == expected);
      }
    }
    // One object per distinct description: the H100 nodes other than this one share one.
    std::set<const tt::NodeTopology*> h100s;
    for (int a : {0, 1, 4, 5})
      if (a != rank) h100s.insert(x.nodes[a].topology.get());
    CHECK(h100s.size() == 1);
  }
  // Each agent read the 8 records and the 2 descriptions it lacked: far less than 8 topologies.
  const std::size_t one_topology = tt::to_json(*loaded.at("dgx-h100")).size();
  CHECK(table.bytes_read < static_cast<std::size_t>(agents) * 3 * one_topology);
  CHECK(table.bytes_read > static_cast<std::size_t>(agents) * one_topology);
}

TEST_CASE("identical nodes exchange records only, no descriptions and no second fence") {
  auto h100 = fixture("dgx-h100");
  SharedTable table(3);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      TableStore store(table, rank);
      tt::NodeInput mine{"n" + std::to_string(rank), h100, {}};
      auto x = exchange_node_inputs(store, mine, "", std::chrono::seconds(5));
      // Its own node keeps its topology; the others share one object, their description.
      if (!x) return;
      const auto& other = x->nodes[(rank + 1) % 3].topology;
      if (x->distinct_topologies == 1 && x->nodes[rank].topology == h100 &&
          other == x->nodes[(rank + 2) % 3].topology && *other != *h100 &&
          other->gpus == h100->gpus)
        ++ok;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 3);
  CHECK(table.bytes_read < 3 * 3 * 400);  // three records of a few hundred bytes, each read 3x
  for (const auto& [key, value] : table.values) CHECK(key.rfind("topo/", 0) != 0);
}

TEST_CASE(
    "alike nodes read from files of their own, with their own hostnames, are one "
    "description") {
  // The plugin's topology_xml=DIR/%n.xml and live discovery name every node differently.
  SharedTable table(4);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  // Loaded before the threads start: the import forks, and a fork while other threads allocate
  // can leave a sanitizer's allocator lock held in the child (it hung to its 10 s limit under
  // ASan with other tests running); Catch's assertions are not for threads either.
  const auto h100 = fixture("dgx-h100");
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank] {
      auto topology = std::make_shared<tt::NodeTopology>(*h100);
      topology->hostname = "n" + std::to_string(rank);
      topology->sources.origin = "/site/topo/n" + std::to_string(rank) + ".xml";
      TableStore store(table, rank);
      tt::NodeInput mine{"n" + std::to_string(rank), topology, {}};
      auto x = exchange_node_inputs(store, mine, "", std::chrono::seconds(5));
      if (x && x->distinct_topologies == 1 && x->nodes[rank].topology == topology &&
          x->nodes[(rank + 1) % 4].topology->hostname.empty())
        ++ok;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 4);
  for (const auto& [key, value] : table.values) CHECK(key.rfind("topo/", 0) != 0);
}

TEST_CASE(
    "alike live nodes that differ in GPU UUIDs, port GIDs and memory are one description, and "
    "each node's ranks get that node's UUIDs") {
  constexpr int agents = 4;
  constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
  auto uuid = [](int node, int gpu) {
    return "GPU-" + std::to_string(node) + "0000000-0000-0000-0000-00000000000" +
           std::to_string(gpu);
  };
  std::vector<std::shared_ptr<const tt::NodeTopology>> live;
  for (int node = 0; node < agents; ++node) {
    auto topology = std::make_shared<tt::NodeTopology>(*fixture("dgx-h100"));
    for (auto& gpu : topology->gpus) gpu.uuid = uuid(node, gpu.index);
    int ports = 0;
    for (auto& nic : topology->nics)
      for (auto& port : nic.ports) {
        port.gids = {"fe80:0000:0000:0000:0000:0000:0000:000" + std::to_string(node)};
        ++ports;
      }
    REQUIRE(ports > 0);  // the fixture has ports, so GIDs are part of what differs
    for (auto& numa : topology->numa_nodes)
      numa.memory_bytes =
          (std::uint64_t{1} << 40) + static_cast<std::uint64_t>(node + 1) * 3 * kMiB;
    live.push_back(std::move(topology));
  }
  std::vector<tt::NodeInput> inputs;
  for (int rank = 0; rank < agents; ++rank) {
    tt::NodeInput mine{"n" + std::to_string(rank), live[rank], {}};
    // Slurm's gres.conf Flags=env_uuid: the job has GPUs 2 and 5 of each node, by UUID.
    mine.allocation.all_gpus = false;
    mine.allocation.gpu_uuids = {uuid(rank, 2), uuid(rank, 5)};
    mine.allocation.cuda_naming = tt::CudaNaming::uuid;
    inputs.push_back(std::move(mine));
  }
  SharedTable table(agents);
  const auto results = exchange_all(table, inputs);
  for (const auto& [key, value] : table.values) CHECK(key.rfind("topo/", 0) != 0);
  for (int rank = 0; rank < agents; ++rank) {
    INFO("agent " << rank);
    REQUIRE(results[rank].ok());
    const AgentExchange& x = *results[rank];
    CHECK(x.distinct_topologies == 1);
    for (int node = 0; node < agents; ++node) {
      if (node == rank) continue;
      REQUIRE(x.nodes[node].gpu_uuids.size() == live[node]->gpus.size());
      CHECK(x.nodes[node].gpu_uuids[3] == uuid(node, 3));
    }
    auto map = tt::compute_rank_map(x.nodes, tt::MappingSpec{});
    REQUIRE(map.ok());
    REQUIRE(map->ranks.size() == 2 * agents);
    for (const auto& assigned : map->ranks) {
      const int node = std::stoi(map->nodes[assigned.node].name.substr(1));
      REQUIRE(assigned.gpus.size() == 1);
      INFO("rank " << assigned.rank << " on n" << node);
      CHECK((assigned.gpus[0] == 2 || assigned.gpus[0] == 5));
      CHECK(assigned.env.at("CUDA_VISIBLE_DEVICES") == uuid(node, assigned.gpus[0]));
    }
  }
}

TEST_CASE("a node record carries the allocation through, and a bad record names its agent") {
  tt::NodeInput node;
  node.name = "gpu-node-17";
  node.topology = fixture("dgx-a100");
  node.allocation.all_gpus = false;
  node.allocation.gpus = {1, 3};
  node.allocation.gpu_uuids = {"GPU-aaaa", "GPU-bbbb"};
  node.allocation.cuda_naming = tt::CudaNaming::visible_index;
  node.allocation.cpus = tt::CpuSet::parse_list("0-15,128-143");
  const std::string fingerprint = topology_fingerprint(tt::to_json(*node.topology));
  auto record = node_record(node, fingerprint, "10.1.2.3:40001");
  REQUIRE(record.ok());
  CHECK(record->size() < 120);  // against ~22 KB for the node's whole description
  auto with_uuids = std::make_shared<tt::NodeTopology>(*node.topology);
  for (auto& gpu : with_uuids->gpus) gpu.uuid = "GPU-" + std::to_string(gpu.index);
  tt::NodeInput named = node;
  named.topology = with_uuids;
  auto named_record = node_record(named, fingerprint, "10.1.2.3:40001");
  REQUIRE(named_record.ok());
  CHECK(has(*named_record, "\tGPU-0,GPU-1,"));  // the UUIDs travel in bus order
  for (auto& gpu : with_uuids->gpus) gpu.uuid = "GPU-a,b";
  CHECK_FALSE(node_record(named, fingerprint, "").ok());

  // Through a one-agent exchange the record comes back as it went in.
  SharedTable table(1);
  TableStore store(table, 0);
  auto x = exchange_node_inputs(store, node, "10.1.2.3:40001", std::chrono::seconds(1));
  REQUIRE(x.ok());
  CHECK(x->nodes[0].name == "gpu-node-17");
  CHECK(x->nodes[0].allocation == node.allocation);
  CHECK(x->relay_addresses[0] == "10.1.2.3:40001");

  // A record that is not one: the error names the agent.
  SharedTable bad_table(2);
  TableStore good(bad_table, 0), broken(bad_table, 1);
  std::thread other([&] { (void)broken.allgather("node", {}, std::chrono::seconds(1)); });
  auto failed = exchange_node_inputs(good, node, "", std::chrono::seconds(1));
  other.join();
  REQUIRE_FALSE(failed.ok());
  CHECK(has(failed.error().message, "agent 1: bad node record"));

  tt::NodeInput tabbed = node;
  tabbed.name = "bad\tname";
  CHECK_FALSE(node_record(tabbed, fingerprint, "").ok());
}
