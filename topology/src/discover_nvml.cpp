// NVML, dlopened at run time (libnvidia-ml.so.1 exists wherever the NVIDIA driver does; it is
// never linked). Only the handful of types and entry points we call are declared here, with
// the layouts of NVML's public ABI, so no nvml.h is needed to build.
#include <dlfcn.h>

#include <algorithm>
#include <map>

#include "discover_internal.hpp"

namespace topolaunch::topology::detail {

namespace {

using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlFeatureEnabled = 1;  // nvmlEnableState_t
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

struct nvmlPciInfo_t {  // layout of nvmlPciInfo_st (v3, used by the _v3/_v2 entry points)
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};

struct NvmlApi {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*count)(unsigned*);
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*pci_info)(nvmlDevice_t, nvmlPciInfo_t*);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*link_state)(nvmlDevice_t, unsigned, int*);
  nvmlReturn_t (*remote_pci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*);
  nvmlReturn_t (*remote_type)(nvmlDevice_t, unsigned, int*);   // optional (drivers >= 460)
  nvmlReturn_t (*version)(nvmlDevice_t, unsigned, unsigned*);  // optional
};

// nvmlIntNvLinkDeviceType_t
NvLinkRemote remote_kind(int type) {
  switch (type) {
    case 0:
      return NvLinkRemote::gpu;
    case 1:
      return NvLinkRemote::cpu;  // IBM NPU (POWER9 CPU)
    case 2:
      return NvLinkRemote::nvswitch;
    default:
      return NvLinkRemote::unknown;
  }
}

