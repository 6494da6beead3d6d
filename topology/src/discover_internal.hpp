// Private to the topology core: the pieces of discovery that discover.cpp, discover_live.cpp
// and discover_nvml.cpp share. hwloc types appear only in discover*.cpp and here.
#pragma once

#include <hwloc.h>

#include <string>
#include <vector>

#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/model.hpp"

namespace topolaunch::topology::detail {

// Owns an hwloc topology handle.
class HwlocTopology {
 public:
  HwlocTopology() { hwloc_topology_init(&handle_); }
  ~HwlocTopology() { hwloc_topology_destroy(handle_); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  hwloc_topology_t get() const { return handle_; }

 private:
  hwloc_topology_t handle_ = nullptr;
};

// The settings every load uses, live or XML (R-LOAD-1): keep important I/O objects (without
// this hwloc drops every bridge and PCI device, XML included) and the PUs outside our cgroup
// (the node picture must not depend on where the tool runs; allowed_cpus says what we may use).
void configure(hwloc_topology_t topology);

// hwloc topology (already loaded and, on a live node, annotated) -> model. Identification,
// locality, PCIe paths and links, NVLink from NVLinkBandwidth distances.
NodeTopology convert(hwloc_topology_t topology, const DiscoverOptions& options,
                     const std::string& origin);

// Live only: write what sysfs knows exactly into the hwloc objects as info annotations, so
// that convert() reads live and XML the same way (and an exported XML keeps them):
// PCIDev infos PCIeLinkGen/PCIeLinkWidth/PCIeMaxLinkGen/PCIeMaxLinkWidth; OpenFabrics osdev
// infos Port<N>Rate (Gb/s), Port<N>LinkLayer, Port<N>PhysState (and Port<N>State/GIDs when
// hwloc did not set them).
void annotate_from_sysfs(hwloc_topology_t topology, const std::string& sysfs_root = "/sys");

// One active NVLink of a GPU as NVML reports it. In VMs the switches are hidden: the remote
// bus id is then "FFFFFFFF:FF:FF.0" (seen on H200 VMs) and only the remote type says NVSwitch.
enum class NvLinkRemote { gpu, nvswitch, cpu, unknown };
struct NvmlLink {
  std::string remote_busid;  // as NVML prints it
  NvLinkRemote remote = NvLinkRemote::unknown;
};

// What NVML says about one GPU (R-ID-5: matched to our GPUs by PCI bus id).
struct NvmlGpu {
  PciAddress busid;
  std::string uuid;
  std::string model;
  int nvlink_version = 0;       // NVML numbering: 1 = NVLink1 ... 6 = NVLink4 (H100), 7 = NVLink5
  std::vector<NvmlLink> links;  // active links only
};

struct NvmlReport {
  bool available = false;
  std::string why_not;  // when !available: "libnvidia-ml.so.1 not found", ...
  std::vector<NvmlGpu> gpus;
};

// dlopens libnvidia-ml.so.1 (never linked); available=false without error when it is absent.
NvmlReport query_nvml();

// Pure: UUIDs, models and NVLink counts (R-NV-1) into the model. Links to one of the node's
// GPUs count per pair; links to anything else but a CPU count as switch links, and two GPUs that
// reach the same switches get NV# = min(switch links of a, switch links of b).
void apply_nvml(NodeTopology& topo, const NvmlReport& report);

}  // namespace topolaunch::topology::detail
