#include "topology_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "topolaunch/common/isolated.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/import_cache.hpp"
#include "topolaunch/topology/serialize.hpp"

namespace topolaunch::spank {
namespace {

using topology::NodeTopology;
namespace import_cache = topology::import_cache;

constexpr std::size_t kMaxOutputBytes = 512u << 20;

// What the child sends back, one record per line; a topology as its length and its bytes:
//   U <why>                       the cache cannot be used (the only record)
//   E <message>                   a node's file cannot be read or imported (the only record)
//   N <node> <key>                per node
//   T <key> <length>\n<json>      per distinct key
//   C <from cache> <imported>
//   W <why>                       an entry could not be written (the results stand)
Result<std::string> cache_child(const SiteConfig& site, const std::vector<std::string>& nodes) {
  // slurmstepd's user_init runs with the job user's effective ids and the real uid 0: the cache
  // is root's. Elsewhere (tests, a user's own slurmd) real and effective ids are the same.
  const uid_t job_uid = ::geteuid();
  const gid_t job_gid = ::getegid();
  if (job_gid != ::getgid() || job_uid != ::getuid()) {
    if (::seteuid(::getuid()) != 0 || ::setegid(::getgid()) != 0) {
      return fmt::format("U cannot take the real identity (uid {}): {}\n", ::getuid(),
                         std::strerror(errno));
    }
  }
  // hwloc parses with the identity it had before the cache (the job user's under slurmstepd);
  // only the cache's own files are read and written with the real one. This child is single
  // threaded, so switching back and forth affects nothing else.
  auto import_as_job_user =
      [&](const std::string& bytes, const std::string& path,
          const topology::DiscoverOptions& options) -> Result<topology::NodeTopology> {
    const bool switched = job_uid != ::geteuid() || job_gid != ::getegid();
    if (switched && (::setegid(job_gid) != 0 || ::seteuid(job_uid) != 0)) {
      return make_error(fmt::format("cannot switch to uid {} to import {}: {}", job_uid, path,
                                    std::strerror(errno)));
    }
    auto topo = topology::load_topology_buffer(bytes, path, options);
    if (switched && (::seteuid(::getuid()) != 0 || ::setegid(::getgid()) != 0)) {
      return make_error(
          fmt::format("cannot switch back to uid {}: {}", ::getuid(), std::strerror(errno)));
    }
    return topo;
  };
  const std::string& root = site.topology_cache;
  if (auto trusted = import_cache::trusted_cache_directory(root); !trusted) {
    return "U " + trusted.error().message + "\n";
  }
  const std::string salt = import_cache::salt(site.nics_text);
  topology::DiscoverOptions options;
  options.nics = site.nics;

  std::string nodes_out;
  std::map<std::string, std::string> json_by_key;
  std::string written;  // the first write failure, if any
  int from_cache = 0;
  int imported = 0;
  for (const std::string& node : nodes) {
    const std::string path = expand_node_pattern(site.topology_xml, node);
    auto found = import_cache::lookup(
        root, path, salt,
        [&](const std::string& bytes) { return import_as_job_user(bytes, path, options); },
        &json_by_key);
    if (!found) return "E " + found.error().message + "\n";
    from_cache += found->from_cache ? 1 : 0;
    imported += found->imported ? 1 : 0;
    if (written.empty()) written = found->write_error;
    nodes_out += fmt::format("N {} {}\n", node, found->key);
  }
  std::string out = std::move(nodes_out);
  for (const auto& [key, json] : json_by_key) {
    out += fmt::format("T {} {}\n", key, json.size());
    out += json;
  }
  out += fmt::format("C {} {}\n", from_cache, imported);
  if (!written.empty()) out += "W " + written + "\n";
  return out;
}

}  // namespace

Result<StepTopologies> load_step_topologies(const SiteConfig& site,
                                            const std::vector<std::string>& nodes,
                                            const std::string& self) {
  StepTopologies result;
  IsolationLimits limits;
  // The first step on a node imports every distinct file (24 ms each here); later ones import none.
  limits.wall = std::chrono::minutes(5);
  limits.cpu = std::chrono::minutes(5);
  auto text = run_isolated_output([&] { return cache_child(site, nodes); }, limits,
                                  "topology cache " + site.topology_cache, kMaxOutputBytes);
  if (!text) {
    result.unusable = text.error().message;
    return result;
  }
  const std::string_view all = *text;
  std::map<std::string, std::string> key_of_node;
  std::map<std::string, std::shared_ptr<const NodeTopology>> by_key;
  std::map<std::string, std::string> first_node_of_key;
  std::size_t at = 0;
  auto bad = [&](std::string_view why) -> Result<StepTopologies> {
    result = StepTopologies{};
    result.unusable = fmt::format("topology cache {}: {}", site.topology_cache, why);
    return result;
  };
  while (at < all.size()) {
    const std::size_t end = all.find('\n', at);
    if (end == std::string_view::npos) return bad("a cut reply");
    const std::string_view line = all.substr(at, end - at);
    at = end + 1;
    if (line.size() < 2 || line[1] != ' ') return bad("a malformed reply");
    const std::string_view rest = line.substr(2);
    const std::size_t space = rest.find(' ');
    switch (line[0]) {
      case 'U':
        return bad(rest);
      case 'E':
        return make_error(std::string(rest));
      case 'N': {
        if (space == std::string_view::npos) return bad("a malformed node record");
        const std::string node(rest.substr(0, space));
        key_of_node[node] = std::string(rest.substr(space + 1));
        first_node_of_key.try_emplace(std::string(rest.substr(space + 1)), node);
        break;
      }
      case 'T': {
        if (space == std::string_view::npos) return bad("a malformed topology record");
        const std::string key(rest.substr(0, space));
        const std::size_t length =
            std::strtoull(std::string(rest.substr(space + 1)).c_str(), nullptr, 10);
        if (length > all.size() - at) return bad("a cut topology record");
        const std::string json(all.substr(at, length));
        at += length;
        auto node = first_node_of_key.find(key);
        const std::string path = node == first_node_of_key.end()
                                     ? key
                                     : expand_node_pattern(site.topology_xml, node->second);
        auto topo = topology::from_json(json, path);
        if (!topo) return bad(topo.error().message);
        if (node != first_node_of_key.end()) topo->hostname = node->second;
        topo->sources.origin = path;
        by_key[key] = std::make_shared<const NodeTopology>(std::move(*topo));
        break;
      }
      case 'C':
        if (std::sscanf(std::string(rest).c_str(), "%d %d", &result.from_cache, &result.imported) !=
            2)
          return bad("a malformed count record");
        break;
      case 'W':
        result.write_error = std::string(rest);
        break;
      default:
        return bad("an unknown record");
    }
  }
  for (const std::string& node : nodes) {
    auto key = key_of_node.find(node);
    if (key == key_of_node.end()) return bad(fmt::format("no record of node {}", node));
    auto topo = by_key.find(key->second);
    if (topo == by_key.end()) return bad(fmt::format("no topology for node {}", node));
    if (node == self && topo->second->hostname != self) {
      // This node's own: its name and its file, in messages and the task environment.
      auto own = std::make_shared<NodeTopology>(*topo->second);
      own->hostname = self;
      own->sources.origin = expand_node_pattern(site.topology_xml, self);
      result.by_node[node] = std::move(own);
    } else {
      result.by_node[node] = topo->second;
    }
  }
  result.distinct = static_cast<int>(by_key.size());
  return result;
}

Result<StepTopologies> load_step_topologies_direct(const SiteConfig& site,
                                                   const std::vector<std::string>& nodes,
                                                   const std::string& self) {
  StepTopologies result;
  std::map<std::string, std::shared_ptr<const NodeTopology>> by_bytes;
  // This node first: its topology carries its own name, and nodes with the same bytes share it.
  std::vector<std::string> order{self};
  for (const std::string& node : nodes) {
    if (node != self) order.push_back(node);
  }
  for (const std::string& node : order) {
    const std::string path = expand_node_pattern(site.topology_xml, node);
    auto bytes = import_cache::topology_file_bytes(path);
    if (!bytes) return bytes.error();
    if (auto known = by_bytes.find(*bytes); known != by_bytes.end()) {
      result.by_node[node] = known->second;
      continue;
    }
    topology::DiscoverOptions options;
    options.nics = site.nics;
    options.hostname = node;
    auto topo = topology::load_topology_buffer(*bytes, path, options);
    if (!topo) return topo.error();
    auto shared = std::make_shared<const NodeTopology>(std::move(*topo));
    result.by_node[node] = shared;
    by_bytes.emplace(std::move(*bytes), std::move(shared));
    ++result.imported;
  }
  result.distinct = static_cast<int>(by_bytes.size());
  return result;
}

}  // namespace topolaunch::spank
