// `topolaunch preflight job.toml [--json] [--level quick|full] [--transport verbs|ucx]
//  [--sysfs DIR] [--node NAME]`: checks the RDMA fabric the way the job's [rdma] table asks.
// Under a launcher-provided store (TOPOLAUNCH_STORE_ADDR, or srun --mpi=pmix) every rank takes
// part and the ring spans the job; alone it tests this node's port in loopback. Exit: 0 healthy,
// 1 the fabric failed a check, 2 bad input (config, a NIC that does not exist, a down port).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "preflight_stage.hpp"
#include "process.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/rdma/preflight.hpp"
#include "topolaunch/rdma/store.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::launcher {
namespace {

struct PreflightOptions {
  std::string config_path;
  bool json = false;
  std::string level;
  std::string transport = "verbs";
  std::string sysfs = "/sys";
  std::string node;
};

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "topolaunch preflight: %s\n", message.c_str());
  return code;
}

int run_preflight_command(const PreflightOptions& o) {
  auto config = jobspec::load_job_config(o.config_path);
  if (!config) return fail(config.error().message, 2);
  const jobspec::RdmaSection& rdma_cfg = config->rdma;

  rdma::PreflightLevel level = preflight_level_of(rdma_cfg.preflight);
  if (!o.level.empty()) {
    auto lvl = rdma::parse_preflight_level(o.level);
    if (!lvl) return fail("--level: " + lvl.error().message, 2);
    level = *lvl;
  }
  if (level == rdma::PreflightLevel::off) {
    std::printf("preflight is off in %s ([rdma] preflight = \"off\")\n", o.config_path.c_str());
    return 0;
  }
  rdma::PreflightPlanInput plan = preflight_plan_input(
      rdma_cfg, level, o.node.empty() ? this_node_name() : o.node, o.transport, o.sysfs);

  // The job's store when a launcher or srun provides one; else this node alone.
  std::unique_ptr<wireup::KvStore> store;
  std::filesystem::path scratch;
  const Environment env = current_environment();
  const bool have_store = env.count("TOPOLAUNCH_STORE_ADDR") || env.count("PMIX_RANK") ||
                          env.count("TOPOLAUNCH_WIREUP");
  if (have_store) {
    auto s = wireup::connect_from_env(env);
    if (!s) return fail(s.error().message, 2);
    store = std::move(*s);
  } else {
    scratch =
        std::filesystem::temp_directory_path() / fmt::format("topolaunch-preflight-{}", getpid());
    std::filesystem::create_directories(scratch);
    auto s = rdma::make_directory_store(scratch.string(), 0, 1);
    if (!s) return fail(s.error().message, 2);
    store = std::move(*s);
  }
  plan.rank = store->rank();

  auto pf = rdma::plan_preflight(plan);
  if (!pf) {
    if (!scratch.empty()) std::filesystem::remove_all(scratch);
    return fail(pf.error().message, pf.error().exit_code);
  }
  std::ostringstream lines;
  auto report = rdma::run_preflight(*store, *pf, &lines);
  if (!scratch.empty()) std::filesystem::remove_all(scratch);
  if (!report) return fail(report.error().message, report.error().exit_code);
  if (o.json) {
    std::cout << lines.str();
  } else {
    std::printf("%-13s %-4s %5s  %s\n", "stage", "ok", "peer", "result");
    for (const auto& r : report->results) {
      std::string value;
      if (r.stage == "bandwidth" && r.ok) value = fmt::format("{:.2f} GB/s  ", r.gbytes_per_s);
      if (r.stage == "latency" && r.ok)
        value = fmt::format("median {:.2f} us, p99 {:.2f} us  ", r.median_us, r.p99_us);
      std::printf("%-13s %-4s %5s  %s%s\n", r.stage.c_str(), r.ok ? "yes" : "NO",
                  r.peer >= 0 ? std::to_string(r.peer).c_str() : "-", value.c_str(),
                  r.message.c_str());
    }
  }
  if (!report->ok()) {
    for (const auto& r : report->results)
      if (!r.ok && r.message.rfind("skipped", 0) != 0)
        return fail(fmt::format("{} stage failed: {}", r.stage, r.message), 1);
    return 1;
  }
  return 0;
}

}  // namespace

void register_preflight_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<PreflightOptions>();
  auto* cmd = app.add_subcommand("preflight", "check the RDMA fabric between the job's nodes");
  cmd->add_option("config", opts->config_path, "job config (TOML)")->required();
  cmd->add_flag("--json", opts->json, "JSON lines, one per stage and rank");
  cmd->add_option("--level", opts->level,
                  "quick (local + connectivity) or full; default: [rdma] preflight");
  cmd->add_option("--transport", opts->transport, "verbs (default) or ucx")
      ->check(CLI::IsMember({"verbs", "ucx"}));
  cmd->add_option("--sysfs", opts->sysfs, "sysfs root to probe (tests)");
  cmd->add_option("--node", opts->node,
                  "node name in messages (default: SLURMD_NODENAME, else the hostname)");
  cmd->callback([opts, &exit_code] { exit_code = run_preflight_command(*opts); });
}

}  // namespace topolaunch::launcher
