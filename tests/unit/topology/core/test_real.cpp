// Real captures from ../shared/topologies/real (read in place, never copied into the project):
// the relations listed in research/topology.md §6/§7 and topologies/real/README.md.
#include <string>
#include <vector>

#include "catch.hpp"
#include "fixtures.hpp"
#include "topolaunch/topology/relation.hpp"
#include "topolaunch/topology/serialize.hpp"

using namespace topolaunch::topology;
using topolaunch::topology::test::load;
using topolaunch::topology::test::real;

namespace {

DeviceRef gpu(int i) { return {DeviceRef::Kind::gpu, i}; }
DeviceRef nic(int k) { return {DeviceRef::Kind::nic, k}; }

std::vector<std::string> row(const NodeTopology& topo, int gpu_index, bool with_nvlink) {
  const RelationMatrix m = relation_matrix(topo, with_nvlink);
  std::vector<std::string> out;
  for (const Relation& r : m.cells.at(static_cast<std::size_t>(gpu_index))) {
    out.push_back(r.to_string());
  }
  return out;
}

void check_round_trip(const NodeTopology& topo) {
  auto back = from_json(to_json(topo, /*pretty=*/true), "round trip");
  REQUIRE(back.ok());
  CHECK(*back == topo);
}

}  // namespace

TEST_CASE("DGX-2: GPU0 row equals NVIDIA's published matrix, NV6 through NVSwitches", "[real]") {
  const NodeTopology topo = load(real("hwloc__nvidiaDGX2.xml"));
  REQUIRE(topo.gpus.size() == 16);
  CHECK(topo.nvswitches.size() == 11);  // the trimmed hwloc test file lists 11 of the 12
  CHECK(topo.gpus[0].busid.to_string() == "0000:34:00.0");
  CHECK(topo.gpus[15].busid.to_string() == "0000:e7:00.0");
  CHECK(topo.gpus[0].model == "Tesla V100-SXM3-32GB-H");
  CHECK(topo.gpus[0].uuid.starts_with("GPU-"));
  const std::vector<std::string> published = {"X",    "PIX",  "PXB", "PXB", "NODE", "NODE",
                                              "NODE", "NODE", "SYS", "SYS", "SYS",  "SYS",
                                              "SYS",  "SYS",  "SYS", "SYS"};
  CHECK(row(topo, 0, /*with_nvlink=*/false) == published);
  REQUIRE(topo.sources.nvlink_known);
  for (std::size_t i = 0; i < 16; ++i) {
    for (std::size_t j = 0; j < 16; ++j) {
      CHECK(
          relation_between(topo, gpu(static_cast<int>(i)), gpu(static_cast<int>(j))).to_string() ==
          (i == j ? "X" : "NV6"));
    }
  }
  CHECK(topo.nvlink_per_link_mbps == 25000);
  check_round_trip(topo);
}

TEST_CASE("POWER8 Minsky: NVLink1 counts 20000 MB/s per link (NV2), GPU<->CPU entries ignored",
          "[real]") {
  const NodeTopology topo = load(real("hwloc__power8gpudistances.xml"));
  REQUIRE(topo.gpus.size() == 4);
  CHECK(topo.gpus[0].busid.to_string() == "0002:01:00.0");
  CHECK(topo.nvlink_per_link_mbps == 20000);
  CHECK(relation_between(topo, gpu(0), gpu(1)).to_string() == "NV2");
  CHECK(relation_between(topo, gpu(2), gpu(3)).to_string() == "NV2");
  CHECK(relation_between(topo, gpu(0), gpu(2)).to_string() == "SYS");
  check_round_trip(topo);
}

TEST_CASE("g4dn.metal: root port per GPU gives PHB/NODE/SYS, one EFA NIC, osdevs not GPUs",
          "[real]") {
  const NodeTopology topo = load(real("mpibind__g4dnmetal.xml"));
  REQUIRE(topo.gpus.size() == 8);  // cuda/opencl/nvml OS devices annotate, never add GPUs
  REQUIRE(topo.nics.size() == 1);
  CHECK(topo.nics[0].name == "rdmap197s0");
  CHECK(pcie_relation(topo, gpu(0), gpu(1)).to_string() == "PHB");
  CHECK(pcie_relation(topo, gpu(0), gpu(2)).to_string() == "NODE");
  CHECK(pcie_relation(topo, gpu(0), gpu(4)).to_string() == "SYS");
  CHECK(pcie_relation(topo, gpu(4), nic(0)).to_string() == "NODE");
  CHECK(topo.gpus[0].cpus.to_list() == "0-23,48-71");
  CHECK(topo.nvlinks.empty());
  check_round_trip(topo);
}

