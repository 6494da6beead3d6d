#include <cstdlib>

#include "catch.hpp"
#include "topolaunch/rdma/select.hpp"
#include "topolaunch/topology/discover.hpp"

using namespace topolaunch;
using namespace topolaunch::rdma;

namespace {

std::vector<RdmaDevice> sysfs(const std::string& name) {
  const char* dir = std::getenv("TOPOLAUNCH_FIXTURES_DIR");
  REQUIRE(dir != nullptr);
  auto devices = probe_rdma_devices(std::string(dir) + "/sysfs/" + name);
  REQUIRE(devices.ok());
  return *devices;
}

topology::NodeTopology load_generated(const std::string& name) {
  const char* dir = std::getenv("TOPOLAUNCH_SHARED_DIR");
  REQUIRE(dir != nullptr);
  auto topo = topology::load_xml_file(std::string(dir) + "/topologies/generated/" + name);
  INFO((topo.ok() ? std::string() : topo.error().message));
  REQUIRE(topo.ok());
  return *topo;
}

CudaProbe cuda_for(const topology::NodeTopology& topo, bool dma_buf, bool gdr) {
  CudaProbe cuda;
  cuda.driver_loaded = true;
  cuda.status = "ok";
  for (const auto& g : topo.gpus) cuda.gpus.push_back({g.index, g.busid, dma_buf, gdr, 100});
  return cuda;
}

bool has_note(const RankRdmaChoice& c, const std::string& text) {
  for (const auto& n : c.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("GID rule: InfiniBand uses index 0") {
  auto devices = sysfs("ndr-ib");
  auto gid = select_gid(devices[0], devices[0].ports[0], {});
  REQUIRE(gid.ok());
  CHECK(gid->index == 0);
}

TEST_CASE("GID rule: RoCE picks the first IPv4 RoCE v2 entry that is not link-local") {
  auto devices = sysfs("roce");
  const auto& port = devices[0].ports[0];
  SelectionPolicy policy;
  auto v4v2 = select_gid(devices[0], port, policy);
  REQUIRE(v4v2.ok());
  CHECK(v4v2->index == 3);

  policy.address_family = AddressFamily::ipv6;
  auto v6 = select_gid(devices[0], port, policy);
  REQUIRE(v6.ok());
  CHECK(v6->index == 4);

  policy = {};
  policy.roce_version = 1;
  auto v1 = select_gid(devices[0], port, policy);
  REQUIRE(v1.ok());
  CHECK(v1->index == 2);

  policy = {};
  policy.gid_index = 1;
  auto forced = select_gid(devices[0], port, policy);
  REQUIRE(forced.ok());
  CHECK(forced->index == 1);
}

TEST_CASE(
    "GID rule: a forced index that is empty, or a port with only link-local GIDs, is an error") {
  auto devices = sysfs("roce");
  SelectionPolicy policy;
  policy.gid_index = 9;
  auto forced = select_gid(devices[0], devices[0].ports[0], policy);
  REQUIRE_FALSE(forced.ok());
  CHECK(forced.error().message.find("mlx5_2:1: GID index 9") != std::string::npos);

  auto none = select_gid(devices[1], devices[1].ports[0], {});
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message.find("mlx5_3:1") != std::string::npos);
  CHECK(none.error().message.find("enp59s0f1np1") != std::string::npos);
}

TEST_CASE("GID rule: types unknown (hwloc data) still skip index 0 and link-local entries") {
  RdmaDevice d;
  d.name = "mlx5_9";
  PortInfo p;
  p.link_layer = "Ethernet";
  p.state = 4;
  p.gids = {{0, "fe80:0000:0000:0000:0e42:a1ff:fe3b:5c10", GidType::unknown, ""},
            {1, "fe80:0000:0000:0000:0e42:a1ff:fe3b:5c10", GidType::unknown, ""},
            {2, "0000:0000:0000:0000:0000:ffff:0a00:0007", GidType::unknown, ""}};
  d.ports = {p};
  auto gid = select_gid(d, d.ports[0], {});
  REQUIRE(gid.ok());
  CHECK(gid->index == 2);
}

TEST_CASE("a NIC named in the config that does not exist is an error naming it (exit 2)") {
  auto devices = sysfs("ndr-ib");
  topology::NodeTopology topo;
  RankSelectionInput in{3, -1, {"mlx5_9"}, "n1"};
  auto c = select_for_rank(in, devices, {}, false, topo);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().exit_code == 2);
  CHECK(c.error().message.find("rank 3 on node n1") != std::string::npos);
  CHECK(c.error().message.find("\"mlx5_9\"") != std::string::npos);
  CHECK(c.error().message.find("mlx5_0, mlx5_1") != std::string::npos);
}

TEST_CASE("a named NIC whose only port is down is an error naming NIC, port and state") {
  auto devices = sysfs("down-port");
  topology::NodeTopology topo;
  auto c = select_for_rank({0, -1, {"mlx5_1"}, "n2"}, devices, {}, false, topo);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().exit_code == 2);
  CHECK(c.error().message.find("mlx5_1:1 is DOWN/Disabled") != std::string::npos);
}

