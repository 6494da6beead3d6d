// NVML data -> model (R-NV-1, R-ID-5), with a made-up NVML report: the pure half of the NVML
// path, so it is tested on hosts without a GPU too.
#include "catch.hpp"
#include "discover_internal.hpp"

using namespace topolaunch::topology;
using topolaunch::topology::detail::apply_nvml;
using topolaunch::topology::detail::NvLinkRemote;
using topolaunch::topology::detail::NvmlGpu;
using topolaunch::topology::detail::NvmlLink;
using topolaunch::topology::detail::NvmlReport;

namespace {

PciAddress bus(unsigned b) { return PciAddress{0, static_cast<std::uint8_t>(b), 0, 0}; }

NodeTopology four_gpus() {
  NodeTopology topo;
  for (unsigned i = 0; i < 4; ++i) {
    Gpu gpu;
    gpu.index = static_cast<int>(i);
    gpu.busid = bus(0x10 + i);
    topo.gpus.push_back(gpu);
  }
  return topo;
}

}  // namespace

TEST_CASE("NVML unavailable leaves the topology alone", "[nvml]") {
  NodeTopology topo = four_gpus();
  const NodeTopology before = topo;
  NvmlReport report;
  report.why_not = "libnvidia-ml.so.1 not found";
  apply_nvml(topo, report);
  CHECK(topo == before);
  CHECK_FALSE(topo.sources.nvml);
}

TEST_CASE("NVSwitch fabric: NV# = min of both GPUs' switch links, matched by bus id", "[nvml]") {
  NodeTopology topo = four_gpus();
  NvmlReport report;
  report.available = true;
  // Listed in reverse: NVML's index order must not matter.
  for (int i = 3; i >= 0; --i) {
    NvmlGpu g;
    g.busid = bus(0x10 + static_cast<unsigned>(i));
    g.uuid = "GPU-" + std::to_string(i);
    g.model = "NVIDIA H100 80GB HBM3";
    const int per_switch[4] = {5, 4, 4, 5};
    for (unsigned sw = 0; sw < 4; ++sw) {
      // GPU2 has one link down on the first switch: 17 links.
      const int links = per_switch[sw] - (i == 2 && sw == 0 ? 1 : 0);
      for (int l = 0; l < links; ++l) {
        g.links.push_back({bus(0xe6 + sw).to_string(), NvLinkRemote::nvswitch});
      }
    }
    g.nvlink_version = 6;
    report.gpus.push_back(g);
  }
  apply_nvml(topo, report);
  CHECK(topo.sources.nvml);
  CHECK(topo.nvlink_per_link_mbps == 25000);
  CHECK(topo.sources.nvlink_known);
  CHECK(topo.gpus[0].uuid == "GPU-0");
  CHECK(topo.gpus[3].uuid == "GPU-3");
  CHECK(topo.gpus[1].model == "NVIDIA H100 80GB HBM3");
  REQUIRE(topo.nvlinks.size() == 4);
  CHECK(topo.nvlinks[0][1] == 18);
  CHECK(topo.nvlinks[1][3] == 18);
  CHECK(topo.nvlinks[0][2] == 17);
  CHECK(topo.nvlinks[2][3] == 17);
  CHECK(topo.nvlinks[1][1] == 0);
}

TEST_CASE("Direct NVLink mesh: links counted per peer; GPUs without NVLink get zeros", "[nvml]") {
  NodeTopology topo = four_gpus();
  NvmlReport report;
  report.available = true;
  for (unsigned i = 0; i < 3; ++i) {  // GPU3: PCIe only
    NvmlGpu g;
    g.busid = bus(0x10 + i);
    for (unsigned peer = 0; peer < 3; ++peer) {
      if (peer == i) continue;
      for (int l = 0; l < 4; ++l)
        g.links.push_back({bus(0x10 + peer).to_string(), NvLinkRemote::gpu});
    }
    report.gpus.push_back(g);
  }
  apply_nvml(topo, report);
  REQUIRE(topo.nvlinks.size() == 4);
  CHECK(topo.nvlinks[0][1] == 4);
  CHECK(topo.nvlinks[2][0] == 4);
  CHECK(topo.nvlinks[0][3] == 0);
  CHECK(topo.nvlinks[3][0] == 0);
}

TEST_CASE("VM with hidden NVSwitches (H200 VM: remote FFFFFFFF:FF:FF.0, type switch) is NV18",
          "[nvml]") {
  NodeTopology topo = four_gpus();
  topo.gpus.resize(2);
  NvmlReport report;
  report.available = true;
  for (unsigned i = 0; i < 2; ++i) {
    NvmlGpu g;
    g.busid = bus(0x10 + i);
    g.nvlink_version = 6;
    for (int l = 0; l < 18; ++l) g.links.push_back({"FFFFFFFF:FF:FF.0", NvLinkRemote::nvswitch});
    report.gpus.push_back(g);
  }
  apply_nvml(topo, report);
  REQUIRE(topo.nvlinks.size() == 2);
  CHECK(topo.nvlinks[0][1] == 18);
  CHECK(topo.nvlinks[1][0] == 18);
}

TEST_CASE("POWER9: NVLinks to the CPU are no GPU links; NVLink1 is 20000 MB/s per link", "[nvml]") {
  NodeTopology topo = four_gpus();
  NvmlReport report;
  report.available = true;
  for (unsigned i = 0; i < 4; ++i) {
    NvmlGpu g;
    g.busid = bus(0x10 + i);
    g.nvlink_version = 1;
    const unsigned peer = i ^ 1u;  // pairs 0-1, 2-3
    for (int l = 0; l < 2; ++l)
      g.links.push_back({bus(0x10 + peer).to_string(), NvLinkRemote::gpu});
    for (int l = 0; l < 2; ++l) g.links.push_back({"0000:00:00.0", NvLinkRemote::cpu});
    report.gpus.push_back(g);
  }
  apply_nvml(topo, report);
  CHECK(topo.nvlinks[0][1] == 2);
  CHECK(topo.nvlinks[2][3] == 2);
  CHECK(topo.nvlinks[0][2] == 0);
  CHECK(topo.nvlink_per_link_mbps == 20000);
}
