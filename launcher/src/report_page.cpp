// `topolaunch report JOB_DIR`: the job's page, self-contained; see report_page.hpp.
#include "report_page.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>

#include "topolaunch/common/units.hpp"

namespace topolaunch::launcher {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

const char* colour_of(std::string_view plot) {
  for (const SeriesColour& c : kSeriesColours)
    if (plot == c.plot) return c.hex;
  return "#000000";
}

// A number for an axis label: 3 significant digits, k/M/G above a thousand.
std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e3) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

// One x-y plot: axes with a few ticks, then polylines (crisp edges: the colour stays exact).
class Plot {
 public:
  Plot(std::string title, std::string x_label, std::string y_label)
      : title_(std::move(title)), x_label_(std::move(x_label)), y_label_(std::move(y_label)) {}

  void add(std::string name, std::string colour, std::vector<std::pair<double, double>> points,
           bool dashed = false) {
    for (const auto& [x, y] : points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0_ = std::min(x0_, x);
      x1_ = std::max(x1_, x);
      y0_ = std::min(y0_, y);
      y1_ = std::max(y1_, y);
    }
    series_.push_back({std::move(name), std::move(colour), std::move(points), dashed});
  }
  void from_zero() { y0_ = std::min(y0_, 0.0); }

  std::string svg(const std::string& id) const {
    constexpr double W = 560, H = 260, L = 64, R = 16, T = 28, B = 40;
    std::string out = fmt::format(
        "<svg id=\"{}\" class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
        "height=\"{}\" viewBox=\"0 0 {} {}\">",
        id, W, H, W, H);
    out += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>", L, escape(title_));
    bool any = false;
    for (const Series& s : series_) any = any || !s.points.empty();
    if (!any || !(x1_ >= x0_) || !(y1_ >= y0_)) {
      out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"none\">no data</text></svg>", W / 2 - 30,
                         H / 2);
      return out;
    }
    double x0 = x0_, x1 = x1_ > x0_ ? x1_ : x0_ + 1, y0 = y0_, y1 = y1_ > y0_ ? y1_ : y0_ + 1;
    const double pad = (y1 - y0) * 0.05;
    y1 += pad;
    if (y0 != 0) y0 -= pad;
    auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>", L, T,
                       W - L - R, H - T - B);
    for (int i = 0; i <= 4; ++i) {
      const double yv = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
      out += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>",
                         L, W - R, py(yv), py(yv));
      out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" class=\"ytick\">{}</text>", L - 6, py(yv) + 4,
                         tick_label(yv));
      out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"xtick\">{}</text>", px(xv),
                         H - B + 16, x1 - x0 >= 8 ? fmt::format("{:.0f}", xv) : tick_label(xv));
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"xlabel\">{}</text>", (L + W - R) / 2, H - 6,
                       escape(x_label_));
    out += fmt::format(
        "<text x=\"14\" y=\"{}\" class=\"ylabel\" transform=\"rotate(-90 14 {})\">{}</text>",
        (T + H - B) / 2, (T + H - B) / 2, escape(y_label_));
    double legend_x = W - R - 8;
    for (const Series& s : series_) {
      std::string points;
      for (const auto& [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y))
          points += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
      if (s.points.size() == 1) {
        const auto [x, y] = s.points.front();
        out += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"6\" height=\"6\" fill=\"{}\" "
            "shape-rendering=\"crispEdges\"/>",
            px(x) - 3, py(y) - 3, s.colour);
      }
      out += fmt::format(
          "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"3\" "
          "shape-rendering=\"crispEdges\"{}><title>{}</title></polyline>",
          points, s.colour, s.dashed ? " stroke-dasharray=\"8 4\"" : "", escape(s.name));
      const std::string label = escape(s.name);
      legend_x -= 32 + 7.5 * static_cast<double>(s.name.size());
      out += fmt::format(
          "<rect x=\"{:.0f}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\" "
          "shape-rendering=\"crispEdges\"/><text x=\"{:.0f}\" y=\"{}\" class=\"legend\">{}</text>",
          legend_x, T + 6, s.colour, legend_x + 14, T + 15, label);
    }
    return out + "</svg>";
  }

 private:
  struct Series {
    std::string name, colour;
    std::vector<std::pair<double, double>> points;
    bool dashed;
  };
  std::string title_, x_label_, y_label_;
  std::vector<Series> series_;
  double x0_ = INFINITY, x1_ = -INFINITY, y0_ = INFINITY, y1_ = -INFINITY;
};

