// Job report: JSON for machines, a short table for people; a Slurm step's agents' reports merged.
#include "topolaunch/launcher/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "report_merge.hpp"
#include "topolaunch/common/units.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"

namespace topolaunch::launcher {

std::string describe_wait_status(int exit_code, int signal) {
  if (signal != 0) {
    const char* abbrev = sigabbrev_np(signal);
    return fmt::format("killed by SIG{}", abbrev ? abbrev : std::to_string(signal));
  }
  if (exit_code < 0) return "not started";
  return fmt::format("exited {}", exit_code);
}

std::size_t earliest_root_cause(const std::vector<RootCause>& causes) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < causes.size(); ++i) {
    const double t = causes[i].at_unix_s, b = causes[best].at_unix_s;
    if (t > 0 && (b <= 0 || t < b)) best = i;
  }
  return best;
}

MergedAttempt merge_agent_reports(int attempt,
                                  const std::vector<std::optional<JobReport>>& agent_reports,
                                  JobReport& report) {
  MergedAttempt step;
  AttemptReport& merged = step.attempt;
  merged.attempt = attempt;
  // every failed agent's first failure: the root cause is the earliest (node order is not time
  // order: the step's teardown kills workers on other nodes, which report that as theirs)
  std::vector<RootCause> failures, consequences;
  std::vector<int> failure_exit;
  std::vector<std::string> failure_preflight;
  for (std::size_t node = 0; node < agent_reports.size(); ++node) {
    const std::optional<JobReport>& fragment = agent_reports[node];
    if (!fragment || fragment->attempts.empty()) {
      step.silent_agents.push_back(static_cast<int>(node));
      continue;
    }
    const AttemptReport& a = fragment->attempts.front();
    merged.all_started_s = std::max(merged.all_started_s, a.all_started_s);
    merged.ranks.insert(merged.ranks.end(), a.ranks.begin(), a.ranks.end());
    merged.nodes.insert(merged.nodes.end(), a.nodes.begin(), a.nodes.end());
    if (report.agent_wireup.empty()) report.agent_wireup = fragment->agent_wireup;
    if (attempt == 0 && node == 0) report.preflight = fragment->preflight;
    if (fragment->root_cause && a.outcome == "failed") {
      // A rank that exited because its peer died is that peer's consequence, whatever the
      // clocks say (another node's clock, or its agent's late wakeup).
      const int rank = fragment->root_cause->rank;
      const bool consequence = std::any_of(a.ranks.begin(), a.ranks.end(), [&](const auto& o) {
        return o.rank == rank && o.rank >= 0 && o.signal == 0 &&
               o.exit_code == jobspec::exit_status::kPeerFailed;
      });
      if (consequence) {
        consequences.push_back(*fragment->root_cause);
        continue;
      }
      failures.push_back(*fragment->root_cause);
      failure_exit.push_back(fragment->exit_code);
      failure_preflight.push_back(fragment->preflight);
    }
    // Agents signalled by Slurm directly (scancel --signal=USR1 JOBID, step teardown). A requeue
    // anywhere is the step's: its ranks checkpointed, and a node stopped by the teardown of the
    // preempted job has the checkpoint before it to resume from.
    if (a.outcome == "requeue" || (a.outcome == "stopped" && step.agent_outcome.empty()))
      step.agent_outcome = a.outcome;
  }
  if (failures.empty() && !consequences.empty()) {
    step.root_cause = consequences[earliest_root_cause(consequences)];
    step.root_cause_is_consequence = true;
  }
  if (!failures.empty()) {
    const std::size_t first = earliest_root_cause(failures);
    step.root_cause = failures[first];
    if (step.root_cause->phase == "preflight") {
      step.preflight_exit = failure_exit[first];
      report.preflight = failure_preflight[first];
    }
  }
  std::sort(merged.ranks.begin(), merged.ranks.end(),
            [](const RankOutcome& a, const RankOutcome& b) { return a.rank < b.rank; });
  return step;
}

std::string step_outcome(const std::string& requested, bool srun_ok, const MergedAttempt& step) {
  if (!requested.empty()) return requested;
  if (step.agent_outcome == "requeue") return "requeue";
  if (srun_ok) return "succeeded";
  if (step.root_cause) return "failed";
  if (!step.agent_outcome.empty()) return step.agent_outcome;
  return "failed";
}

