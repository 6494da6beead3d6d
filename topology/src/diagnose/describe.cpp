#include "describe.hpp"

#include <fmt/format.h>

#include <cmath>

namespace topolaunch::topology::describe {

std::string gpu_object(const Gpu& gpu) {
  return fmt::format("GPU{} {}", gpu.index, gpu.busid.to_string());
}

std::string nic_object(const Nic& nic) {
  return fmt::format("NIC{} {}", nic.index, nic.name.empty() ? nic.busid.to_string() : nic.name);
}

std::string link(int gen, int width) {
  if (gen > 0 && width > 0) {
    return fmt::format("Gen{} x{}", gen, width);
  }
  if (width > 0) {
    return fmt::format("x{}", width);
  }
  if (gen > 0) {
    return fmt::format("Gen{}", gen);
  }
  return "?";
}

std::string link_with_max(const PcieLink& l) {
  std::string current = link(l.gen, l.width);
  const bool gen_lower = l.max_gen > 0 && l.gen > 0 && l.gen < l.max_gen;
  const bool width_lower = l.max_width > 0 && l.width > 0 && l.width < l.max_width;
  if (gen_lower || width_lower) {
    current += fmt::format(" (max {})", link(l.max_gen, l.max_width));
  }
  return current;
}

std::string port_state(int state) {
  switch (state) {
    case 0:
      return "?";
    case 1:
      return "DOWN";
    case 2:
      return "INIT";
    case 3:
      return "ARMED";
    case 4:
      return "ACTIVE";
    case 5:
      return "ACTIVE_DEFER";
    default:
      return fmt::format("state {}", state);
  }
}

std::string bytes(std::uint64_t value) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double gib = static_cast<double>(value) / kGiB;
  if (gib >= 1024.0 && std::fmod(gib, 1024.0) == 0.0) {
    return fmt::format("{} TiB", static_cast<std::uint64_t>(gib / 1024.0));
  }
  if (gib >= 10.0 || std::fmod(gib, 1.0) == 0.0) {
    return fmt::format("{:.0f} GiB", gib);
  }
  return fmt::format("{:.1f} GiB", gib);
}

std::string rate(double gbps) {
  if (gbps <= 0.0) {
    return "?";
  }
  return fmt::format("{:g} Gb/s", gbps);
}

std::string gpu_model(const Gpu& gpu) {
  if (!gpu.model.empty()) {
    return gpu.model;
  }
  return "[" + pci_id(gpu.vendor_id, gpu.device_id) + "]";
}

std::string pci_id(std::uint16_t vendor, std::uint16_t device) {
  return fmt::format("{:04x}:{:04x}", vendor, device);
}

std::string numa(int os_index) { return os_index < 0 ? "N/A" : std::to_string(os_index); }

std::vector<const NumaNode*> host_numa_nodes(const NodeTopology& topo) {
  std::vector<const NumaNode*> nodes;
  for (const NumaNode& node : topo.numa_nodes) {
    if (!node.gpu_memory) {
      nodes.push_back(&node);
    }
  }
  return nodes;
}

}  // namespace topolaunch::topology::describe
