// NodeTopology <-> JSON, lossless (agents exchange it; baselines store it).
#pragma once

#include <string>

#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/model.hpp"

namespace topolaunch::topology {

inline constexpr int kTopologyJsonVersion = 1;

std::string to_json(const NodeTopology& topo, bool pretty = false);
// `origin` names the source in error messages ("node.json", "agent n3").
Result<NodeTopology> from_json(const std::string& text, const std::string& origin);

}  // namespace topolaunch::topology