int agent_exit_status(const std::string& outcome, int stop_signal) {
  if (outcome == "requeue") return 0;
  return exit_code_of(outcome, stop_signal);
}

std::optional<RootCause> silent_agents_cause(const MergedAttempt& step, std::size_t agents,
                                             const std::string& rankmap_json,
                                             const std::string& srun_end, bool waited) {
  if (step.silent_agents.empty() || step.silent_agents.size() >= agents) return std::nullopt;
  if (step.root_cause && !step.root_cause_is_consequence) return std::nullopt;
  // The nodes of the map none of whose ranks is in a report.
  auto reported = [&](int rank) {
    return std::any_of(step.attempt.ranks.begin(), step.attempt.ranks.end(),
                       [&](const RankOutcome& o) { return o.rank == rank; });
  };
  std::vector<std::string> lost;
  const auto map = nlohmann::json::parse(rankmap_json, nullptr, false);
  if (!map.is_discarded() && map.is_object() && map.contains("nodes") && map["nodes"].is_array()) {
    for (const auto& node : map["nodes"]) {
      if (!node.is_object() || !node.contains("name") || !node["name"].is_string() ||
          !node.contains("rank_ids") || !node["rank_ids"].is_array())
        continue;
      bool any = false;
      for (const auto& id : node["rank_ids"])
        any = any || (id.is_number_integer() && reported(id.get<int>()));
      if (!any) lost.push_back(node["name"].get<std::string>());
    }
  }
  std::string who;
  if (!lost.empty() && lost.size() == step.silent_agents.size()) {
    who = fmt::format("node{} {}", lost.size() == 1 ? "" : "s", fmt::join(lost, ", "));
  } else {
    who = fmt::format("agent{} {} of {}", step.silent_agents.size() == 1 ? "" : "s",
                      fmt::join(step.silent_agents, ", "), agents);
  }
  const bool one = step.silent_agents.size() == 1;
  RootCause cause;
  cause.attempt = step.attempt.attempt;
  cause.node = lost.size() == 1 ? lost.front() : "";
  if (waited) {
    cause.what = fmt::format(
        "{} lost: {} never reported and srun kept waiting for {} task{} (the node down, or cut "
        "off, with its slurmd and slurmstepd); the other nodes' ranks stopped after {}; srun {}",
        who, one ? "its agent" : "their agents", one ? "its" : "their", one ? "" : "s",
        one ? "it" : "them", srun_end);
    cause.phase = "node-lost";
  } else {
    cause.what = fmt::format(
        "{}: {} ended without a report (killed?) and {} ranks with {}; the other nodes' ranks "
        "stopped after {}; srun {}",
        who, one ? "its agent" : "their agents", one ? "its" : "their", one ? "it" : "them",
        one ? "it" : "them", srun_end);
    cause.phase = "agent-lost";
  }
  return cause;
}

int exit_code_of(const std::string& outcome, int stop_signal) {
  if (outcome == "succeeded") return 0;
  if (outcome == "requeue") return jobspec::exit_status::kJobRequeue;
  if (outcome == "stopped") {
    return jobspec::exit_status::kJobSignalled + (stop_signal ? stop_signal : SIGTERM);
  }
  return 1;
}

const RankOutcome* root_cause_rank(const JobReport& r) {
  if (!r.root_cause || r.root_cause->rank < 0) return nullptr;
  for (const AttemptReport& a : r.attempts) {
    if (a.attempt != r.root_cause->attempt) continue;
    for (const RankOutcome& o : a.ranks) {
      if (o.rank == r.root_cause->rank) return &o;
    }
  }
  return nullptr;
}

std::optional<TrainingFigures> read_training_figures(const std::string& metrics_file,
                                                     const std::string& validation_file) {
  TrainingFigures t;
  auto read = [&](const std::string& path, bool validation) {
    std::ifstream in(path);
    if (path.empty() || !in) return;
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      if (j.contains("val_loss") && j["val_loss"].is_number()) {
        if (validation)
          t.val_losses.emplace_back(j["step"].get<std::int64_t>(), j["val_loss"].get<double>());
      } else if (!validation && j.contains("loss") && j["loss"].is_number()) {
        t.step = j["step"].get<std::int64_t>(), t.loss = j["loss"].get<double>();
      }
    }
  };
  read(metrics_file, false);
  read(validation_file, true);
  if (t.step < 0 && t.val_losses.empty()) return std::nullopt;
  if (t.step >= 0) t.metrics_file = metrics_file;
  return t;
}

