// Where the test topologies are: TOPOLAUNCH_SHARED_DIR (../shared, read-only, never copied into
// the project) and TOPOLAUNCH_FIXTURES_DIR (tests/fixtures, our own files).
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "topolaunch/topology/discover.hpp"

namespace topolaunch::topology::test {

inline std::string env_dir(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string(name) +
                             " is not set: run the tests with meson test (test_env sets it)");
  }
  return value;
}

inline std::string shared_path(const std::string& relative) {
  return env_dir("TOPOLAUNCH_SHARED_DIR") + "/" + relative;
}
inline std::string generated(const std::string& file) {
  return shared_path("topologies/generated/" + file);
}
inline std::string real(const std::string& file) { return shared_path("topologies/real/" + file); }
inline std::string fixture(const std::string& file) {
  return env_dir("TOPOLAUNCH_FIXTURES_DIR") + "/" + file;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Loads or fails the test with the loader's message.
inline NodeTopology load(const std::string& path, const DiscoverOptions& options = {}) {
  Result<NodeTopology> topo = load_topology_file(path, options);
  if (!topo) throw std::runtime_error(topo.error().message);
  return std::move(topo).value();
}

}  // namespace topolaunch::topology::test
