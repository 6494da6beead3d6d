// topodiag: show a node's GPU/NIC topology and check it against a baseline. A thin shell: parse
// the command line, load a topology (live or file), call the diagnostics engine, print.
// Exit status (R-DIAG-3): 0 ok, 1 error findings, 2 usage or unreadable input, 3 warnings only,
// 4 a data source the baseline needs is missing (NVML/NVLink).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "topolaunch/topology/diagnose.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/serialize.hpp"

namespace tt = topolaunch::topology;

namespace {

constexpr int kExitUsage = 2;

struct Options {
  std::string input;
  std::string baseline;
  std::string save_baseline;
  std::string nics;
  bool json = false;
  bool gres = false;
  bool dot = false;
  bool verbose = false;
  bool warnings_ok = false;
  double memory_tolerance_percent = 2.0;
};

int fail(const std::string& message) {
  std::cerr << "topodiag: " << message << '\n';
  return kExitUsage;
}

bool color_wanted() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr &&
         (term == nullptr || std::string(term) != "dumb");
}

int run(const Options& options) {
  tt::DiscoverOptions discover;
  if (!options.nics.empty()) {
    auto filter = tt::NicFilter::parse(options.nics);
    if (!filter) {
      return fail("--nics: " + filter.error().message);
    }
    discover.nics = std::move(filter.value());
  }

  auto topo = options.input.empty() ? tt::discover_live(discover)
                                    : tt::load_topology_file(options.input, discover);
  if (!topo) {
    return fail(topo.error().message);
  }

  std::optional<tt::NodeTopology> baseline;
  if (!options.baseline.empty()) {
    auto loaded = tt::load_topology_file(options.baseline, discover);
    if (!loaded) {
      return fail("--baseline: " + loaded.error().message);
    }
    baseline = std::move(loaded.value());
  }

  if (!options.save_baseline.empty()) {
    std::ofstream file(options.save_baseline, std::ios::binary | std::ios::trunc);
    file << tt::to_json(*topo, true) << '\n';
    file.close();
    if (!file) {
      return fail("--save-baseline " + options.save_baseline +
                  ": cannot write the file (check the directory and permissions)");
    }
  }

  tt::DiagnoseOptions diagnose_options;
  diagnose_options.memory_tolerance_percent = options.memory_tolerance_percent;
  const std::vector<tt::Finding> findings =
      tt::diagnose(*topo, baseline ? &*baseline : nullptr, diagnose_options);

  if (options.gres) {
    // Device minors only exist for the machine we run on, never for an --input file.
    std::cout << tt::render_gres(*topo, options.input.empty() ? tt::read_nvidia_device_minors()
                                                              : std::map<std::string, int>{});
  } else if (options.dot) {
    std::cout << tt::render_dot(*topo);
  } else if (options.json) {
    std::cout << tt::render_json(*topo, findings);
  } else {
    tt::ReportStyle style;
    style.color = color_wanted();
    style.verbose = options.verbose;
    std::cout << tt::render_report(*topo, findings, style);
  }
  std::cout.flush();

  const int status = tt::exit_status(findings);
  return status == 3 && options.warnings_ok ? 0 : status;
}

}  // namespace

int main(int argc, char** argv) {
  tt::prefer_minimal_xml_importer();
  CLI::App app{
      "topodiag: show the GPU/NIC topology of this node (or of an hwloc XML / topolaunch JSON "
      "file) like nvidia-smi topo -m, and check it against a baseline.\n"
      "Exit status: 0 ok, 1 errors, 2 usage or unreadable input, 3 warnings only, 4 data "
      "source missing.",
      "topodiag"};
  Options options;
  app.add_option("-i,--input", options.input,
                 "read the topology from FILE (hwloc XML v1/v2, or JSON saved by "
                 "--save-baseline) instead of this machine")
      ->type_name("FILE");
  app.add_option("--baseline", options.baseline,
                 "compare against FILE (saved by --save-baseline, or hwloc XML)")
      ->type_name("FILE");
  app.add_option("--save-baseline", options.save_baseline,
                 "write this topology as a baseline JSON to FILE")
      ->type_name("FILE");
  auto* json = app.add_flag("--json", options.json, "machine-readable output (stable schema)");
  auto* gres = app.add_flag("--gres", options.gres,
                            "print gres.conf lines and the slurm.conf NodeName line");
  auto* dot = app.add_flag("--dot", options.dot, "print a Graphviz picture (dot -Tpng)");
  json->excludes(gres)->excludes(dot);
  gres->excludes(dot);
  app.add_option("--nics", options.nics,
                 "which NICs are compute NICs, NCCL_IB_HCA syntax (\"mlx5_0,mlx5_3\", "
                 "\"^=mlx5_1,mlx5_2\")")
      ->type_name("SPEC");
  app.add_option("--memory-tolerance", options.memory_tolerance_percent,
                 "percent of NUMA memory that may be missing vs the baseline (default 2)")
      ->check(CLI::Range(0.0, 100.0));
  app.add_flag("--warnings-ok", options.warnings_ok, "exit 0 instead of 3 on warnings only");
  app.add_flag("-v,--verbose", options.verbose, "also info findings and data sources");
  app.set_version_flag("--version", std::string("topodiag ") + TOPOLAUNCH_VERSION);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << '\n';
    return 0;
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see topodiag --help)");
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    // Nothing below should throw on bad input; if it does, still one line and exit 2.
    return fail(std::string("internal error: ") + e.what());
  }
}
