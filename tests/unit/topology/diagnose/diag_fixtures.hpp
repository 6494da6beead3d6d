// Paths of the topologies the diagnostics tests read: the generated and real captures in
// TOPOLAUNCH_SHARED_DIR (read in place, never copied) and our edited copies in
// TOPOLAUNCH_FIXTURES_DIR/negative (made by make_negative.py from dgx-h100.full.xml).
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "topolaunch/topology/discover.hpp"

namespace topolaunch::topology::diagtest {

inline std::string env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string(name) +
                             " is not set: run the tests with meson test (the test env sets it)");
  }
  return value;
}

inline std::string generated(const std::string& file) {
  return env("TOPOLAUNCH_SHARED_DIR") + "/topologies/generated/" + file;
}
inline std::string real(const std::string& file) {
  return env("TOPOLAUNCH_SHARED_DIR") + "/topologies/real/" + file;
}
inline std::string negative(const std::string& file) {
  return env("TOPOLAUNCH_FIXTURES_DIR") + "/negative/" + file;
}
inline std::string golden(const std::string& file) {
  return env("TOPODIAG_GOLDEN_DIR") + "/" + file;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read " + path);
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline NodeTopology load(const std::string& path, const DiscoverOptions& options = {}) {
  Result<NodeTopology> topo = load_topology_file(path, options);
  if (!topo) {
    throw std::runtime_error(topo.error().message);
  }
  return std::move(topo).value();
}

}  // namespace topolaunch::topology::diagtest
