// Building a NodeTopology: from the live machine (hwloc + sysfs, NVML dlopened when present)
// or from an hwloc XML file (v1 or v2). After loading, both go through the same code path.
#pragma once

#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/model.hpp"

namespace topolaunch::topology {

// Which NICs are HPC NICs for ranks, in NCCL_IB_HCA syntax: "mlx5_0,mlx5_3" (include, prefix
// match), "=mlx5_0" (exact), "^mlx5_1,mlx5_2" / "^=mlx5_1" (exclude). Ports as ":1" are accepted.
struct NicFilter {
  std::vector<std::string> include;  // empty = all
  std::vector<std::string> exclude;
  bool exact = false;

  static Result<NicFilter> parse(std::string_view nccl_ib_hca_syntax);
  bool selects(std::string_view nic_name) const;
  // The names of `include` that select none of `nic_names` (NICs asked for that are not there;
  // a name in `exclude` that matches nothing excludes nothing and is not reported).
  std::vector<std::string> unmatched(const std::vector<std::string>& nic_names) const;
};

// An error (exit 2) when `filter` asks for NICs that `topo` lacks, naming them and the NICs the
// node has: "<what>: node n1 has no NIC nosuchnic9 (its NICs: mlx5_0, mlx5_1)"; `what` is the
// option or key the filter came from ("--topolaunch-nics=nosuchnic9", "rdma.nics").
Status check_named_nics(const NicFilter& filter, const NodeTopology& topo, std::string_view node,
                        std::string_view what);

struct DiscoverOptions {
  NicFilter nics;        // NICs not selected get role `excluded`
  bool use_nvml = true;  // live only: dlopen libnvidia-ml.so.1 for NVLink/UUIDs
  std::string hostname;  // override (e.g. the Slurm node name); "" = gethostname / XML
};

// Makes hwloc read XML with its own minimal parser, not libxml2, for the rest of the process:
// hwloc 2.9's libxml importer crashes on an internal DTD subset (research/hostile-inputs.md),
// and the files we read are hwloc's own exports, which the minimal parser reads. hwloc decides
// once, at the first XML import of the process, from the environment, so programs call this at
// the top of main, before any thread starts (it sets HWLOC_LIBXML=0). Where it cannot be called
// (inside slurmstepd) the loaders below still refuse DTD subsets and entities.
void prefer_minimal_xml_importer();

// Live discovery of this machine.
Result<NodeTopology> discover_live(const DiscoverOptions& options = {});

// From an hwloc XML file (v1 or v2). Rejects v3, empty, truncated or non-XML files and
// directories with one clear line naming the file (exit code 2).
Result<NodeTopology> load_xml_file(const std::string& path, const DiscoverOptions& options = {});
Result<NodeTopology> load_xml_buffer(const std::string& xml, const std::string& name,
                                     const DiscoverOptions& options = {});

// Either of the above by file content: hwloc XML or our own NodeTopology JSON.
Result<NodeTopology> load_topology_file(const std::string& path,
                                        const DiscoverOptions& options = {});
// The same from the file's bytes; `name` stands for the file in error messages.
Result<NodeTopology> load_topology_buffer(const std::string& text, const std::string& name,
                                          const DiscoverOptions& options = {});

}  // namespace topolaunch::topology
