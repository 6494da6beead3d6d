// sysfs and CUDA-driver probe. sysfs layout (kernel
// Documentation/ABI/stable/sysfs-class-infiniband):
//   class/infiniband/<dev>/{node_type, device -> PCI dir (numa_node, net/<if>)}
//   class/infiniband/<dev>/ports/<n>/{state, phys_state, rate, link_layer, lid, gids/<i>,
//                                     gid_attrs/types/<i>, gid_attrs/ndevs/<i>}
// Reading an unused gid_attrs entry fails with EINVAL on a live system; that is not an error.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "topolaunch/rdma/probe.hpp"

namespace topolaunch::rdma {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_line(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  if (in.bad()) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r'))
    line.pop_back();
  return line;
}

// "4: ACTIVE" -> {4, "ACTIVE"}
bool parse_numbered(const std::string& text, int& number, std::string& name) {
  auto colon = text.find(':');
  if (colon == std::string::npos) return false;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (end != text.c_str() + colon) return false;
  number = static_cast<int>(v);
  name = text.substr(colon + 1);
  while (!name.empty() && name.front() == ' ') name.erase(name.begin());
  return true;
}

bool is_zero_gid(const std::string& gid) {
  return std::all_of(gid.begin(), gid.end(), [](char c) { return c == '0' || c == ':'; });
}

// Natural order on a trailing number: "2" < "10", "mlx5_2" < "mlx5_10".
bool natural_less(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    std::size_t i = s.size();
    while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
    unsigned long n = i < s.size() ? std::stoul(s.substr(i)) : 0;
    return std::pair(s.substr(0, i), n);
  };
  auto [pa, na] = split(a);
  auto [pb, nb] = split(b);
  if (pa != pb) return pa < pb;
  if (na != nb) return na < nb;
  return a < b;
}

std::vector<std::string> sorted_entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end(), natural_less);
  return names;
}

Result<PortInfo> read_port(const fs::path& dir, const std::string& device) {
  PortInfo port;
  const std::string where = device + " port " + dir.filename().string();
  port.number = std::atoi(dir.filename().c_str());
  auto state = read_line(dir / "state");
  if (!state || !parse_numbered(*state, port.state, port.state_name))
    return make_error("rdma probe: " + (dir / "state").string() +
                      ": unreadable or not \"N: NAME\" (" + where + ")");
  auto phys = read_line(dir / "phys_state");
  if (phys && !parse_numbered(*phys, port.physical_state, port.physical_state_name))
    return make_error("rdma probe: " + (dir / "phys_state").string() + ": \"" + *phys +
                      "\" is not \"N: NAME\"");
  if (auto rate = read_line(dir / "rate")) {
    port.rate_text = *rate;
    port.rate_gbps = std::strtod(rate->c_str(), nullptr);
  }
  port.link_layer = read_line(dir / "link_layer").value_or("");
  if (auto lid = read_line(dir / "lid"))
    port.lid = static_cast<std::uint32_t>(std::strtoul(lid->c_str(), nullptr, 0));
  for (const std::string& idx : sorted_entries(dir / "gids")) {
    auto gid = read_line(dir / "gids" / idx);
    if (!gid || is_zero_gid(*gid)) continue;
    GidEntry entry;
    entry.index = std::atoi(idx.c_str());
    entry.gid = *gid;
    auto type = read_line(dir / "gid_attrs" / "types" / idx);
    if (type == "RoCE v2")
      entry.type = GidType::roce_v2;
    else if (type == "IB/RoCE v1")
      entry.type = GidType::ib_roce_v1;
    entry.netdev = read_line(dir / "gid_attrs" / "ndevs" / idx).value_or("");
    port.gids.push_back(entry);
  }
  return port;
}

Result<RdmaDevice> read_device(const fs::path& dir) {
  RdmaDevice dev;
  dev.name = dir.filename().string();
  if (auto nt = read_line(dir / "node_type")) {
    int n = 0;
    if (!parse_numbered(*nt, n, dev.node_type)) dev.node_type = *nt;
  }
  std::error_code ec;
  const fs::path pci_dir = fs::canonical(dir / "device", ec);
  if (!ec) {
    dev.pci = topology::PciAddress::parse(pci_dir.filename().string());
    if (auto numa = read_line(pci_dir / "numa_node")) dev.numa = std::atoi(numa->c_str());
    dev.netdevs = sorted_entries(pci_dir / "net");
  }
  for (const std::string& p : sorted_entries(dir / "ports")) {
    auto port = read_port(dir / "ports" / p, dev.name);
    if (!port) return port.error();
    dev.ports.push_back(std::move(*port));
  }
  if (dev.netdevs.empty()) {  // virtual devices (rxe) have no PCI dir: use the GID netdevs
    for (const auto& port : dev.ports)
      for (const auto& gid : port.gids)
        if (!gid.netdev.empty() &&
            std::find(dev.netdevs.begin(), dev.netdevs.end(), gid.netdev) == dev.netdevs.end())
          dev.netdevs.push_back(gid.netdev);
  }
  return dev;
}

