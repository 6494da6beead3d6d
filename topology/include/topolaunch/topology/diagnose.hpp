// Topology diagnostics: findings with stable codes (research topology.md R-DIAG-1..4), checks of
// one topology on its own and against a baseline, and the renderings `topodiag` prints (human
// report, JSON, gres.conf, Graphviz). Everything here is a pure function of NodeTopology values,
// so a live node, an hwloc XML and a saved JSON baseline are diagnosed by the same code.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/topology/model.hpp"

namespace topolaunch::topology {

// info never changes the exit status; warning gives 3 when nothing is worse; error gives 1.
enum class Severity { info, warning, error };
std::string_view to_string(Severity severity);

// One observation, printed as one line:
//   TOPO401 error GPU3 0000:61:00.0: PCIe width expected x16, found x8
// `code` is stable across releases (the table is in topodiag(8) and kFindingCodes below);
// `expected`/`actual` are empty when the check has no baseline value.
struct Finding {
  std::string code;
  Severity severity = Severity::warning;
  std::string object;  // "GPU3 0000:61:00.0", "NIC2 mlx5_4", "NUMA1", "node"
  std::string expected;
  std::string actual;
  std::string message;  // what is wrong, lower case, without the object

  bool operator==(const Finding&) const = default;
};

// Stable finding codes. Families: 0xx node/data, 1xx GPUs, 2xx NICs, 3xx NUMA and locality,
// 4xx PCIe links, 5xx NVLink, 6xx relations, 7xx CPUs and memory, 9xx data sources.
namespace codes {
inline constexpr std::string_view kNoGpu = "TOPO001";               // info
inline constexpr std::string_view kNoNic = "TOPO002";               // info
inline constexpr std::string_view kGpuMissing = "TOPO101";          // error
inline constexpr std::string_view kGpuMoved = "TOPO102";            // error
inline constexpr std::string_view kGpuUnexpected = "TOPO103";       // warning
inline constexpr std::string_view kGpuModelChanged = "TOPO104";     // warning
inline constexpr std::string_view kNicMissingOrDown = "TOPO201";    // error (warning: non-compute)
inline constexpr std::string_view kNicRateLow = "TOPO202";          // error
inline constexpr std::string_view kNicMoved = "TOPO203";            // error
inline constexpr std::string_view kNicUnexpected = "TOPO204";       // warning
inline constexpr std::string_view kNicNoDriver = "TOPO205";         // warning
inline constexpr std::string_view kNumaMismatch = "TOPO301";        // error
inline constexpr std::string_view kLocalityUnknown = "TOPO302";     // warning (error vs baseline)
inline constexpr std::string_view kPcieWidthLow = "TOPO401";        // error (vs baseline)
inline constexpr std::string_view kPcieGenLow = "TOPO402";          // warning (vs baseline)
inline constexpr std::string_view kPcieWidthBelowMax = "TOPO403";   // warning (no baseline)
inline constexpr std::string_view kPcieGenBelowMax = "TOPO404";     // info GPU / warning NIC
inline constexpr std::string_view kNvlinkLow = "TOPO501";           // error
inline constexpr std::string_view kRelationWorse = "TOPO601";       // error
inline constexpr std::string_view kGpuWithoutLocalNic = "TOPO602";  // warning (R-MAP-5)
inline constexpr std::string_view kSocketCount = "TOPO701";         // error
inline constexpr std::string_view kCoreCount = "TOPO702";           // error
inline constexpr std::string_view kThreadCount = "TOPO703";         // error
inline constexpr std::string_view kNumaCount = "TOPO704";           // error
inline constexpr std::string_view kNumaMemoryLow = "TOPO705";       // error
inline constexpr std::string_view kNumaCpusChanged = "TOPO706";     // error
inline constexpr std::string_view kNvlinkDataMissing = "TOPO901";   // warning, exit 4
inline constexpr std::string_view kNvlinkUnknown = "TOPO902";       // warning (no baseline)
}  // namespace codes

struct DiagnoseOptions {
  // NHC-style fudge: memory per NUMA node may be this much below the baseline (firmware and
  // kernel reservations vary between boots and BIOS versions).
  double memory_tolerance_percent = 2.0;
};

// Checks that need no baseline: locality unknown, GPUs without a NIC better than SYS (R-MAP-5),
// PCIe links below their maximum, NIC ports not ACTIVE, NICs without driver, NVLink data missing
// although NVSwitches exist. Info findings say when there is no GPU or no NIC at all.
std::vector<Finding> check_topology(const NodeTopology& topo);

// Expected (baseline) vs actual (R-DIAG-2): GPUs and their bus ids, NICs (presence, port state,
// rate, bus id), NUMA placement, PCIe width (error) and generation (warning), NVLink counts,
// relation matrix, sockets/cores/threads, NUMA nodes and memory.
std::vector<Finding> compare_to_baseline(const NodeTopology& baseline, const NodeTopology& actual,
                                         const DiagnoseOptions& options = {});

// check_topology(actual) plus, with a baseline, compare_to_baseline; sorted by severity (errors
// first), then code, then object.
std::vector<Finding> diagnose(const NodeTopology& actual, const NodeTopology* baseline,
                              const DiagnoseOptions& options = {});

// Exit status for a set of findings (R-DIAG-3): 1 any error; else 4 any missing data source
// (TOPO901); else 3 any warning; else 0. (2, bad usage or input, is the program's business.)
int exit_status(const std::vector<Finding>& findings);

// "TOPO401 error GPU3 0000:61:00.0: PCIe width expected x16, found x8"
std::string format_finding(const Finding& finding);

// ---- renderings (pure: topology + findings -> text) ----------------------------------------

struct ReportStyle {
  bool color = false;    // ANSI colours for severities and NV#/PIX cells
  bool verbose = false;  // also info findings and data sources
};

// Node summary, GPU table, NIC table, relation matrix with legend, findings.
std::string render_report(const NodeTopology& topo, const std::vector<Finding>& findings,
                          const ReportStyle& style = {});

// The R-DIAG-1 JSON document (schema version kDiagnoseJsonVersion), pretty-printed.
inline constexpr int kDiagnoseJsonVersion = 1;
std::string render_json(const NodeTopology& topo, const std::vector<Finding>& findings);

// gres.conf lines for the GPUs (Cores= as Slurm's logical core indexes) and the slurm.conf
// NodeName line for this node. `device_minors` maps a GPU bus id ("0000:1b:00.0") to its NVIDIA
// device minor (/dev/nvidia<minor>); GPUs without an entry use their index, and a comment says so.
std::string render_gres(const NodeTopology& topo,
                        const std::map<std::string, int>& device_minors = {});

// The live node's NVIDIA device minors, from /proc/driver/nvidia/gpus/<bus id>/information
// ("Device Minor:"), keyed by normalised bus id; empty without the NVIDIA driver. `proc_root`
// lets tests point it at a directory tree of their own.
std::map<std::string, int> read_nvidia_device_minors(
    const std::string& proc_root = "/proc/driver/nvidia/gpus");

// Graphviz: packages, NUMA nodes, host bridges, PCIe switches, GPUs, NICs, NVLinks.
std::string render_dot(const NodeTopology& topo);

}  // namespace topolaunch::topology
