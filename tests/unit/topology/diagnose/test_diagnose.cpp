// The diagnostics engine as a library: findings, baseline comparison, exit status, renderings.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch.hpp"
#include "diag_fixtures.hpp"
#include "topolaunch/topology/diagnose.hpp"
#include "topolaunch/topology/relation.hpp"
#include "topolaunch/topology/serialize.hpp"

using namespace topolaunch::topology;
using diagtest::generated;
using diagtest::load;
using diagtest::negative;

namespace {

std::vector<std::string> codes_of(const std::vector<Finding>& findings,
                                  Severity at_least = Severity::warning) {
  std::vector<std::string> out;
  for (const Finding& f : findings) {
    if (static_cast<int>(f.severity) >= static_cast<int>(at_least)) {
      out.push_back(f.code);
    }
  }
  return out;
}

const Finding* find_code(const std::vector<Finding>& findings, std::string_view code) {
  auto it = std::find_if(findings.begin(), findings.end(),
                         [&](const Finding& f) { return f.code == code; });
  return it == findings.end() ? nullptr : &*it;
}

const NodeTopology& dgx_h100() {
  static const NodeTopology topo = load(generated("dgx-h100.full.xml"));
  return topo;
}

}  // namespace

TEST_CASE("DGX H100 fixture: healthy, no warning or error, exit 0") {
  const auto findings = diagnose(dgx_h100(), nullptr);
  CHECK(codes_of(findings).empty());
  CHECK(exit_status(findings) == 0);
}

TEST_CASE("DGX H100 compared with itself (and with its JSON round trip) gives no finding") {
  CHECK(compare_to_baseline(dgx_h100(), dgx_h100()).empty());
  auto reloaded = from_json(to_json(dgx_h100(), true), "baseline.json");
  REQUIRE(reloaded.ok());
  CHECK(compare_to_baseline(*reloaded, dgx_h100()).empty());
}

TEST_CASE("finding lines read like TOPO401 error GPU3 0000:61:00.0: PCIe width ...") {
  const Finding f{"TOPO401", Severity::error, "GPU3 0000:61:00.0", "x16", "x8", "PCIe width"};
  CHECK(format_finding(f) == "TOPO401 error GPU3 0000:61:00.0: PCIe width expected x16, found x8");
  const Finding plain{"TOPO001", Severity::info, "node", "", "", "no NVIDIA GPU found"};
  CHECK(format_finding(plain) == "TOPO001 info node: no NVIDIA GPU found");
}

TEST_CASE("exit status: error 1 beats missing data 4 beats warning 3; info alone is 0") {
  const Finding info{"TOPO001", Severity::info, "node", "", "", "x"};
  const Finding warning{"TOPO402", Severity::warning, "GPU0", "Gen5", "Gen1", "x"};
  const Finding missing{"TOPO901", Severity::warning, "node", "", "", "x"};
  const Finding error{"TOPO401", Severity::error, "GPU0", "x16", "x8", "x"};
  CHECK(exit_status({}) == 0);
  CHECK(exit_status({info}) == 0);
  CHECK(exit_status({info, warning}) == 3);
  CHECK(exit_status({warning, missing}) == 4);
  CHECK(exit_status({warning, missing, error}) == 1);
}

TEST_CASE("baseline: a missing GPU is TOPO101, exit 1") {
  const auto findings = diagnose(load(negative("dgx-h100.gpu-missing.xml")), &dgx_h100());
  const Finding* f = find_code(findings, codes::kGpuMissing);
  REQUIRE(f != nullptr);
  CHECK(f->severity == Severity::error);
  const auto gpu3 = std::find_if(findings.begin(), findings.end(), [](const Finding& x) {
    return x.code == "TOPO101" && x.object == "GPU3 0000:61:00.0";
  });
  CHECK(gpu3 != findings.end());
  CHECK(exit_status(findings) == 1);
}

TEST_CASE("baseline: a GPU link at x8 instead of x16 is TOPO401, exit 1") {
  const auto findings = diagnose(load(negative("dgx-h100.link-x8.xml")), &dgx_h100());
  const Finding* f = find_code(findings, codes::kPcieWidthLow);
  REQUIRE(f != nullptr);
  CHECK(format_finding(*f) == "TOPO401 error GPU3 0000:61:00.0: PCIe width expected x16, found x8");
  // The no-baseline twin (width below the device maximum) is not repeated.
  CHECK(find_code(findings, codes::kPcieWidthBelowMax) == nullptr);
  CHECK(exit_status(findings) == 1);
}

