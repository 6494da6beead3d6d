// The agents' cache of their node's topology file (job.hpp, load_topology_file_cached): the
// first load imports and writes the entry, the next reads it back (proved by an altered entry
// that still parses), a changed file is imported again, an unusable directory falls back to the
// direct load (said only when named on purpose), and the result is a direct load's.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../temp_dir.hpp"
#include "catch.hpp"
#include "job.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/import_cache.hpp"
#include "topolaunch/topology/serialize.hpp"

namespace fs = std::filesystem;
using namespace topolaunch;
using namespace topolaunch::launcher;

namespace {

fs::path fixture(const std::string& type) {
  const char* fixtures = std::getenv("TOPOLAUNCH_FIXTURES_DIR");
  REQUIRE(fixtures != nullptr);
  return fs::path(fixtures) / "slurm" / (type + ".pci.xml");
}

std::string direct_json(const fs::path& file) {
  auto topo = topology::load_topology_file(file.string(), {});
  REQUIRE(topo.ok());
  return topology::to_json(*topo);
}

}  // namespace

TEST_CASE("agent topology cache: imports once, reads the import back, as a direct load") {
  testing::TempDir d;
  fs::copy_file(fixture("dgx-h100"), d.path / "n1.xml");
  fs::copy_file(fixture("dgx-h100"), d.path / "n2.xml");  // the same bytes, another path
  const TopologyCacheDir cache{(d.path / "cache").string(), true};

  auto first = load_topology_file_cached((d.path / "n1.xml").string(), {}, "", cache);
  REQUIRE(first.ok());
  CHECK(topology::to_json(*first) == direct_json(d.path / "n1.xml"));
  std::vector<fs::path> imports;
  for (const auto& e : fs::directory_iterator(d.path / "cache" / "topologies")) {
    if (e.path().extension() == ".json") imports.push_back(e.path());
  }
  REQUIRE(imports.size() == 1);
  CHECK((fs::status(d.path / "cache").permissions() &
         (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none);

  // The same bytes under another name: the one import, with this file's name as its origin.
  auto other = load_topology_file_cached((d.path / "n2.xml").string(), {}, "", cache);
  REQUIRE(other.ok());
  CHECK(other->sources.origin == (d.path / "n2.xml").string());
  CHECK(topology::to_json(*other) == direct_json(d.path / "n2.xml"));

  // Read back from the cache: an entry altered (still valid JSON) is what the next load sees.
  std::string json = testing::read_file(imports[0]);
  const std::string product = "\"product\":\"";
  const auto at = json.find(product);
  REQUIRE(at != std::string::npos);
  json.insert(at + product.size(), "cached ");
  std::ofstream(imports[0], std::ios::trunc) << json;
  auto cached = load_topology_file_cached((d.path / "n1.xml").string(), {}, "", cache);
  REQUIRE(cached.ok());
  CHECK(cached->product.rfind("cached ", 0) == 0);

  // A changed file (new stat signature, new bytes) is imported again.
  fs::copy_file(fixture("pcie-l40s-8gpu"), d.path / "n1.xml", fs::copy_options::overwrite_existing);
  auto changed = load_topology_file_cached((d.path / "n1.xml").string(), {}, "", cache);
  REQUIRE(changed.ok());
  CHECK(topology::to_json(*changed) == direct_json(d.path / "n1.xml"));
  CHECK(changed->product.rfind("cached ", 0) != 0);

  // A NIC filter is part of the key: another filter never reads this import.
  topology::DiscoverOptions filtered;
  filtered.nics.exclude = {"mlx5_0"};
  auto with_filter =
      load_topology_file_cached((d.path / "n2.xml").string(), filtered, "^mlx5_0", cache);
  REQUIRE(with_filter.ok());
  auto direct_filtered = topology::load_topology_file((d.path / "n2.xml").string(), filtered);
  REQUIRE(direct_filtered.ok());
  CHECK(topology::to_json(*with_filter) == topology::to_json(*direct_filtered));
}

TEST_CASE("agent topology cache: an unusable directory falls back to the direct load") {
  testing::TempDir d;
  fs::copy_file(fixture("dgx-a100"), d.path / "n1.xml");
  fs::create_directory(d.path / "open");
  ::chmod((d.path / "open").c_str(), 0777);  // writable by others: not trusted
  const TopologyCacheDir cache{(d.path / "open").string(), true};
  auto topo = load_topology_file_cached((d.path / "n1.xml").string(), {}, "", cache);
  REQUIRE(topo.ok());
  CHECK(topology::to_json(*topo) == direct_json(d.path / "n1.xml"));
  CHECK_FALSE(fs::exists(d.path / "open" / "topologies"));

  // No cache at all, and errors that name the file as a direct load's do.
  auto none = load_topology_file_cached((d.path / "n1.xml").string(), {}, "", {});
  REQUIRE(none.ok());
  auto missing = load_topology_file_cached((d.path / "n9.xml").string(), {}, "",
                                           {(d.path / "cache").string(), true});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find((d.path / "n9.xml").string()) != std::string::npos);
}

TEST_CASE("agent topology cache: where it lives") {
  const char* saved_home = std::getenv("HOME");
  const char* saved_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string home = saved_home ? saved_home : "";
  const std::string xdg = saved_xdg ? saved_xdg : "";
  testing::TempDir d;
  ::unsetenv(kTopologyCacheVariable);
  ::setenv("XDG_CACHE_HOME", (d.path / "xdg").c_str(), 1);
  CHECK(topology_cache_dir().path == (d.path / "xdg" / "topolaunch" / "topology-cache").string());
  CHECK_FALSE(topology_cache_dir().explicit_setting);
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", d.path.c_str(), 1);
  CHECK(topology_cache_dir().path ==
        (d.path / ".cache" / "topolaunch" / "topology-cache").string());
  ::setenv(kTopologyCacheVariable, "off", 1);
  CHECK(topology_cache_dir().path.empty());
  CHECK(topology_cache_dir().explicit_setting);
  ::setenv(kTopologyCacheVariable, "/somewhere", 1);
  CHECK(topology_cache_dir().path == "/somewhere");
  ::unsetenv(kTopologyCacheVariable);
  if (saved_home) ::setenv("HOME", home.c_str(), 1);
  if (saved_xdg) ::setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
}
