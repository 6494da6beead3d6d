// The RDMA preflight shared by `topolaunch preflight` and `topolaunch run`; see
// preflight_stage.hpp.
#include "preflight_stage.hpp"

#include <fmt/format.h>

#include <sstream>

#include "topolaunch/rdma/store.hpp"

namespace topolaunch::launcher {

rdma::PreflightLevel preflight_level_of(jobspec::PreflightMode mode) {
  switch (mode) {
    case jobspec::PreflightMode::full:
      return rdma::PreflightLevel::full;
    case jobspec::PreflightMode::quick:
      return rdma::PreflightLevel::quick;
    case jobspec::PreflightMode::off:
      break;
  }
  return rdma::PreflightLevel::off;
}

rdma::PreflightPlanInput preflight_plan_input(const jobspec::RdmaSection& rdma,
                                              rdma::PreflightLevel level, const std::string& node,
                                              const std::string& transport,
                                              const std::string& sysfs_root) {
  rdma::PreflightPlanInput plan;
  plan.level = level;
  plan.node = node;
  plan.transport = transport;
  plan.sysfs_root = sysfs_root;
  plan.nics = rdma.nics.include;
  plan.require_gpudirect = rdma.gpudirect == jobspec::GpuDirectPolicy::require;
  plan.min_bandwidth_gbps = rdma.min_bandwidth_gbps;
  plan.max_latency_us = static_cast<double>(rdma.max_latency.count());
  plan.stage_timeout = rdma.preflight_timeout;
  return plan;
}

PreflightStageOutcome run_preflight_stage(const jobspec::JobConfig& config, const std::string& node,
                                          wireup::KvStore* shared_store,
                                          const std::string& scratch_dir) {
  PreflightStageOutcome out;
  const rdma::PreflightLevel level = preflight_level_of(config.rdma.preflight);
  const std::string_view level_name = to_string(config.rdma.preflight);
  if (level == rdma::PreflightLevel::off) {
    out.line = "rdma preflight: off ([rdma] preflight = \"off\")";
    return out;
  }
  std::unique_ptr<wireup::KvStore> local_store;
  if (shared_store == nullptr) {
    auto made = rdma::make_directory_store(scratch_dir, 0, 1);
    if (!made) {
      out.ok = false;
      out.exit_code = 1;
      out.line = fmt::format("rdma preflight on node {}: {}", node, made.error().message);
      return out;
    }
    local_store = std::move(*made);
  }
  wireup::KvStore& store = shared_store ? *shared_store : *local_store;
  rdma::PreflightPlanInput input = preflight_plan_input(config.rdma, level, node);
  input.rank = store.rank();
  auto plan = rdma::plan_preflight(input);
  if (!plan) {
    out.ok = false;
    out.exit_code = plan.error().exit_code;
    out.line =
        fmt::format("rdma preflight ({}) on node {}: {}", level_name, node, plan.error().message);
    return out;
  }
  if (!plan->selected && plan->devices.empty()) {
    out.line = fmt::format("rdma preflight ({}) on node {}: no RDMA NICs here, nothing to check",
                           level_name, node);
    return out;
  }
  std::ostringstream lines;
  auto report = rdma::run_preflight(store, *plan, &lines);
  out.jsonl = lines.str();
  if (!report) {
    out.ok = false;
    out.exit_code = report.error().exit_code;
    out.line =
        fmt::format("rdma preflight ({}) on node {}: {}", level_name, node, report.error().message);
    return out;
  }
  const std::string nic = plan->selected
                              ? fmt::format("{} port {}", plan->selected->nic, plan->selected->port)
                              : plan->transport;
  std::string stages;
  for (const auto& r : report->results) {
    if (!r.ok && r.message.rfind("skipped", 0) != 0 && out.ok) {
      out.ok = false;
      out.exit_code = 1;
      out.line = fmt::format("rdma preflight ({}) on node {}, {}: {} stage failed: {}", level_name,
                             node, nic, r.stage, r.message);
    }
    if (r.ok && stages.find(r.stage) == std::string::npos) {
      stages += (stages.empty() ? "" : ", ") + r.stage;
    }
  }
  if (out.ok && !report->ok()) {
    out.ok = false;
    out.exit_code = 1;
    out.line = fmt::format("rdma preflight ({}) on node {}, {}: failed", level_name, node, nic);
  }
  if (out.ok) {
    out.line = fmt::format("rdma preflight ({}) on node {}, {}: {} ok", level_name, node, nic,
                           stages.empty() ? std::string("no stage") : stages);
  }
  return out;
}

}  // namespace topolaunch::launcher