TEST_CASE("no baseline: a link below its maximum width is TOPO403, exit 3") {
  const auto findings = diagnose(load(negative("dgx-h100.link-x8.xml")), nullptr);
  const Finding* f = find_code(findings, codes::kPcieWidthBelowMax);
  REQUIRE(f != nullptr);
  CHECK(f->object == "GPU3 0000:61:00.0");
  CHECK(f->severity == Severity::warning);
  CHECK(exit_status(findings) == 3);
}

TEST_CASE("baseline: a NIC port down is TOPO201, exit 1") {
  const auto findings = diagnose(load(negative("dgx-h100.nic-down.xml")), &dgx_h100());
  const Finding* f = find_code(findings, codes::kNicMissingOrDown);
  REQUIRE(f != nullptr);
  CHECK(f->object == "NIC5 mlx5_5");
  CHECK(f->expected == "ACTIVE");
  CHECK(f->actual == "DOWN");
  CHECK(std::count_if(findings.begin(), findings.end(),
                      [](const Finding& x) { return x.code == "TOPO201"; }) == 1);
  CHECK(exit_status(findings) == 1);
}

TEST_CASE("no baseline: a compute NIC port that is not ACTIVE is already an error") {
  const auto findings = diagnose(load(negative("dgx-h100.nic-down.xml")), nullptr);
  const Finding* f = find_code(findings, codes::kNicMissingOrDown);
  REQUIRE(f != nullptr);
  CHECK(f->severity == Severity::error);
  CHECK(exit_status(findings) == 1);
}

TEST_CASE("baseline: GPU0 with 17 NVLinks instead of 18 is TOPO501 for each of its pairs") {
  const NodeTopology actual = load(negative("dgx-h100.nvlink17.xml"));
  const auto findings = diagnose(actual, &dgx_h100());
  std::vector<std::string> objects;
  for (const Finding& f : findings) {
    if (f.code == "TOPO501") {
      objects.push_back(f.object);
      CHECK(f.expected == "NV18");
      CHECK(f.actual == "NV17");
    }
  }
  CHECK(objects == std::vector<std::string>{"GPU0-GPU1", "GPU0-GPU2", "GPU0-GPU3", "GPU0-GPU4",
                                            "GPU0-GPU5", "GPU0-GPU6", "GPU0-GPU7"});
  CHECK(exit_status(findings) == 1);
}

TEST_CASE("baseline: devices without locality are one TOPO302 error, not a flood of NUMA/SYS") {
  const auto findings = diagnose(load(negative("dgx-h100.no-locality.xml")), &dgx_h100());
  REQUIRE(find_code(findings, codes::kLocalityUnknown) != nullptr);
  CHECK(find_code(findings, codes::kLocalityUnknown)->severity == Severity::error);
  CHECK(find_code(findings, codes::kNumaMismatch) == nullptr);
  CHECK(exit_status(findings) == 1);
}

TEST_CASE("no baseline: devices without locality are a TOPO302 warning, exit 3") {
  const auto findings = diagnose(load(negative("dgx-h100.no-locality.xml")), nullptr);
  CHECK(codes_of(findings) == std::vector<std::string>{"TOPO302"});
  CHECK(exit_status(findings) == 3);
}

TEST_CASE("baseline with NVLink vs a topology without NVLink data: TOPO901, exit 4") {
  const auto findings = diagnose(load(generated("dgx-h100.pci.xml")), &dgx_h100());
  CHECK(find_code(findings, codes::kNvlinkDataMissing) != nullptr);
  CHECK(find_code(findings, codes::kNvlinkLow) == nullptr);
  CHECK(exit_status(findings) == 4);
}

TEST_CASE("no baseline: NVSwitches without NVLink data (Debian hwloc, no NVML) is TOPO902") {
  NodeTopology topo = dgx_h100();
  topo.nvlinks.clear();
  topo.sources.nvlink_known = false;
  const auto findings = diagnose(topo, nullptr);
  CHECK(codes_of(findings) == std::vector<std::string>{"TOPO902"});
  CHECK(exit_status(findings) == 3);
}

