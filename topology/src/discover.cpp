// Discovery from hwloc XML and the shared hwloc -> model conversion (research topology.md §6:
// R-LOAD, R-ID, R-LOC, R-NV-2). Live discovery adds sysfs/NVML data in discover_live.cpp.
#include "topolaunch/topology/discover.hpp"

#include <hwloc.h>
#include <sys/stat.h>

#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "discover_internal.hpp"
#include "topolaunch/common/isolated.hpp"
#include "topolaunch/topology/serialize.hpp"

namespace topolaunch::topology {

namespace {

constexpr std::uint16_t kNvidia = 0x10de;
// A node's description as JSON: about 15 KB for a DGX H100 (tests/fixtures/slurm), far below
// this for any machine hwloc describes.
constexpr std::size_t kMaxTopologyJsonBytes = std::size_t{64} << 20;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

// ---- NicFilter (NCCL_IB_HCA syntax) ----------------------------------------------------

Result<NicFilter> NicFilter::parse(std::string_view text) {
  NicFilter filter;
  text = trim(text);
  bool exclude = false;
  if (text.starts_with('^')) {
    exclude = true;
    text.remove_prefix(1);
  }
  if (text.starts_with('=')) {
    filter.exact = true;
    text.remove_prefix(1);
  }
  if (text.empty()) {
    if (exclude || filter.exact) {
      return make_error("nic filter '" + std::string(text) +
                        "': no nic names after '^'/'=' (example: ^=mlx5_1,mlx5_2)");
    }
    return filter;
  }
  std::vector<std::string>& names = exclude ? filter.exclude : filter.include;
  while (true) {
    auto comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    auto colon = item.find(':');  // port suffix ("mlx5_0:1"): ports are not filtered here
    std::string_view name = trim(item.substr(0, colon));
    if (name.empty()) {
      return make_error(
          "nic filter: empty nic name in the list (NCCL_IB_HCA syntax, e.g. "
          "mlx5_0,mlx5_3 or ^=mlx5_1,mlx5_2)");
    }
    names.emplace_back(name);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return filter;
}

bool NicFilter::selects(std::string_view nic_name) const {
  auto matches = [&](const std::string& pattern) {
    return exact ? nic_name == pattern : nic_name.starts_with(pattern);
  };
  if (!include.empty() && std::none_of(include.begin(), include.end(), matches)) {
    return false;
  }
  return std::none_of(exclude.begin(), exclude.end(), matches);
}

std::vector<std::string> NicFilter::unmatched(const std::vector<std::string>& nic_names) const {
  std::vector<std::string> out;
  for (const std::string& pattern : include) {
    const bool found = std::any_of(nic_names.begin(), nic_names.end(), [&](const std::string& n) {
      return exact ? n == pattern : std::string_view(n).starts_with(pattern);
    });
    if (!found) out.push_back(pattern);
  }
  return out;
}

Status check_named_nics(const NicFilter& filter, const NodeTopology& topo, std::string_view node,
                        std::string_view what) {
  std::vector<std::string> names;
  for (const Nic& nic : topo.nics) {
    if (!nic.name.empty()) names.push_back(nic.name);
  }
  const std::vector<std::string> missing = filter.unmatched(names);
  if (missing.empty()) return ok_status();
  auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
    return out;
  };
  return make_error(fmt::format(
      "{}: node {} has no NIC{} {} ({})", what, node, missing.size() == 1 ? "" : "s", join(missing),
      names.empty() ? "it has no RDMA NICs" : "its NICs: " + join(names)));
}

namespace detail {

void configure(hwloc_topology_t topology) {
  hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  hwloc_topology_set_flags(topology, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
}

namespace {

CpuSet to_cpuset(hwloc_const_bitmap_t bitmap) {
  std::vector<int> ids;
  if (bitmap == nullptr || hwloc_bitmap_weight(bitmap) < 0) {
    return {};
  }
  int id = -1;
  while ((id = hwloc_bitmap_next(bitmap, id)) != -1) {
    ids.push_back(id);
  }
  return CpuSet(std::move(ids));
}

int os_index_of(hwloc_obj_t obj) {
  return obj == nullptr || obj->os_index == HWLOC_UNKNOWN_INDEX ? -1
                                                                : static_cast<int>(obj->os_index);
}

std::string info(hwloc_obj_t obj, const char* name) {
  const char* value = hwloc_obj_get_info_by_name(obj, name);
  return value == nullptr ? std::string() : std::string(value);
}

int info_int(hwloc_obj_t obj, const char* name) {
  const std::string text = info(obj, name);
  if (text.empty()) return 0;
  try {
    return std::stoi(text, nullptr, 0);
  } catch (const std::exception&) {
    return 0;
  }
}

bool is_osdev(hwloc_obj_t obj, hwloc_obj_osdev_type_t type) {
  return obj->type == HWLOC_OBJ_OS_DEVICE && obj->attr->osdev.type == type;
}

PciAddress address_of(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return PciAddress{static_cast<std::uint32_t>(pci.domain), pci.bus, pci.dev, pci.func};
}

// Per-lane data rate in GB/s the way hwloc computes pci_link_speed: Gen1/2 8b/10b,
// Gen3-5 128b/130b, Gen6 242b/256b FLIT.
double lane_gbytes_per_s(int gen) {
  switch (gen) {
    case 1:
      return 2.5 * 0.8 / 8;
    case 2:
      return 5.0 * 0.8 / 8;
    case 3:
      return 8.0 * 128 / 130 / 8;
    case 4:
      return 16.0 * 128 / 130 / 8;
    case 5:
      return 32.0 * 128 / 130 / 8;
    case 6:
      return 64.0 * 242 / 256 / 8;
    default:
      return 0;
  }
}

// pci_link_speed (GB/s = lane rate x width) -> gen and width. Ambiguous values (31.5 GB/s is
// Gen5 x8 and Gen4 x16) resolve to x16 (the usual GPU/NIC slot), then narrower widths; exact values
// come from our PCIeLink* info annotations when present (see link_of).
PcieLink decode_link_speed(double gbytes_per_s) {
  PcieLink link;
  link.speed_gbytes_per_s = gbytes_per_s;
  if (gbytes_per_s <= 0) return link;
  for (int width : {16, 8, 4, 2, 1, 32, 12}) {
    for (int gen = 1; gen <= 6; ++gen) {
      const double expected = lane_gbytes_per_s(gen) * width;
      if (std::fabs(expected - gbytes_per_s) <= 0.005 * expected) {
        link.gen = gen;
        link.width = width;
        return link;
      }
    }
  }
  return link;
}

// PCIe link of a PCI device. hwloc XML only has pci_link_speed (current speed x width), which
// is ambiguous, so live discovery (which reads sysfs current/max_link_speed/width exactly)
// annotates the PCIDev with infos PCIeLinkGen, PCIeLinkWidth, PCIeMaxLinkGen and
// PCIeMaxLinkWidth (annotate_from_sysfs). Those annotations win whenever a file carries them
// (an XML exported from a live topology, or a hand-edited fixture); otherwise gen/width are
// decoded from the speed and the maximum stays unknown (0).
PcieLink link_of(hwloc_obj_t pcidev) {
  PcieLink link = decode_link_speed(pcidev->attr->pcidev.linkspeed);
  if (int gen = info_int(pcidev, "PCIeLinkGen"); gen > 0) link.gen = gen;
  if (int width = info_int(pcidev, "PCIeLinkWidth"); width > 0) link.width = width;
  link.max_gen = info_int(pcidev, "PCIeMaxLinkGen");
  link.max_width = info_int(pcidev, "PCIeMaxLinkWidth");
  return link;
}

class Converter {
 public:
  Converter(hwloc_topology_t topology, const DiscoverOptions& options)
      : t_(topology), options_(options) {}

  NodeTopology run(const std::string& origin) {
    hwloc_obj_t root = hwloc_get_root_obj(t_);
    topo_.hostname = options_.hostname.empty() ? info(root, "HostName") : options_.hostname;
    topo_.product = info(root, "DMIProductName");
    topo_.sources.origin = origin;
    // The hwloc release we were built with ("2.9.0", what admins know); the runtime library's
    // API version is added only when it differs from the headers' (another hwloc at run time).
    topo_.sources.hwloc_api_version = HWLOC_VERSION;
    if (const unsigned api = hwloc_get_api_version(); api != HWLOC_API_VERSION) {
      topo_.sources.hwloc_api_version +=
          fmt::format(" (runtime api {}.{}.{})", api >> 16, (api >> 8) & 0xff, api & 0xff);
    }
    topo_.sources.hwloc_file_version = info(root, "hwlocVersion");
    topo_.allowed_cpus = to_cpuset(hwloc_topology_get_allowed_cpuset(t_));
    read_cpu_side();
    read_devices();
    read_nvlink_distances();
    read_io_backends();
    return std::move(topo_);
  }

 private:
  void read_cpu_side() {
    for (hwloc_obj_t p = nullptr; (p = hwloc_get_next_obj_by_type(t_, HWLOC_OBJ_PACKAGE, p));) {
      topo_.packages.push_back({os_index_of(p), to_cpuset(p->cpuset), info(p, "CPUModel")});
    }
    std::sort(topo_.packages.begin(), topo_.packages.end(),
              [](const Package& a, const Package& b) { return a.os_index < b.os_index; });
    for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(t_, HWLOC_OBJ_NUMANODE, n));) {
      NumaNode node;
      node.os_index = os_index_of(n);
      node.cpus = to_cpuset(n->cpuset);
      node.memory_bytes = n->attr->numanode.local_memory;
      // R-LOC-3: Grace Hopper / POWER9 GPU HBM, never host memory.
      node.gpu_memory = n->subtype != nullptr && std::strcmp(n->subtype, "GPUMemory") == 0;
      if (node.gpu_memory) {
        node.gpu_busid = PciAddress::parse(info(n, "PCIBusID"));
      } else {
        host_numa_.push_back(n);
      }
      topo_.numa_nodes.push_back(std::move(node));
    }
    std::sort(topo_.numa_nodes.begin(), topo_.numa_nodes.end(),
              [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
    // Cores from PUs, so machines whose XML has no Core level still get one core per PU.
    std::map<hwloc_obj_t, Core> cores;
    for (hwloc_obj_t pu = nullptr; (pu = hwloc_get_next_obj_by_type(t_, HWLOC_OBJ_PU, pu));) {
      hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(t_, HWLOC_OBJ_CORE, pu);
      hwloc_obj_t key = core != nullptr ? core : pu;
      Core& c = cores[key];
      c.os_index = os_index_of(key);
      c.package = os_index_of(hwloc_get_ancestor_obj_by_type(t_, HWLOC_OBJ_PACKAGE, pu));
      c.pus = c.pus | CpuSet({os_index_of(pu)});
    }
    for (auto& [obj, core] : cores) {
      for (hwloc_obj_t n : host_numa_) {
        if (hwloc_bitmap_isset(n->cpuset, static_cast<unsigned>(core.pus.first()))) {
          core.numa = os_index_of(n);
          break;
        }
      }
      topo_.cores.push_back(std::move(core));
    }
    std::sort(topo_.cores.begin(), topo_.cores.end(),
              [](const Core& a, const Core& b) { return a.pus.first() < b.pus.first(); });
  }

  // R-LOC-1/2: locality = first non-I/O ancestor; NUMA = its single host NUMA node.
  struct Locality {
    int numa = -1;
    CpuSet cpus;
    bool known = true;
  };
  Locality locality_of(hwloc_obj_t obj) const {
    Locality out;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t_, obj);
    if (anc == nullptr) {
      out.known = false;
      return out;
    }
    if (anc == hwloc_get_root_obj(t_) && host_numa_.size() > 1) {
      out.known = false;  // VMs, BIOS without _PXM: the device hangs under the Machine
      return out;
    }
    out.cpus = to_cpuset(anc->cpuset);
    std::vector<int> numa;
    for (hwloc_obj_t n : host_numa_) {
      if (anc->nodeset != nullptr && hwloc_bitmap_isset(anc->nodeset, n->os_index)) {
        numa.push_back(os_index_of(n));
      }
    }
    if (numa.size() == 1) out.numa = numa.front();
    return out;
  }

  // Host bridge and PCI bridges from the root port down to the device's parent.
  PciPath path_of(hwloc_obj_t obj) {
    PciPath path;
    std::vector<PciAddress> below;
    for (hwloc_obj_t p = obj->parent; p != nullptr && p->type == HWLOC_OBJ_BRIDGE; p = p->parent) {
      if (p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
        path.host_bridge = host_bridge_name(p);
        path.bridges.assign(below.rbegin(), below.rend());
      } else if (p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI) {
        below.push_back(address_of(p->attr->bridge.upstream.pci));
      }
    }
    return path;
  }

  // "dddd:[ss-ee]"; unique per host bridge object even in odd files (suffix on collision).
  std::string host_bridge_name(hwloc_obj_t bridge) {
    auto known = host_bridge_names_.find(bridge);
    if (known != host_bridge_names_.end()) return known->second;
    const auto& down = bridge->attr->bridge.downstream.pci;
    std::string name = fmt::format("{:04x}:[{:02x}-{:02x}]", down.domain, down.secondary_bus,
                                   down.subordinate_bus);
    if (used_host_bridge_names_.count(name) != 0) {
      name += fmt::format("@{}", bridge->gp_index);
    }
    used_host_bridge_names_.insert(name);
    host_bridge_names_[bridge] = name;
    return name;
  }

  void read_devices() {
    for (hwloc_obj_t d = nullptr; (d = hwloc_get_next_pcidev(t_, d));) {
      const auto& pci = d->attr->pcidev;
      const unsigned base_class = pci.class_id >> 8;
      // R-ID-1: NVIDIA display/3D controllers (and processing accelerators); not NVSwitches,
      // audio functions, other vendors' VGA, nor the OS devices hanging on a GPU.
      const bool gpu = pci.vendor_id == kNvidia &&
                       (pci.class_id == 0x0300 || pci.class_id == 0x0302 || base_class == 0x12);
      const bool nvswitch = pci.vendor_id == kNvidia && pci.class_id == 0x0680;
      hwloc_obj_t rdma = nullptr;
      hwloc_obj_t netdev = nullptr;
      for (hwloc_obj_t c = d->io_first_child; c != nullptr; c = c->next_sibling) {
        if (rdma == nullptr && is_osdev(c, HWLOC_OBJ_OSDEV_OPENFABRICS)) rdma = c;
        if (netdev == nullptr && is_osdev(c, HWLOC_OBJ_OSDEV_NETWORK)) netdev = c;
      }
      // R-ID-3: one NIC per PCI function with an OpenFabrics device, or IB class without one.
      const bool nic = !gpu && (rdma != nullptr || pci.class_id == 0x0207);
      if (!gpu && !nvswitch && !nic) continue;
      const Locality loc = locality_of(d);
      if (!loc.known) topo_.locality_known = false;
      if (gpu) {
        Gpu g;
        g.busid = address_of(pci);
        g.vendor_id = pci.vendor_id;
        g.device_id = pci.device_id;
        read_gpu_annotations(d, g);
        g.numa = loc.numa;
        g.cpus = loc.cpus;
        g.link = link_of(d);
        g.path = path_of(d);
        topo_.gpus.push_back(std::move(g));
        gpu_objects_.push_back(d);
      } else if (nvswitch) {
        topo_.nvswitches.push_back({address_of(pci), loc.numa, path_of(d)});
      } else {
        Nic n;
        n.busid = address_of(pci);
        n.vendor_id = pci.vendor_id;
        n.device_id = pci.device_id;
        n.has_driver = rdma != nullptr;
        n.name = rdma != nullptr && rdma->name != nullptr ? rdma->name : "";
        n.netdev = netdev != nullptr && netdev->name != nullptr ? netdev->name : "";
        n.numa = loc.numa;
        n.cpus = loc.cpus;
        n.link = link_of(d);
        n.path = path_of(d);
        if (rdma != nullptr) n.ports = ports_of(rdma);
        n.role = options_.nics.selects(n.name) ? NicRole::compute : NicRole::excluded;
        topo_.nics.push_back(std::move(n));
      }
    }
    // R-ID-2: GPU index = bus id order, never hwloc traversal order.
    std::vector<std::size_t> order(topo_.gpus.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return topo_.gpus[a].busid < topo_.gpus[b].busid;
    });
    std::vector<Gpu> gpus;
    std::vector<hwloc_obj_t> objects;
    for (std::size_t i : order) {
      gpus.push_back(std::move(topo_.gpus[i]));
      gpus.back().index = static_cast<int>(gpus.size() - 1);
      objects.push_back(gpu_objects_[i]);
    }
    topo_.gpus = std::move(gpus);
    gpu_objects_ = std::move(objects);
    // R-ID-3: NIC index = natural order of the RDMA name; driverless NICs last, by bus id.
    std::stable_sort(topo_.nics.begin(), topo_.nics.end(), [](const Nic& a, const Nic& b) {
      if (a.name.empty() != b.name.empty()) return !a.name.empty();
      if (a.name.empty()) return a.busid < b.busid;
      return natural_less(a.name, b.name);
    });
    for (std::size_t k = 0; k < topo_.nics.size(); ++k) topo_.nics[k].index = static_cast<int>(k);
    std::sort(topo_.nvswitches.begin(), topo_.nvswitches.end(),
              [](const NvSwitch& a, const NvSwitch& b) { return a.busid < b.busid; });
  }

  // Model and UUID from the OS devices that annotate a GPU (NVML first, then CUDA/OpenCL), or
  // from infos on the PCIDev itself; the PCI device name as a last resort.
  static void read_gpu_annotations(hwloc_obj_t d, Gpu& g) {
    g.uuid = info(d, "NVIDIAUUID");
    g.model = info(d, "GPUModel");
    for (hwloc_obj_t c = d->io_first_child; c != nullptr; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE) continue;
      if (g.uuid.empty()) g.uuid = info(c, "NVIDIAUUID");
      const std::string model = info(c, "GPUModel");
      if (!model.empty() && (g.model.empty() || info(c, "Backend") == "NVML")) g.model = model;
    }
    if (g.model.empty()) g.model = info(d, "PCIDevice");
  }