TEST_CASE("NCCL_IB_HCA lists only healthy ports; UCX_TLS is never a bare rc_verbs") {
  auto devices = sysfs("down-port");
  topology::NodeTopology topo;
  auto c = select_for_rank({0, -1, {"mlx5_0", "mlx5_1"}, "n2"}, devices, {}, false, topo);
  REQUIRE(c.ok());
  CHECK(c->nic == "mlx5_0");
  CHECK(c->port == 1);
  CHECK(c->env.at("NCCL_IB_HCA") == "=mlx5_0:1");
  CHECK(c->env.at("UCX_NET_DEVICES") == "mlx5_0:1");
  CHECK(c->env.at("UCX_TLS") != "rc_verbs");
  CHECK(c->env.at("UCX_TLS").find("rc") != std::string::npos);
  CHECK(c->env.count("NCCL_IB_GID_INDEX") == 0);  // InfiniBand: NCCL's default is right
  CHECK(has_note(*c, "skipped mlx5_0:2 is INIT/Polling"));
  CHECK(has_note(*c, "skipped mlx5_1:1 is DOWN/Disabled"));
  CHECK(c->registration == RegistrationMethod::host_staging);
  CHECK(has_note(*c, "host staging"));
}

TEST_CASE("RoCE selection exports the same GID index to NCCL and UCX") {
  auto devices = sysfs("roce");
  topology::NodeTopology topo;
  auto c = select_for_rank({1, -1, {"mlx5_2:1"}, ""}, devices, {}, false, topo);
  REQUIRE(c.ok());
  CHECK(c->gid_index == 3);
  CHECK(c->gid == "0000:0000:0000:0000:0000:ffff:0a00:0005");
  CHECK(c->env.at("NCCL_IB_GID_INDEX") == "3");
  CHECK(c->env.at("UCX_IB_GID_INDEX") == "3");
}

TEST_CASE("DGX H100: each GPU gets its own PIX NIC and dma-buf registration") {
  auto topo = load_generated("dgx-h100.pci.xml");
  auto devices = devices_from_topology(topo);
  auto cuda = cuda_for(topo, true, true);
  const std::vector<std::string> expected = {"mlx5_0", "mlx5_3", "mlx5_4",  "mlx5_5",
                                             "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"};
  REQUIRE(topo.gpus.size() == 8);
  for (int g = 0; g < 8; ++g) {
    auto c = select_for_rank({g, g, {}, "dgx"}, devices, cuda, false, topo);
    INFO("GPU " << g << (c.ok() ? "" : ": " + c.error().message));
    REQUIRE(c.ok());
    CHECK(c->nic == expected[g]);
    CHECK(c->port == 1);
    CHECK(c->gid_index == 0);
    CHECK(c->registration == RegistrationMethod::dma_buf);
    CHECK(c->env.at("NCCL_IB_HCA") == "=" + expected[g] + ":1");
    CHECK(c->env.at("UCX_NET_DEVICES") == expected[g] + ":1");
  }
}

TEST_CASE("DGX H100: without dma-buf but with nvidia_peermem, registration is peermem") {
  auto topo = load_generated("dgx-h100.pci.xml");
  auto c = select_for_rank({0, 0, {}, ""}, devices_from_topology(topo), cuda_for(topo, false, true),
                           true, topo);
  REQUIRE(c.ok());
  CHECK(c->registration == RegistrationMethod::peermem);
}

TEST_CASE("DGX H100: a storage NIC named for a GPU on the other socket means host staging, said") {
  auto topo = load_generated("dgx-h100.pci.xml");
  auto c = select_for_rank({0, 0, {"mlx5_9"}, ""}, devices_from_topology(topo),
                           cuda_for(topo, true, true), false, topo);
  REQUIRE(c.ok());
  CHECK(c->registration == RegistrationMethod::host_staging);
  CHECK(has_note(*c, "SYS apart"));
  SelectionPolicy strict;
  strict.require_gpudirect = true;
  auto refused = select_for_rank({0, 0, {"mlx5_9"}, ""}, devices_from_topology(topo),
                                 cuda_for(topo, true, true), false, topo, strict);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("GPUDirect RDMA required") != std::string::npos);
}

TEST_CASE("DGX A100: each GPU pair shares two PXB NICs, one each") {
  auto topo = load_generated("dgx-a100.pci.xml");
  auto devices = devices_from_topology(topo);
  auto cuda = cuda_for(topo, true, true);
  const std::vector<std::string> expected = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3",
                                             "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"};
  REQUIRE(topo.gpus.size() == 8);
  for (int g = 0; g < 8; ++g) {
    auto c = select_for_rank({g, g, {}, "a100"}, devices, cuda, false, topo);
    INFO("GPU " << g << (c.ok() ? "" : ": " + c.error().message));
    REQUIRE(c.ok());
    CHECK(c->nic == expected[g]);
    CHECK(c->registration == RegistrationMethod::dma_buf);
  }
}

TEST_CASE("DGX A100 without a CUDA driver: host staging with the reason") {
  auto topo = load_generated("dgx-a100.pci.xml");
  CudaProbe none;
  none.status = "libcuda.so.1 not found (no NVIDIA driver on this node)";
  auto c = select_for_rank({5, 5, {}, ""}, devices_from_topology(topo), none, true, topo);
  REQUIRE(c.ok());
  CHECK(c->registration == RegistrationMethod::host_staging);
  CHECK(has_note(*c, "CUDA driver not usable"));
}
