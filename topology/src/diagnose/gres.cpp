// `topodiag --gres`: gres.conf lines and the slurm.conf NodeName line for this node. Debian's
// Slurm has no gpu_nvml autodetection, so admins write these by hand; this writes them from the
// same topology everything else uses.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "describe.hpp"
#include "topolaunch/topology/diagnose.hpp"

namespace topolaunch::topology {

namespace {

// gres.conf Cores= takes Slurm's logical core indexes, not OS CPU numbers: "core 0 is the first
// core on the first socket, core 1 the second core on the first socket", the Core L# of
// `lstopo -l` (gres.conf(5), Cores). Order cores by package, then by their first PU.
std::vector<const Core*> cores_in_logical_order(const NodeTopology& topo) {
  std::map<int, std::size_t> package_position;
  for (std::size_t p = 0; p < topo.packages.size(); ++p) {
    package_position[topo.packages[p].os_index] = p;
  }
  std::vector<const Core*> cores;
  for (const Core& c : topo.cores) {
    cores.push_back(&c);
  }
  auto position = [&](const Core* c) {
    auto it = package_position.find(c->package);
    return it == package_position.end() ? topo.packages.size() : it->second;
  };
  std::stable_sort(cores.begin(), cores.end(), [&](const Core* a, const Core* b) {
    return std::pair(position(a), a->pus.first()) < std::pair(position(b), b->pus.first());
  });
  return cores;
}

}  // namespace

std::string render_gres(const NodeTopology& topo, const std::map<std::string, int>& device_minors) {
  const std::string node = topo.hostname.empty() ? std::string("NODE") : topo.hostname;
  std::string out;
  out += fmt::format("# gres.conf for {} (topodiag --gres)\n", node);
  if (topo.gpus.empty()) {
    out += "# no NVIDIA GPU found: no Name=gpu lines\n";
  } else {
    const bool all_minors_known = std::all_of(
        topo.gpus.begin(), topo.gpus.end(),
        [&](const Gpu& gpu) { return device_minors.count(gpu.busid.to_string()) != 0; });
    if (all_minors_known) {
      out += "# File=/dev/nvidia<N>: N is the device minor the NVIDIA driver reports.\n";
    } else {
      out +=
          "# File=/dev/nvidia<N>: N is the GPU index in PCI bus order where the NVIDIA device "
          "minor\n"
          "# is not known here; check \"Device Minor\" in "
          "/proc/driver/nvidia/gpus/<bus id>/information.\n";
    }
    out +=
        "# Cores= are Slurm logical core indexes (lstopo -l Core L#), the cores local to each "
        "GPU.\n";
    const std::vector<const Core*> cores = cores_in_logical_order(topo);
    for (const Gpu& gpu : topo.gpus) {
      std::vector<int> logical;
      for (std::size_t l = 0; l < cores.size(); ++l) {
        if (cores[l]->pus.intersects(gpu.cpus)) {
          logical.push_back(static_cast<int>(l));
        }
      }
      const auto minor = device_minors.find(gpu.busid.to_string());
      std::string line = fmt::format("Name=gpu File=/dev/nvidia{}",
                                     minor == device_minors.end() ? gpu.index : minor->second);
      if (!logical.empty()) {
        line += " Cores=" + CpuSet(logical).to_list();
      }
      line += fmt::format("  # GPU{} {} NUMA {}", gpu.index, gpu.busid.to_string(),
                          describe::numa(gpu.numa));
      if (minor == device_minors.end() && !all_minors_known) {
        line += " (minor unknown: index used)";
      }
      if (logical.empty()) {
        line += " (locality unknown: no Cores=)";
      }
      out += line + '\n';
    }
  }

  out += "\n# slurm.conf\n";
  const std::size_t sockets = std::max<std::size_t>(topo.packages.size(), 1);
  const std::size_t cores = topo.cores.size();
  const std::size_t threads = topo.pu_count();
  std::map<int, std::size_t> cores_per_package;
  for (const Core& c : topo.cores) {
    ++cores_per_package[c.package];
  }
  bool uniform = true;
  for (const auto& [package, count] : cores_per_package) {
    uniform = uniform && count == cores / sockets;
  }
  if (!uniform || cores % sockets != 0) {
    out += "# sockets have different core counts: CoresPerSocket is the average\n";
  }
  std::uint64_t memory_bytes = 0;
  for (const NumaNode* n : describe::host_numa_nodes(topo)) {
    memory_bytes += n->memory_bytes;
  }
  out +=
      "# RealMemory is all host memory in MiB; set it a little lower to leave room for the OS.\n";
  std::string line = fmt::format(
      "NodeName={} CPUs={} Sockets={} CoresPerSocket={} ThreadsPerCore={} RealMemory={}", node,
      threads, sockets, cores / sockets, cores == 0 ? 1 : threads / cores,
      memory_bytes / (1024 * 1024));
  if (!topo.gpus.empty()) {
    line += fmt::format(" Gres=gpu:{}", topo.gpus.size());
  }
  out += line + '\n';
  return out;
}

}  // namespace topolaunch::topology

namespace topolaunch::topology {

std::map<std::string, int> read_nvidia_device_minors(const std::string& proc_root) {
  std::map<std::string, int> minors;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(proc_root, error)) {
    const auto busid = PciAddress::parse(entry.path().filename().string());
    std::ifstream info(entry.path() / "information");
    if (!busid || !info) {
      continue;
    }
    for (std::string line; std::getline(info, line);) {
      // "Device Minor: \t 0"
      if (line.rfind("Device Minor:", 0) == 0) {
        try {
          minors[busid->to_string()] = std::stoi(line.substr(line.find(':') + 1));
        } catch (const std::exception&) {
          // an unreadable minor stays unknown: the index is used and the comment says so
        }
        break;
      }
    }
  }
  return minors;
}

}  // namespace topolaunch::topology
