// A node-local cache of imported topologies, for sites that give every node an hwloc XML
// (topology_xml=/etc/topolaunch/%n.xml). Each node's slurmstepd plans the whole step, so without
// it every node reads every node's XML (~200 KB each: ~200 MB per node per step at 1,024 nodes)
// and imports each distinct file, at every step start. With it, a step start stats each node's
// file and reads its index entry (~150 B); a file is read and imported only when it changed or is
// new to this node, and the nodes whose files have the same bytes share one parse of one JSON.
//
// The cache's layout and keys: topolaunch/topology/import_cache.hpp (shared with the agents'
// cache of their own node's file). Here the directory is root's, under slurmstepd.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "site_config.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/model.hpp"

namespace topolaunch::spank {

struct StepTopologies {
  // Node name -> topology, with `hostname` and `sources.origin` those of the node's own file for
  // `self`; other nodes whose files have the same bytes share one object.
  std::map<std::string, std::shared_ptr<const topology::NodeTopology>> by_node;
  int from_cache = 0;       // files whose index entry matched their stat signature
  int imported = 0;         // files imported (new or changed bytes)
  int distinct = 0;         // distinct topologies among the nodes
  std::string unusable;     // not empty: the cache could not be used, why (nothing else is set)
  std::string write_error;  // not empty: an entry could not be written (the results stand)
};

// Every node's topology through the cache at site.topology_cache (site.topology_xml expanded per
// node). The cache's reads and writes run in a forked child that takes the process's real
// identity (slurmstepd's user_init runs with the job user's effective ids; the cache is root's).
// A node file that cannot be read or imported is an Error naming the file, as a direct load says;
// a cache that cannot be used (unsafe owner or mode, a full disk) sets `unusable` instead, and the
// caller loads directly.
Result<StepTopologies> load_step_topologies(const SiteConfig& site,
                                            const std::vector<std::string>& nodes,
                                            const std::string& self);

// The same without the cache, as with topology_cache=off: every node's file read, and each
// distinct content imported (`imported`, `distinct`; `from_cache` stays 0). Errors name the file.
Result<StepTopologies> load_step_topologies_direct(const SiteConfig& site,
                                                   const std::vector<std::string>& nodes,
                                                   const std::string& self);

}  // namespace topolaunch::spank
