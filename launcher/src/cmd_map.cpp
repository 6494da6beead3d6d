// `topolaunch map job.toml [--topology node.xml ...] [--nodes N] [--json]`: the rank map of a job,
// its score next to the baselines' and why it differs, without starting anything. Works without
// Slurm: topologies come from files (or this machine), allocations are "everything".
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "process.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/rankmap.hpp"
#include "topolaunch/topology/score.hpp"
#include "topolaunch/topology/switch_tree.hpp"

namespace topolaunch::launcher {

namespace {

using topology::MappingReport;
using topology::MapScore;
using topology::NodeInput;

struct MapOptions {
  std::string config_path;
  std::vector<std::string> topology_files;
  int nodes = 0;
  std::string hosts;
  std::string switch_tree;
  bool json = false;
};

std::string gbytes(double mbps, int rings) {
  return rings == 0 ? std::string("-") : fmt::format("{:.1f}", mbps / 1000.0);
}

std::vector<std::pair<std::string, std::vector<std::string>>> score_rows(
    const std::vector<const MapScore*>& scores) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto add = [&](const char* name, auto&& cell) {
    std::vector<std::string> cells;
    for (const MapScore* s : scores) cells.push_back(cell(*s));
    rows.emplace_back(name, std::move(cells));
  };
  add("tensor rings: slowest (GB/s)",
      [](const MapScore& s) { return gbytes(s.tp_ring_min_mbps, s.tp_rings); });
  add("tensor rings: mean (GB/s)",
      [](const MapScore& s) { return gbytes(s.tp_ring_mean_mbps, s.tp_rings); });
  add("data rings: slowest (GB/s)",
      [](const MapScore& s) { return gbytes(s.dp_ring_min_mbps, s.dp_rings); });
  add("data rings: mean (GB/s)",
      [](const MapScore& s) { return gbytes(s.dp_ring_mean_mbps, s.dp_rings); });
  add("ranks with cores off GPU's NUMA",
      [](const MapScore& s) { return std::to_string(s.ranks_cpus_off_numa); });
  add("ranks with memory off GPU's NUMA",
      [](const MapScore& s) { return std::to_string(s.ranks_memory_off_numa); });
  add("ranks with a NIC not closest",
      [](const MapScore& s) { return std::to_string(s.ranks_nic_not_closest); });
  add("ranks sharing a NIC needlessly",
      [](const MapScore& s) { return std::to_string(s.ranks_nic_shared_needlessly); });
  add("most ranks on one NIC",
      [](const MapScore& s) { return std::to_string(s.max_ranks_per_nic); });
  add("ranks without NIC", [](const MapScore& s) { return std::to_string(s.ranks_without_nic); });
  add("switch hops over all rings",
      [](const MapScore& s) { return std::to_string(s.switch_hops); });
  return rows;
}

void print_table(const std::vector<std::vector<std::string>>& rows,
                 const std::vector<bool>& right) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      bool r = c < right.size() && right[c];
      line += r ? fmt::format("{:>{}}", row[c], width[c]) : fmt::format("{:<{}}", row[c], width[c]);
      if (c + 1 < row.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

void print_human(const MappingReport& report, const std::vector<NodeInput>& nodes) {
  const topology::RankMap& map = report.map;
  std::printf(
      "rank map: %d ranks on %zu node(s), tensor %d x pipeline %d x data %d; nodes in %s order\n\n",
      map.world_size, map.nodes.size(), map.tensor, map.pipeline, map.data,
      map.switch_tree_order ? "switch-tree" : "name");
  auto topology_of = [&](const std::string& name) -> const topology::NodeTopology* {
    for (const auto& node : nodes) {
      if (node.name == name) return node.topology.get();
    }
    return nullptr;
  };
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"RANK", "NODE", "LOCAL", "GPU", "BUS ID", "CUDA_VISIBLE_DEVICES", "CPUS", "CORES",
                  "NUMA", "NICS", "TP", "PP", "DP"});
  const topology::NodeTopology* last = nullptr;
  std::string last_name;
  for (const auto& rank : map.ranks) {
    const std::string& node_name = map.nodes[rank.node].name;
    if (node_name != last_name) {
      last = topology_of(node_name);
      last_name = node_name;
    }
    std::string gpus, busids;
    for (std::size_t i = 0; i < rank.gpus.size(); ++i) {
      gpus += (i ? "," : "") + std::to_string(rank.gpus[i]);
      if (last) busids += (i ? "," : "") + last->gpus[rank.gpus[i]].busid.to_string();
    }
    std::string nics;
    for (std::size_t i = 0; i < rank.nics.size(); ++i) nics += (i ? "," : "") + rank.nics[i];
    auto cvd = rank.env.find("CUDA_VISIBLE_DEVICES");
    rows.push_back({std::to_string(rank.rank), node_name, std::to_string(rank.local_rank),
                    gpus.empty() ? "-" : gpus, busids.empty() ? "-" : busids,
                    cvd == rank.env.end() ? "-" : cvd->second, rank.cpus.to_list(),
                    std::to_string(rank.cores), rank.numa < 0 ? "-" : std::to_string(rank.numa),
                    nics.empty() ? "-" : nics, std::to_string(rank.tp), std::to_string(rank.pp),
                    std::to_string(rank.dp)});
  }
  print_table(rows,
              {true, false, true, false, false, false, false, true, true, false, true, true, true});

