// Bad input never crashes: one line naming the file, exit code 2.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "catch.hpp"
#include "fixtures.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/serialize.hpp"

using namespace topolaunch::topology;
namespace fs = std::filesystem;
using topolaunch::topology::test::generated;
using topolaunch::topology::test::slurp;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "topology-core-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() { fs::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string write(const std::string& name, const std::string& content) const {
    const std::string file = (path_ / name).string();
    std::ofstream(file, std::ios::binary) << content;
    return file;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void check_rejected(const std::string& file, const std::string& what) {
  INFO(file);
  for (auto result : {load_topology_file(file), load_xml_file(file)}) {
    REQUIRE_FALSE(result.ok());
    CHECK(result.error().exit_code == 2);
    CHECK(result.error().message.find(file) != std::string::npos);
    CHECK(result.error().message.find('\n') == std::string::npos);
    CHECK(result.error().message.find(what) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("bad topology files are rejected with one line naming the file", "[errors]") {
  TempDir dir;
  const std::string good = slurp(generated("dgx-h100.pci.xml"));
  check_rejected(dir.path("missing.xml"), "no such file");
  fs::create_directory(dir.path("a-directory.xml"));
  check_rejected(dir.path("a-directory.xml"), "directory");
  check_rejected(dir.write("empty.xml", ""), "empty");
  check_rejected(dir.write("blank.xml", "  \n\n"), "empty");
  check_rejected(dir.write("truncated.xml", good.substr(0, good.size() / 2)), "truncated");
  std::string junk(4096, '\0');
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 7919) % 256);
  check_rejected(dir.write("junk.bin", junk), "binary");
  check_rejected(dir.write("text.txt", "hello\n"), "not an hwloc xml");
  check_rejected(dir.write("html.xml", "<html><body></body></html>"), "no <topology>");
  // Cut in the middle but closed: hwloc's own parser refuses it (quietly).
  check_rejected(dir.write("cut.xml", good.substr(0, 20000) + "\n</topology>\n"),
                 "hwloc cannot import");
  std::string v3 = good;
  v3.replace(v3.find("version=\"2.0\""), 13, "version=\"3.0\"");
  check_rejected(dir.write("v3.xml", v3), "version 3.0");
}

TEST_CASE("objects whose sets hwloc 2.9 crashes on are refused before hwloc sees them",
          "[errors]") {
  // Found by tests/fuzz/fuzz_hwloc_xml: a NUMA node (or the root) with nodeset but no
  // complete_nodeset, or the root with cpuset but no complete_cpuset, is a NULL bitmap inside
  // hwloc_topology_load (SIGSEGV, both importers).
  TempDir dir;
  const std::string good = slurp(generated("dgx-h100.pci.xml"));
  std::string numa = good;
  const auto node = numa.find("<object type=\"NUMANode\"");
  REQUIRE(node != std::string::npos);
  const auto attr = numa.find(" complete_nodeset=\"", node);
  numa.erase(attr, numa.find('"', attr + 19) + 1 - attr);
  const auto line = 1 + std::count(numa.begin(), numa.begin() + static_cast<long>(node), '\n');
  check_rejected(dir.write("numa.xml", numa), "numa.xml:" + std::to_string(line) +
                                                  ": an <object> with nodeset without " +
                                                  "complete_nodeset");
  std::string root = good;
  const auto cpuset = root.find(" complete_cpuset=\"");
  root.erase(cpuset, root.find('"', cpuset + 18) + 1 - cpuset);
  check_rejected(dir.write("root.xml", root), "cpuset without complete_cpuset");
  // A '>' inside a quoted value does not end the tag: the attributes after it still count.
  std::string quoted = numa;
  quoted.insert(node + 7, " name=\"a>b\"");
  check_rejected(dir.write("quoted.xml", quoted), "nodeset without complete_nodeset");
  // Every real export keeps its pairs.
  CHECK(load_xml_buffer(good, "dgx-h100.pci.xml").ok());
}

TEST_CASE("an xml that crashes hwloc in a shape no check knows is refused by the probe",
          "[errors]") {
  // Found by tests/fuzz/fuzz_hwloc_xml: hwloc's minimal parser reads the name of the attribute
  // before an unbalanced quote up to the next '=' ("complete_nodesetx\" allowed_nodeset"), so
  // the root loses complete_nodeset where no tag scan sees it; hwloc_topology_load() then
  // crashes. The isolated import probe turns it into one line.
  TempDir dir;
  const std::string xml =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<topology version=\"2.0\">\n"
      "  <object type=\"Machine\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" "
      "allowed_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodesetx\" allowed_nodeset=\"0x1\" "
      "gp_index=\"1\">\n"
      "    <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" "
      "nodeset=\"0x1\" complete_nodeset=\"0x1\" gp_index=\"2\"/>\n"
      "    <object type=\"PU\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" "
      "nodeset=\"0x1\" complete_nodeset=\"0x1\" gp_index=\"3\"/>\n"
      "  </object>\n</topology>\n";
  check_rejected(dir.write("differential.xml", xml), "the parser crashed on this input");
}

TEST_CASE("bad topology json is rejected naming the origin", "[errors][json]") {
  TempDir dir;
  const std::string truncated = dir.write("t.json", "{\"version\": 1, \"gpus\": [");
  auto r = load_topology_file(truncated);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().exit_code == 2);
  CHECK(r.error().message.find(truncated) != std::string::npos);

  auto wrong_version = from_json("{\"version\": 7}", "agent n3");
  REQUIRE_FALSE(wrong_version.ok());
  CHECK(wrong_version.error().message.starts_with("agent n3: "));
  CHECK(wrong_version.error().message.find("version 7") != std::string::npos);

  auto bad_busid =
      from_json("{\"version\": 1, \"gpus\": [{\"index\": 0, \"busid\": \"zz\"}]}", "x");
  REQUIRE_FALSE(bad_busid.ok());
  CHECK(bad_busid.error().message.find("zz") != std::string::npos);

  auto bad_type = from_json("{\"version\": 1, \"hostname\": 5}", "x");
  REQUIRE_FALSE(bad_type.ok());
  CHECK(bad_type.error().message.find("hostname") != std::string::npos);

  auto bad_role =
      from_json("{\"version\": 1, \"nics\": [{\"index\": 0, \"role\": \"boss\"}]}", "x");
  REQUIRE_FALSE(bad_role.ok());
  CHECK(bad_role.error().message.find("boss") != std::string::npos);

  auto bad_matrix = from_json(
      "{\"version\": 1, \"gpus\": [{\"index\": 0, \"busid\": \"0000:01:00.0\"}], "
      "\"nvlinks\": [[0, 1]]}",
      "x");
  REQUIRE_FALSE(bad_matrix.ok());
  CHECK(bad_matrix.error().message.find("nvlinks") != std::string::npos);

  CHECK_FALSE(from_json("[1, 2]", "x").ok());
  CHECK_FALSE(from_json("", "x").ok());
}

