// `topodiag --dot`: a Graphviz picture of the node. Packages and NUMA nodes are nested clusters;
// inside them the PCIe trees from host bridge to GPUs and NICs, where only bridges at which the
// tree branches (PCIe switches) are drawn, since a chain of root port, upstream and downstream
// port says nothing a reader needs; an NVSwitch fabric is one node, not 4 or 6.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "describe.hpp"
#include "topolaunch/topology/diagnose.hpp"
#include "topolaunch/topology/relation.hpp"

namespace topolaunch::topology {

namespace {

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
    }
    out += c;
  }
  return out + "\"";
}

// One node of a PCIe tree: a host bridge (root) or a PCI-to-PCI bridge, with devices as leaves.
struct TreeNode {
  std::string id;
  std::string label;
  std::map<std::string, std::unique_ptr<TreeNode>> bridges;  // by bus id string (sorted)
  std::vector<std::string> devices;                          // dot ids of GPUs/NICs
  int numa = -1;                                             // of the first device

  std::size_t fanout() const { return bridges.size() + devices.size(); }
};

struct Device {
  std::string id;
  std::string label;
  std::string attributes;
  int numa;
  const PciPath* path;
};

std::string node_line(const std::string& id, const std::string& label, const std::string& attrs) {
  return fmt::format("{} [label={}{}{}];\n", id, quote(label), attrs.empty() ? "" : ", ", attrs);
}

// Draws the subtree below `node`; `parent` is the nearest drawn ancestor's id.
void emit_tree(const TreeNode& node, const std::string& parent, bool draw_self, std::string& nodes,
               std::string& edges) {
  std::string here = parent;
  if (draw_self) {
    nodes += "    " + node_line(node.id, node.label, "");
    if (!parent.empty()) {
      edges += fmt::format("  {} -- {};\n", parent, node.id);
    }
    here = node.id;
  }
  for (const auto& [busid, child] : node.bridges) {
    emit_tree(*child, here, child->fanout() >= 2, nodes, edges);
  }
  for (const std::string& device : node.devices) {
    edges += fmt::format("  {} -- {};\n", here, device);
  }
}

}  // namespace

