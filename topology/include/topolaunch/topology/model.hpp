// The node model: plain data, value semantics, no hwloc types. Everything downstream (relations,
// rank mapping, diagnostics, the JSON that agents exchange) works on this, so a topology loaded
// from a live machine, from hwloc XML or from JSON behaves the same.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/topology/cpuset.hpp"

namespace topolaunch::topology {

// PCI address "dddd:bb:dd.f". Ordering is (domain, bus, device, function): the GPU index order
// of NVML, nvidia-smi and CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID.
struct PciAddress {
  std::uint32_t domain = 0;
  std::uint8_t bus = 0;
  std::uint8_t device = 0;
  std::uint8_t function = 0;

  std::string to_string() const;  // "0000:1b:00.0"
  // Accepts "0000:1b:00.0", "1b:00.0" and NVML's "00000000:1B:00.0".
  static std::optional<PciAddress> parse(std::string_view text);

  bool operator==(const PciAddress&) const = default;
  auto operator<=>(const PciAddress&) const = default;
};

// PCIe link state. 0 means unknown. `speed_gbytes_per_s` is hwloc's pci_link_speed
// (current speed x current width, GB/s). Live discovery reads gen/width and max_gen/max_width
// exactly from sysfs and stores them on the hwloc PCIDev as infos PCIeLinkGen, PCIeLinkWidth,
// PCIeMaxLinkGen, PCIeMaxLinkWidth; an XML carrying those infos gives them back exactly.
// Otherwise gen/width are decoded from the speed (ambiguous values such as 31.5 GB/s = Gen4 x16
// or Gen5 x8 read as x16) and max_gen/max_width stay 0.
struct PcieLink {
  int gen = 0;
  int width = 0;
  int max_gen = 0;
  int max_width = 0;
  double speed_gbytes_per_s = 0.0;

  bool operator==(const PcieLink&) const = default;
};

// Where a PCI device hangs: its host bridge (root complex; "" when the device has none, as in
// VMs) and the PCI-to-PCI bridges from the root port down to the device's parent.
// Relations between devices are computed from two paths (see relation.hpp).
struct PciPath {
  std::string host_bridge;          // e.g. "0000:[15-1b]" (domain:[secondary-subordinate])
  std::vector<PciAddress> bridges;  // root port first, the device's direct parent last

  bool operator==(const PciPath&) const = default;
};

struct Package {
  int os_index = -1;
  CpuSet cpus;
  std::string cpu_model;

  bool operator==(const Package&) const = default;
};

struct NumaNode {
  int os_index = -1;
  CpuSet cpus;
  std::uint64_t memory_bytes = 0;
  // Grace Hopper / POWER9 expose GPU HBM as CPU-less NUMA nodes: never host memory (R-LOC-3).
  bool gpu_memory = false;
  std::optional<PciAddress> gpu_busid;  // the GPU whose memory this is, when gpu_memory

  bool operator==(const NumaNode&) const = default;
};

struct Core {
  int os_index = -1;  // hwloc's Core os_index (not unique across packages on some machines)
  int package = -1;   // os_index of the package
  int numa = -1;      // os_index of its host NUMA node, -1 when unknown
  CpuSet pus;         // its hardware threads (SMT siblings)

  bool operator==(const Core&) const = default;
};

struct Gpu {
  int index = -1;  // position in bus-id order
  PciAddress busid;
  std::uint16_t vendor_id = 0;
  std::uint16_t device_id = 0;
  std::string model;  // "NVIDIA H100 80GB HBM3" when known (NVML/OpenCL/CUDA osdev)
  std::string uuid;   // "GPU-..." when NVML (or the XML) says
  int numa = -1;      // host NUMA node os_index, -1 = unknown (R-LOC-2)
  CpuSet cpus;        // locality (R-LOC-1); empty = unknown
  PcieLink link;
  PciPath path;

  bool operator==(const Gpu&) const = default;
};

struct NicPort {
  int number = 1;
  int state = 0;           // IB port state: 4 = ACTIVE (hwloc's PortNState)
  int physical_state = 0;  // 5 = LinkUp, 0 = unknown
  double rate_gbps = 0.0;  // 0 = unknown
  std::string link_layer;  // "InfiniBand", "Ethernet", "" unknown
  std::vector<std::string> gids;

  bool operator==(const NicPort&) const = default;
};

enum class NicRole { compute, storage, excluded };

struct Nic {
  int index = -1;    // position in natural order of name
  std::string name;  // OpenFabrics name ("mlx5_0"); "" when no driver is bound
  PciAddress busid;
  std::uint16_t vendor_id = 0;
  std::uint16_t device_id = 0;
  std::string netdev;  // "ibp24s0"
  int numa = -1;
  CpuSet cpus;
  PcieLink link;
  PciPath path;
  std::vector<NicPort> ports;
  NicRole role = NicRole::compute;
  bool has_driver = true;  // false for class 0x0207 without an OpenFabrics device

  bool operator==(const Nic&) const = default;
};

struct NvSwitch {
  PciAddress busid;
  int numa = -1;
  PciPath path;

  bool operator==(const NvSwitch&) const = default;
};

// Where the data came from, for diagnostics (R-LOAD-4).
struct Sources {
  std::string origin;                    // "live" or the XML/JSON path
  std::string hwloc_api_version;         // hwloc release we were built with ("2.9.0")
  std::string hwloc_file_version;        // hwlocVersion info of an XML, "" if none
  bool nvml = false;                     // NVML enriched this topology
  bool nvlink_known = false;             // NVLink counts come from NVML or XML distances
  std::vector<std::string> io_backends;  // osdev kinds seen: "cuda", "nvml", "opencl", ...

  bool operator==(const Sources&) const = default;
};

struct NodeTopology {
  std::string hostname;
  std::string product;  // DMIProductName, "" if unknown
  Sources sources;
  std::vector<Package> packages;     // ordered by os_index
  std::vector<NumaNode> numa_nodes;  // ordered by os_index
  std::vector<Core> cores;           // ordered by first PU
  CpuSet allowed_cpus;               // PUs this process may use (cgroup/affinity)
  std::vector<Gpu> gpus;             // ordered by bus id
  std::vector<Nic> nics;             // ordered by natural order of name
  std::vector<NvSwitch> nvswitches;
  // nvlinks[i][j] = NVLink count between gpus[i] and gpus[j]; empty when unknown (no NVML, no
  // distances); all-zero rows for GPUs without NVLink.
  std::vector<std::vector<int>> nvlinks;
  int nvlink_per_link_mbps = 0;  // per-link, per-direction bandwidth used for NV#
  // false when devices have no locality although the machine has >1 NUMA node (VMs, BIOS
  // without _PXM): NUMA is then N/A for every device (R-LOC-1).
  bool locality_known = true;

  std::size_t pu_count() const;
  const NumaNode* numa(int os_index) const;
  const Gpu* gpu_by_busid(const PciAddress& busid) const;
  const Nic* nic_by_name(std::string_view name) const;

  bool operator==(const NodeTopology&) const = default;
};

std::string_view to_string(NicRole role);
std::optional<NicRole> nic_role_from_string(std::string_view text);

// "mlx5_9" < "mlx5_10", "n2" < "n10": digit runs compare as numbers. Orders NICs and nodes.
bool natural_less(std::string_view a, std::string_view b);

}  // namespace topolaunch::topology
