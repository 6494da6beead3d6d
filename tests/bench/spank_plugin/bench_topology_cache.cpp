// One node's topology loading at a step start with topology_xml=DIR/%n.xml, N nodes of three
// types (the scale suite's cycle: DGX A100, DGX H100, DGX H100, 8x L40S): the plugin's path
// without a cache (every file read, alike bytes sharing one import: the peer) against the cache
// cold (the first step on a node) and warm (every later step). Prints one JSON object: wall ms
// (median of --repeats), bytes read from topology files per step, and warm / peer.
//
//   bench_topology_cache [--nodes 1024] [--repeats 5]   (TOPOLAUNCH_FIXTURES_DIR: the fixtures)
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "site_config.hpp"
#include "topology_cache.hpp"

namespace fs = std::filesystem;
using namespace topolaunch;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::uintmax_t tree_bytes(const fs::path& dir) {
  std::uintmax_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) total += e.file_size();
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 1024;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--nodes")
      nodes = std::atoi(argv[i + 1]);
    else if (flag == "--repeats")
      repeats = std::atoi(argv[i + 1]);
  }
  const char* fixtures = std::getenv("TOPOLAUNCH_FIXTURES_DIR");
  if (fixtures == nullptr || nodes < 1 || repeats < 1) {
    fmt::print(stderr,
               "usage: TOPOLAUNCH_FIXTURES_DIR=... bench_topology_cache [--nodes N] "
               "[--repeats R]\n");
    return 2;
  }
  char name[] = "/tmp/topolaunch-bench-cache-XXXXXX";
  if (mkdtemp(name) == nullptr) return 1;
  const fs::path dir = name;
  fs::create_directory(dir / "topo");
  const std::vector<std::string> types{"dgx-a100", "dgx-h100", "dgx-h100", "pcie-l40s-8gpu"};
  std::vector<std::string> names;
  std::uintmax_t file_bytes = 0;
  for (int i = 1; i <= nodes; ++i) {
    names.push_back(fmt::format("n{}", i));
    const fs::path file = dir / "topo" / (names.back() + ".xml");
    fs::copy_file(fmt::format("{}/slurm/{}.pci.xml", fixtures, types[i % 4]), file);
    file_bytes += fs::file_size(file);
  }
  spank::SiteConfig site;
  site.topology_xml = (dir / "topo" / "%n.xml").string();
  site.topology_cache = (dir / "cache").string();
  const std::string self = names.front();
  int failures = 0;

  // The peer: the plugin's own path with topology_cache=off.
  auto direct = [&] {
    auto loaded = spank::load_step_topologies_direct(site, names, self);
    if (!loaded || loaded->imported != 3) ++failures;
  };
  std::vector<double> direct_ms, cold_ms, warm_ms;
  int imported_cold = 0;
  int from_cache_warm = 0;
  for (int r = 0; r < repeats; ++r) {
    direct_ms.push_back(time_ms(direct));
    fs::remove_all(site.topology_cache);
    cold_ms.push_back(time_ms([&] {
      auto loaded = spank::load_step_topologies(site, names, self);
      if (!loaded || !loaded->unusable.empty())
        ++failures;
      else
        imported_cold = loaded->imported;
    }));
    warm_ms.push_back(time_ms([&] {
      auto loaded = spank::load_step_topologies(site, names, self);
      if (!loaded || !loaded->unusable.empty() || loaded->imported != 0)
        ++failures;
      else
        from_cache_warm = loaded->from_cache;
    }));
  }
  // Bytes a warm step reads: every index entry and the distinct imports.
  const std::uintmax_t index_bytes = tree_bytes(dir / "cache" / "files");
  const std::uintmax_t import_bytes = tree_bytes(dir / "cache" / "topologies");
  fmt::print(
      "{{\"benchmark\": \"spank_topology_cache\", \"nodes\": {}, \"repeats\": {}, "
      "\"peer\": \"no cache (read every file, import each distinct one)\", "
      "\"peer_ms\": {:.1f}, \"peer_bytes_read\": {}, \"cold_ms\": {:.1f}, \"cold_imported\": {}, "
      "\"warm_ms\": {:.1f}, \"warm_from_cache\": {}, \"warm_bytes_read\": {}, "
      "\"warm_over_peer\": {:.3f}, \"failures\": {}}}\n",
      nodes, repeats, median(direct_ms), file_bytes, median(cold_ms), imported_cold,
      median(warm_ms), from_cache_warm, index_bytes + import_bytes,
      median(warm_ms) / median(direct_ms), failures);
  fs::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