TEST_CASE("load_topology_file tells XML from JSON by content", "[json]") {
  TempDir dir;
  auto xml = load_topology_file(generated("pcie-l40s-8gpu.pci.xml"));
  REQUIRE(xml.ok());
  // Saved with a misleading name: the content decides.
  const std::string file = dir.write("node.xml", to_json(*xml, true));
  auto json = load_topology_file(file);
  REQUIRE(json.ok());
  CHECK(*json == *xml);
}

TEST_CASE("discover options: NIC filter roles and hostname", "[nic]") {
  DiscoverOptions options;
  options.nics = *NicFilter::parse("^=mlx5_1,mlx5_2,mlx5_7,mlx5_8");
  options.hostname = "dgx01";
  auto topo = load_xml_file(generated("dgx-h100.pci.xml"), options);
  REQUIRE(topo.ok());
  CHECK(topo->hostname == "dgx01");
  std::vector<std::string> compute;
  for (const Nic& nic : topo->nics) {
    if (nic.role == NicRole::compute) compute.push_back(nic.name);
  }
  CHECK(compute == std::vector<std::string>{"mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6",
                                            "mlx5_9", "mlx5_10", "mlx5_11"});
  CHECK(topo->nic_by_name("mlx5_1")->role == NicRole::excluded);
  // The same filter applied when reading the JSON form.
  TempDir dir;
  auto plain = load_xml_file(generated("dgx-h100.pci.xml"));
  REQUIRE(plain.ok());
  auto json = load_topology_file(dir.write("n.json", to_json(*plain)), options);
  REQUIRE(json.ok());
  CHECK(json->nics == topo->nics);
}