  // Ports from the OpenFabrics infos: Port<N>State, Port<N>LID, Port<N>GID<m> (hwloc) and
  // Port<N>PhysState, Port<N>Rate, Port<N>LinkLayer (our live annotations).
  static std::vector<NicPort> ports_of(hwloc_obj_t rdma) {
    std::map<int, NicPort> ports;
    std::map<int, std::map<int, std::string>> gids;
    for (unsigned i = 0; i < rdma->infos_count; ++i) {
      const std::string name = rdma->infos[i].name ? rdma->infos[i].name : "";
      const std::string value = rdma->infos[i].value ? rdma->infos[i].value : "";
      if (!name.starts_with("Port")) continue;
      std::size_t pos = 4;
      while (pos < name.size() && std::isdigit(static_cast<unsigned char>(name[pos]))) ++pos;
      if (pos == 4) continue;
      const int number = std::stoi(name.substr(4, pos - 4));
      const std::string key = name.substr(pos);
      NicPort& port = ports[number];
      port.number = number;
      try {
        if (key == "State") {
          port.state = std::stoi(value);
        } else if (key == "PhysState") {
          port.physical_state = std::stoi(value);
        } else if (key == "Rate") {
          port.rate_gbps = std::stod(value);
        } else if (key == "LinkLayer") {
          port.link_layer = value;
        } else if (key.starts_with("GID") && key.size() > 3) {
          gids[number][std::stoi(key.substr(3))] = value;
        }
      } catch (const std::exception&) {
        // an unparsable annotation leaves the field unknown
      }
    }
    std::vector<NicPort> out;
    for (auto& [number, port] : ports) {
      for (auto& [index, gid] : gids[number]) port.gids.push_back(gid);
      out.push_back(std::move(port));
    }
    return out;
  }

