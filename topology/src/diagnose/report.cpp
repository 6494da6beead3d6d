// The human report of topodiag: node summary, GPU and NIC tables, an `nvidia-smi topo -m` style
// relation matrix with its legend, and the findings. Aligned columns; colour only when asked.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "describe.hpp"
#include "topolaunch/topology/diagnose.hpp"
#include "topolaunch/topology/relation.hpp"

namespace topolaunch::topology {

namespace {

using Row = std::vector<std::string>;

// Left-aligned columns separated by two spaces; trailing spaces trimmed.
void append_table(std::string& out, const std::vector<Row>& rows, std::string_view indent) {
  std::vector<std::size_t> widths;
  for (const Row& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  for (const Row& row : rows) {
    std::string line(indent);
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) {
        line.append(widths[c] - row[c].size() + 2, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    out += line;
    out += '\n';
  }
}

std::string paint(const std::string& text, std::string_view ansi, bool color) {
  if (!color) {
    return text;
  }
  return fmt::format("\033[{}m{}\033[0m", ansi, text);
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += (i ? std::string(sep) : std::string()) + items[i];
  }
  return out;
}

std::string plural(std::size_t count, std::string_view noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

void append_summary(std::string& out, const NodeTopology& topo, const ReportStyle& style) {
  std::vector<Row> rows;
  std::string node = topo.hostname.empty() ? "(unknown host)" : topo.hostname;
  if (!topo.product.empty()) {
    node += fmt::format(" ({})", topo.product);
  }
  rows.push_back({"Node", node});
  std::string source = topo.sources.origin.empty() ? "live" : topo.sources.origin;
  if (!topo.sources.hwloc_file_version.empty() && source != "live") {
    source += fmt::format(" (written by hwloc {})", topo.sources.hwloc_file_version);
  }
  rows.push_back({"Source", source});

  const std::size_t threads = topo.pu_count();
  std::string cpus = fmt::format("{}, {}, {}", plural(topo.packages.size(), "socket"),
                                 plural(topo.cores.size(), "core"), plural(threads, "thread"));
  if (!topo.cores.empty() && threads % topo.cores.size() == 0 && threads > topo.cores.size()) {
    cpus += fmt::format(" (SMT{})", threads / topo.cores.size());
  }
  if (!topo.packages.empty() && !topo.packages.front().cpu_model.empty()) {
    cpus += ": " + topo.packages.front().cpu_model;
  }
  rows.push_back({"CPUs", cpus});
  const auto host_numa = describe::host_numa_nodes(topo);
  std::uint64_t memory = 0;
  for (const NumaNode* n : host_numa) {
    memory += n->memory_bytes;
  }
  rows.push_back({"Memory", fmt::format("{} in {}", describe::bytes(memory),
                                        plural(host_numa.size(), "NUMA node"))});
  append_table(out, rows, "");

  std::vector<Row> numa_rows;
  for (const NumaNode& n : topo.numa_nodes) {
    Row row{fmt::format("NUMA{}", n.os_index), "CPUs " + (n.cpus.empty() ? "-" : n.cpus.to_list()),
            "memory " + describe::bytes(n.memory_bytes)};
    if (n.gpu_memory) {
      row.push_back("GPU memory" + (n.gpu_busid ? " of " + n.gpu_busid->to_string() : ""));
    }
    numa_rows.push_back(std::move(row));
  }
  append_table(out, numa_rows, "  ");
  if (style.verbose) {
    std::vector<Row> source_rows;
    source_rows.push_back({"hwloc", topo.sources.hwloc_api_version.empty()
                                        ? std::string("?")
                                        : topo.sources.hwloc_api_version});
    source_rows.push_back({"NVML", topo.sources.nvml ? "yes" : "no"});
    source_rows.push_back({"NVLink data", topo.sources.nvlink_known ? "yes" : "no"});
    source_rows.push_back({"I/O backends", topo.sources.io_backends.empty()
                                               ? std::string("none")
                                               : join(topo.sources.io_backends, ", ")});
    out += "Data sources:\n";
    append_table(out, source_rows, "  ");
  }
}

std::string closest_nics_cell(const NodeTopology& topo, const Gpu& gpu) {
  const std::vector<int> best = closest_nics(topo, gpu.index);
  if (best.empty()) {
    return "-";
  }
  std::vector<std::string> names;
  for (int k : best) {
    const Nic& nic = topo.nics[static_cast<std::size_t>(k)];
    names.push_back(nic.name.empty() ? nic.busid.to_string() : nic.name);
  }
  const Relation r =
      pcie_relation(topo, {DeviceRef::Kind::gpu, gpu.index}, {DeviceRef::Kind::nic, best.front()});
  return fmt::format("{} ({})", join(names, ","), r.to_string());
}

void append_gpus(std::string& out, const NodeTopology& topo) {
  out += fmt::format("\nGPUs: {} (PCI bus order = CUDA order with CUDA_DEVICE_ORDER=PCI_BUS_ID)\n",
                     topo.gpus.size());
  std::vector<Row> rows{
      {"GPU", "Bus id", "Model", "NUMA", "CPU Affinity", "PCIe link", "Closest NICs"}};
  for (const Gpu& gpu : topo.gpus) {
    rows.push_back({fmt::format("GPU{}", gpu.index), gpu.busid.to_string(),
                    describe::gpu_model(gpu), describe::numa(gpu.numa),
                    gpu.cpus.empty() ? "N/A" : gpu.cpus.to_list(),
                    describe::link_with_max(gpu.link), closest_nics_cell(topo, gpu)});
  }
  append_table(out, rows, "  ");
}

void append_nics(std::string& out, const NodeTopology& topo) {
  out += fmt::format("\nNICs: {}\n", topo.nics.size());
  std::vector<Row> rows{{"NIC", "Name", "Netdev", "Bus id", "NUMA", "CPU Affinity", "PCIe link",
                         "Ports", "Rate", "Role"}};
  for (const Nic& nic : topo.nics) {
    std::vector<std::string> ports;
    std::vector<std::string> rates;
    for (const NicPort& p : nic.ports) {
      ports.push_back(fmt::format("{}:{}", p.number, describe::port_state(p.state)));
      rates.push_back(describe::rate(p.rate_gbps));
    }
    rows.push_back({fmt::format("NIC{}", nic.index), nic.name.empty() ? "(no driver)" : nic.name,
                    nic.netdev.empty() ? "-" : nic.netdev, nic.busid.to_string(),
                    describe::numa(nic.numa), nic.cpus.empty() ? "N/A" : nic.cpus.to_list(),
                    describe::link_with_max(nic.link), ports.empty() ? "-" : join(ports, ","),
                    rates.empty() ? "?" : join(rates, ","), std::string(to_string(nic.role))});
  }
  append_table(out, rows, "  ");
}

void append_matrix(std::string& out, const NodeTopology& topo) {
  const RelationMatrix matrix = relation_matrix(topo, true);
  out += "\nRelations (like nvidia-smi topo -m):\n";
  std::vector<Row> rows;
  Row header{""};
  header.insert(header.end(), matrix.labels.begin(), matrix.labels.end());
  header.push_back("CPU Affinity");
  header.push_back("NUMA Affinity");
  rows.push_back(std::move(header));
  for (std::size_t r = 0; r < matrix.labels.size(); ++r) {
    Row row{matrix.labels[r]};
    for (const Relation& cell : matrix.cells[r]) {
      row.push_back(cell.to_string());
    }
    if (r < topo.gpus.size()) {
      const Gpu& gpu = topo.gpus[r];
      row.push_back(gpu.cpus.empty() ? "N/A" : gpu.cpus.to_list());
      row.push_back(describe::numa(gpu.numa));
    }
    rows.push_back(std::move(row));
  }
  append_table(out, rows, "  ");
  out +=
      "\nLegend:\n"
      "  X    = Self\n"
      "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
      "(e.g., QPI/UPI)\n"
      "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
      "within a NUMA node\n"
      "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
      "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
      "Bridge)\n"
      "  PIX  = Connection traversing at most a single PCIe bridge\n"
      "  NV#  = Connection traversing a bonded set of # NVLinks\n";
  if (topo.gpus.size() > 1 && topo.nvlinks.empty()) {
    out += "  (no NVLink data in this topology: GPU pairs show PCIe relations only)\n";
  }
  if (!topo.nics.empty()) {
    out += "\nNIC Legend:\n\n";
    for (const Nic& nic : topo.nics) {
      out += fmt::format("  NIC{}: {}\n", nic.index,
                         nic.name.empty() ? nic.busid.to_string() + " (no driver)" : nic.name);
    }
  }
}

void append_findings(std::string& out, const std::vector<Finding>& findings,
                     const ReportStyle& style) {
  std::vector<const Finding*> shown;
  for (const Finding& f : findings) {
    if (f.severity != Severity::info || style.verbose) {
      shown.push_back(&f);
    }
  }
  out += "\nFindings:";
  if (shown.empty()) {
    out += " none\n";
    return;
  }
  out += '\n';
  for (const Finding* f : shown) {
    std::string line = format_finding(*f);
    if (style.color) {
      const std::string word(to_string(f->severity));
      const std::string_view ansi = f->severity == Severity::error     ? "1;31"
                                    : f->severity == Severity::warning ? "33"
                                                                       : "36";
      const std::size_t at = line.find(' ' + word + ' ');
      if (at != std::string::npos) {
        line.replace(at + 1, word.size(), paint(word, ansi, true));
      }
    }
    out += "  " + line + '\n';
  }
}

}  // namespace

std::string render_report(const NodeTopology& topo, const std::vector<Finding>& findings,
                          const ReportStyle& style) {
  std::string out;
  append_summary(out, topo, style);
  if (topo.gpus.empty() && topo.nics.empty()) {
    out +=
        "\nNo NVIDIA GPU and no RDMA NIC found: this is a CPU-only node as far as topolaunch "
        "is concerned.\n";
  } else {
    if (topo.gpus.empty()) {
      out += "\nNo NVIDIA GPU found.\n";
    } else {
      append_gpus(out, topo);
    }
    if (topo.nics.empty()) {
      out += "\nNo RDMA NIC found.\n";
    } else {
      append_nics(out, topo);
    }
    append_matrix(out, topo);
  }
  append_findings(out, findings, style);
  return out;
}

}  // namespace topolaunch::topology
