// NVLink from hwloc XML distances (R-NV-2) on our own NV4 mesh fixture: GPU<->GPU endpoints
// without switches (no switch merge), and the per-link table by hwloc version and GPU family.
#include "catch.hpp"
#include "fixtures.hpp"
#include "topolaunch/topology/relation.hpp"

using namespace topolaunch::topology;
using topolaunch::topology::test::fixture;
using topolaunch::topology::test::load;
using topolaunch::topology::test::slurp;

namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

NodeTopology from_buffer(const std::string& xml) {
  auto topo = load_xml_buffer(xml, "edited a100-nv4-mesh.xml");
  REQUIRE(topo.ok());
  return std::move(topo).value();
}

void check_all_pairs(const NodeTopology& topo, const std::string& expected) {
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      INFO("GPU" << i << " GPU" << j);
      CHECK(relation_between(topo, {DeviceRef::Kind::gpu, i}, {DeviceRef::Kind::gpu, j})
                .to_string() == (i == j ? "X" : expected));
    }
  }
}

}  // namespace

TEST_CASE("4x A100 NV4 mesh: GPU<->GPU NVLinkBandwidth without switches gives NV4", "[nvlink]") {
  const NodeTopology topo = load(fixture("topology/a100-nv4-mesh.xml"));
  REQUIRE(topo.gpus.size() == 4);
  REQUIRE(topo.nics.size() == 4);
  CHECK(topo.nvswitches.empty());
  CHECK(topo.sources.nvlink_known);
  CHECK(topo.nvlink_per_link_mbps == 25000);
  check_all_pairs(topo, "NV4");
  for (int i = 0; i < 4; ++i) {
    CHECK(closest_nics(topo, i) == std::vector<int>{i});
    CHECK(pcie_relation(topo, {DeviceRef::Kind::gpu, i}, {DeviceRef::Kind::nic, i}).to_string() ==
          "PIX");
  }
  CHECK(pcie_relation(topo, {DeviceRef::Kind::gpu, 0}, {DeviceRef::Kind::gpu, 1}).to_string() ==
        "NODE");
  CHECK(pcie_relation(topo, {DeviceRef::Kind::gpu, 0}, {DeviceRef::Kind::gpu, 2}).to_string() ==
        "SYS");
  CHECK(topo.gpus[0].link.gen == 4);
  CHECK(topo.gpus[0].link.width == 16);
}

TEST_CASE("A100 matrices written by hwloc 2.5-2.11 count 50000 MB/s per link", "[nvlink]") {
  const std::string xml = slurp(fixture("topology/a100-nv4-mesh.xml"));
  const std::string old_hwloc = replace_all(xml, "value=\"2.12.2\"", "value=\"2.9.0\"");
  // hwloc 2.9's NVML plugin wrote 4 NVLink3 links as 4 x 50000.
  check_all_pairs(from_buffer(replace_all(old_hwloc, "100000", "200000")), "NV4");
  CHECK(from_buffer(old_hwloc).nvlink_per_link_mbps == 50000);
  // The same values from hwloc 2.12 mean twice the links.
  check_all_pairs(from_buffer(replace_all(xml, "100000", "200000")), "NV8");
}

TEST_CASE("no NVLinkBandwidth matrix: NVLink unknown, PCIe relations only", "[nvlink]") {
  const std::string xml = slurp(fixture("topology/a100-nv4-mesh.xml"));
  const std::string without = replace_all(xml, "name=\"NVLinkBandwidth\"", "name=\"Other\"");
  const NodeTopology topo = from_buffer(without);
  CHECK_FALSE(topo.sources.nvlink_known);
  CHECK(topo.nvlinks.empty());
  CHECK(relation_between(topo, {DeviceRef::Kind::gpu, 0}, {DeviceRef::Kind::gpu, 1}).to_string() ==
        "NODE");
}

TEST_CASE("4x GH200: GPU memory NUMA nodes are not host memory; domains sort; NV6; NIC NODE",
          "[nvlink][gh200]") {
  const NodeTopology topo = load(fixture("topology/gh200-quad.xml"));
  REQUIRE(topo.gpus.size() == 4);
  REQUIRE(topo.nics.size() == 4);
  const std::vector<std::string> busids = {"0009:01:00.0", "0019:01:00.0", "0029:01:00.0",
                                           "0039:01:00.0"};
  for (int i = 0; i < 4; ++i) {
    const Gpu& gpu = topo.gpus[static_cast<std::size_t>(i)];
    CHECK(gpu.busid.to_string() == busids[static_cast<std::size_t>(i)]);
    // R-LOC-3: the package holds the Grace node and the GPU's HBM node; host NUMA = Grace.
    CHECK(gpu.numa == i);
    CHECK(gpu.cpus.size() == 4);
    CHECK(closest_nics(topo, i) == std::vector<int>{i});
    CHECK(pcie_relation(topo, {DeviceRef::Kind::gpu, i}, {DeviceRef::Kind::nic, i}).to_string() ==
          "NODE");
  }
  REQUIRE(topo.numa_nodes.size() == 8);
  const NumaNode* hbm = topo.numa(4);
  REQUIRE(hbm != nullptr);
  CHECK(hbm->gpu_memory);
  REQUIRE(hbm->gpu_busid);
  CHECK(hbm->gpu_busid->to_string() == "0009:01:00.0");
  CHECK_FALSE(topo.numa(0)->gpu_memory);
  for (const Core& core : topo.cores) CHECK(core.numa < 4);  // cores live on Grace memory
  check_all_pairs(topo, "NV6");
  CHECK(pcie_relation(topo, {DeviceRef::Kind::gpu, 0}, {DeviceRef::Kind::gpu, 1}).to_string() ==
        "SYS");
}
