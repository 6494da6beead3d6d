// `topodiag --json`: the R-DIAG-1 schema. Field names are stable; new fields may be added, none
// renamed or removed without bumping "schema_version". Unknown values are null, never "".
#include <nlohmann/json.hpp>

#include "describe.hpp"
#include "topolaunch/topology/diagnose.hpp"
#include "topolaunch/topology/relation.hpp"

namespace topolaunch::topology {

namespace {

using Json = nlohmann::ordered_json;

Json string_or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }
Json int_or_null(int v, int unknown = 0) { return v == unknown ? Json(nullptr) : Json(v); }
Json cpus_or_null(const CpuSet& cpus) {
  return cpus.empty() ? Json(nullptr) : Json(cpus.to_list());
}

Json link_json(const PcieLink& link) {
  return Json{{"gen", int_or_null(link.gen)},
              {"width", int_or_null(link.width)},
              {"max_gen", int_or_null(link.max_gen)},
              {"max_width", int_or_null(link.max_width)},
              {"speed_gbytes_per_s",
               link.speed_gbytes_per_s > 0 ? Json(link.speed_gbytes_per_s) : Json(nullptr)}};
}

}  // namespace

std::string render_json(const NodeTopology& topo, const std::vector<Finding>& findings) {
  Json doc;
  doc["schema"] = "topolaunch.topodiag";
  doc["schema_version"] = kDiagnoseJsonVersion;
  doc["hostname"] = string_or_null(topo.hostname);
  doc["product"] = string_or_null(topo.product);
  doc["hwloc_version"] = string_or_null(topo.sources.hwloc_api_version);
  doc["sources"] = Json{{"origin", string_or_null(topo.sources.origin)},
                        {"hwloc_file_version", string_or_null(topo.sources.hwloc_file_version)},
                        {"nvml", topo.sources.nvml},
                        {"nvlink", topo.sources.nvlink_known},
                        {"hwloc_io_backends", topo.sources.io_backends}};
  const std::size_t threads = topo.pu_count();
  doc["cpu"] = Json{
      {"sockets", topo.packages.size()},
      {"cores", topo.cores.size()},
      {"threads", threads},
      {"threads_per_core", topo.cores.empty() ? Json(nullptr) : Json(threads / topo.cores.size())}};

  Json packages = Json::array();
  for (const Package& p : topo.packages) {
    packages.push_back(Json{{"os_index", p.os_index},
                            {"cpus", cpus_or_null(p.cpus)},
                            {"cpu_model", string_or_null(p.cpu_model)}});
  }
  doc["packages"] = std::move(packages);

  Json numa = Json::array();
  for (const NumaNode& n : topo.numa_nodes) {
    numa.push_back(
        Json{{"os_index", n.os_index},
             {"cpus", cpus_or_null(n.cpus)},
             {"memory_bytes", n.memory_bytes},
             {"subtype", n.gpu_memory ? Json("GPUMemory") : Json(nullptr)},
             {"gpu_busid", n.gpu_busid ? Json(n.gpu_busid->to_string()) : Json(nullptr)}});
  }
  doc["numa"] = std::move(numa);
  doc["locality_known"] = topo.locality_known;

  Json gpus = Json::array();
  for (const Gpu& g : topo.gpus) {
    Json closest = Json::array();
    Json relation = nullptr;
    const std::vector<int> best = closest_nics(topo, g.index);
    for (int k : best) {
      const Nic& nic = topo.nics[static_cast<std::size_t>(k)];
      closest.push_back(nic.name.empty() ? nic.busid.to_string() : nic.name);
    }
    if (!best.empty()) {
      relation =
          pcie_relation(topo, {DeviceRef::Kind::gpu, g.index}, {DeviceRef::Kind::nic, best.front()})
              .to_string();
    }
    gpus.push_back(Json{{"index", g.index},
                        {"busid", g.busid.to_string()},
                        {"uuid", string_or_null(g.uuid)},
                        {"model", string_or_null(g.model)},
                        {"pci_id", describe::pci_id(g.vendor_id, g.device_id)},
                        {"numa", int_or_null(g.numa, -1)},
                        {"cpus", cpus_or_null(g.cpus)},
                        {"link", link_json(g.link)},
                        {"closest_nics", std::move(closest)},
                        {"relation_to_nic", std::move(relation)}});
  }
  doc["gpus"] = std::move(gpus);

  Json nics = Json::array();
  for (const Nic& n : topo.nics) {
    Json ports = Json::array();
    for (const NicPort& p : n.ports) {
      ports.push_back(
          Json{{"number", p.number},
               {"state", int_or_null(p.state)},
               {"state_name", p.state == 0 ? Json(nullptr) : Json(describe::port_state(p.state))},
               {"rate_gbps", p.rate_gbps > 0 ? Json(p.rate_gbps) : Json(nullptr)},
               {"link_layer", string_or_null(p.link_layer)}});
    }
    const NicPort* first = n.ports.empty() ? nullptr : &n.ports.front();
    nics.push_back(
        Json{{"index", n.index},
             {"name", string_or_null(n.name)},
             {"netdev", string_or_null(n.netdev)},
             {"busid", n.busid.to_string()},
             {"pci_id", describe::pci_id(n.vendor_id, n.device_id)},
             {"numa", int_or_null(n.numa, -1)},
             {"cpus", cpus_or_null(n.cpus)},
             {"role", std::string(to_string(n.role))},
             {"has_driver", n.has_driver},
             {"link", link_json(n.link)},
             {"port_state",
              first && first->state ? Json(describe::port_state(first->state)) : Json(nullptr)},
             {"rate", first && first->rate_gbps > 0 ? Json(first->rate_gbps) : Json(nullptr)},
             {"ports", std::move(ports)}});
  }
  doc["nics"] = std::move(nics);

  const RelationMatrix m = relation_matrix(topo, true);
  Json matrix = Json::object();
  for (std::size_t r = 0; r < m.labels.size(); ++r) {
    Json row = Json::object();
    for (std::size_t c = 0; c < m.labels.size(); ++c) {
      row[m.labels[c]] = m.cells[r][c].to_string();
    }
    matrix[m.labels[r]] = std::move(row);
  }
  doc["matrix"] = std::move(matrix);

  Json out_findings = Json::array();
  for (const Finding& f : findings) {
    out_findings.push_back(Json{{"code", f.code},
                                {"severity", std::string(to_string(f.severity))},
                                {"object", f.object},
                                {"message", f.message},
                                {"expected", string_or_null(f.expected)},
                                {"actual", string_or_null(f.actual)}});
  }
  doc["findings"] = std::move(out_findings);
  doc["exit_status"] = exit_status(findings);
  return doc.dump(2) + "\n";
}

}  // namespace topolaunch::topology
