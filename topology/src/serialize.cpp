// JSON layout: one object per model struct, field names as in model.hpp; CPU sets as cpulist
// strings ("0-3,8"), PCI addresses as "0000:1b:00.0". Missing fields take the model default
// (so version 1 readers accept files written by later additive versions); wrong types and
// unparsable values are errors naming the origin and the field.
#include "topolaunch/topology/serialize.hpp"

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace topolaunch::topology {

using nlohmann::json;

namespace {

struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

json to_j(const Package& p);
json to_j(const NumaNode& n);
json to_j(const Core& c);
json to_j(const Gpu& g);
json to_j(const NicPort& p);
json to_j(const Nic& n);
json to_j(const NvSwitch& s);

json to_j(const CpuSet& set) { return set.to_list(); }
json to_j(const PciAddress& address) { return address.to_string(); }

json to_j(const PcieLink& link) {
  return {{"gen", link.gen},
          {"width", link.width},
          {"max_gen", link.max_gen},
          {"max_width", link.max_width},
          {"speed_gbytes_per_s", link.speed_gbytes_per_s}};
}

json to_j(const PciPath& path) {
  json bridges = json::array();
  for (const PciAddress& bridge : path.bridges) {
    bridges.push_back(to_j(bridge));
  }
  return {{"host_bridge", path.host_bridge}, {"bridges", bridges}};
}

template <class T>
json to_j_list(const std::vector<T>& items) {
  json out = json::array();
  for (const T& item : items) {
    out.push_back(to_j(item));
  }
  return out;
}

json to_j(const Package& p) {
  return {{"os_index", p.os_index}, {"cpus", to_j(p.cpus)}, {"cpu_model", p.cpu_model}};
}

json to_j(const NumaNode& n) {
  return {{"os_index", n.os_index},
          {"cpus", to_j(n.cpus)},
          {"memory_bytes", n.memory_bytes},
          {"gpu_memory", n.gpu_memory},
          {"gpu_busid", n.gpu_busid ? json(n.gpu_busid->to_string()) : json(nullptr)}};
}

json to_j(const Core& c) {
  return {{"os_index", c.os_index}, {"package", c.package}, {"numa", c.numa}, {"pus", to_j(c.pus)}};
}

json to_j(const Gpu& g) {
  return {{"index", g.index},         {"busid", to_j(g.busid)}, {"vendor_id", g.vendor_id},
          {"device_id", g.device_id}, {"model", g.model},       {"uuid", g.uuid},
          {"numa", g.numa},           {"cpus", to_j(g.cpus)},   {"link", to_j(g.link)},
          {"path", to_j(g.path)}};
}

json to_j(const NicPort& p) {
  return {{"number", p.number},
          {"state", p.state},
          {"physical_state", p.physical_state},
          {"rate_gbps", p.rate_gbps},
          {"link_layer", p.link_layer},
          {"gids", p.gids}};
}

json to_j(const Nic& n) {
  return {{"index", n.index},
          {"name", n.name},
          {"busid", to_j(n.busid)},
          {"vendor_id", n.vendor_id},
          {"device_id", n.device_id},
          {"netdev", n.netdev},
          {"numa", n.numa},
          {"cpus", to_j(n.cpus)},
          {"link", to_j(n.link)},
          {"path", to_j(n.path)},
          {"ports", to_j_list(n.ports)},
          {"role", std::string(to_string(n.role))},
          {"has_driver", n.has_driver}};
}

json to_j(const NvSwitch& s) {
  return {{"busid", to_j(s.busid)}, {"numa", s.numa}, {"path", to_j(s.path)}};
}

json to_j(const Sources& s) {
  return {{"origin", s.origin},
          {"hwloc_api_version", s.hwloc_api_version},
          {"hwloc_file_version", s.hwloc_file_version},
          {"nvml", s.nvml},
          {"nvlink_known", s.nvlink_known},
          {"io_backends", s.io_backends}};
}

// ---- reading ------------------------------------------------------------------------------

// Reads j[key] into out when present; the model default stays otherwise.
template <class T>
void get(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return;
  }
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    throw FieldError(std::string("field '") + key + "' has the wrong type (" + it->type_name() +
                     ")");
  }
}

