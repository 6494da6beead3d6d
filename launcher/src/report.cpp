// Job report: JSON for machines, a short table for people; a Slurm step's agents' reports merged.
#include "topolaunch/launcher/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>

#include "report_merge.hpp"
#include "topolaunch/launcher/units.hpp"

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
  std::vector<RootCause> failures;
  std::vector<int> failure_exit;
  std::vector<std::string> failure_preflight;
  for (std::size_t node = 0; node < agent_reports.size(); ++node) {
    const std::optional<JobReport>& fragment = agent_reports[node];
    if (!fragment || fragment->attempts.empty()) continue;
    const AttemptReport& a = fragment->attempts.front();
    merged.all_started_s = std::max(merged.all_started_s, a.all_started_s);
    merged.ranks.insert(merged.ranks.end(), a.ranks.begin(), a.ranks.end());
    if (report.agent_wireup.empty()) report.agent_wireup = fragment->agent_wireup;
    if (attempt == 0 && node == 0) report.preflight = fragment->preflight;
    if (fragment->root_cause && a.outcome == "failed") {
      failures.push_back(*fragment->root_cause);
      failure_exit.push_back(fragment->exit_code);
      failure_preflight.push_back(fragment->preflight);
    }
    // Agents signalled by Slurm directly (scancel --signal=USR1 JOBID, step teardown).
    if (a.outcome == "requeue" || a.outcome == "stopped") step.agent_outcome = a.outcome;
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

int exit_code_of(const std::string& outcome, int stop_signal) {
  if (outcome == "succeeded") return 0;
  if (outcome == "requeue") return 3;
  if (outcome == "stopped") return 128 + (stop_signal ? stop_signal : SIGTERM);
  return 1;
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
  if (r.root_cause) {
    j["root_cause"] = {{"attempt", r.root_cause->attempt}, {"rank", r.root_cause->rank},
                       {"node", r.root_cause->node},       {"what", r.root_cause->what},
                       {"phase", r.root_cause->phase},     {"at_unix_s", r.root_cause->at_unix_s}};
  } else {
    j["root_cause"] = nullptr;
  }
  j["attempts"] = nlohmann::json::array();
  for (const AttemptReport& a : r.attempts) {
    nlohmann::json ja{
        {"attempt", a.attempt}, {"started_s", a.started_s}, {"all_started_s", a.all_started_s},
        {"wall_s", a.wall_s},   {"outcome", a.outcome},     {"ranks", nlohmann::json::array()}};
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
                             {"cause", o.cause}});
    }
    j["attempts"].push_back(std::move(ja));
  }
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
      a.ranks.push_back(o);
    }
    r.attempts.push_back(std::move(a));
  }
  return r;
}

std::string summarize(const JobReport& r) {
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
  if (r.attempts.empty()) return out;
  const AttemptReport& last = r.attempts.back();
  out += fmt::format("  {:>5}  {:<12} {:>8}  {:<22} {:>10} {:>9}  {}\n", "rank", "node", "pid",
                     "status", "peak rss", "wall", "note");
  for (const RankOutcome& o : last.ranks) {
    out += fmt::format("  {:>5}  {:<12} {:>8}  {:<22} {:>10} {:>8.1f}s  {}\n", o.rank, o.node_name,
                       o.pid, describe_wait_status(o.exit_code, o.signal),
                       format_size(o.peak_rss_bytes), o.wall_s, o.cause);
  }
  out += fmt::format("  report: {}/report.json, logs: {}/attempt-{}/\n", r.job_dir, r.job_dir,
                     last.attempt);
  return out;
}

}  // namespace topolaunch::launcher
