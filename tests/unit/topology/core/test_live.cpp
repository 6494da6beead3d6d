// Live discovery on whatever host runs the tests (the build host has no GPU and no NIC; the GPU
// host has some): the counts must equal what sysfs lists, independently of hwloc.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "catch.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/serialize.hpp"

using namespace topolaunch::topology;
namespace fs = std::filesystem;

namespace {

unsigned read_hex(const fs::path& file) {
  std::ifstream in(file);
  unsigned value = 0;
  in >> std::hex >> value;
  return value;
}

struct SysfsCounts {
  std::size_t gpus = 0;
  std::size_t nics = 0;
};

// NVIDIA display/3D/accelerator functions, and RDMA functions (an infiniband/ child or IB class).
SysfsCounts count_from_sysfs() {
  SysfsCounts counts;
  const fs::path root = "/sys/bus/pci/devices";
  if (!fs::exists(root)) return counts;
  for (const auto& entry : fs::directory_iterator(root)) {
    const unsigned vendor = read_hex(entry.path() / "vendor");
    const unsigned cls = read_hex(entry.path() / "class") >> 8;  // 0xCCSSPP -> 0xCCSS
    if (vendor == 0x10de && (cls == 0x0300 || cls == 0x0302 || (cls >> 8) == 0x12)) ++counts.gpus;
    if (cls == 0x0207 || fs::exists(entry.path() / "infiniband")) ++counts.nics;
  }
  return counts;
}

bool nvml_library_present() {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

}  // namespace

TEST_CASE("live discovery of this host matches sysfs", "[live]") {
  topolaunch::Result<NodeTopology> topo = discover_live();
  REQUIRE(topo.ok());
  const SysfsCounts expected = count_from_sysfs();
  CHECK(topo->gpus.size() == expected.gpus);
  CHECK(topo->nics.size() == expected.nics);
  CHECK(topo->sources.origin == "live");
  CHECK_FALSE(topo->hostname.empty());
  CHECK(topo->pu_count() == static_cast<std::size_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  CHECK_FALSE(topo->numa_nodes.empty());
  CHECK_FALSE(topo->allowed_cpus.empty());
  for (const Gpu& gpu : topo->gpus) {
    INFO(gpu.busid.to_string());
    CHECK(gpu.link.width > 0);  // sysfs current_link_width, exact on live nodes
    CHECK(gpu.link.max_width >= gpu.link.width);
  }
  if (!nvml_library_present()) {
    CHECK_FALSE(topo->sources.nvml);  // no driver: said so, no error
  } else if (topo->sources.nvml) {
    for (const Gpu& gpu : topo->gpus) CHECK(gpu.uuid.starts_with("GPU-"));
  }
  auto back = from_json(to_json(*topo), "live");
  REQUIRE(back.ok());
  CHECK(*back == *topo);
}

TEST_CASE("live discovery without NVML asked for", "[live]") {
  DiscoverOptions options;
  options.use_nvml = false;
  options.hostname = "node-a";
  topolaunch::Result<NodeTopology> topo = discover_live(options);
  REQUIRE(topo.ok());
  CHECK_FALSE(topo->sources.nvml);
  CHECK(topo->hostname == "node-a");
}