// Horizontal bars (one row per label, several values side by side).
std::string bars_svg(const std::string& id, const std::string& title,
                     const std::vector<std::string>& rows, const std::vector<std::string>& names,
                     const std::vector<std::string>& colours,
                     const std::vector<std::vector<double>>& values,
                     std::string (*format)(double)) {
  const double W = 560, L = 110, R = 90, T = 40,
               row_h = 14.0 * static_cast<double>(names.size()) + 10;
  const double H = T + row_h * static_cast<double>(rows.size()) + 12;
  double top = 0;
  for (const auto& r : values)
    for (double v : r) top = std::max(top, v);
  std::string out = fmt::format(
      "<svg id=\"{}\" class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
      "height=\"{:.0f}\" viewBox=\"0 0 {} {:.0f}\">",
      id, W, H, W, H);
  out += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>", 8, escape(title));
  double lx = 8;
  for (std::size_t n = 0; n < names.size(); ++n) {
    out += fmt::format(
        "<rect x=\"{:.0f}\" y=\"26\" width=\"10\" height=\"10\" fill=\"{}\" "
        "shape-rendering=\"crispEdges\"/><text x=\"{:.0f}\" y=\"35\" class=\"legend\">{}</text>",
        lx, colours[n], lx + 14, escape(names[n]));
    lx += 24 + 7.0 * static_cast<double>(names[n].size());
  }
  if (top <= 0) top = 1;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const double y = T + row_h * static_cast<double>(r) + 6;
    out += fmt::format("<text x=\"{}\" y=\"{:.0f}\" class=\"ytick\">{}</text>", L - 6,
                       y + row_h / 2, escape(rows[r]));
    for (std::size_t n = 0; n < names.size() && n < values[r].size(); ++n) {
      const double w = values[r][n] / top * (W - L - R);
      out += fmt::format(
          "<rect x=\"{}\" y=\"{:.0f}\" width=\"{:.1f}\" height=\"12\" fill=\"{}\" "
          "shape-rendering=\"crispEdges\"><title>{}: {}</title></rect>",
          L, y + 14.0 * static_cast<double>(n), std::max(w, 0.0), colours[n], escape(names[n]),
          format(values[r][n]));
      out += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" class=\"legend\">{}</text>",
                         L + std::max(w, 0.0) + 4, y + 14.0 * static_cast<double>(n) + 10,
                         format(values[r][n]));
    }
  }
  return out + "</svg>";
}

std::string bytes_text(double v) {
  return format_size(static_cast<std::uint64_t>(std::max(v, 0.0)));
}

// The step-time split of the job: one stacked bar, a colour per part.
std::string split_svg(const json& step_time) {
  static const std::pair<const char*, const char*> kParts[] = {
      {"compute", "#ff7f0f"},    {"comm_exposed", "#ffbb79"}, {"data", "#17becf"},
      {"checkpoint", "#aec7e8"}, {"idle", "#c7c7c7"},         {"trace", "#f7b6d2"},
      {"validation", "#c49c95"}};
  const double wall = step_time.value("wall_ms", 0.0);
  const double W = 560, L = 8, R = 8, H = 112;
  std::string out = fmt::format(
      "<svg id=\"plot-step-time\" class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\"><text x=\"8\" y=\"18\" "
      "class=\"title\">Step time, all ranks: where it went</text>",
      W, H, W, H);
  if (wall <= 0) return out + "<text x=\"250\" y=\"60\" class=\"none\">no data</text></svg>";
  double x = L, lx = L, ly = 66;
  const json parts = step_time.value("parts_ms", json::object());
  for (const auto& [name, colour] : kParts) {
    const double ms = parts.value(name, 0.0);
    const double w = ms / wall * (W - L - R);
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"28\" width=\"{:.1f}\" height=\"26\" fill=\"{}\" "
        "shape-rendering=\"crispEdges\"><title>{}: {:.1f}% ({:.0f} ms)</title></rect>",
        x, w, colour, name, 100 * ms / wall, ms);
    x += w;
    const std::string label = fmt::format("{} {:.1f}%", name, 100 * ms / wall);
    const double width = 24 + 6.5 * static_cast<double>(label.size());
    if (lx + width > W - R) {
      lx = L;
      ly += 18;
    }
    out += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"10\" height=\"10\" fill=\"{}\" "
        "shape-rendering=\"crispEdges\"/><text x=\"{:.0f}\" y=\"{:.0f}\" "
        "class=\"legend\">{}</text>",
        lx, ly, colour, lx + 13, ly + 9, label);
    lx += width;
  }
  return out + "</svg>";
}

