// The step figures of a rank and the job's cost attributed from them; see cost.hpp.
#include "topolaunch/launcher/cost.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace topolaunch::launcher {

namespace {

std::uint64_t unsigned_of(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  const double v = it->get<double>();
  return v > 0 ? static_cast<std::uint64_t>(v) : 0;
}

double number_of(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string string_of(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

bool add_step_figures_line(StepFigures& f, std::string_view line) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (const auto plan = j.find("plan"); plan != j.end() && plan->is_object()) {
    const nlohmann::json& p = *plan;
    f.present = true;
    f.backend = string_of(p, "backend");
    f.tokens_per_step = static_cast<std::int64_t>(unsigned_of(p, "tokens_per_step"));
    f.flops_per_step = number_of(p, "flops_per_step");
    if (const auto m = p.find("memory"); m != p.end() && m->is_object())
      for (const auto& [role, bytes] : m->items())
        if (bytes.is_number()) f.planned_bytes[role] = unsigned_of(*m, role.c_str());
    if (const auto a = p.find("allocated"); a != p.end() && a->is_object()) {
      f.arena_bytes = unsigned_of(*a, "arena");
      f.outside_arena_bytes = unsigned_of(*a, "outside_arena");
      f.device_used_bytes = unsigned_of(*a, "device_used");
      f.device_total_bytes = unsigned_of(*a, "device_total");
      f.device = string_of(*a, "device");
    }
    if (const auto c = p.find("comm"); c != p.end() && c->is_object()) {
      f.plan_comm_bytes_per_step = unsigned_of(*c, "bytes_per_step");
      f.plan_comm_ms = number_of(*c, "comm_ms");
      f.plan_exposed_ms = number_of(*c, "exposed_ms");
    }
    return true;
  }
  if (!j.contains("wall_ms") || !j.contains("step")) return false;
  const double parts[kStepPartCount] = {
      number_of(j, "compute_ms"),    number_of(j, "comm_exposed_ms"), number_of(j, "data_ms"),
      number_of(j, "checkpoint_ms"), number_of(j, "idle_ms"),         number_of(j, "trace_ms"),
      number_of(j, "validation_ms")};
  f.last_step = static_cast<std::int64_t>(number_of(j, "step"));
  f.last_steps = static_cast<std::int64_t>(number_of(j, "steps"));
  f.last_tokens = static_cast<std::int64_t>(number_of(j, "tokens"));
  f.last_wall_ms = number_of(j, "wall_ms");
  f.last_t_unix = number_of(j, "t_unix");
  f.steps += f.last_steps;
  f.tokens += f.last_tokens;
  f.wall_ms += f.last_wall_ms;
  f.compute_ms += parts[0];
  f.comm_exposed_ms += parts[1];
  f.data_ms += parts[2];
  f.checkpoint_ms += parts[3];
  f.idle_ms += parts[4];
  f.trace_ms += parts[5];
  f.validation_ms += parts[6];
  std::copy(std::begin(parts), std::end(parts), f.last_parts_ms);
  f.comm_busy_ms += number_of(j, "comm_busy_ms");
  f.comm_bytes += unsigned_of(j, "comm_bytes");
  if (const auto loss = j.find("loss"); loss != j.end() && loss->is_number())
    f.last_loss = loss->get<double>();
  f.skipped_steps =
      std::max(f.skipped_steps, static_cast<std::int64_t>(number_of(j, "skipped_steps")));
  return true;
}

double datasheet_peak_flops(std::string_view device) {
  // Dense bf16 tensor-core throughput (NVIDIA's data sheets; SXM parts, no sparsity).
  struct Entry {
    std::string_view model;
    double tflops;
  };
  static constexpr Entry kPeaks[] = {{"H200", 989.4}, {"H100", 989.4},  {"GH200", 989.4},
                                     {"A100", 312.0}, {"B200", 2250.0}, {"L40S", 362.05}};
  for (const Entry& e : kPeaks)
    if (device.find(e.model) != std::string_view::npos) return e.tflops * 1e12;
  return 0;
}

CostReport attribute_cost(const std::vector<RankStepFigures>& ranks,
                          const std::vector<NodeUsage>& nodes, double wall_s,
                          const jobspec::JobConfig& config) {
  CostReport c;
  c.wall_s = wall_s;
  // The allocation: the most GPUs and cores any attempt held (attempts run one after another).
  std::map<int, std::pair<int, int>> per_attempt;  // GPUs, cores
  for (const NodeUsage& n : nodes) {
    per_attempt[n.attempt].first += n.gpus;
    per_attempt[n.attempt].second += n.cores;
  }
  for (const auto& [attempt, held] : per_attempt) {
    c.gpus = std::max(c.gpus, held.first);
    c.cores = std::max(c.cores, held.second);
  }
  c.gpu_hours = c.gpus * wall_s / 3600.0;
  c.core_hours = c.cores * wall_s / 3600.0;

  // Energy, where measured.
  for (const NodeUsage& n : nodes) {
    for (std::size_t g = 0; g < n.gpu_energy_j.size(); ++g) {
      c.gpu_energy_j = c.gpu_energy_j.value_or(0) + n.gpu_energy_j[g];
      auto it = std::find_if(c.per_gpu.begin(), c.per_gpu.end(), [&](const auto& e) {
        return e.node == n.node && e.gpu == static_cast<int>(g);
      });
      if (it == c.per_gpu.end())
        c.per_gpu.push_back({n.node, static_cast<int>(g), n.gpu_energy_j[g]});
      else
        it->joules += n.gpu_energy_j[g];
    }
    if (n.cpu_energy_j) c.cpu_energy_j = c.cpu_energy_j.value_or(0) + *n.cpu_energy_j;
    for (const std::string* note : {&n.gpu_energy_note, &n.cpu_energy_note})
      if (!note->empty() &&
          std::find(c.notes.begin(), c.notes.end(), n.node + ": " + *note) == c.notes.end())
        c.notes.push_back(n.node + ": " + *note);
  }

  // Steps, tokens, FLOPs: per attempt, the slowest rank's time is the attempt's.
  std::map<int, double> attempt_wall_ms;
  std::map<int, std::int64_t> attempt_skipped;
  double flops = 0;
  std::string device;
  for (const RankStepFigures& r : ranks) {
    const StepFigures& f = *r.figures;
    if (!f.present && f.steps == 0) continue;
    c.step_wall_ms += f.wall_ms;
    c.step_parts_ms["compute"] += f.compute_ms;
    c.step_parts_ms["comm_exposed"] += f.comm_exposed_ms;
    c.step_parts_ms["data"] += f.data_ms;
    c.step_parts_ms["checkpoint"] += f.checkpoint_ms;
    c.step_parts_ms["idle"] += f.idle_ms;
    c.step_parts_ms["trace"] += f.trace_ms;
    c.step_parts_ms["validation"] += f.validation_ms;
    c.tokens += f.tokens;
    attempt_wall_ms[r.attempt] = std::max(attempt_wall_ms[r.attempt], f.wall_ms);
    attempt_skipped[r.attempt] = std::max(attempt_skipped[r.attempt], f.skipped_steps);
    if (f.tokens_per_step > 0)
      flops +=
          f.flops_per_step * static_cast<double>(f.tokens) / static_cast<double>(f.tokens_per_step);
    if (!f.device.empty()) device = f.device;
  }
  double wall_ms = 0;
  for (const auto& [attempt, ms] : attempt_wall_ms) wall_ms += ms;
  for (const auto& [attempt, n] : attempt_skipped) c.skipped_steps += n;
  if (wall_ms > 0) c.tokens_per_s = static_cast<double>(c.tokens) / (wall_ms / 1e3);
  const double joules = c.gpu_energy_j.value_or(0) + c.cpu_energy_j.value_or(0);
  if (joules > 0 && c.tokens > 0) c.tokens_per_j = static_cast<double>(c.tokens) / joules;

  if (config.observe.peak_tflops_per_rank > 0) {
    c.peak_flops_per_rank = config.observe.peak_tflops_per_rank * 1e12;
    c.peak_from = "observe.peak_tflops_per_rank";
  } else if (double peak = datasheet_peak_flops(device); peak > 0) {
    c.peak_flops_per_rank = peak;
    c.peak_from = device + " data sheet (dense bf16)";
  }
  // The ranks of the slowest attempt's time: FLOPs of every rank over the time they took.
  std::map<int, int> ranks_of_attempt;
  for (const RankStepFigures& r : ranks)
    if (r.figures->steps > 0) ++ranks_of_attempt[r.attempt];
  double rank_seconds = 0;
  for (const auto& [attempt, n] : ranks_of_attempt)
    rank_seconds += n * attempt_wall_ms[attempt] / 1e3;
  if (c.peak_flops_per_rank > 0 && rank_seconds > 0)
    c.mfu = flops / (rank_seconds * c.peak_flops_per_rank);
  else if (c.peak_flops_per_rank == 0)
    c.notes.push_back("MFU: no peak known for " +
                      (device.empty() ? std::string("CPU ranks") : device) +
                      " (set observe.peak_tflops_per_rank)");

  c.gpu_hour_price = config.cost.gpu_hour;
  c.core_hour_price = config.cost.core_hour;
  if (c.gpu_hour_price > 0 || c.core_hour_price > 0) {
    c.cost = c.gpu_hours * c.gpu_hour_price + c.core_hours * c.core_hour_price;
    if (c.tokens > 0) c.cost_per_million_tokens = *c.cost / static_cast<double>(c.tokens) * 1e6;
  }
  return c;
}

}  // namespace topolaunch::launcher