  // R-NV-2: per-link, per-direction MB/s that the file's NVLinkBandwidth values are made of.
  int per_link_mbps(const Gpu& gpu) const {
    const unsigned family = gpu.device_id >> 8;
    if (family == 0x15) return 20000;  // P100, NVLink1
    if (family == 0x29) return 50000;  // B200/GB200, NVLink5
    if (family == 0x20) {              // A100: hwloc 2.5-2.11 counted NVLink3 as 50000 per link
      int major = 0, minor = 0;
      if (std::sscanf(topo_.sources.hwloc_file_version.c_str(), "%d.%d", &major, &minor) == 2 &&
          major == 2 && minor >= 5 && minor <= 11) {
        return 50000;
      }
    }
    return 25000;
  }

  void read_nvlink_distances() {
    unsigned count = 1;
    hwloc_distances_s* d = nullptr;
    if (hwloc_distances_get_by_name(t_, "NVLinkBandwidth", &count, &d, 0) != 0 || count == 0 ||
        d == nullptr) {
      return;
    }
    bool has_switch = false;
    for (unsigned i = 0; i < d->nbobjs; ++i) {
      hwloc_obj_t o = d->objs[i];
      has_switch = has_switch ||
                   (o != nullptr && o->type == HWLOC_OBJ_PCI_DEVICE &&
                    o->attr->pcidev.vendor_id == kNvidia && o->attr->pcidev.class_id == 0x0680);
    }
    // Switch ports -> one switch, then GPU<->GPU through it. Only with switches: the
    // transform fails on GPU<->GPU meshes.
    if (has_switch && (hwloc_distances_transform(
                           t_, d, HWLOC_DISTANCES_TRANSFORM_MERGE_SWITCH_PORTS, nullptr, 0) != 0 ||
                       hwloc_distances_transform(
                           t_, d, HWLOC_DISTANCES_TRANSFORM_TRANSITIVE_CLOSURE, nullptr, 0) != 0)) {
      hwloc_distances_release(t_, d);
      return;
    }
    // Endpoints are the GPUs' nvmlN OS devices or the GPU PCIDevs themselves.
    std::vector<int> gpu_of(d->nbobjs, -1);
    bool any = false;
    for (unsigned i = 0; i < d->nbobjs; ++i) {
      hwloc_obj_t o = d->objs[i];
      if (o != nullptr && o->type == HWLOC_OBJ_OS_DEVICE) o = o->parent;
      for (std::size_t g = 0; o != nullptr && g < gpu_objects_.size(); ++g) {
        if (gpu_objects_[g] == o) {
          gpu_of[i] = static_cast<int>(g);
          any = true;
        }
      }
    }
    if (any) {
      const std::size_t n = topo_.gpus.size();
      topo_.nvlinks.assign(n, std::vector<int>(n, 0));
      topo_.nvlink_per_link_mbps = per_link_mbps(topo_.gpus.front());
      for (unsigned a = 0; a < d->nbobjs; ++a) {
        for (unsigned b = 0; b < d->nbobjs; ++b) {
          const int ga = gpu_of[a], gb = gpu_of[b];
          if (ga < 0 || gb < 0 || ga == gb) continue;
          const double per_link = per_link_mbps(topo_.gpus[static_cast<std::size_t>(ga)]);
          const auto value = static_cast<double>(d->values[a * d->nbobjs + b]);
          topo_.nvlinks[static_cast<std::size_t>(ga)][static_cast<std::size_t>(gb)] =
              static_cast<int>(std::lround(value / per_link));
        }
      }
      topo_.sources.nvlink_known = true;
    }
    hwloc_distances_release(t_, d);
  }

