// The ranks' step timelines merged into one job trace; see trace_merge.hpp.
#include "trace_merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace topolaunch::launcher {

namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::vector<ClockOffset> align_clocks(const std::vector<SyncPoints>& ranks) {
  std::vector<ClockOffset> out;
  const SyncPoints* reference = nullptr;
  for (const SyncPoints& r : ranks)
    if (reference == nullptr || r.rank < reference->rank) reference = &r;
  if (reference == nullptr) return out;
  std::map<long long, double> ref(reference->points.begin(), reference->points.end());
  // Each rank's differences from rank 0 at the points both have; a node's offset is the median
  // over all of its ranks' differences.
  std::map<int, std::vector<double>> diffs;
  std::map<std::string, std::vector<double>> node_diffs;
  for (const SyncPoints& r : ranks) {
    for (const auto& [key, t] : r.points) {
      const auto it = ref.find(key);
      if (it == ref.end()) continue;
      diffs[r.rank].push_back(t - it->second);
      node_diffs[r.node].push_back(t - it->second);
    }
  }
  for (const SyncPoints& r : ranks) {
    ClockOffset c;
    c.rank = r.rank;
    c.node = r.node;
    const std::vector<double>& d = diffs[r.rank];
    c.points = static_cast<int>(d.size());
    if (r.node != reference->node) c.offset_us = median(node_diffs[r.node]);
    std::vector<double> left;
    for (double x : d) {
      left.push_back(std::abs(x - c.offset_us));
      c.worst_us = std::max(c.worst_us, left.back());
    }
    c.residual_us = median(left);
    out.push_back(c);
  }
  std::sort(out.begin(), out.end(),
            [](const ClockOffset& a, const ClockOffset& b) { return a.rank < b.rank; });
  return out;
}

Result<std::optional<MergedTrace>> merge_traces(const fs::path& attempt_dir, const fs::path& out) {
  const fs::path dir = attempt_dir / "trace";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::optional<MergedTrace>();
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) == 0 && entry.path().extension() == ".json")
      files.push_back(entry.path());
  }
  if (files.empty()) return std::optional<MergedTrace>();
  std::sort(files.begin(), files.end());

  struct RankTrace {
    int rank = 0;
    std::string node;
    nlohmann::json events, other;
  };
  std::vector<RankTrace> traces;
  std::vector<SyncPoints> sync;
  for (const fs::path& file : files) {
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    auto j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") ||
        !j["traceEvents"].is_array() || !j.contains("otherData") || !j["otherData"].is_object())
      return make_error(fmt::format("{}: not a step trace of topolaunch-worker", file.string()), 1);
    RankTrace t;
    t.other = j["otherData"];
    t.rank = t.other.value("rank", 0);
    t.node = t.other.value("node", "");
    t.events = std::move(j["traceEvents"]);
    SyncPoints s{t.rank, t.node, {}};
    for (const auto& p : t.other.value("sync_points", nlohmann::json::array()))
      s.points.emplace_back(p.value("step", 0LL) * 1000 + p.value("index", 0),
                            p.value("t_us", 0.0));
    sync.push_back(std::move(s));
    traces.push_back(std::move(t));
  }
  const std::vector<ClockOffset> clocks = align_clocks(sync);
  std::map<int, double> offset;
  for (const ClockOffset& c : clocks) offset[c.rank] = c.offset_us;

  double t0 = INFINITY;
  for (const RankTrace& t : traces)
    for (const auto& e : t.events)
      if (e.value("ph", "") == "X") t0 = std::min(t0, e.value("ts", 0.0) - offset[t.rank]);
  if (!std::isfinite(t0)) t0 = 0;

  MergedTrace merged;
  merged.path = out;
  merged.clocks = clocks;
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json per_rank = nlohmann::json::array();
  std::set<long long> steps;
  for (RankTrace& t : traces) {
    merged.ranks.push_back(t.rank);
    for (auto& e : t.events) {
      if (e.value("ph", "") == "X") {
        e["ts"] = e.value("ts", 0.0) - offset[t.rank] - t0;
        ++merged.spans;
      }
      events.push_back(std::move(e));
    }
    for (const auto& s : t.other.value("steps", nlohmann::json::array()))
      if (s.is_number_integer()) steps.insert(s.get<long long>());
    per_rank.push_back(std::move(t.other));
  }
  merged.steps.assign(steps.begin(), steps.end());
  nlohmann::json alignment = nlohmann::json::array();
  for (const ClockOffset& c : clocks) {
    merged.max_skew_us = std::max(merged.max_skew_us, c.residual_us);
    merged.worst_skew_us = std::max(merged.worst_skew_us, c.worst_us);
    alignment.push_back({{"rank", c.rank},
                         {"node", c.node},
                         {"offset_us", c.offset_us},
                         {"residual_us", c.residual_us},
                         {"worst_us", c.worst_us},
                         {"sync_points", c.points}});
  }
  nlohmann::json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  j["otherData"] = {
      {"ranks", merged.ranks},
      {"steps", merged.steps},
      {"time_zero_unix_us", t0},
      {"clock_alignment",
       {{"method",
         "the median offset of each node from rank 0 at the clock-sync all-reduces after each "
         "traced step (ranks on rank 0's node share its clock); residual_us: the median "
         "disagreement left at those points, worst_us the largest"},
        {"ranks", alignment},
        {"max_skew_us", merged.max_skew_us},
        {"worst_skew_us", merged.worst_skew_us}}},
      {"per_rank", per_rank}};
  std::ofstream f(out, std::ios::trunc);
  f << j.dump() << "\n";
  f.close();
  if (!f) return make_error(fmt::format("{}: cannot write the job trace", out.string()), 1);

  std::string steps_text, moved;
  for (long long s : merged.steps)
    steps_text += (steps_text.empty() ? "" : ",") + std::to_string(s);
  for (const ClockOffset& c : clocks)
    if (c.offset_us != 0) moved += fmt::format(", rank {} moved {:+.0f} us", c.rank, -c.offset_us);
  const int points = clocks.empty() ? 0 : clocks.back().points;
  merged.line = fmt::format(
      "trace: {}: {} rank(s), step(s) {}, {} spans; clock skew {:.1f} us (median over {} sync "
      "points per rank; worst {:.0f} us){}",
      out.string(), merged.ranks.size(), steps_text, merged.spans, merged.max_skew_us, points,
      merged.worst_skew_us, moved);
  return std::optional<MergedTrace>(std::move(merged));
}

}  // namespace topolaunch::launcher