namespace {

nlohmann::json optional_number(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json figures_json(const StepFigures& f) {
  nlohmann::json parts = nlohmann::json::object();
  const double values[kStepPartCount] = {f.compute_ms,    f.comm_exposed_ms, f.data_ms,
                                         f.checkpoint_ms, f.idle_ms,         f.trace_ms,
                                         f.validation_ms};
  double sum = 0;
  for (int i = 0; i < kStepPartCount; ++i) {
    parts[std::string(kStepPartNames[i])] = values[i];
    sum += values[i];
  }
  return {{"backend", f.backend},
          {"steps", f.steps},
          {"last_step", f.last_step},
          {"tokens", f.tokens},
          {"tokens_per_step", f.tokens_per_step},
          {"flops_per_step", f.flops_per_step},
          {"wall_ms", f.wall_ms},
          {"parts_ms", parts},
          {"parts_sum_ms", sum},
          {"comm_busy_ms", f.comm_busy_ms},
          {"comm_bytes", f.comm_bytes},
          {"last_loss", optional_number(f.last_loss)},
          {"plan_comm",
           {{"bytes_per_step", f.plan_comm_bytes_per_step},
            {"comm_ms", f.plan_comm_ms},
            {"exposed_ms", f.plan_exposed_ms}}},
          {"memory",
           {{"planned", f.planned_bytes},
            {"allocated",
             {{"arena", f.arena_bytes},
              {"outside_arena", f.outside_arena_bytes},
              {"device_used", f.device_used_bytes},
              {"device_total", f.device_total_bytes},
              {"device", f.device}}}}}};
}

StepFigures figures_from_json(const nlohmann::json& j) {
  StepFigures f;
  if (!j.is_object()) return f;
  f.present = true;
  f.backend = j.value("backend", "");
  f.steps = j.value("steps", std::int64_t{0});
  f.last_step = j.value("last_step", std::int64_t{0});
  f.tokens = j.value("tokens", std::int64_t{0});
  f.tokens_per_step = j.value("tokens_per_step", std::int64_t{0});
  f.flops_per_step = j.value("flops_per_step", 0.0);
  f.wall_ms = j.value("wall_ms", 0.0);
  if (const auto parts = j.find("parts_ms"); parts != j.end() && parts->is_object()) {
    double* fields[kStepPartCount] = {&f.compute_ms,    &f.comm_exposed_ms, &f.data_ms,
                                      &f.checkpoint_ms, &f.idle_ms,         &f.trace_ms,
                                      &f.validation_ms};
    for (int i = 0; i < kStepPartCount; ++i)
      *fields[i] = parts->value(std::string(kStepPartNames[i]), 0.0);
  }
  f.comm_busy_ms = j.value("comm_busy_ms", 0.0);
  f.comm_bytes = j.value("comm_bytes", std::uint64_t{0});
  if (j.contains("last_loss") && j["last_loss"].is_number())
    f.last_loss = j["last_loss"].get<double>();
  if (const auto c = j.find("plan_comm"); c != j.end() && c->is_object()) {
    f.plan_comm_bytes_per_step = c->value("bytes_per_step", std::uint64_t{0});
    f.plan_comm_ms = c->value("comm_ms", 0.0);
    f.plan_exposed_ms = c->value("exposed_ms", 0.0);
  }
  if (const auto m = j.find("memory"); m != j.end() && m->is_object()) {
    if (const auto p = m->find("planned"); p != m->end() && p->is_object())
      for (const auto& [role, bytes] : p->items())
        if (bytes.is_number_unsigned()) f.planned_bytes[role] = bytes.get<std::uint64_t>();
    if (const auto a = m->find("allocated"); a != m->end() && a->is_object()) {
      f.arena_bytes = a->value("arena", std::uint64_t{0});
      f.outside_arena_bytes = a->value("outside_arena", std::uint64_t{0});
      f.device_used_bytes = a->value("device_used", std::uint64_t{0});
      f.device_total_bytes = a->value("device_total", std::uint64_t{0});
      f.device = a->value("device", "");
    }
  }
  return f;
}

nlohmann::json node_json(const NodeUsage& n) {
  nlohmann::json j = {{"attempt", n.attempt},
                      {"node", n.node},
                      {"gpus", n.gpus},
                      {"cores", n.cores},
                      {"wall_s", n.wall_s},
                      {"gpu_energy_j", n.gpu_energy_j},
                      {"gpu_energy_note", n.gpu_energy_note},
                      {"cpu_energy_j", optional_number(n.cpu_energy_j)},
                      {"cpu_energy_note", n.cpu_energy_note}};
  // [name, value] pairs in the order the agent reached them (an object would sort them).
  auto marks = [&j](const char* key, const std::vector<std::pair<std::string, double>>& list) {
    if (list.empty()) return;
    j[key] = nlohmann::json::array();
    for (const auto& [name, value] : list) j[key].push_back({name, value});
  };
  marks("start_marks_unix_s", n.start_marks_unix_s);
  marks("start_marks_cpu_s", n.start_marks_cpu_s);
  return j;
}

NodeUsage node_from_json(const nlohmann::json& j) {
  NodeUsage n;
  n.attempt = j.value("attempt", 0);
  n.node = j.value("node", "");
  n.gpus = j.value("gpus", 0);
  n.cores = j.value("cores", 0);
  n.wall_s = j.value("wall_s", 0.0);
  if (j.contains("gpu_energy_j") && j["gpu_energy_j"].is_array())
    for (const auto& e : j["gpu_energy_j"])
      if (e.is_number()) n.gpu_energy_j.push_back(e.get<double>());
  n.gpu_energy_note = j.value("gpu_energy_note", "");
  if (j.contains("cpu_energy_j") && j["cpu_energy_j"].is_number())
    n.cpu_energy_j = j["cpu_energy_j"].get<double>();
  n.cpu_energy_note = j.value("cpu_energy_note", "");
  for (auto [key, list] : {std::pair{"start_marks_unix_s", &n.start_marks_unix_s},
                           std::pair{"start_marks_cpu_s", &n.start_marks_cpu_s}}) {
    if (!j.contains(key) || !j[key].is_array()) continue;
    for (const auto& m : j[key]) {
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_number())
        list->emplace_back(m[0].get<std::string>(), m[1].get<double>());
    }
  }
  return n;
}

nlohmann::json cost_json(const CostReport& c) {
  nlohmann::json per_gpu = nlohmann::json::array();
  for (const auto& g : c.per_gpu)
    per_gpu.push_back({{"node", g.node}, {"gpu", g.gpu}, {"joules", g.joules}});
  nlohmann::json fractions = nlohmann::json::object();
  double sum = 0;
  for (const auto& [part, ms] : c.step_parts_ms) sum += ms;
  for (const auto& [part, ms] : c.step_parts_ms)
    fractions[part] = c.step_wall_ms > 0 ? ms / c.step_wall_ms : 0.0;
  return {{"allocation",
           {{"gpus", c.gpus},
            {"cores", c.cores},
            {"wall_s", c.wall_s},
            {"gpu_hours", c.gpu_hours},
            {"core_hours", c.core_hours}}},
          {"energy",
           {{"gpu_j", optional_number(c.gpu_energy_j)},
            {"cpu_j", optional_number(c.cpu_energy_j)},
            {"per_gpu", per_gpu}}},
          {"step_time",
           {{"wall_ms", c.step_wall_ms},
            {"parts_ms", c.step_parts_ms},
            {"parts_fraction", fractions},
            {"parts_sum_ms", sum},
            {"untracked_ms", c.step_wall_ms - sum}}},
          {"tokens", c.tokens},
          {"tokens_per_s", c.tokens_per_s},
          {"tokens_per_j", optional_number(c.tokens_per_j)},
          {"mfu", optional_number(c.mfu)},
          {"skipped_steps", c.skipped_steps},
          {"peak_flops_per_rank", c.peak_flops_per_rank},
          {"peak_from", c.peak_from},
          {"price",
           {{"gpu_hour", c.gpu_hour_price},
            {"core_hour", c.core_hour_price},
            {"total", optional_number(c.cost)},
            {"per_million_tokens", optional_number(c.cost_per_million_tokens)}}},
          {"notes", c.notes}};
}

}  // namespace

