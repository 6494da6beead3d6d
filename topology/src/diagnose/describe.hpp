// Small private helpers shared by the checks and the renderings: how objects, links, port states
// and sizes are named in findings and reports, so every output spells them the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topolaunch/topology/model.hpp"

namespace topolaunch::topology::describe {

// "GPU3 0000:61:00.0"
std::string gpu_object(const Gpu& gpu);
// "NIC2 mlx5_4" (or "NIC2 0000:4f:00.0" when no driver is bound)
std::string nic_object(const Nic& nic);
// "Gen5 x16", "x16" (gen unknown), "Gen5" (width unknown), "?" (nothing known)
std::string link(int gen, int width);
// current link plus " (max Gen5 x16)" when the maximum is known and differs
std::string link_with_max(const PcieLink& link);
// IB port states as ibstat prints them: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER
std::string port_state(int state);
// "1 TiB", "512 GiB", "6 GiB", "5.9 GiB"
std::string bytes(std::uint64_t value);
// "400 Gb/s", "?" when 0
std::string rate(double gbps);
// GPU model, or "[10de:2330]" when the model name is unknown (no NVML/CUDA/OpenCL data)
std::string gpu_model(const Gpu& gpu);
// "10de:2330"
std::string pci_id(std::uint16_t vendor, std::uint16_t device);
// "-1" -> "N/A"
std::string numa(int os_index);
// Host NUMA nodes only (GPU-memory nodes of Grace Hopper are not host memory, R-LOC-3).
std::vector<const NumaNode*> host_numa_nodes(const NodeTopology& topo);

}  // namespace topolaunch::topology::describe