TEST_CASE("baseline: edits in the model give their codes") {
  const NodeTopology& base = dgx_h100();
  SECTION("GPU moved to another NUMA node: TOPO301") {
    NodeTopology t = base;
    t.gpus[2].numa = 1;
    const auto f = compare_to_baseline(base, t);
    REQUIRE(find_code(f, codes::kNumaMismatch) != nullptr);
    CHECK(find_code(f, codes::kNumaMismatch)->object == "GPU2 0000:52:00.0");
  }
  SECTION("GPU bus id moved with the same count: TOPO102") {
    NodeTopology t = base;
    t.gpus[7].busid.bus = 0xe0;
    const auto f = compare_to_baseline(base, t);
    REQUIRE(find_code(f, codes::kGpuMoved) != nullptr);
    CHECK(find_code(f, codes::kGpuMoved)->actual == "0000:e0:00.0");
    CHECK(find_code(f, codes::kGpuMissing) == nullptr);
  }
  SECTION("PCIe generation lower: TOPO402 warning only, exit 3") {
    NodeTopology t = base;
    t.gpus[0].link.gen = 1;
    const auto f = compare_to_baseline(base, t);
    CHECK(codes_of(f) == std::vector<std::string>{"TOPO402"});
    CHECK(exit_status(f) == 3);
  }
  SECTION("NIC port rate lower: TOPO202") {
    NodeTopology b = base;
    NodeTopology t = base;
    b.nics[0].ports[0].rate_gbps = 400;
    t.nics[0].ports[0].rate_gbps = 200;
    const auto f = compare_to_baseline(b, t);
    REQUIRE(find_code(f, codes::kNicRateLow) != nullptr);
    CHECK(find_code(f, codes::kNicRateLow)->expected == "400 Gb/s");
  }
  SECTION("NIC gone: TOPO201 missing") {
    NodeTopology t = base;
    t.nics.erase(t.nics.begin() + 3);
    const auto f = compare_to_baseline(base, t);
    REQUIRE(find_code(f, codes::kNicMissingOrDown) != nullptr);
    CHECK(find_code(f, codes::kNicMissingOrDown)->object == "NIC3 mlx5_3");
  }
  SECTION("GPU no longer behind its NIC's switch: TOPO601 relation worse") {
    NodeTopology t = base;
    t.gpus[0].path.bridges = {t.gpus[0].path.bridges.front()};  // straight on the root port
    const auto f = compare_to_baseline(base, t);
    const auto it = std::find_if(f.begin(), f.end(), [](const Finding& x) {
      return x.code == "TOPO601" && x.object == "GPU0-mlx5_0";
    });
    REQUIRE(it != f.end());
    CHECK(it->expected == "PIX");
    CHECK(it->actual == "PXB");
  }
  SECTION("memory per NUMA node: within tolerance is fine, below is TOPO705") {
    NodeTopology t = base;
    t.numa_nodes[1].memory_bytes = base.numa_nodes[1].memory_bytes / 100 * 99;
    CHECK(compare_to_baseline(base, t).empty());
    t.numa_nodes[1].memory_bytes = base.numa_nodes[1].memory_bytes / 2;
    const auto f = compare_to_baseline(base, t);
    REQUIRE(find_code(f, codes::kNumaMemoryLow) != nullptr);
    CHECK(find_code(f, codes::kNumaMemoryLow)->object == "NUMA1");
  }
  SECTION("cores and threads counts: TOPO702, TOPO703") {
    NodeTopology t = base;
    t.cores.pop_back();
    const auto f = compare_to_baseline(base, t);
    CHECK(find_code(f, codes::kCoreCount) != nullptr);
    CHECK(find_code(f, codes::kThreadCount) != nullptr);
  }
}

TEST_CASE("MeluXina (real capture): GPUs without a NIC closer than SYS are reported (R-MAP-5)") {
  const NodeTopology topo = load(diagtest::real("psmgmt__topo.mel2001.xml"));
  REQUIRE(topo.gpus.size() == 4);
  std::vector<std::string> objects;
  for (const Finding& f : check_topology(topo)) {
    if (f.code == "TOPO602") {
      objects.push_back(f.object);
    }
  }
  // Only 2 NICs (43:00 and 83:00): the GPUs at 03:00 and c3:00 have no local NIC.
  CHECK(objects == std::vector<std::string>{"GPU0 0000:03:00.0", "GPU3 0000:c3:00.0"});
}