  // R-LOAD-4: which I/O backends annotated this topology.
  void read_io_backends() {
    std::set<std::string> kinds;
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(t_, o));) {
      std::string backend = info(o, "Backend");
      if (backend.empty() && o->subtype != nullptr) backend = o->subtype;
      const std::string name = o->name != nullptr ? o->name : "";
      std::transform(backend.begin(), backend.end(), backend.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (backend == "cuda" || backend == "nvml" || backend == "opencl" || backend == "rsmi" ||
          backend == "levelzero" || backend == "gl") {
        kinds.insert(backend);
      } else if (is_osdev(o, HWLOC_OBJ_OSDEV_GPU) &&
                 (name.starts_with("card") || name.starts_with("renderD"))) {
        kinds.insert("drm");
      } else if (is_osdev(o, HWLOC_OBJ_OSDEV_OPENFABRICS)) {
        kinds.insert("openfabrics");
      } else if (is_osdev(o, HWLOC_OBJ_OSDEV_NETWORK)) {
        kinds.insert("network");
      } else if (is_osdev(o, HWLOC_OBJ_OSDEV_BLOCK)) {
        kinds.insert("block");
      }
    }
    topo_.sources.io_backends.assign(kinds.begin(), kinds.end());
  }

  hwloc_topology_t t_;
  const DiscoverOptions& options_;
  NodeTopology topo_;
  std::vector<hwloc_obj_t> host_numa_;
  std::vector<hwloc_obj_t> gpu_objects_;  // parallel to topo_.gpus
  std::map<hwloc_obj_t, std::string> host_bridge_names_;
  std::set<std::string> used_host_bridge_names_;
};

}  // namespace