void get_cpus(const json& j, const char* key, CpuSet& out) {
  std::string text;
  get(j, key, text);
  auto set = CpuSet::parse_list(text);
  if (!set) {
    throw FieldError(std::string("field '") + key + "': bad cpu list '" + text + "'");
  }
  out = *set;
}

PciAddress parse_busid(const std::string& text, const char* key) {
  auto address = PciAddress::parse(text);
  if (!address) {
    throw FieldError(std::string("field '") + key + "': bad pci address '" + text + "'");
  }
  return *address;
}

void get_busid(const json& j, const char* key, PciAddress& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return;
  }
  std::string text;
  get(j, key, text);
  out = parse_busid(text, key);
}

const json& object_at(const json& j, const char* key) {
  static const json empty = json::object();
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return empty;
  }
  if (!it->is_object()) {
    throw FieldError(std::string("field '") + key + "' must be an object");
  }
  return *it;
}

template <class T, class F>
void get_list(const json& j, const char* key, std::vector<T>& out, F read_one) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return;
  }
  if (!it->is_array()) {
    throw FieldError(std::string("field '") + key + "' must be an array");
  }
  out.clear();
  for (const json& item : *it) {
    if (!item.is_object()) {
      throw FieldError(std::string("field '") + key + "' must hold objects");
    }
    out.push_back(read_one(item));
  }
}

PcieLink read_link(const json& j) {
  PcieLink link;
  get(j, "gen", link.gen);
  get(j, "width", link.width);
  get(j, "max_gen", link.max_gen);
  get(j, "max_width", link.max_width);
  get(j, "speed_gbytes_per_s", link.speed_gbytes_per_s);
  return link;
}

PciPath read_path(const json& j) {
  PciPath path;
  get(j, "host_bridge", path.host_bridge);
  std::vector<std::string> bridges;
  get(j, "bridges", bridges);
  for (const std::string& text : bridges) {
    path.bridges.push_back(parse_busid(text, "bridges"));
  }
  return path;
}

Gpu read_gpu(const json& j) {
  Gpu g;
  get(j, "index", g.index);
  get_busid(j, "busid", g.busid);
  get(j, "vendor_id", g.vendor_id);
  get(j, "device_id", g.device_id);
  get(j, "model", g.model);
  get(j, "uuid", g.uuid);
  get(j, "numa", g.numa);
  get_cpus(j, "cpus", g.cpus);
  g.link = read_link(object_at(j, "link"));
  g.path = read_path(object_at(j, "path"));
  return g;
}

NicPort read_port(const json& j) {
  NicPort p;
  get(j, "number", p.number);
  get(j, "state", p.state);
  get(j, "physical_state", p.physical_state);
  get(j, "rate_gbps", p.rate_gbps);
  get(j, "link_layer", p.link_layer);
  get(j, "gids", p.gids);
  return p;
}

Nic read_nic(const json& j) {
  Nic n;
  get(j, "index", n.index);
  get(j, "name", n.name);
  get_busid(j, "busid", n.busid);
  get(j, "vendor_id", n.vendor_id);
  get(j, "device_id", n.device_id);
  get(j, "netdev", n.netdev);
  get(j, "numa", n.numa);
  get_cpus(j, "cpus", n.cpus);
  n.link = read_link(object_at(j, "link"));
  n.path = read_path(object_at(j, "path"));
  get_list(j, "ports", n.ports, read_port);
  std::string role = std::string(to_string(n.role));
  get(j, "role", role);
  auto parsed = nic_role_from_string(role);
  if (!parsed) {
    throw FieldError("field 'role': unknown nic role '" + role +
                     "' (expected compute, storage or excluded)");
  }
  n.role = *parsed;
  get(j, "has_driver", n.has_driver);
  return n;
}

}  // namespace

std::string to_json(const NodeTopology& topo, bool pretty) {
  json j = {{"version", kTopologyJsonVersion},
            {"hostname", topo.hostname},
            {"product", topo.product},
            {"sources", to_j(topo.sources)},
            {"packages", to_j_list(topo.packages)},
            {"numa_nodes", to_j_list(topo.numa_nodes)},
            {"cores", to_j_list(topo.cores)},
            {"allowed_cpus", to_j(topo.allowed_cpus)},
            {"gpus", to_j_list(topo.gpus)},
            {"nics", to_j_list(topo.nics)},
            {"nvswitches", to_j_list(topo.nvswitches)},
            {"nvlinks", topo.nvlinks},
            {"nvlink_per_link_mbps", topo.nvlink_per_link_mbps},
            {"locality_known", topo.locality_known}};
  return j.dump(pretty ? 1 : -1);
}