class Library {
 public:
  explicit Library(const char* name) : handle_(dlopen(name, RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  explicit operator bool() const { return handle_ != nullptr; }
  template <class F>
  bool load(F& out, const char* symbol) const {
    out = reinterpret_cast<F>(dlsym(handle_, symbol));
    return out != nullptr;
  }

 private:
  void* handle_;
};

std::optional<PciAddress> address_of(const nvmlPciInfo_t& info) {
  return PciAddress::parse(std::string_view(info.busId, strnlen(info.busId, sizeof info.busId)));
}

int per_link_mbps_of_version(int version) {
  if (version == 1) return 20000;  // NVLink1 (P100)
  if (version >= 7) return 50000;  // NVLink5 (B200)
  return 25000;
}

}  // namespace

NvmlReport query_nvml() {
  NvmlReport report;
  Library lib("libnvidia-ml.so.1");
  if (!lib) {
    report.why_not = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return report;
  }
  NvmlApi api{};
  const bool complete =
      lib.load(api.init, "nvmlInit_v2") && lib.load(api.shutdown, "nvmlShutdown") &&
      lib.load(api.count, "nvmlDeviceGetCount_v2") &&
      lib.load(api.handle, "nvmlDeviceGetHandleByIndex_v2") &&
      lib.load(api.pci_info, "nvmlDeviceGetPciInfo_v3") &&
      lib.load(api.uuid, "nvmlDeviceGetUUID") && lib.load(api.name, "nvmlDeviceGetName");
  if (!complete) {
    report.why_not = "libnvidia-ml.so.1 lacks nvmlInit_v2/nvmlDeviceGetPciInfo_v3 (driver too old)";
    return report;
  }
  // NVLink entry points are optional (PCIe-only drivers/GPUs).
  const bool nvlink = lib.load(api.link_state, "nvmlDeviceGetNvLinkState") &&
                      lib.load(api.remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  if (nvlink) {
    lib.load(api.remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType");
    lib.load(api.version, "nvmlDeviceGetNvLinkVersion");
  }
  if (api.init() != kNvmlSuccess) {
    report.why_not = "nvmlInit failed (driver not loaded?)";
    return report;
  }
  unsigned count = 0;
  if (api.count(&count) == kNvmlSuccess) {
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t device = nullptr;
      nvmlPciInfo_t pci{};
      if (api.handle(i, &device) != kNvmlSuccess || api.pci_info(device, &pci) != kNvmlSuccess) {
        continue;
      }
      auto busid = address_of(pci);
      if (!busid) continue;
      NvmlGpu gpu;
      gpu.busid = *busid;
      char text[96] = {};
      if (api.uuid(device, text, sizeof text) == kNvmlSuccess) gpu.uuid = text;
      char name[96] = {};
      if (api.name(device, name, sizeof name) == kNvmlSuccess) gpu.model = name;
      for (unsigned link = 0; nvlink && link < kNvmlMaxLinks; ++link) {
        int state = 0;
        nvmlPciInfo_t remote{};
        if (api.link_state(device, link, &state) != kNvmlSuccess || state != kNvmlFeatureEnabled ||
            api.remote_pci(device, link, &remote) != kNvmlSuccess) {
          continue;
        }
        NvmlLink nvlink_info;
        nvlink_info.remote_busid.assign(remote.busId, strnlen(remote.busId, sizeof remote.busId));
        int type = -1;
        if (api.remote_type != nullptr && api.remote_type(device, link, &type) == kNvmlSuccess) {
          nvlink_info.remote = remote_kind(type);
        }
        unsigned version = 0;
        if (gpu.nvlink_version == 0 && api.version != nullptr &&
            api.version(device, link, &version) == kNvmlSuccess) {
          gpu.nvlink_version = static_cast<int>(version);
        }
        gpu.links.push_back(std::move(nvlink_info));
      }
      report.gpus.push_back(std::move(gpu));
    }
  }
  api.shutdown();
  report.available = true;
  return report;
}

void apply_nvml(NodeTopology& topo, const NvmlReport& report) {
  if (!report.available) return;
  topo.sources.nvml = true;
  const std::size_t n = topo.gpus.size();
  auto index_of = [&](const PciAddress& busid) -> int {
    for (std::size_t i = 0; i < n; ++i) {
      if (topo.gpus[i].busid == busid) return static_cast<int>(i);
    }
    return -1;
  };
  std::vector<std::map<int, int>> direct(n);                // GPU i -> peer GPU -> links
  std::vector<std::map<std::string, int>> switch_links(n);  // GPU i -> switch bus id -> links
  int nvlink_version = 0;
  for (const NvmlGpu& g : report.gpus) {
    const int i = index_of(g.busid);  // R-ID-5: by bus id, never by NVML index
    if (i < 0) continue;
    Gpu& gpu = topo.gpus[static_cast<std::size_t>(i)];
    if (!g.uuid.empty()) gpu.uuid = g.uuid;
    if (!g.model.empty()) gpu.model = g.model;
    if (nvlink_version == 0) nvlink_version = g.nvlink_version;
    for (const NvmlLink& link : g.links) {
      const auto remote = PciAddress::parse(link.remote_busid);
      const int peer = remote ? index_of(*remote) : -1;
      if (peer >= 0) {
        ++direct[static_cast<std::size_t>(i)][peer];
      } else if (link.remote != NvLinkRemote::cpu) {
        ++switch_links[static_cast<std::size_t>(i)][link.remote_busid];
      }
    }
  }
  topo.nvlinks.assign(n, std::vector<int>(n, 0));
  for (std::size_t a = 0; a < n; ++a) {
    int total_a = 0;
    for (const auto& [sw, links] : switch_links[a]) total_a += links;
    for (std::size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      int count = direct[a].count(static_cast<int>(b)) ? direct[a].at(static_cast<int>(b)) : 0;
      // R-NV-1: through NVSwitches, both GPUs reaching the same switches.
      bool same_switches =
          !switch_links[a].empty() && switch_links[a].size() == switch_links[b].size();
      for (const auto& [sw, links] : switch_links[a]) {
        same_switches = same_switches && switch_links[b].count(sw) != 0;
      }
      if (same_switches) {
        int total_b = 0;
        for (const auto& [sw, links] : switch_links[b]) total_b += links;
        count += std::min(total_a, total_b);
      }
      topo.nvlinks[a][b] = count;
    }
  }
  topo.sources.nvlink_known = true;
  bool any_link = false;
  for (std::size_t i = 0; i < n; ++i)
    any_link = any_link || !direct[i].empty() || !switch_links[i].empty();
  if (any_link) topo.nvlink_per_link_mbps = per_link_mbps_of_version(nvlink_version);
}

}  // namespace topolaunch::topology::detail