// The CUDA driver API we use, as plain function pointers (no cuda.h on build hosts).
using CuInit = int (*)(unsigned);
using CuDriverGetVersion = int (*)(int*);
using CuDeviceGetCount = int (*)(int*);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetAttribute = int (*)(int*, int, int);
using CuDeviceGetPCIBusId = int (*)(char*, int, int);

constexpr int kCuAttrGpuDirectRdmaSupported = 116;
constexpr int kCuAttrGpuDirectRdmaWritesOrdering = 118;
constexpr int kCuAttrDmaBufSupported = 124;

}  // namespace

bool GidEntry::ipv4_mapped() const {
  // sysfs prints 8 groups of 4 hex digits: 0000:0000:0000:0000:0000:ffff:xxxx:xxxx
  return gid.size() == 39 && gid.compare(0, 30, "0000:0000:0000:0000:0000:ffff:") == 0;
}

bool GidEntry::link_local() const {
  if (gid.size() < 4) return false;
  unsigned v = static_cast<unsigned>(std::strtoul(gid.substr(0, 4).c_str(), nullptr, 16));
  return (v & 0xffc0u) == 0xfe80u;
}

const PortInfo* RdmaDevice::port(int number) const {
  for (const auto& p : ports)
    if (p.number == number) return &p;
  return nullptr;
}

const RdmaDevice* NodeRdmaInventory::device(std::string_view name) const {
  for (const auto& d : devices)
    if (d.name == name) return &d;
  return nullptr;
}

Result<std::vector<RdmaDevice>> probe_rdma_devices(const std::string& sysfs_root) {
  std::vector<RdmaDevice> devices;
  const fs::path cls = fs::path(sysfs_root) / "class" / "infiniband";
  std::error_code ec;
  if (!fs::is_directory(cls, ec)) return devices;
  for (const std::string& name : sorted_entries(cls)) {
    auto dev = read_device(cls / name);
    if (!dev) return dev.error();
    devices.push_back(std::move(*dev));
  }
  return devices;
}

std::optional<std::string> find_peermem(const std::string& sysfs_root) {
  const fs::path root(sysfs_root);
  for (const fs::path& p : {root / "module" / "nvidia_peermem", root / "module" / "nv_peer_mem",
                            root / "kernel" / "mm" / "memory_peers" / "nv_mem"}) {
    std::error_code ec;
    if (fs::exists(p, ec)) return p.string();
  }
  return std::nullopt;
}

CudaProbe probe_cuda(const std::string& library) {
  CudaProbe out;
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    out.status = library + " not found (no NVIDIA driver on this node)";
    return out;
  }
  struct Closer {
    void* h;
    ~Closer() { dlclose(h); }
  } closer{handle};
  auto sym = [&](const char* name) { return dlsym(handle, name); };
  auto cu_init = reinterpret_cast<CuInit>(sym("cuInit"));
  auto cu_version = reinterpret_cast<CuDriverGetVersion>(sym("cuDriverGetVersion"));
  auto cu_count = reinterpret_cast<CuDeviceGetCount>(sym("cuDeviceGetCount"));
  auto cu_get = reinterpret_cast<CuDeviceGet>(sym("cuDeviceGet"));
  auto cu_attr = reinterpret_cast<CuDeviceGetAttribute>(sym("cuDeviceGetAttribute"));
  auto cu_bus = reinterpret_cast<CuDeviceGetPCIBusId>(sym("cuDeviceGetPCIBusId"));
  if (!cu_init || !cu_version || !cu_count || !cu_get || !cu_attr || !cu_bus) {
    out.status = library + " lacks a driver API entry point (driver too old?)";
    return out;
  }
  out.driver_loaded = true;
  if (int rc = cu_init(0); rc != 0) {
    out.status = "cuInit failed with CUresult " + std::to_string(rc);
    return out;
  }
  cu_version(&out.driver_version);
  int count = 0;
  if (int rc = cu_count(&count); rc != 0) {
    out.status = "cuDeviceGetCount failed with CUresult " + std::to_string(rc);
    return out;
  }
  for (int i = 0; i < count; ++i) {
    int dev = 0;
    if (cu_get(&dev, i) != 0) continue;
    GpuRdmaCaps caps;
    caps.cuda_index = i;
    int v = 0;
    if (cu_attr(&v, kCuAttrDmaBufSupported, dev) == 0) caps.dma_buf = v != 0;
    v = 0;
    if (cu_attr(&v, kCuAttrGpuDirectRdmaSupported, dev) == 0) caps.gpudirect_rdma = v != 0;
    v = 0;
    if (cu_attr(&v, kCuAttrGpuDirectRdmaWritesOrdering, dev) == 0) caps.writes_ordering = v;
    char bus[32] = {};
    if (cu_bus(bus, sizeof bus, dev) == 0) caps.pci = topology::PciAddress::parse(bus);
    out.gpus.push_back(caps);
  }
  out.status = "ok";
  return out;
}