TEST_CASE("a CPU-only node says so with info findings and exits 0") {
  const auto findings = diagnose(load(negative("cpu-only.xml")), nullptr);
  CHECK(codes_of(findings, Severity::info) == std::vector<std::string>{"TOPO001", "TOPO002"});
  CHECK(exit_status(findings) == 0);
  const std::string report = render_report(load(negative("cpu-only.xml")), findings);
  CHECK(report.find("No NVIDIA GPU and no RDMA NIC found") != std::string::npos);
}

TEST_CASE("JSON output follows the R-DIAG-1 schema") {
  const auto findings = diagnose(load(negative("dgx-h100.link-x8.xml")), &dgx_h100());
  const auto doc = nlohmann::json::parse(render_json(dgx_h100(), findings));
  CHECK(doc["schema_version"] == kDiagnoseJsonVersion);
  CHECK(doc["product"] == "DGXH100");
  CHECK(doc["sources"]["nvml"].is_boolean());
  CHECK(doc["sources"]["hwloc_io_backends"].is_array());
  CHECK(doc["cpu"]["sockets"] == 2);
  CHECK(doc["cpu"]["cores"] == 112);
  CHECK(doc["cpu"]["threads"] == 224);
  REQUIRE(doc["numa"].size() == 2);
  CHECK(doc["numa"][1]["cpus"] == "56-111,168-223");
  CHECK(doc["numa"][1]["memory_bytes"] == 1099511627776ULL);
  REQUIRE(doc["gpus"].size() == 8);
  CHECK(doc["gpus"][4]["busid"] == "0000:9d:00.0");
  CHECK(doc["gpus"][4]["numa"] == 1);
  CHECK(doc["gpus"][4]["link"]["gen"] == 5);
  CHECK(doc["gpus"][4]["link"]["width"] == 16);
  CHECK(doc["gpus"][4]["closest_nics"] == nlohmann::json::array({"mlx5_6"}));
  CHECK(doc["gpus"][4]["relation_to_nic"] == "PIX");
  REQUIRE(doc["nics"].size() == 12);
  CHECK(doc["nics"][5]["name"] == "mlx5_5");
  CHECK(doc["nics"][5]["netdev"] == "ibp94s0");
  CHECK(doc["nics"][5]["port_state"] == "ACTIVE");
  CHECK(doc["matrix"]["GPU0"]["GPU7"] == "NV18");
  CHECK(doc["matrix"]["GPU0"]["NIC0"] == "PIX");
  CHECK(doc["matrix"]["GPU0"]["NIC6"] == "SYS");
  REQUIRE(doc["findings"].size() == 1);
  CHECK(doc["findings"][0]["code"] == "TOPO401");
  CHECK(doc["findings"][0]["severity"] == "error");
  CHECK(doc["findings"][0]["expected"] == "x16");
  CHECK(doc["findings"][0]["actual"] == "x8");
  CHECK(doc["exit_status"] == 1);
}

TEST_CASE("gres.conf: Cores= are Slurm logical core indexes of each GPU's socket") {
  const std::string gres = render_gres(dgx_h100());
  CHECK(gres.find("Name=gpu File=/dev/nvidia0 Cores=0-55  # GPU0 0000:1b:00.0 NUMA 0 (minor "
                  "unknown: index used)\n") != std::string::npos);
  CHECK(gres.find("Name=gpu File=/dev/nvidia7 Cores=56-111  # GPU7 0000:df:00.0 NUMA 1") !=
        std::string::npos);
  CHECK(gres.find("Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 RealMemory=2097152 Gres=gpu:8") !=
        std::string::npos);
  CHECK(gres.find("# File=/dev/nvidia<N>: N is the GPU index") != std::string::npos);
}