NodeTopology convert(hwloc_topology_t topology, const DiscoverOptions& options,
                     const std::string& origin) {
  return Converter(topology, options).run(origin);
}

}  // namespace detail

// ---- loading files ---------------------------------------------------------------------

namespace {

std::string lower_first(std::string text) {
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

Result<std::string> read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return make_error("cannot read topology file " + path + ": " +
                      lower_first(std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return make_error(path + ": is a directory, expected an hwloc xml or topology json file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error("cannot read topology file " + path + ": " +
                      lower_first(std::strerror(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) {
    return make_error("cannot read topology file " + path + ": read error");
  }
  return out.str();
}

// hwloc 2.9.0 dereferences a NULL bitmap in hwloc_topology_load() (both importers) when the
// root or a NUMA node has `cpuset` without `complete_cpuset` or `nodeset` without
// `complete_nodeset` (docs/fuzzing-findings.md); its exports always write them in pairs. So every
// <object> tag must: checked here with the tag read as XML reads it ('>' inside a quoted value
// does not end it).
Status check_object_sets(std::string_view text, const std::string& name) {
  for (std::size_t at = text.find("<object"); at != std::string_view::npos;
       at = text.find("<object", at + 1)) {
    bool has[4] = {};  // cpuset, complete_cpuset, nodeset, complete_nodeset
    std::size_t i = at + 7;
    bool cut = false;  // a '<' before the tag's '>': not a tag (a cut file), left to hwloc
    while (i < text.size() && text[i] != '>') {
      if (text[i] == '<') {
        cut = true;
        break;
      }
      if (text[i] == '"' || text[i] == '\'') {
        const auto close = text.find(text[i], i + 1);
        if (close == std::string_view::npos) return ok_status();  // hwloc refuses it
        i = close + 1;
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(text[i])) || text[i] == '_') {
        std::size_t end = i;
        while (end < text.size() &&
               (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_'))
          ++end;
        const std::string_view attribute = text.substr(i, end - i);
        if (attribute == "cpuset") has[0] = true;
        if (attribute == "complete_cpuset") has[1] = true;
        if (attribute == "nodeset") has[2] = true;
        if (attribute == "complete_nodeset") has[3] = true;
        i = end;
        continue;
      }
      ++i;
    }
    if (cut) continue;
    const char* missing = has[0] && !has[1]   ? "cpuset without complete_cpuset"
                          : has[2] && !has[3] ? "nodeset without complete_nodeset"
                                              : nullptr;
    if (missing != nullptr) {
      const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(at), '\n');
      return make_error(name + ":" + std::to_string(line) + ": an <object> with " + missing +
                        " (hwloc writes both; hwloc 2.9 crashes on it)");
    }
  }
  return ok_status();
}

// Checks hwloc cannot be trusted to report cleanly (its parsers may print to stderr or accept a
// cut-off file): empty, binary, not XML, cut off, or hwloc XML version 3.
Status check_xml_text(const std::string& xml, const std::string& name) {
  const std::string_view text = trim(xml);
  if (text.empty()) {
    return make_error(name + ": empty file, expected an hwloc xml topology");
  }
  if (xml.find('\0') != std::string::npos) {
    return make_error(name + ": binary data, not an hwloc xml topology");
  }
  if (!text.starts_with('<')) {
    return make_error(name + ": not an hwloc xml topology (does not start with '<')");
  }
  const auto open = text.find("<topology");
  if (open == std::string_view::npos) {
    return make_error(name + ": no <topology> element, not an hwloc xml topology");
  }
  if (!text.ends_with("</topology>")) {
    return make_error(name + ": truncated xml (no closing </topology>)");
  }
  // hwloc never writes these; libxml2 under hwloc 2.9 crashes on an internal subset, and
  // entities can expand without bound. The DOCTYPE line hwloc writes has no '['.
  const std::string_view prologue = text.substr(0, open);
  if (const auto doctype = prologue.find("<!DOCTYPE"); doctype != std::string_view::npos) {
    const std::string_view decl = prologue.substr(doctype, prologue.find('>', doctype) - doctype);
    if (decl.find('[') != std::string_view::npos) {
      return make_error(name + ": an internal DTD subset (<!DOCTYPE ... [ ]>) is not part of an " +
                        "hwloc xml topology");
    }
  }
  if (text.find("<!ENTITY") != std::string_view::npos) {
    return make_error(name + ": xml entity declarations are not part of an hwloc xml topology");
  }
  const std::string_view tag = text.substr(open, text.find('>', open) - open);
  const auto version = tag.find("version=\"");
  if (version != std::string_view::npos) {
    const int major = std::atoi(std::string(tag.substr(version + 9, 4)).c_str());
    if (major >= 3) {
      return make_error(
          name + ": hwloc xml version " +
          std::string(tag.substr(version + 9, tag.find('"', version + 9) - (version + 9))) +
          " is not supported (reads v1 and v2); re-export it with hwloc 2.x "
          "(lstopo --of xml)");
    }
  }
  if (xml.size() >= static_cast<std::size_t>(INT32_MAX)) {
    return make_error(name + ": file too large for an hwloc xml topology");
  }
  return check_object_sets(xml, name);
}

// An xml import needs none of the plugins Debian's hwloc 2.9 dlopens at its first init: the
// xml reader is built in (libxml2's is refused), and pci, OpenCL and GL discovery do not run on
// an imported topology. Loading libxml2 with ICU, OpenCL, GL with X11 and pciaccess cost a
// standalone agent ~10 ms of its ~28 ms of CPU; 32 emulated nodes pay it 32 times on 2 cores.
// Called in the isolated child only, so that live discovery in the caller keeps hwloc_pci.
void skip_hwloc_plugins() {
  constexpr std::string_view kUnused = "hwloc_xml_libxml,hwloc_opencl,hwloc_gl,hwloc_pci";
  std::string list(kUnused);
  if (const char* given = std::getenv("HWLOC_PLUGINS_BLACKLIST"); given && *given) {
    list = std::string(given) + "," + list;
  }
  ::setenv("HWLOC_PLUGINS_BLACKLIST", list.c_str(), 1);
}

}  // namespace

void prefer_minimal_xml_importer() {
  // HWLOC_LIBXML decides both import and export and wins over HWLOC_LIBXML_IMPORT.
  ::setenv("HWLOC_LIBXML", "0", 1);
}

Result<NodeTopology> load_xml_buffer(const std::string& xml, const std::string& name,
                                     const DiscoverOptions& options) {
  if (Status checked = check_xml_text(xml, name); !checked) {
    return checked.error();
  }
  auto import = [&](detail::HwlocTopology& topology) -> Status {
    detail::configure(topology.get());
    if (hwloc_topology_set_xmlbuffer(topology.get(), xml.c_str(),
                                     static_cast<int>(xml.size() + 1)) != 0 ||
        hwloc_topology_load(topology.get()) != 0) {
      return make_error(name +
                        ": hwloc cannot import this xml (corrupt or not an hwloc topology; " +
                        "HWLOC_XML_VERBOSE=1 lstopo-no-graphics --input " + name + " says why)");
    }
    return ok_status();
  };
  // hwloc 2.9's core dereferences NULL bitmaps on more malformed shapes than check_xml_text
  // knows (docs/fuzzing-findings.md): the import runs in an isolated child, so that a new shape
  // is one error line, not a dead process (slurmstepd, as root). The child sends the node back
  // as its JSON (lossless: the golden tests round-trip every fixture), so hwloc imports once:
  // importing again here loaded hwloc's plugins again too, ~25% more CPU per load of a DGX H100.
  auto described = run_isolated_output(
      [&]() -> Result<std::string> {
        skip_hwloc_plugins();
        detail::HwlocTopology topology;
        if (Status imported = import(topology); !imported) return imported.error();
        return to_json(detail::convert(topology.get(), options, name));
      },
      IsolationLimits{}, name, kMaxTopologyJsonBytes);
  if (!described) return described.error();
  return from_json(*described, name);
}

Result<NodeTopology> load_xml_file(const std::string& path, const DiscoverOptions& options) {
  Result<std::string> text = read_file(path);
  if (!text) return text.error();
  return load_xml_buffer(*text, path, options);
}

Result<NodeTopology> load_topology_file(const std::string& path, const DiscoverOptions& options) {
  Result<std::string> text = read_file(path);
  if (!text) return text.error();
  return load_topology_buffer(*text, path, options);
}

Result<NodeTopology> load_topology_buffer(const std::string& text, const std::string& name,
                                          const DiscoverOptions& options) {
  if (trim(text).starts_with('{')) {
    Result<NodeTopology> topo = from_json(text, name);
    if (topo && (!options.nics.include.empty() || !options.nics.exclude.empty())) {
      for (Nic& nic : topo->nics) {
        if (!options.nics.selects(nic.name)) {
          nic.role = NicRole::excluded;
        } else if (nic.role == NicRole::excluded) {
          nic.role = NicRole::compute;
        }
      }
    }
    if (topo && !options.hostname.empty()) topo->hostname = options.hostname;
    return topo;
  }
  return load_xml_buffer(text, name, options);
}

}  // namespace topolaunch::topology
