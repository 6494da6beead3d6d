// Every generated fixture against its .expected.json (computed from the node specification,
// independently of hwloc): GPU order, NUMA, NICs, closest NICs, the whole matrix.
#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "fixtures.hpp"
#include "topolaunch/topology/relation.hpp"
#include "topolaunch/topology/serialize.hpp"

using namespace topolaunch::topology;
using topolaunch::topology::test::generated;
using topolaunch::topology::test::load;
using topolaunch::topology::test::slurp;

namespace {

void check_devices(const NodeTopology& topo, const nlohmann::json& expected) {
  const auto& gpus = expected.at("gpus");
  REQUIRE(topo.gpus.size() == gpus.size());
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    INFO("GPU" << i);
    CHECK(topo.gpus[i].index == static_cast<int>(i));
    CHECK(topo.gpus[i].busid.to_string() == gpus[i].at("busid").get<std::string>());
    CHECK(topo.gpus[i].numa == gpus[i].at("numa").get<int>());
    CHECK_FALSE(topo.gpus[i].cpus.empty());
    // Storage NICs count here: choosing compute NICs is the rank mapping's business.
    std::vector<std::string> closest;
    for (int k : closest_nics(topo, static_cast<int>(i), /*include_all_roles=*/true)) {
      closest.push_back(topo.nics[static_cast<std::size_t>(k)].name);
    }
    CHECK(closest == gpus[i].at("closest_nics").get<std::vector<std::string>>());
    const auto relation =
        pcie_relation(topo, {DeviceRef::Kind::gpu, static_cast<int>(i)},
                      {DeviceRef::Kind::nic, closest_nics(topo, static_cast<int>(i), true).at(0)});
    CHECK(relation.to_string() == gpus[i].at("closest_nic_relation").get<std::string>());
  }
  const auto& nics = expected.at("nics");
  REQUIRE(topo.nics.size() == nics.size());
  for (std::size_t k = 0; k < nics.size(); ++k) {
    INFO("NIC" << k);
    CHECK(topo.nics[k].name == nics[k].at("rdma").get<std::string>());
    CHECK(topo.nics[k].busid.to_string() == nics[k].at("busid").get<std::string>());
    CHECK(topo.nics[k].numa == nics[k].at("numa").get<int>());
    CHECK(topo.nics[k].netdev == nics[k].at("netdev").get<std::string>());
    CHECK(topo.nics[k].has_driver);
    CHECK(topo.nics[k].ports.size() == 1);
  }
}

void check_matrix(const RelationMatrix& matrix, const nlohmann::json& expected) {
  REQUIRE(matrix.labels.size() == expected.size());
  for (std::size_t r = 0; r < matrix.labels.size(); ++r) {
    for (std::size_t c = 0; c < matrix.labels.size(); ++c) {
      INFO(matrix.labels[r] << " -> " << matrix.labels[c]);
      CHECK(matrix.cells[r][c].to_string() ==
            expected.at(matrix.labels[r]).at(matrix.labels[c]).get<std::string>());
    }
  }
}

}  // namespace

TEST_CASE("generated fixtures match their expected results", "[golden]") {
  for (const char* type : {"dgx-h100", "dgx-a100", "pcie-l40s-8gpu"}) {
    DYNAMIC_SECTION(type) {
      const auto expected =
          nlohmann::json::parse(slurp(generated(std::string(type) + ".expected.json")));
      const NodeTopology pci = load(generated(std::string(type) + ".pci.xml"));
      const NodeTopology full = load(generated(std::string(type) + ".full.xml"));
      check_devices(pci, expected);
      check_devices(full, expected);
      // .pci.xml: no NVLink data at all, so both matrices are the PCIe one.
      CHECK(pci.nvlinks.empty());
      CHECK_FALSE(pci.sources.nvlink_known);
      check_matrix(relation_matrix(pci, /*with_nvlink=*/false), expected.at("matrix_pcie"));
      check_matrix(relation_matrix(pci, /*with_nvlink=*/true), expected.at("matrix_pcie"));
      // .full.xml: NV# from the switch-merged NVLinkBandwidth matrix.
      check_matrix(relation_matrix(full, /*with_nvlink=*/false), expected.at("matrix_pcie"));
      check_matrix(relation_matrix(full, /*with_nvlink=*/true), expected.at("matrix"));
      if (expected.at("nvlink_per_link_mbps").is_number()) {
        CHECK(full.nvlink_per_link_mbps == expected.at("nvlink_per_link_mbps").get<int>());
        CHECK(full.sources.nvlink_known);
      }
      // JSON round trip is lossless and gives the same matrices.
      for (const NodeTopology* topo : {&pci, &full}) {
        auto back = from_json(to_json(*topo), "round trip");
        REQUIRE(back.ok());
        CHECK(*back == *topo);
        check_matrix(relation_matrix(*back, true),
                     expected.at(topo == &pci ? "matrix_pcie" : "matrix"));
      }
    }
  }
}

TEST_CASE("an InfiniBand function without an OpenFabrics device is a NIC without driver",
          "[golden][nic]") {
  std::string xml = slurp(generated("dgx-h100.pci.xml"));
  // Drop mlx5_3's OpenFabrics OS device (driver not loaded): its PCI function stays.
  const auto start = xml.find("<object type=\"OSDev\" gp_index=");
  REQUIRE(start != std::string::npos);
  const auto name = xml.find("name=\"mlx5_3\"");
  REQUIRE(name != std::string::npos);
  const auto open = xml.rfind("<object type=\"OSDev\"", name);
  const auto close = xml.find("</object>", name) + std::string("</object>").size();
  xml.erase(open, close - open);
  auto topo = load_xml_buffer(xml, "dgx-h100 without mlx5_3 driver");
  REQUIRE(topo.ok());
  REQUIRE(topo->nics.size() == 12);
  CHECK(topo->nic_by_name("mlx5_3") == nullptr);
  const Nic& last = topo->nics.back();  // driverless NICs sort last
  CHECK_FALSE(last.has_driver);
  CHECK(last.name.empty());
  CHECK(last.busid.to_string() == "0000:40:00.0");
  CHECK(last.ports.empty());
  CHECK(topo->nics[3].name == "mlx5_4");
}