// The traced steps' timeline: per rank a lane per track, spans coloured by what they are.
std::string timeline_svg(const std::string& trace_text) {
  static const std::map<std::string, std::string> kColours{
      {"forward", "#8c564c"},   {"recompute", "#c49c95"},  {"backward", "#e377c3"},
      {"optimizer", "#7f7f7f"}, {"all-reduce", "#bcbd22"}, {"communication", "#bcbd22"},
      {"data", "#17becf"},      {"wait", "#c7c7c7"},       {"checkpoint", "#aec7e8"},
      {"trace", "#f7b6d2"},     {"step", "#dbdb8d"}};
  const double W = 1100, L = 120, R = 10, T = 44, lane = 16;
  auto j = json::parse(trace_text, nullptr, false);
  if (j.is_discarded() || !j.contains("traceEvents"))
    return "<p class=\"note\">No traced steps (<code>[observe] trace_steps</code>).</p>";
  struct Span {
    int rank, track;
    double ts, dur;
    std::string name, cat;
    long long step;
  };
  std::vector<Span> spans;
  std::map<int, std::string> rank_names;
  double end = 0;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e.value("ph", "");
    if (ph == "M" && e.value("name", "") == "process_name")
      rank_names[e.value("pid", 0)] = e["args"].value("name", "");
    if (ph != "X") continue;
    Span s{e.value("pid", 0),
           e.value("tid", 0),
           e.value("ts", 0.0),
           e.value("dur", 0.0),
           e.value("name", ""),
           e.value("cat", ""),
           0};
    if (e.contains("args") && e["args"].is_object()) s.step = e["args"].value("step", 0LL);
    end = std::max(end, s.ts + s.dur);
    spans.push_back(std::move(s));
  }
  if (spans.empty() || end <= 0) return "<p class=\"note\">The trace holds no spans.</p>";
  std::vector<int> ranks;
  for (const Span& s : spans)
    if (std::find(ranks.begin(), ranks.end(), s.rank) == ranks.end()) ranks.push_back(s.rank);
  std::sort(ranks.begin(), ranks.end());
  const double per_rank = lane * 4 + 10;
  const double H = T + per_rank * static_cast<double>(ranks.size()) + 30;
  std::string out = fmt::format(
      "<svg id=\"plot-timeline\" class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"{}\" height=\"{:.0f}\" viewBox=\"0 0 {} {:.0f}\"><text x=\"8\" y=\"18\" "
      "class=\"title\">Timeline of the traced steps ({:.1f} ms; hover a span for its name)</text>",
      W, H, W, H, end / 1e3);
  double lx = 8;
  for (const char* cat : {"forward", "backward", "optimizer", "all-reduce", "data", "wait",
                          "checkpoint", "trace", "step"}) {
    out += fmt::format(
        "<rect x=\"{:.0f}\" y=\"26\" width=\"10\" height=\"10\" fill=\"{}\" "
        "shape-rendering=\"crispEdges\"/><text x=\"{:.0f}\" y=\"35\" class=\"legend\">{}</text>",
        lx, kColours.at(cat), lx + 13, cat);
    lx += 22 + 6.5 * std::string_view(cat).size();
  }
  auto px = [&](double t) { return L + t / end * (W - L - R); };
  static const char* kTracks[] = {"host", "compute", "comm"};
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const double y0 = T + per_rank * static_cast<double>(r) + 6;
    const std::string label =
        rank_names.count(ranks[r]) ? rank_names[ranks[r]] : "rank " + std::to_string(ranks[r]);
    out += fmt::format("<text x=\"4\" y=\"{:.0f}\" class=\"legend\">{}</text>", y0 + 10,
                       escape(label));
    for (int t = 0; t < 3; ++t)
      out += fmt::format("<text x=\"{}\" y=\"{:.0f}\" class=\"ytick\">{}</text>", L - 4,
                         y0 + lane * (t + 1) + 11, kTracks[t]);
    for (const Span& s : spans) {
      if (s.rank != ranks[r]) continue;
      const bool step = s.cat == "step";
      const double y = step ? y0 : y0 + lane * (s.track + 1);
      const auto c = kColours.find(s.cat);
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.0f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" "
          "shape-rendering=\"crispEdges\"><title>{} (step {}, {:.1f} us)</title></rect>",
          px(s.ts), y + 1, std::max(px(s.ts + s.dur) - px(s.ts), 0.6), step ? 6 : lane - 2,
          c == kColours.end() ? "#555555" : c->second, escape(s.name), s.step, s.dur);
    }
  }
  out += fmt::format("<text x=\"{}\" y=\"{:.0f}\" class=\"xtick\">0</text>", L, H - 8);
  out += fmt::format("<text x=\"{}\" y=\"{:.0f}\" class=\"xtick\">{:.2f} ms</text>", W - R - 20,
                     H - 8, end / 1e3);
  return out + "</svg>";
}