void set_cost(JobReport& report, const jobspec::JobConfig& config) {
  std::vector<RankStepFigures> ranks;
  std::vector<NodeUsage> nodes;
  for (const AttemptReport& a : report.attempts) {
    for (const RankOutcome& o : a.ranks) ranks.push_back({a.attempt, o.rank, &o.figures});
    nodes.insert(nodes.end(), a.nodes.begin(), a.nodes.end());
  }
  report.cost = attribute_cost(ranks, nodes, report.wall_s, config);
}

std::string to_json(const JobReport& r) {
  nlohmann::json j;
  j["job"] = r.job_name;
  j["run_id"] = r.run_id;
  j["job_dir"] = r.job_dir;
  j["status"] = r.status;
  j["exit_code"] = r.exit_code;
  j["wall_s"] = r.wall_s;
  j["restarts_used"] = r.restarts_used;
  j["max_restarts"] = r.max_restarts;
  j["wireup"] = {{"agents", r.agent_wireup}, {"workers", "tcp"}};
  j["preflight"] = r.preflight;
  j["trace"] = r.trace;
  if (r.root_cause) {
    j["root_cause"] = {{"attempt", r.root_cause->attempt}, {"rank", r.root_cause->rank},
                       {"node", r.root_cause->node},       {"what", r.root_cause->what},
                       {"phase", r.root_cause->phase},     {"at_unix_s", r.root_cause->at_unix_s}};
    // The exception and traceback of the rank's error file (torch's @record), where it wrote one.
    if (const RankOutcome* rank = root_cause_rank(r); rank && !rank->error.empty()) {
      j["root_cause"]["error"] = rank->error;
      j["root_cause"]["traceback"] = rank->traceback;
    }
  } else {
    j["root_cause"] = nullptr;
  }
  if (r.training) {
    const TrainingFigures& t = *r.training;
    auto& jt = j["training"] = nlohmann::json::object();
    if (t.step >= 0) jt["metrics_file"] = t.metrics_file, jt["step"] = t.step, jt["loss"] = t.loss;
    if (!t.val_losses.empty()) {
      jt["val_step"] = t.val_losses.back().first;
      jt["val_loss"] = t.val_losses.back().second;
      jt["val_losses"] = t.val_losses;
    }
  }
  j["attempts"] = nlohmann::json::array();
  for (const AttemptReport& a : r.attempts) {
    nlohmann::json ja{
        {"attempt", a.attempt}, {"started_s", a.started_s}, {"all_started_s", a.all_started_s},
        {"wall_s", a.wall_s},   {"outcome", a.outcome},     {"ranks", nlohmann::json::array()}};
    ja["nodes"] = nlohmann::json::array();
    for (const NodeUsage& n : a.nodes) ja["nodes"].push_back(node_json(n));
    for (const RankOutcome& o : a.ranks) {
      ja["ranks"].push_back({{"rank", o.rank},
                             {"local_rank", o.local_rank},
                             {"node", o.node},
                             {"node_name", o.node_name},
                             {"pid", o.pid},
                             {"exit_code", o.exit_code},
                             {"signal", o.signal},
                             {"status", describe_wait_status(o.exit_code, o.signal)},
                             {"peak_rss_bytes", o.peak_rss_bytes},
                             {"peak_gpu_bytes", o.peak_gpu_bytes},
                             {"wall_s", o.wall_s},
                             {"heartbeat", o.heartbeat},
                             {"cause", o.cause},
                             {"error", o.error},
                             {"traceback", o.traceback}});
      if (o.figures.present) ja["ranks"].back()["steps"] = figures_json(o.figures);
    }
    j["attempts"].push_back(std::move(ja));
  }
  if (r.cost) j["cost"] = cost_json(*r.cost);
  return j.dump(2) + "\n";
}