TEST_CASE("gres.conf uses the driver's device minors when /proc/driver/nvidia says them") {
  // A proc tree of our own, laid out like the driver's: minors deliberately not in bus order.
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("topodiag-minors-" + std::to_string(::getpid()));
  const char* busids[] = {"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                          "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"};
  for (int i = 0; i < 8; ++i) {
    std::filesystem::create_directories(root / busids[i]);
    std::ofstream(root / busids[i] / "information")
        << "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nDevice Minor: \t " << (7 - i)
        << "\nBus Location: \t " << busids[i] << "\n";
  }
  const auto minors = read_nvidia_device_minors(root.string());
  std::filesystem::remove_all(root);
  REQUIRE(minors.size() == 8);
  CHECK(minors.at("0000:1b:00.0") == 7);
  const std::string gres = render_gres(dgx_h100(), minors);
  CHECK(gres.find("Name=gpu File=/dev/nvidia7 Cores=0-55  # GPU0 0000:1b:00.0 NUMA 0\n") !=
        std::string::npos);
  CHECK(gres.find("N is the device minor the NVIDIA driver reports") != std::string::npos);
  CHECK(read_nvidia_device_minors("/nonexistent/proc/driver/nvidia/gpus").empty());
}

TEST_CASE("gres.conf on the DGX A100 (NPS4): each GPU gets the 16 cores of its quadrant") {
  const std::string gres = render_gres(load(generated("dgx-a100.full.xml")));
  // GPU0 (07:00.0) is on NUMA 3 = cores 48-63 (PUs 48-63,176-191).
  CHECK(gres.find("File=/dev/nvidia0 Cores=48-63  # GPU0 0000:07:00.0 NUMA 3") !=
        std::string::npos);
  CHECK(gres.find("Sockets=2 CoresPerSocket=64 ThreadsPerCore=2") != std::string::npos);
}

TEST_CASE("Graphviz: NVSwitch fabric is one node with an NV18 edge per GPU") {
  const std::string dot = render_dot(dgx_h100());
  CHECK(dot.rfind("graph topology {", 0) == 0);
  CHECK(dot.find("cluster_package0") != std::string::npos);
  CHECK(dot.find("cluster_numa1") != std::string::npos);
  for (int i = 0; i < 8; ++i) {
    CHECK(dot.find("gpu" + std::to_string(i) + " -- nvswitch [label=\"NV18\"") !=
          std::string::npos);
  }
  CHECK(dot.find("4 NVSwitches") != std::string::npos);
}

TEST_CASE("human report of the DGX H100 matches the golden file") {
  NodeTopology topo = dgx_h100();
  topo.sources.origin = "dgx-h100.full.xml";  // the path differs between checkouts
  const std::string report = render_report(topo, diagnose(topo, nullptr));
  CHECK(report == diagtest::slurp(diagtest::golden("dgx-h100.report.txt")));
}

TEST_CASE("every fixture matches itself and its JSON round trip; the generated ones are healthy") {
  const std::vector<std::string> generated_files = {
      "dgx-h100.full.xml", "dgx-h100.pci.xml",        "dgx-a100.full.xml",
      "dgx-a100.pci.xml",  "pcie-l40s-8gpu.full.xml", "pcie-l40s-8gpu.pci.xml"};
  const std::vector<std::string> real_files = {
      "hwloc__nvidiaDGX2.xml",    "hwloc__power8gpudistances.xml", "mpibind__coral-lassen.xml",
      "mpibind__cts1-pascal.xml", "mpibind__g4dnmetal.xml",        "psmgmt__topo.jrc0323.xml",
      "psmgmt__topo.jsfc005.xml", "psmgmt__topo.jwb0004.xml",      "psmgmt__topo.jwc09n003.xml",
      "psmgmt__topo.mel2001.xml"};
  std::vector<std::string> paths;
  for (const auto& f : generated_files) paths.push_back(generated(f));
  for (const auto& f : real_files) paths.push_back(diagtest::real(f));
  for (const std::string& path : paths) {
    INFO(path);
    const NodeTopology topo = load(path);
    CHECK(compare_to_baseline(topo, topo).empty());
    auto reloaded = from_json(to_json(topo), "round trip");
    REQUIRE(reloaded.ok());
    CHECK(compare_to_baseline(*reloaded, topo).empty());
    // Every rendering works on every topology.
    CHECK_FALSE(render_report(topo, check_topology(topo)).empty());
    CHECK_FALSE(render_json(topo, check_topology(topo)).empty());
    CHECK_FALSE(render_dot(topo).empty());
    CHECK_FALSE(render_gres(topo).empty());
  }
  for (const auto& f : generated_files) {
    INFO(f);
    CHECK(codes_of(check_topology(load(generated(f)))).empty());
  }
}