std::string cell(const json& v, const char* unit = "", int digits = 4) {
  if (v.is_null()) return "<span class=\"none\">not measured</span>";
  if (v.is_number()) return fmt::format("{:.{}g}{}", v.get<double>(), digits, unit);
  if (v.is_string()) return escape(v.get<std::string>());
  return escape(v.dump());
}

std::string cost_table(const json& cost) {
  if (!cost.is_object()) return "<p class=\"note\">No cost in report.json.</p>";
  const json a = cost.value("allocation", json::object());
  const json e = cost.value("energy", json::object());
  const json p = cost.value("price", json::object());
  std::string rows;
  auto row = [&](const std::string& what, const std::string& value) {
    rows += "<tr><th>" + escape(what) + "</th><td>" + value + "</td></tr>";
  };
  row("allocation", fmt::format("{} GPU(s), {} core(s), {:.1f} s", a.value("gpus", 0),
                                a.value("cores", 0), a.value("wall_s", 0.0)));
  row("GPU-hours", cell(a.value("gpu_hours", json(nullptr))));
  row("core-hours", cell(a.value("core_hours", json(nullptr))));
  row("GPU energy (NVML)", cell(e.value("gpu_j", json(nullptr)), " J"));
  row("CPU energy (RAPL)", cell(e.value("cpu_j", json(nullptr)), " J"));
  row("tokens", cell(cost.value("tokens", json(nullptr)), "", 12));
  row("tokens/s", cell(cost.value("tokens_per_s", json(nullptr))));
  row("tokens/J", cell(cost.value("tokens_per_j", json(nullptr))));
  std::string mfu = cost.value("mfu", json(nullptr)).is_number()
                        ? fmt::format("{:.2f}% ({})", 100 * cost["mfu"].get<double>(),
                                      escape(cost.value("peak_from", "")))
                        : cell(json(nullptr));
  row("model FLOPs utilisation", mfu);
  row("price", fmt::format("{} per GPU-hour, {} per core-hour", p.value("gpu_hour", 0.0),
                           p.value("core_hour", 0.0)));
  row("cost", cell(p.value("total", json(nullptr))));
  row("cost per million tokens", cell(p.value("per_million_tokens", json(nullptr))));
  std::string notes;
  for (const auto& n : cost.value("notes", json::array()))
    if (n.is_string()) notes += "<li>" + escape(n.get<std::string>()) + "</li>";
  return "<table class=\"cost\">" + rows + "</table>" +
         (notes.empty() ? "" : "<ul class=\"note\">" + notes + "</ul>");
}

std::string attempts_table(const json& report) {
  std::string out =
      "<table class=\"ranks\"><tr><th>attempt</th><th>outcome</th><th>wall</th>"
      "<th>rank</th><th>node</th><th>status</th><th>peak RSS</th><th>peak GPU</th>"
      "<th>note</th></tr>";
  for (const auto& a : report.value("attempts", json::array())) {
    for (const auto& r : a.value("ranks", json::array())) {
      out += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{:.1f} s</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td>{}</td><td>{}</td></tr>",
          a.value("attempt", 0), escape(a.value("outcome", "")), a.value("wall_s", 0.0),
          r.value("rank", -1), escape(r.value("node_name", "")), escape(r.value("status", "")),
          bytes_text(r.value("peak_rss_bytes", 0.0)), bytes_text(r.value("peak_gpu_bytes", 0.0)),
          escape(r.value("cause", "")));
    }
  }
  out += "</table>";
  const json cause = report.value("root_cause", json(nullptr));
  if (cause.is_object()) {
    out +=
        fmt::format("<p class=\"cause\">Root cause: {} on {} (attempt {}): {}</p>",
                    cause.value("rank", -1) >= 0 ? "rank " + std::to_string(cause.value("rank", -1))
                                                 : escape(cause.value("phase", "the job")),
                    escape(cause.value("node", "")), cause.value("attempt", 0),
                    escape(cause.value("what", "")));
    if (!cause.value("traceback", "").empty())
      out += "<pre>" + escape(cause.value("traceback", "")) + "</pre>";
  }
  return out;
}

}  // namespace