std::optional<JobReport> report_from_json(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  JobReport r;
  r.job_name = j.value("job", "");
  r.run_id = j.value("run_id", "");
  r.job_dir = j.value("job_dir", "");
  r.status = j.value("status", "");
  r.exit_code = j.value("exit_code", 0);
  r.wall_s = j.value("wall_s", 0.0);
  r.restarts_used = j.value("restarts_used", 0);
  r.max_restarts = j.value("max_restarts", 0);
  if (j.contains("wireup") && j["wireup"].is_object()) {
    r.agent_wireup = j["wireup"].value("agents", "");
  }
  r.preflight = j.value("preflight", "");
  r.trace = j.value("trace", "");
  if (j.contains("root_cause") && j["root_cause"].is_object()) {
    const auto& c = j["root_cause"];
    r.root_cause =
        RootCause{c.value("attempt", -1), c.value("rank", -1),  c.value("node", ""),
                  c.value("what", ""),    c.value("phase", ""), c.value("at_unix_s", 0.0)};
  }
  for (const auto& ja : j.value("attempts", nlohmann::json::array())) {
    AttemptReport a;
    a.attempt = ja.value("attempt", 0);
    a.started_s = ja.value("started_s", 0.0);
    a.all_started_s = ja.value("all_started_s", 0.0);
    a.wall_s = ja.value("wall_s", 0.0);
    a.outcome = ja.value("outcome", "");
    for (const auto& jr : ja.value("ranks", nlohmann::json::array())) {
      RankOutcome o;
      o.rank = jr.value("rank", -1);
      o.local_rank = jr.value("local_rank", -1);
      o.node = jr.value("node", -1);
      o.node_name = jr.value("node_name", "");
      o.pid = jr.value("pid", -1);
      o.exit_code = jr.value("exit_code", -1);
      o.signal = jr.value("signal", 0);
      o.peak_rss_bytes = jr.value("peak_rss_bytes", std::uint64_t{0});
      o.peak_gpu_bytes = jr.value("peak_gpu_bytes", std::uint64_t{0});
      o.wall_s = jr.value("wall_s", 0.0);
      o.heartbeat = jr.value("heartbeat", "");
      o.cause = jr.value("cause", "");
      o.error = jr.value("error", "");
      o.traceback = jr.value("traceback", "");
      if (jr.contains("steps")) o.figures = figures_from_json(jr["steps"]);
      a.ranks.push_back(o);
    }
    for (const auto& jn : ja.value("nodes", nlohmann::json::array()))
      if (jn.is_object()) a.nodes.push_back(node_from_json(jn));
    r.attempts.push_back(std::move(a));
  }
  return r;
}

