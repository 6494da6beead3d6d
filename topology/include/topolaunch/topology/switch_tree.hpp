// Slurm's switch tree (topology/tree plugin): read from topology.conf or from the output of
// `scontrol show topology`, and used to order nodes so that rings cross the fewest switches.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::topology {

struct SwitchTree {
  struct Switch {
    std::string name;
    std::vector<std::string> switches;  // child switches, in the order written
    std::vector<std::string> nodes;     // attached nodes, hostlist expanded, in the order written
    int source_line = 0;
  };
  std::string origin;            // file name, for messages
  std::vector<Switch> switches;  // in the order written

  // Nodes in depth-first order from the root switches (roots in file order): nodes under one leaf
  // switch are adjacent, leaves under one parent are adjacent, and so on.
  std::vector<std::string> node_order() const;
};

// "n[1-4,7],gpu[01-03]-ib,login" -> every name; zero padding of the lower bound is kept.
// Errors name the offending text ("unbalanced '['", "descending range 5-3").
Result<std::vector<std::string>> expand_hostlist(std::string_view text);

// topology.conf: lines of `SwitchName=s1 Switches=s[2-3]` / `SwitchName=s2 Nodes=n[1-4]`
// (keys case-insensitive, `LinkSpeed=` accepted and ignored, `#` comments). Errors are
// "<origin>:<line>: <key>: <what>" (unknown key, missing SwitchName, duplicate switch, unknown
// child switch, a switch with both or neither Switches and Nodes is fine, a cycle is not).
Result<SwitchTree> parse_topology_conf(std::string_view text, const std::string& origin);
// `scontrol show topology` output: same key=value records, plus Level= etc. (ignored).
Result<SwitchTree> parse_scontrol_topology(std::string_view text, const std::string& origin);
// Either of the above by content, from a file.
Result<SwitchTree> load_switch_tree(const std::string& path);

// Position of nodes in a tree, for hop counting.
class SwitchDistance {
 public:
  SwitchDistance() = default;
  explicit SwitchDistance(const SwitchTree& tree);
  // Number of switches a message between two distinct nodes passes through: 1 under one leaf
  // switch, 3 via a common parent, ... Without a tree (or a node missing from it): 1, as if all
  // nodes hung off one switch; nodes in different trees count the paths to both roots + 1.
  int hops(std::string_view a, std::string_view b) const;
  bool has_tree() const { return !paths_.empty(); }
  bool contains(std::string_view node) const { return path(node) != nullptr; }
  // Switch ids from the root down to the node's leaf switch; nullptr when not in the tree.
  const std::vector<int>* path(std::string_view node) const;
  // hops() for two precomputed paths (either may be nullptr).
  static int hops_between(const std::vector<int>* a, const std::vector<int>* b);

 private:
  // node name -> switch ids from the root down to its leaf switch; sorted by name
  std::vector<std::pair<std::string, std::vector<int>>> paths_;
};

}  // namespace topolaunch::topology