ReportPageInputs read_report_inputs(const fs::path& job_dir, std::string& error) {
  ReportPageInputs in;
  std::error_code ec;
  if (!fs::is_regular_file(job_dir / "report.json", ec)) {
    error = fmt::format("{}: no report.json here (a job directory of topolaunch run?)",
                        job_dir.string());
    return in;
  }
  in.report_json = read_text(job_dir / "report.json");
  const std::regex attempt_re("attempt-([0-9]+)"), rank_re("rank-([0-9]+)\\.jsonl");
  for (const auto& entry : fs::directory_iterator(job_dir, ec)) {
    std::smatch a;
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !std::regex_match(name, a, attempt_re)) continue;
    for (const auto& f : fs::directory_iterator(entry.path() / "metrics", ec)) {
      std::smatch r;
      const std::string file = f.path().filename().string();
      if (!std::regex_match(file, r, rank_re)) continue;
      in.figures.push_back({std::stoi(a[1]), std::stoi(r[1]), read_text(f.path())});
    }
  }
  std::sort(in.figures.begin(), in.figures.end(), [](const auto& x, const auto& y) {
    return std::tie(x.attempt, x.rank) < std::tie(y.attempt, y.rank);
  });
  if (fs::is_regular_file(job_dir / "trace.json", ec))
    in.trace_json = read_text(job_dir / "trace.json");
  if (fs::is_regular_file(job_dir / "validation.jsonl", ec))
    in.validation_jsonl = read_text(job_dir / "validation.jsonl");
  return in;
}

