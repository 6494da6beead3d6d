// Live discovery: hwloc on this machine, plus what sysfs knows exactly (PCIe link gen/width,
// InfiniBand port rate/state/link layer), plus NVML when the driver is installed.
#include <hwloc.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <string>

#include "discover_internal.hpp"
#include "topolaunch/topology/discover.hpp"

namespace topolaunch::topology {

namespace detail {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

// "16.0 GT/s PCIe" (or "16 GT/s") -> 4; 0 when unknown.
int gen_from_speed(const std::string& text) {
  double gts = 0;
  if (std::sscanf(text.c_str(), "%lf", &gts) != 1) return 0;
  const struct {
    double gts;
    int gen;
  } table[] = {{2.5, 1}, {5, 2}, {8, 3}, {16, 4}, {32, 5}, {64, 6}, {128, 7}};
  for (const auto& row : table) {
    if (gts > row.gts * 0.95 && gts < row.gts * 1.05) return row.gen;
  }
  return 0;
}

void add_info(hwloc_obj_t obj, const char* name, const std::string& value) {
  if (!value.empty() && hwloc_obj_get_info_by_name(obj, name) == nullptr) {
    hwloc_obj_add_info(obj, name, value.c_str());
  }
}

void add_positive(hwloc_obj_t obj, const char* name, int value) {
  if (value > 0) add_info(obj, name, std::to_string(value));
}

int parse_int(const std::string& text) {
  int value = 0;
  return std::sscanf(text.c_str(), "%d", &value) == 1 ? value : 0;
}

}  // namespace

void annotate_from_sysfs(hwloc_topology_t topology, const std::string& sysfs_root) {
  for (hwloc_obj_t d = nullptr; (d = hwloc_get_next_pcidev(topology, d));) {
    const auto& pci = d->attr->pcidev;
    char busid[32];
    std::snprintf(busid, sizeof busid, "%04x:%02x:%02x.%x", static_cast<unsigned>(pci.domain),
                  pci.bus, pci.dev, pci.func);
    const std::string dir = sysfs_root + "/bus/pci/devices/" + busid + "/";
    add_positive(d, "PCIeLinkGen", gen_from_speed(read_line(dir + "current_link_speed")));
    add_positive(d, "PCIeLinkWidth", parse_int(read_line(dir + "current_link_width")));
    add_positive(d, "PCIeMaxLinkGen", gen_from_speed(read_line(dir + "max_link_speed")));
    add_positive(d, "PCIeMaxLinkWidth", parse_int(read_line(dir + "max_link_width")));
  }
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(topology, o));) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || o->name == nullptr) continue;
    const std::string ports_dir = sysfs_root + "/class/infiniband/" + o->name + "/ports/";
    for (int port = 1; port <= 8; ++port) {
      const std::string dir = ports_dir + std::to_string(port) + "/";
      const std::string state = read_line(dir + "state");  // "4: ACTIVE"
      if (state.empty()) continue;
      const std::string prefix = "Port" + std::to_string(port);
      add_positive(o, (prefix + "State").c_str(), parse_int(state));
      add_positive(o, (prefix + "PhysState").c_str(), parse_int(read_line(dir + "phys_state")));
      double rate = 0;  // "400 Gb/sec (4X NDR)"
      if (std::sscanf(read_line(dir + "rate").c_str(), "%lf", &rate) == 1 && rate > 0) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", rate);
        add_info(o, (prefix + "Rate").c_str(), text);
      }
      add_info(o, (prefix + "LinkLayer").c_str(), read_line(dir + "link_layer"));
      const std::string gid0 = read_line(dir + "gids/0");
      if (!gid0.empty() && gid0 != "0000:0000:0000:0000:0000:0000:0000:0000") {
        add_info(o, (prefix + "GID0").c_str(), gid0);
      }
    }
  }
}

}  // namespace detail

Result<NodeTopology> discover_live(const DiscoverOptions& options) {
  detail::HwlocTopology topology;
  detail::configure(topology.get());
  // PCI from sysfs (the linux backend) rather than hwloc's libpciaccess component: same devices
  // and link speeds, and the libpciaccess path leaks ~1 MB per load (seen with ASan, hwloc 2.9).
  hwloc_topology_set_components(topology.get(), HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
  if (hwloc_topology_load(topology.get()) != 0) {
    return make_error("hwloc cannot discover this machine's topology (hwloc_topology_load failed)",
                      2);
  }
  detail::annotate_from_sysfs(topology.get());
  DiscoverOptions effective = options;
  if (effective.hostname.empty()) {
    char name[HOST_NAME_MAX + 1] = {};
    if (gethostname(name, sizeof name - 1) == 0) effective.hostname = name;
  }
  NodeTopology topo = detail::convert(topology.get(), effective, "live");
  if (options.use_nvml) {
    detail::apply_nvml(topo, detail::query_nvml());
  }
  return topo;
}

}  // namespace topolaunch::topology