TEST_CASE("JURECA-DC: GPU order by bus id, GPUn-NICn PIX, everything else SYS", "[real]") {
  const NodeTopology topo = load(real("psmgmt__topo.jrc0323.xml"));
  REQUIRE(topo.gpus.size() == 4);
  REQUIRE(topo.nics.size() == 4);
  CHECK(topo.gpus[0].busid.to_string() == "0000:03:00.0");  // hwloc meets 44:00.0 first
  const std::vector<int> numa = {3, 1, 7, 5};
  for (int i = 0; i < 4; ++i) {
    CHECK(topo.gpus[static_cast<std::size_t>(i)].numa == numa[static_cast<std::size_t>(i)]);
    CHECK(topo.nics[static_cast<std::size_t>(i)].name == "mlx5_" + std::to_string(i));
    for (int k = 0; k < 4; ++k) {
      CHECK(pcie_relation(topo, gpu(i), nic(k)).to_string() == (i == k ? "PIX" : "SYS"));
      if (k != i) CHECK(pcie_relation(topo, gpu(i), gpu(k)).to_string() == "SYS");
    }
  }
  CHECK(topo.gpus[0].cpus.to_list() == "48-63,176-191");
  CHECK(topo.gpus[0].link.gen == 4);  // 31.5 GB/s: Gen4 x16, not Gen5 x8
  CHECK(topo.gpus[0].link.width == 16);
  CHECK(topo.numa_nodes.size() == 8);
  check_round_trip(topo);
}

TEST_CASE("JUWELS Booster: same PCI layout as JURECA-DC with 6-core NUMA nodes", "[real]") {
  const NodeTopology topo = load(real("psmgmt__topo.jwb0004.xml"));
  REQUIRE(topo.gpus.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(closest_nics(topo, i) == std::vector<int>{i});
  }
  CHECK(topo.gpus[0].cpus.to_list() == "18-23,66-71");
}

TEST_CASE("cts1-pascal: both GPUs and the NIC on one switch are PIX", "[real]") {
  const NodeTopology topo = load(real("mpibind__cts1-pascal.xml"));
  REQUIRE(topo.gpus.size() == 2);
  REQUIRE(topo.nics.size() == 1);
  CHECK(pcie_relation(topo, gpu(0), gpu(1)).to_string() == "PIX");
  CHECK(pcie_relation(topo, gpu(0), nic(0)).to_string() == "PIX");
  CHECK(pcie_relation(topo, gpu(1), nic(0)).to_string() == "PIX");
  check_round_trip(topo);
}

TEST_CASE("MeluXina: DRM osdevs and the BMC VGA are no GPUs; two GPUs without a local NIC",
          "[real]") {
  const NodeTopology topo = load(real("psmgmt__topo.mel2001.xml"));
  REQUIRE(topo.gpus.size() == 4);
  REQUIRE(topo.nics.size() == 2);
  int without_local_nic = 0;
  for (int i = 0; i < 4; ++i) {
    const std::vector<int> best = closest_nics(topo, i);
    REQUIRE_FALSE(best.empty());
    if (pcie_relation(topo, gpu(i), nic(best.front())).kind == RelationKind::SYS) {
      ++without_local_nic;
      CHECK(best.size() == 2);  // every NIC is equally far
    }
  }
  CHECK(without_local_nic == 2);
  CHECK(pcie_relation(topo, gpu(0), nic(0)).to_string() == "SYS");
  CHECK(pcie_relation(topo, gpu(1), nic(0)).to_string() == "PIX");
  check_round_trip(topo);
}

TEST_CASE("JUWELS Cluster: hwloc v1 XML loads; 2 GPUs and 1 NIC per switch", "[real]") {
  const NodeTopology topo = load(real("psmgmt__topo.jwc09n003.xml"));
  REQUIRE(topo.gpus.size() == 4);
  REQUIRE(topo.nics.size() == 2);
  CHECK(topo.sources.hwloc_file_version == "1.11.9");
  CHECK(pcie_relation(topo, gpu(0), gpu(1)).to_string() == "PIX");
  CHECK(closest_nics(topo, 0) == std::vector<int>{0});
  CHECK(closest_nics(topo, 1) == std::vector<int>{0});
  CHECK(closest_nics(topo, 2) == std::vector<int>{1});
  check_round_trip(topo);
}

TEST_CASE("JUSUF: v1 XML, dual-function NIC on another NUMA node", "[real]") {
  const NodeTopology topo = load(real("psmgmt__topo.jsfc005.xml"));
  REQUIRE(topo.gpus.size() == 1);
  REQUIRE(topo.nics.size() == 2);
  CHECK(topo.gpus[0].numa == 3);
  CHECK(topo.nics[0].numa == 2);
  CHECK(pcie_relation(topo, nic(0), nic(1)).to_string() == "PIX");
  CHECK(pcie_relation(topo, gpu(0), nic(0)).to_string() == "SYS");
}

TEST_CASE("Lassen: NUMA os indexes 0 and 8, PCI domains, GPU and NIC on different PHBs (NODE)",
          "[real]") {
  const NodeTopology topo = load(real("mpibind__coral-lassen.xml"));
  REQUIRE(topo.numa_nodes.size() == 2);
  CHECK(topo.numa_nodes[0].os_index == 0);
  CHECK(topo.numa_nodes[1].os_index == 8);
  REQUIRE(topo.gpus.size() == 4);
  CHECK(topo.gpus[2].busid.to_string() == "0035:03:00.0");
  CHECK(topo.gpus[0].numa == 0);
  CHECK(topo.gpus[2].numa == 8);
  CHECK(pcie_relation(topo, gpu(0), nic(0)).to_string() == "NODE");
  CHECK(pcie_relation(topo, gpu(0), gpu(2)).to_string() == "SYS");
  CHECK(topo.cores.front().pus.size() == 4);  // SMT4
  check_round_trip(topo);
}