namespace {

std::string percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : "-";
}

// The cost lines of the summary: allocation and energy, the step-time split, throughput, price,
// and the first rank's memory planned against measured.
std::string cost_lines(const CostReport& c, const AttemptReport& last) {
  std::string out =
      fmt::format("  cost: {} GPU(s), {} core(s) for {:.1f}s = {:.4g} GPU-hours, {:.4g} core-hours",
                  c.gpus, c.cores, c.wall_s, c.gpu_hours, c.core_hours);
  if (c.cost)
    out += fmt::format("; {:.4g} at {} per GPU-hour and {} per core-hour", *c.cost,
                       c.gpu_hour_price, c.core_hour_price);
  out += "\n";
  std::string energy = c.gpu_energy_j ? fmt::format("GPUs {:.1f} J (NVML)", *c.gpu_energy_j)
                                      : std::string("GPUs not measured");
  energy += c.cpu_energy_j ? fmt::format(", CPU packages {:.1f} J (RAPL)", *c.cpu_energy_j)
                           : std::string(", CPU packages not measured");
  out += "  energy: " + energy + "\n";
  if (c.step_wall_ms > 0) {
    std::string parts;
    for (std::size_t i = 0; i < std::size(kStepPartNames); ++i) {
      const auto it = c.step_parts_ms.find(std::string(kStepPartNames[i]));
      const double ms = it == c.step_parts_ms.end() ? 0 : it->second;
      parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", kStepPartNames[i],
                           percent(ms, c.step_wall_ms));
    }
    out += fmt::format("  step time: {}\n", parts);
    std::string rate = fmt::format("{:.0f} tok/s", c.tokens_per_s);
    if (c.tokens_per_j) rate += fmt::format(", {:.4g} tok/J", *c.tokens_per_j);
    if (c.mfu)
      rate += fmt::format(", MFU {:.1f}% of {:.4g} TFLOP/s per rank ({})", 100 * *c.mfu,
                          c.peak_flops_per_rank / 1e12, c.peak_from);
    if (c.cost_per_million_tokens)
      rate += fmt::format(", {:.4g} per million tokens", *c.cost_per_million_tokens);
    out += fmt::format("  tokens: {} = {}\n", c.tokens, rate);
  }
  if (c.skipped_steps > 0)
    out += fmt::format("  optimizer steps skipped (non-finite gradients): {}\n", c.skipped_steps);
  for (const RankOutcome& o : last.ranks) {
    if (!o.figures.present) continue;
    const StepFigures& f = o.figures;
    auto planned = [&](const char* role) {
      const auto it = f.planned_bytes.find(role);
      return format_size(it == f.planned_bytes.end() ? 0 : it->second);
    };
    const std::uint64_t measured = f.backend == "cpu" ? o.peak_rss_bytes : o.peak_gpu_bytes;
    out += fmt::format(
        "  memory of rank {}: planned parameters {}, gradients {}, optimizer {}, activations {}, "
        "workspaces {}: arena {}; measured peak {} ({})\n",
        o.rank, planned("parameters"), planned("gradients"), planned("optimizer_state"),
        planned("activations"), planned("workspaces"), format_size(f.arena_bytes),
        measured ? format_size(measured) : std::string("not watched"),
        f.backend == "cpu" ? "host RSS" : "NVML");
    break;
  }
  return out;
}

}  // namespace

