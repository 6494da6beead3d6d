// What RDMA hardware a node has, read from sysfs (an injectable root, so fixture trees test it)
// and, for the GPU side, from the CUDA driver (dlopened; absent on most build hosts).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/model.hpp"

namespace topolaunch::rdma {

enum class GidType { unknown, ib_roce_v1, roce_v2 };  // sysfs: "IB/RoCE v1", "RoCE v2"

struct GidEntry {
  int index = 0;
  std::string gid;  // "fe80:0000:0000:0000:0200:00ff:fe00:0000" as sysfs prints it
  GidType type = GidType::unknown;
  std::string netdev;  // gid_attrs/ndevs (RoCE), "" for IB

  bool ipv4_mapped() const;  // ::ffff:a.b.c.d
  bool link_local() const;   // fe80::/10
  bool operator==(const GidEntry&) const = default;
};

struct PortInfo {
  int number = 1;
  int state = 0;           // 4 = ACTIVE
  std::string state_name;  // "ACTIVE"
  int physical_state = 0;  // 5 = LinkUp
  std::string physical_state_name;
  double rate_gbps = 0.0;  // first number of `rate` ("400 Gb/sec (4X NDR)")
  std::string rate_text;
  std::string link_layer;  // "InfiniBand" | "Ethernet"
  std::uint32_t lid = 0;
  std::vector<GidEntry> gids;  // non-zero entries only

  bool active() const { return state == 4; }
  // 0 = unknown (hwloc XML records only the logical state): not held against the port.
  bool link_up() const { return physical_state == 5 || physical_state == 0; }
  bool healthy() const { return active() && link_up(); }
  bool roce() const { return link_layer == "Ethernet"; }  // "" (unknown) counts as InfiniBand
  bool operator==(const PortInfo&) const = default;
};

struct RdmaDevice {
  std::string name;                         // "mlx5_0"
  std::optional<topology::PciAddress> pci;  // absent for virtual devices (rxe)
  int numa = -1;
  std::string node_type;             // "CA"
  std::vector<std::string> netdevs;  // from device/net/*, else gid_attrs/ndevs
  std::vector<PortInfo> ports;

  const PortInfo* port(int number) const;
  bool operator==(const RdmaDevice&) const = default;
};

// GPU capabilities reported by the CUDA driver (CU_DEVICE_ATTRIBUTE_*).
struct GpuRdmaCaps {
  int cuda_index = -1;
  std::optional<topology::PciAddress> pci;
  bool dma_buf = false;         // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (124)
  bool gpudirect_rdma = false;  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED (116)
  int writes_ordering = 0;      // ..._GPU_DIRECT_RDMA_WRITES_ORDERING (118): 100 = owner
  bool operator==(const GpuRdmaCaps&) const = default;
};

struct CudaProbe {
  bool driver_loaded = false;
  std::string status;  // "libcuda.so.1 not found", "cuInit failed: 100", "ok"
  int driver_version = 0;
  std::vector<GpuRdmaCaps> gpus;
};

struct NodeRdmaInventory {
  std::vector<RdmaDevice> devices;  // sorted by name
  bool peermem = false;             // nvidia_peermem / nv_peer_mem / memory_peers present
  std::string peermem_evidence;     // the path that showed it
  CudaProbe cuda;

  const RdmaDevice* device(std::string_view name) const;
};

// Reads <sysfs_root>/class/infiniband/*. No such directory = no devices (not an error); an
// unreadable or malformed device is an error naming the file.
Result<std::vector<RdmaDevice>> probe_rdma_devices(const std::string& sysfs_root = "/sys");
// <root>/module/nvidia_peermem, <root>/module/nv_peer_mem, <root>/kernel/mm/memory_peers/nv_mem.
std::optional<std::string> find_peermem(const std::string& sysfs_root = "/sys");
// dlopens `library` (libcuda.so.1); a missing driver is a normal result with driver_loaded=false.
CudaProbe probe_cuda(const std::string& library = "libcuda.so.1");

Result<NodeRdmaInventory> probe_node(const std::string& sysfs_root = "/sys", bool with_cuda = true);

// Devices as the topology core saw them (hwloc XML or live): ports, GIDs (type unknown), PCI,
// NUMA. For selection from a topology fixture without a sysfs tree.
std::vector<RdmaDevice> devices_from_topology(const topology::NodeTopology& topo);

std::string to_string(GidType type);
std::string to_json(const NodeRdmaInventory& inventory, bool pretty = false);

}  // namespace topolaunch::rdma
