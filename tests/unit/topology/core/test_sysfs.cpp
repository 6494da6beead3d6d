// Live-only annotations from sysfs (exact PCIe gen/width, IB port rate/link layer) written into
// the hwloc objects, then read by the same conversion as XML. Uses a made-up sysfs tree over the
// dgx-h100 fixture, so it runs on any host.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "catch.hpp"
#include "discover_internal.hpp"
#include "fixtures.hpp"

using namespace topolaunch::topology;
namespace fs = std::filesystem;
using topolaunch::topology::test::generated;

namespace {

void put(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

}  // namespace

TEST_CASE("sysfs link and port annotations reach the model", "[sysfs]") {
  std::string pattern = (fs::temp_directory_path() / "topology-sysfs-XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  const fs::path root = pattern;
  const fs::path gpu0 = root / "bus/pci/devices/0000:1b:00.0";
  put(gpu0 / "current_link_speed", "32.0 GT/s PCIe");
  put(gpu0 / "current_link_width", "8");
  put(gpu0 / "max_link_speed", "32.0 GT/s PCIe");
  put(gpu0 / "max_link_width", "16");
  const fs::path gpu1 = root / "bus/pci/devices/0000:43:00.0";
  put(gpu1 / "current_link_speed", "2.5 GT/s PCIe");  // idle GPU, down-trained
  put(gpu1 / "current_link_width", "16");
  put(gpu1 / "max_link_speed", "32.0 GT/s PCIe");
  put(gpu1 / "max_link_width", "16");
  const fs::path port = root / "class/infiniband/mlx5_0/ports/1";
  put(port / "state", "4: ACTIVE");
  put(port / "phys_state", "5: LinkUp");
  put(port / "rate", "400 Gb/sec (4X NDR)");
  put(port / "link_layer", "InfiniBand");

  detail::HwlocTopology hwloc;
  detail::configure(hwloc.get());
  REQUIRE(hwloc_topology_set_xml(hwloc.get(), generated("dgx-h100.pci.xml").c_str()) == 0);
  REQUIRE(hwloc_topology_load(hwloc.get()) == 0);
  detail::annotate_from_sysfs(hwloc.get(), root.string());
  const NodeTopology topo = detail::convert(hwloc.get(), {}, "annotated");
  fs::remove_all(root);

  // The fixture's pci_link_speed alone says Gen5 x16; sysfs says x8 of x16.
  CHECK(topo.gpus[0].link.gen == 5);
  CHECK(topo.gpus[0].link.width == 8);
  CHECK(topo.gpus[0].link.max_gen == 5);
  CHECK(topo.gpus[0].link.max_width == 16);
  CHECK(topo.gpus[1].link.gen == 1);
  CHECK(topo.gpus[1].link.width == 16);
  CHECK(topo.gpus[1].link.max_gen == 5);
  // No sysfs entry: decoded from the speed, maximum unknown.
  CHECK(topo.gpus[2].link.gen == 5);
  CHECK(topo.gpus[2].link.width == 16);
  CHECK(topo.gpus[2].link.max_width == 0);

  const Nic* nic = topo.nic_by_name("mlx5_0");
  REQUIRE(nic != nullptr);
  REQUIRE(nic->ports.size() == 1);
  CHECK(nic->ports[0].number == 1);
  CHECK(nic->ports[0].state == 4);
  CHECK(nic->ports[0].physical_state == 5);
  CHECK(nic->ports[0].rate_gbps == 400.0);
  CHECK(nic->ports[0].link_layer == "InfiniBand");
  CHECK(nic->ports[0].gids.size() == 1);  // Port1GID0 from hwloc
  const Nic* other = topo.nic_by_name("mlx5_3");
  REQUIRE(other != nullptr);
  CHECK(other->ports.at(0).rate_gbps == 0.0);  // unknown without sysfs
}