Result<NodeTopology> from_json(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return make_error(origin + ": not valid json (truncated or corrupt topology file)");
  }
  if (!j.is_object()) {
    return make_error(origin + ": a topology json must be an object");
  }
  try {
    int version = 0;
    get(j, "version", version);
    if (version != kTopologyJsonVersion) {
      return make_error(origin + ": unsupported topology json version " + std::to_string(version) +
                        " (this build reads version " + std::to_string(kTopologyJsonVersion) + ")");
    }
    NodeTopology topo;
    get(j, "hostname", topo.hostname);
    get(j, "product", topo.product);
    const json& sources = object_at(j, "sources");
    get(sources, "origin", topo.sources.origin);
    get(sources, "hwloc_api_version", topo.sources.hwloc_api_version);
    get(sources, "hwloc_file_version", topo.sources.hwloc_file_version);
    get(sources, "nvml", topo.sources.nvml);
    get(sources, "nvlink_known", topo.sources.nvlink_known);
    get(sources, "io_backends", topo.sources.io_backends);
    get_list(j, "packages", topo.packages, [](const json& e) {
      Package p;
      get(e, "os_index", p.os_index);
      get_cpus(e, "cpus", p.cpus);
      get(e, "cpu_model", p.cpu_model);
      return p;
    });
    get_list(j, "numa_nodes", topo.numa_nodes, [](const json& e) {
      NumaNode n;
      get(e, "os_index", n.os_index);
      get_cpus(e, "cpus", n.cpus);
      get(e, "memory_bytes", n.memory_bytes);
      get(e, "gpu_memory", n.gpu_memory);
      std::string busid;
      get(e, "gpu_busid", busid);
      if (!busid.empty()) {
        n.gpu_busid = parse_busid(busid, "gpu_busid");
      }
      return n;
    });
    get_list(j, "cores", topo.cores, [](const json& e) {
      Core c;
      get(e, "os_index", c.os_index);
      get(e, "package", c.package);
      get(e, "numa", c.numa);
      get_cpus(e, "pus", c.pus);
      return c;
    });
    get_cpus(j, "allowed_cpus", topo.allowed_cpus);
    get_list(j, "gpus", topo.gpus, read_gpu);
    get_list(j, "nics", topo.nics, read_nic);
    get_list(j, "nvswitches", topo.nvswitches, [](const json& e) {
      NvSwitch s;
      get_busid(e, "busid", s.busid);
      get(e, "numa", s.numa);
      s.path = read_path(object_at(e, "path"));
      return s;
    });
    get(j, "nvlinks", topo.nvlinks);
    get(j, "nvlink_per_link_mbps", topo.nvlink_per_link_mbps);
    get(j, "locality_known", topo.locality_known);
    if (!topo.nvlinks.empty()) {
      const std::size_t n = topo.gpus.size();
      bool square = topo.nvlinks.size() == n;
      for (const auto& row : topo.nvlinks) {
        square = square && row.size() == n;
      }
      if (!square) {
        return make_error(origin + ": field 'nvlinks' must be a " + std::to_string(n) + "x" +
                          std::to_string(n) + " matrix (one row and column per gpu)");
      }
    }
    for (std::size_t i = 0; i < topo.gpus.size(); ++i) {
      if (topo.gpus[i].index != static_cast<int>(i)) {
        return make_error(origin + ": gpus[" + std::to_string(i) + "].index is " +
                          std::to_string(topo.gpus[i].index) + ", expected " + std::to_string(i));
      }
    }
    for (std::size_t k = 0; k < topo.nics.size(); ++k) {
      if (topo.nics[k].index != static_cast<int>(k)) {
        return make_error(origin + ": nics[" + std::to_string(k) + "].index is " +
                          std::to_string(topo.nics[k].index) + ", expected " + std::to_string(k));
      }
    }
    return topo;
  } catch (const FieldError& e) {
    return make_error(origin + ": " + e.what());
  } catch (const json::exception& e) {
    return make_error(origin + ": bad topology json: " + e.what());
  }
}

}  // namespace topolaunch::topology