Result<std::string> render_report_page(const ReportPageInputs& in) {
  const json report = json::parse(in.report_json, nullptr, false);
  if (report.is_discarded() || !report.is_object() || !report.contains("attempts"))
    return make_error("report.json: not a report of topolaunch run", 2);

  // The step figures: per (attempt, rank) the plan and the interval lines.
  std::vector<std::pair<double, double>> loss, val_loss, comm_sent, comm_exposed, plan_sent,
      plan_exposed;
  std::map<std::pair<int, long long>, double> tokens_per_s;  // (attempt, step) -> all ranks
  int world = 1;
  for (const auto& f : in.figures) {
    std::istringstream lines(f.text);
    json plan;
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      if (j.contains("plan")) {
        plan = j["plan"];
        world = std::max(world, plan.value("world_size", 1));
        continue;
      }
      const double step = j.value("step", 0.0), steps = j.value("steps", 0.0);
      const double wall = j.value("wall_ms", 0.0);
      if (steps <= 0 || wall <= 0) continue;
      tokens_per_s[{f.attempt, static_cast<long long>(step)}] +=
          j.value("tokens", 0.0) / (wall / 1e3);
      if (f.rank != 0) continue;
      if (j.contains("loss") && j["loss"].is_number())
        loss.emplace_back(step, j["loss"].get<double>());
      if (j.contains("val_loss") && j["val_loss"].is_number())
        val_loss.emplace_back(step, j["val_loss"].get<double>());
      const double ring = world > 1 ? 2.0 * (world - 1) / world : 0.0;
      comm_sent.emplace_back(step, ring * j.value("comm_bytes", 0.0) / steps);
      comm_exposed.emplace_back(step, j.value("comm_exposed_ms", 0.0) / steps);
      if (plan.is_object() && plan.contains("comm")) {
        plan_sent.emplace_back(step, plan["comm"].value("bytes_per_step", 0.0));
        plan_exposed.emplace_back(step, plan["comm"].value("exposed_ms", 0.0));
      }
    }
  }
  {
    std::istringstream lines(in.validation_jsonl);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("val_loss") && j["val_loss"].is_number())
        val_loss.emplace_back(j.value("step", 0.0), j["val_loss"].get<double>());
    }
  }
  std::vector<std::pair<double, double>> throughput;
  for (const auto& [key, value] : tokens_per_s) throughput.emplace_back(key.second, value);

  Plot loss_plot("Loss", "step", "loss");
  loss_plot.add("training", colour_of("loss"), loss);
  if (!val_loss.empty()) loss_plot.add("validation", "#ff9897", val_loss);
  Plot tokens_plot("Tokens per second, all ranks", "step", "tokens/s");
  tokens_plot.add("tokens/s", colour_of("tokens_per_s"), throughput);
  tokens_plot.from_zero();
  Plot comm_plot("Gradient communication per step: sent per rank", "step", "bytes");
  comm_plot.add("measured", colour_of("communication"), comm_sent);
  comm_plot.add("planned", "#c5b0d6", plan_sent, true);
  comm_plot.from_zero();
  Plot exposed_plot("Exposed communication per step", "step", "ms");
  exposed_plot.add("measured", colour_of("communication"), comm_exposed);
  exposed_plot.add("planned", "#c5b0d6", plan_exposed, true);
  exposed_plot.from_zero();

  // Memory per rank (the last attempt): measured peak against the planned arena.
  std::vector<std::string> rows;
  std::vector<std::vector<double>> mem;
  bool gpu = false;
  const json attempts = report["attempts"];
  if (!attempts.empty()) {
    for (const auto& r : attempts.back().value("ranks", json::array())) {
      const json steps = r.value("steps", json::object());
      const bool cuda = steps.value("backend", "") == "cuda";
      gpu = gpu || cuda;
      const double measured =
          cuda ? r.value("peak_gpu_bytes", 0.0) : r.value("peak_rss_bytes", 0.0);
      const double arena =
          steps.contains("memory") ? steps["memory"]["planned"].value("arena", 0.0) : 0.0;
      rows.push_back("rank " + std::to_string(r.value("rank", -1)));
      mem.push_back({measured, arena});
    }
  }
  const std::string memory_svg = bars_svg("plot-memory",
                                          gpu ? "Memory per rank: GPU (NVML) against the plan"
                                              : "Memory per rank: host RSS against the plan",
                                          rows, {"measured peak", "planned arena"},
                                          {colour_of("memory"), "#98df8b"}, mem, bytes_text);

  const json cost = report.value("cost", json(nullptr));
  const std::string title =
      fmt::format("{} — {}", report.value("run_id", "job"), report.value("status", ""));
  std::string html =
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + escape(title) +
      "</title><style>"
      "body{font-family:sans-serif;margin:24px;color:#222;max-width:1180px}"
      "h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
      ".grid{display:flex;flex-wrap:wrap;gap:12px}"
      ".plot{background:#fff;border:1px solid #ddd}"
      ".plot .title{font-size:13px;font-weight:bold}.plot text{font-size:11px;fill:#333}"
      ".plot .ytick{text-anchor:end}.plot .xtick{text-anchor:middle}"
      ".plot .xlabel{text-anchor:middle}.plot .ylabel{text-anchor:middle}"
      ".frame{fill:none;stroke:#999}.grid line,.plot .grid{stroke:#eee}"
      ".none{fill:#999;color:#999}table{border-collapse:collapse;font-size:13px}"
      "th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}"
      "th{background:#f5f5f5}.note{color:#666;font-size:12px}.cause{color:#a00}"
      "pre{background:#f8f8f8;padding:8px;font-size:12px;overflow:auto}"
      "</style></head><body>";
  html += "<h1>" + escape(title) + "</h1>";
  html += fmt::format(
      "<p>{} after {:.1f} s, {} of {} restarts used; exit status {}. Job directory: "
      "<code>{}</code>.</p>",
      escape(report.value("status", "")), report.value("wall_s", 0.0),
      report.value("restarts_used", 0), report.value("max_restarts", 0),
      report.value("exit_code", 0), escape(report.value("job_dir", "")));
  html += "<h2>Training</h2><div class=\"grid\">" + loss_plot.svg("plot-loss") +
          tokens_plot.svg("plot-tokens") + "</div>";
  html += "<h2>Memory and communication</h2><div class=\"grid\">" + memory_svg +
          comm_plot.svg("plot-comm") + exposed_plot.svg("plot-exposed") + "</div>";
  html += "<h2>Cost</h2><div class=\"grid\">" + cost_table(cost) +
          split_svg(cost.is_object() ? cost.value("step_time", json::object()) : json::object()) +
          "</div>";
  html += "<h2>Attempts</h2>" + attempts_table(report);
  html += "<h2>Traced steps</h2>" + timeline_svg(in.trace_json);
  if (!report.value("trace", "").empty())
    html += "<p class=\"note\">" + escape(report.value("trace", "")) + "</p>";
  html += "</body></html>\n";
  return html;
}

}  // namespace topolaunch::launcher