  std::vector<const MapScore*> scores{&report.score};
  for (const auto& s : report.baseline_scores) scores.push_back(&s);
  std::vector<std::vector<std::string>> score_table;
  std::vector<std::string> header{"SCORE"};
  for (const MapScore* s : scores) header.push_back(s->label);
  score_table.push_back(header);
  for (auto& [name, cells] : score_rows(scores)) {
    std::vector<std::string> row{name};
    row.insert(row.end(), cells.begin(), cells.end());
    score_table.push_back(std::move(row));
  }
  std::printf("\n");
  print_table(score_table, {false, true, true, true});
  std::printf(
      "(GB/s: one direction, bandwidth model of NVLink, PCIe, NICs; higher is better; counts: "
      "lower "
      "is better)\n");
  if (!report.explanation.empty()) {
    std::printf("\nwhy it differs from %s:\n",
                report.baselines.empty() ? "the baseline" : report.baselines.front().label.c_str());
    for (const auto& line : report.explanation) std::printf("  %s\n", line.c_str());
  }
  if (!map.warnings.empty()) {
    std::printf("\nwarnings:\n");
    for (const auto& line : map.warnings) std::printf("  %s\n", line.c_str());
  }
}

int run_map(const MapOptions& options) {
  auto config = jobspec::load_job_config(options.config_path);
  if (!config) {
    std::fprintf(stderr, "topolaunch map: %s\n", config.error().message.c_str());
    return config.error().exit_code;
  }
  topology::MappingSpec spec = config->mapping;
  if (spec.source.empty()) spec.source = config->path.empty() ? options.config_path : config->path;
  if (options.nodes < 0) {
    std::fprintf(stderr, "topolaunch map: --nodes: %d is out of range (>= 1)\n", options.nodes);
    return 2;
  }
  topology::DiscoverOptions discover;
  discover.nics = spec.nics;
  std::vector<std::shared_ptr<const topology::NodeTopology>> types;
  bool live = options.topology_files.empty();
  if (live) {
    auto topo = topology::discover_live(discover);
    if (!topo) {
      std::fprintf(stderr, "topolaunch map: this machine: %s\n", topo.error().message.c_str());
      return topo.error().exit_code;
    }
    types.push_back(std::make_shared<const topology::NodeTopology>(std::move(*topo)));
  } else {
    for (const auto& file : options.topology_files) {
      auto topo = topology::load_topology_file(file, discover);
      if (!topo) {
        std::fprintf(stderr, "topolaunch map: %s\n", topo.error().message.c_str());
        return topo.error().exit_code;
      }
      types.push_back(std::make_shared<const topology::NodeTopology>(std::move(*topo)));
    }
  }
  int count = options.nodes > 0       ? options.nodes
              : config->job.nodes > 0 ? config->job.nodes
                                      : static_cast<int>(types.size());
  std::vector<std::string> names;
  if (!options.hosts.empty()) {
    auto expanded = topology::expand_hostlist(options.hosts);
    if (!expanded) {
      std::fprintf(stderr, "topolaunch map: --hosts: %s\n", expanded.error().message.c_str());
      return 2;
    }
    names = std::move(*expanded);
    if (options.nodes > 0 && static_cast<int>(names.size()) != options.nodes) {
      std::fprintf(stderr, "topolaunch map: --hosts names %zu nodes but --nodes is %d\n",
                   names.size(), options.nodes);
      return 2;
    }
    count = static_cast<int>(names.size());
  } else {
    // The names `run` would use: the allocation's nodes inside Slurm, this machine's name for
    // one node, else n1..nN.
    std::vector<std::string> allocated;
    if (auto nodelist = env_value("SLURM_JOB_NODELIST")) {
      if (auto expanded = topology::expand_hostlist(*nodelist)) allocated = std::move(*expanded);
    }
    if (static_cast<int>(allocated.size()) >= count) {
      names.assign(allocated.begin(), allocated.begin() + count);
    } else if (count == 1) {
      names.push_back(this_node_name());
    } else {
      for (int i = 0; i < count; ++i) names.push_back(fmt::format("n{}", i + 1));
    }
  }
  topology::NodeAllocation allocation = topology::NodeAllocation::everything();
  if (live) {
    auto mine = topology::allocation_of_this_process();
    if (!mine) {
      std::fprintf(stderr, "topolaunch map: %s\n", mine.error().message.c_str());
      return mine.error().exit_code;
    }
    allocation = *mine;
  }
  std::vector<NodeInput> nodes;
  for (int i = 0; i < count; ++i) {
    // Topology files are dealt to nodes in turn: --topology a.xml b.xml --nodes 4 gives a b a b.
    nodes.push_back({names[i], types[static_cast<std::size_t>(i) % types.size()], allocation});
  }
  std::optional<topology::SwitchTree> tree;
  std::string tree_path = !options.switch_tree.empty() ? options.switch_tree : spec.topology_conf;
  if (!tree_path.empty()) {
    auto loaded = topology::load_switch_tree(tree_path);
    if (!loaded) {
      std::fprintf(stderr, "topolaunch map: %s\n", loaded.error().message.c_str());
      return loaded.error().exit_code;
    }
    tree = std::move(*loaded);
  }
  auto report = topology::plan_rank_map(nodes, spec, tree ? &*tree : nullptr);
  if (!report) {
    std::fprintf(stderr, "topolaunch map: %s\n", report.error().message.c_str());
    return report.error().exit_code;
  }
  if (options.json) {
    std::printf("%s\n", topology::to_json(*report).c_str());
  } else {
    print_human(*report, nodes);
  }
  return 0;
}

}  // namespace

void register_map_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "map", "show the rank map of a job, its score and why, without starting anything");
  auto options = std::make_shared<MapOptions>();
  cmd->add_option("config", options->config_path, "the job config (TOML)")->required();
  cmd->add_option(
      "--topology", options->topology_files,
      "hwloc XML or topology JSON per node type (default: this machine); dealt to nodes in turn");
  cmd->add_option("--nodes", options->nodes,
                  "number of nodes (default: job.nodes, else one per --topology)");
  cmd->add_option("--hosts", options->hosts,
                  "node names as a Slurm hostlist, e.g. gpu[01-16] (default: the allocation's "
                  "nodes, or this machine's name, else n1..nN)");
  cmd->add_option(
      "--switch-tree", options->switch_tree,
      "Slurm topology.conf or `scontrol show topology` output (default: mapping.topology_conf)");
  cmd->add_flag("--json", options->json, "print the map, the scores and the explanation as JSON");
  cmd->callback([options, &exit_code] { exit_code = run_map(*options); });
}

}  // namespace topolaunch::launcher