Result<NodeRdmaInventory> probe_node(const std::string& sysfs_root, bool with_cuda) {
  NodeRdmaInventory inv;
  auto devices = probe_rdma_devices(sysfs_root);
  if (!devices) return devices.error();
  inv.devices = std::move(*devices);
  if (auto pm = find_peermem(sysfs_root)) {
    inv.peermem = true;
    inv.peermem_evidence = *pm;
  }
  if (with_cuda)
    inv.cuda = probe_cuda();
  else
    inv.cuda.status = "not probed";
  return inv;
}

std::vector<RdmaDevice> devices_from_topology(const topology::NodeTopology& topo) {
  std::vector<RdmaDevice> out;
  for (const auto& nic : topo.nics) {
    if (nic.name.empty()) continue;
    RdmaDevice dev;
    dev.name = nic.name;
    dev.pci = nic.busid;
    dev.numa = nic.numa;
    dev.node_type = "CA";
    if (!nic.netdev.empty()) dev.netdevs.push_back(nic.netdev);
    for (const auto& np : nic.ports) {
      PortInfo p;
      p.number = np.number;
      p.state = np.state;
      p.physical_state = np.physical_state;
      p.rate_gbps = np.rate_gbps;
      p.link_layer = np.link_layer;
      for (std::size_t i = 0; i < np.gids.size(); ++i)
        if (!is_zero_gid(np.gids[i]))
          p.gids.push_back({static_cast<int>(i), np.gids[i], GidType::unknown, ""});
      dev.ports.push_back(std::move(p));
    }
    out.push_back(std::move(dev));
  }
  return out;
}

std::string to_string(GidType type) {
  switch (type) {
    case GidType::ib_roce_v1:
      return "IB/RoCE v1";
    case GidType::roce_v2:
      return "RoCE v2";
    case GidType::unknown:
      break;
  }
  return "unknown";
}

std::string to_json(const NodeRdmaInventory& inv, bool pretty) {
  nlohmann::json j;
  j["devices"] = nlohmann::json::array();
  for (const auto& d : inv.devices) {
    nlohmann::json dj{{"name", d.name},
                      {"pci", d.pci ? d.pci->to_string() : ""},
                      {"numa", d.numa},
                      {"node_type", d.node_type},
                      {"netdevs", d.netdevs}};
    dj["ports"] = nlohmann::json::array();
    for (const auto& p : d.ports) {
      nlohmann::json pj{{"port", p.number},
                        {"state", p.state_name},
                        {"phys_state", p.physical_state_name},
                        {"rate_gbps", p.rate_gbps},
                        {"link_layer", p.link_layer},
                        {"healthy", p.healthy()}};
      pj["gids"] = nlohmann::json::array();
      for (const auto& g : p.gids)
        pj["gids"].push_back({{"index", g.index},
                              {"gid", g.gid},
                              {"type", to_string(g.type)},
                              {"netdev", g.netdev}});
      dj["ports"].push_back(pj);
    }
    j["devices"].push_back(dj);
  }
  j["peermem"] = inv.peermem;
  j["peermem_evidence"] = inv.peermem_evidence;
  j["cuda"] = {{"driver_loaded", inv.cuda.driver_loaded},
               {"status", inv.cuda.status},
               {"driver_version", inv.cuda.driver_version}};
  j["cuda"]["gpus"] = nlohmann::json::array();
  for (const auto& g : inv.cuda.gpus)
    j["cuda"]["gpus"].push_back({{"index", g.cuda_index},
                                 {"pci", g.pci ? g.pci->to_string() : ""},
                                 {"dma_buf", g.dma_buf},
                                 {"gpudirect_rdma", g.gpudirect_rdma},
                                 {"writes_ordering", g.writes_ordering}});
  return pretty ? j.dump(2) : j.dump();
}

}  // namespace topolaunch::rdma
