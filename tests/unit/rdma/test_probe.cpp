#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "catch.hpp"
#include "topolaunch/rdma/probe.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;

namespace {

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("TOPOLAUNCH_FIXTURES_DIR");
  REQUIRE(dir != nullptr);  // set by meson's test_env
  return std::string(dir) + "/sysfs/" + name;
}

std::vector<RdmaDevice> probe(const std::string& name) {
  auto devices = probe_rdma_devices(fixture(name));
  REQUIRE(devices.ok());
  return *devices;
}

}  // namespace

TEST_CASE("NDR InfiniBand: two active 400G ports with PCI address, NUMA node and netdev") {
  auto devices = probe("ndr-ib");
  REQUIRE(devices.size() == 2);
  const auto& d0 = devices[0];
  CHECK(d0.name == "mlx5_0");
  REQUIRE(d0.pci.has_value());
  CHECK(d0.pci->to_string() == "0000:18:00.0");
  CHECK(d0.numa == 0);
  CHECK(d0.node_type == "CA");
  CHECK(d0.netdevs == std::vector<std::string>{"ibp24s0"});
  REQUIRE(d0.ports.size() == 1);
  const auto& p = d0.ports[0];
  CHECK(p.number == 1);
  CHECK(p.state == 4);
  CHECK(p.state_name == "ACTIVE");
  CHECK(p.physical_state == 5);
  CHECK(p.physical_state_name == "LinkUp");
  CHECK(p.rate_gbps == 400.0);
  CHECK(p.rate_text == "400 Gb/sec (4X NDR)");
  CHECK(p.link_layer == "InfiniBand");
  CHECK(p.lid == 0x1f);
  CHECK(p.healthy());
  CHECK_FALSE(p.roce());
  REQUIRE(p.gids.size() == 1);  // the zero entries are not GIDs
  CHECK(p.gids[0].index == 0);
  CHECK(p.gids[0].type == GidType::ib_roce_v1);
  CHECK(p.gids[0].link_local());
  CHECK(devices[1].numa == 1);
  CHECK(devices[1].pci->to_string() == "0000:9a:00.0");
}

TEST_CASE("nvidia_peermem is found under the sysfs root, and only there") {
  auto pm = find_peermem(fixture("ndr-ib"));
  REQUIRE(pm.has_value());
  CHECK(pm->find("module/nvidia_peermem") != std::string::npos);
  CHECK_FALSE(find_peermem(fixture("roce")).has_value());
}

TEST_CASE("RoCE: GID table with types and netdevs, Ethernet link layer") {
  auto devices = probe("roce");
  REQUIRE(devices.size() == 2);
  const auto& p = devices[0].ports.at(0);
  CHECK(p.roce());
  CHECK(p.rate_gbps == 200.0);
  REQUIRE(p.gids.size() == 5);
  CHECK(p.gids[0].type == GidType::ib_roce_v1);
  CHECK(p.gids[1].type == GidType::roce_v2);
  CHECK(p.gids[3].type == GidType::roce_v2);
  CHECK(p.gids[3].ipv4_mapped());
  CHECK_FALSE(p.gids[3].link_local());
  CHECK(p.gids[1].link_local());
  CHECK_FALSE(p.gids[4].ipv4_mapped());
  CHECK(p.gids[3].netdev == "enp59s0f0np0");
  CHECK(devices[0].netdevs == std::vector<std::string>{"enp59s0f0np0"});
}

TEST_CASE("a down port and a polling port are not healthy; their state is reported") {
  auto devices = probe("down-port");
  REQUIRE(devices.size() == 2);
  REQUIRE(devices[0].ports.size() == 2);
  CHECK(devices[0].ports[0].healthy());
  CHECK_FALSE(devices[0].ports[1].healthy());
  CHECK(devices[0].ports[1].physical_state_name == "Polling");
  const auto& down = devices[1].ports.at(0);
  CHECK_FALSE(down.active());
  CHECK_FALSE(down.healthy());
  CHECK(down.state_name == "DOWN");
  CHECK(down.physical_state_name == "Disabled");
}

TEST_CASE("XDR rates (200 Gb/s per lane) come from the rate text, beyond what verbs 44 can say") {
  auto devices = probe("xdr");
  REQUIRE(devices.size() == 2);
  CHECK(devices[0].ports.at(0).rate_gbps == 800.0);
  CHECK(devices[1].ports.at(0).rate_gbps == 1600.0);
  CHECK(devices[1].ports.at(0).rate_text == "1600 Gb/sec (8X XDR)");
}

TEST_CASE("no /sys/class/infiniband means no devices, not an error") {
  auto devices = probe_rdma_devices("/nonexistent-sysfs-root");
  REQUIRE(devices.ok());
  CHECK(devices->empty());
}

TEST_CASE("a malformed port state is an error naming the file") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("rdma-probe-bad-" + std::to_string(getpid()));
  fs::create_directories(root / "class/infiniband/mlx5_7/ports/1");
  std::ofstream(root / "class/infiniband/mlx5_7/ports/1/state") << "ACTIVE\n";
  auto devices = probe_rdma_devices(root.string());
  fs::remove_all(root);
  REQUIRE_FALSE(devices.ok());
  CHECK(devices.error().message.find("mlx5_7/ports/1/state") != std::string::npos);
}

TEST_CASE("a missing CUDA driver is reported, not fatal") {
  auto cuda = probe_cuda("libcuda-does-not-exist.so.1");
  CHECK_FALSE(cuda.driver_loaded);
  CHECK(cuda.status.find("not found") != std::string::npos);
  CHECK(cuda.gpus.empty());
}

TEST_CASE("inventory JSON carries ports, GIDs and GPU capability") {
  auto inv = probe_node(fixture("roce"), false);
  REQUIRE(inv.ok());
  const std::string j = to_json(*inv);
  CHECK(j.find("\"RoCE v2\"") != std::string::npos);
  CHECK(j.find("\"mlx5_3\"") != std::string::npos);
  CHECK(j.find("\"not probed\"") != std::string::npos);
}