std::string render_dot(const NodeTopology& topo) {
  std::vector<Device> devices;
  for (const Gpu& gpu : topo.gpus) {
    std::string label =
        fmt::format("GPU{}\n{}\n{}", gpu.index, describe::gpu_model(gpu), gpu.busid.to_string());
    const std::string link = describe::link(gpu.link.gen, gpu.link.width);
    if (link != "?") {
      label += "\nPCIe " + link;
    }
    devices.push_back({fmt::format("gpu{}", gpu.index), label,
                       "shape=box, style=\"rounded,filled,bold\", fillcolor=\"#76b900\", "
                       "fontcolor=white",
                       gpu.numa, &gpu.path});
  }
  for (const Nic& nic : topo.nics) {
    std::string label =
        fmt::format("NIC{} {}\n{}", nic.index, nic.name.empty() ? "(no driver)" : nic.name,
                    nic.netdev.empty() ? nic.busid.to_string() : nic.netdev);
    if (!nic.ports.empty() && nic.ports.front().rate_gbps > 0) {
      label += "\n" + describe::rate(nic.ports.front().rate_gbps);
    }
    if (nic.role != NicRole::compute) {
      label += fmt::format("\n({})", to_string(nic.role));
    }
    const bool down = std::any_of(nic.ports.begin(), nic.ports.end(),
                                  [](const NicPort& p) { return p.state != 0 && p.state != 4; });
    std::string attrs = fmt::format("shape=box, style=\"rounded,filled\", fillcolor=\"{}\"",
                                    nic.role == NicRole::compute ? "#9cc3e6" : "#dde8f3");
    if (down) {
      attrs += ", color=red, penwidth=2";
    }
    devices.push_back({fmt::format("nic{}", nic.index), label, attrs, nic.numa, &nic.path});
  }

  // PCIe trees, one per host bridge; devices without a host bridge (VMs) hang off their NUMA.
  std::map<std::string, std::unique_ptr<TreeNode>> roots;
  int next_id = 0;
  for (const Device& d : devices) {
    if (d.path->host_bridge.empty()) {
      continue;  // drawn directly in its NUMA cluster
    }
    auto& root = roots[d.path->host_bridge];
    if (!root) {
      root = std::make_unique<TreeNode>();
      root->id = fmt::format("hb{}", next_id++);
      root->label = "HostBridge\n" + d.path->host_bridge;
      root->numa = d.numa;
    }
    TreeNode* at = root.get();
    for (std::size_t depth = 0; depth < d.path->bridges.size(); ++depth) {
      const PciAddress& bridge = d.path->bridges[depth];
      auto& child = at->bridges[bridge.to_string()];
      if (!child) {
        child = std::make_unique<TreeNode>();
        child->id = fmt::format("br{}", next_id++);
        // A drawn root port is one with several devices below it but no switch in between
        // (e.g. the two functions of a dual-port NIC).
        child->label = (depth == 0 ? "Root port\n" : "PCIe switch\n") + bridge.to_string();
        child->numa = d.numa;
      }
      at = child.get();
    }
    at->devices.push_back(d.id);
  }

  std::string out;
  out += "graph topology {\n";
  std::string title = topo.hostname;
  if (!topo.product.empty()) {
    title += title.empty() ? topo.product : " (" + topo.product + ")";
  }
  if (title.empty()) {
    title = "node";
  }
  out += fmt::format(
      "  graph [rankdir=LR, ordering=out, label={}, labelloc=t, fontname=\"Helvetica\", "
      "fontsize=18, newrank=true, "
      "nodesep=0.2, ranksep=0.45];\n",
      quote(title));
  out +=
      "  node [fontname=\"Helvetica\", fontsize=10, shape=box, style=\"rounded,filled\", "
      "fillcolor=white];\n";
  out += "  edge [color=\"#555555\"];\n";

  std::string edges;
  // What goes into the cluster of NUMA node n (or the machine, n = -1).
  auto numa_content = [&](int numa) {
    std::string nodes;
    for (const auto& [name, root] : roots) {
      if (root->numa == numa) {
        emit_tree(*root, "", true, nodes, edges);
      }
    }
    for (const Device& d : devices) {
      if (d.numa == numa) {
        nodes += "    " + node_line(d.id, d.label, d.attributes);
      }
    }
    return nodes;
  };

  std::vector<int> drawn_numa;
  for (const Package& package : topo.packages) {
    out += fmt::format("  subgraph cluster_package{} {{\n", package.os_index);
    std::string label = fmt::format("Package {}", package.os_index);
    if (!package.cpu_model.empty()) {
      label += ": " + package.cpu_model;
    }
    out += fmt::format(
        "    label={}; style=\"rounded,filled\"; fillcolor=\"#f4f4f4\"; color=\"#999999\"; "
        "fontsize=14;\n",
        quote(label));
    for (const NumaNode& numa : topo.numa_nodes) {
      if (numa.gpu_memory || !package.cpus.contains_all(numa.cpus) || numa.cpus.empty()) {
        continue;
      }
      drawn_numa.push_back(numa.os_index);
      out += fmt::format("    subgraph cluster_numa{} {{\n", numa.os_index);
      out += fmt::format(
          "      label={}; style=\"rounded,filled\"; fillcolor=\"#e8f1fa\"; color=\"#7aa6d6\"; "
          "fontsize=12;\n",
          quote(fmt::format("NUMA {}: CPUs {}, {}", numa.os_index, numa.cpus.to_list(),
                            describe::bytes(numa.memory_bytes))));
      // The CPUs of the NUMA node as one node, so NUMA nodes without devices (and CPU-only
      // machines) still show up: Graphviz does not draw empty clusters.
      std::size_t cores = 0;
      std::size_t threads = 0;
      for (const Core& core : topo.cores) {
        if (core.numa == numa.os_index) {
          ++cores;
          threads += core.pus.size();
        }
      }
      out += "      " + node_line(fmt::format("cpus{}", numa.os_index),
                                  fmt::format("{} cores\n{} threads", cores, threads),
                                  "shape=box, style=\"rounded,filled\", fillcolor=\"#fdf3d0\", "
                                  "fontsize=9");
      out += numa_content(numa.os_index);
      out += "    }\n";
    }
    out += "  }\n";
  }
  // Devices whose NUMA node is unknown or was not drawn inside a package.
  for (const Device& d : devices) {
    if (std::find(drawn_numa.begin(), drawn_numa.end(), d.numa) == drawn_numa.end()) {
      out += "  " + node_line(d.id, d.label, d.attributes);
    }
  }
  for (const auto& [name, root] : roots) {
    if (std::find(drawn_numa.begin(), drawn_numa.end(), root->numa) == drawn_numa.end()) {
      std::string nodes;
      emit_tree(*root, "", true, nodes, edges);
      out += nodes;
    }
  }

  // NVLink.
  if (!topo.nvswitches.empty()) {
    const bool known = !topo.nvlinks.empty();
    out += node_line("nvswitch",
                     fmt::format("NVSwitch fabric\n{} NVSwitches{}", topo.nvswitches.size(),
                                 known ? "" : "\n(NVLink counts unknown)"),
                     "shape=hexagon, style=filled, fillcolor=\"#c8e6a0\", fontsize=12");
    out += "  { rank=sink; nvswitch; }\n";
    if (known) {
      for (const Gpu& gpu : topo.gpus) {
        const auto i = static_cast<std::size_t>(gpu.index);
        int links = 0;
        if (i < topo.nvlinks.size()) {
          links = *std::max_element(topo.nvlinks[i].begin(), topo.nvlinks[i].end());
        }
        if (links > 0) {
          edges += fmt::format(
              "  gpu{} -- nvswitch [label=\"NV{}\", color=\"#76b900\", penwidth=2.5, "
              "fontcolor=\"#3d6b00\", fontsize=9];\n",
              gpu.index, links);
        }
      }
    }
  } else {
    for (std::size_t i = 0; i < topo.nvlinks.size(); ++i) {
      for (std::size_t j = i + 1; j < topo.nvlinks[i].size(); ++j) {
        if (topo.nvlinks[i][j] > 0) {
          edges += fmt::format(
              "  gpu{} -- gpu{} [label=\"NV{}\", color=\"#76b900\", penwidth=2.5, "
              "fontcolor=\"#3d6b00\", fontsize=9, constraint=false];\n",
              i, j, topo.nvlinks[i][j]);
        }
      }
    }
  }
  out += edges;
  out += "}\n";
  return out;
}

}  // namespace topolaunch::topology