std::string summarize(const JobReport& r, std::string_view report_error) {
  std::string out = fmt::format("topolaunch: job {} {} after {:.1f}s ({} of {} restarts used)\n",
                                r.run_id, r.status, r.wall_s, r.restarts_used, r.max_restarts);
  if (r.root_cause && r.root_cause->rank < 0) {
    out += fmt::format("  root cause: {} on {} (attempt {}): {}\n",
                       r.root_cause->phase.empty() ? "the job" : r.root_cause->phase,
                       r.root_cause->node, r.root_cause->attempt, r.root_cause->what);
  } else if (r.root_cause) {
    out += fmt::format("  root cause: rank {} on {} (attempt {}): {}\n", r.root_cause->rank,
                       r.root_cause->node, r.root_cause->attempt, r.root_cause->what);
  }
  if (const RankOutcome* rank = root_cause_rank(r); rank && !rank->traceback.empty()) {
    // The last lines of the rank's traceback (its error file): where it raised.
    std::vector<std::string> lines;
    std::size_t start = 0;
    const std::string& tb = rank->traceback;
    while (start < tb.size()) {
      std::size_t nl = tb.find('\n', start);
      if (nl == std::string::npos) nl = tb.size();
      if (nl > start) lines.push_back(tb.substr(start, nl - start));
      start = nl + 1;
    }
    constexpr std::size_t kShown = 12;
    if (lines.size() > kShown) {
      out += fmt::format("    ... ({} lines more in report.json)\n", lines.size() - kShown);
      lines.erase(lines.begin(), lines.end() - kShown);
    }
    for (const std::string& line : lines) out += "    " + line + "\n";
  }
  if (r.attempts.empty()) return out;
  const AttemptReport& last = r.attempts.back();
  out += fmt::format("  {:>5}  {:<12} {:>8}  {:<22} {:>10} {:>9}  {}\n", "rank", "node", "pid",
                     "status", "peak rss", "wall", "note");
  for (const RankOutcome& o : last.ranks) {
    out += fmt::format("  {:>5}  {:<12} {:>8}  {:<22} {:>10} {:>8.1f}s  {}\n", o.rank, o.node_name,
                       o.pid, describe_wait_status(o.exit_code, o.signal),
                       format_size(o.peak_rss_bytes), o.wall_s, o.cause);
  }
  if (r.cost) out += cost_lines(*r.cost, last);
  if (!r.trace.empty()) out += "  " + r.trace + "\n";
  if (report_error.empty()) {
    out += fmt::format("  report: {}/report.json, logs: {}/attempt-{}/\n", r.job_dir, r.job_dir,
                       last.attempt);
  } else {
    out += fmt::format("  report: not written ({}), logs: {}/attempt-{}/\n", report_error,
                       r.job_dir, last.attempt);
  }
  return out;
}

}  // namespace topolaunch::launcher
