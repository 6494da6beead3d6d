// The job's page: one self-contained file whose every plot draws its data in its own colour.
#include <string>

#include "catch.hpp"
#include "report_page.hpp"
#include "topolaunch/launcher/report.hpp"

using namespace topolaunch::launcher;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

ReportPageInputs two_ranks() {
  JobReport r;
  r.run_id = "tiny-1";
  r.status = "succeeded";
  r.wall_s = 10;
  AttemptReport a;
  for (int rank = 0; rank < 2; ++rank) {
    RankOutcome o;
    o.rank = rank;
    o.node_name = "vm";
    o.exit_code = 0;
    o.peak_rss_bytes = 40 << 20;
    add_step_figures_line(
        o.figures,
        R"({"plan":{"backend":"cpu","tokens_per_step":256,"memory":{"arena":4760064}}})");
    a.ranks.push_back(o);
  }
  r.attempts = {a};
  set_cost(r, topolaunch::jobspec::JobConfig{});
  ReportPageInputs in;
  in.report_json = to_json(r);
  const std::string plan =
      R"({"plan":{"backend":"cpu","world_size":2,"tokens_per_step":256,"comm":{"bytes_per_step":449536,"exposed_ms":0.27}}})";
  std::string lines = plan + "\n";
  for (int step = 10; step <= 50; step += 10)
    lines += "{\"step\":" + std::to_string(step) +
             ",\"steps\":10,\"wall_ms\":1500,\"tokens\":2560,\"compute_ms\":1100,"
             "\"comm_exposed_ms\":380,\"comm_bytes\":4495360,\"loss\":" +
             std::to_string(4.0 - step / 25.0) + "}\n";
  in.figures = {{0, 0, lines}, {0, 1, lines}};
  in.validation_jsonl = "{\"step\":0,\"val_loss\":4.4}\n{\"step\":50,\"val_loss\":2.9}\n";
  in.trace_json =
      R"J({"traceEvents":[{"ph":"M","pid":0,"tid":0,"name":"process_name","args":{"name":"rank 0 (vm)"}},)J"
      R"J({"ph":"X","pid":0,"tid":1,"ts":0,"dur":100,"name":"h0.attention","cat":"forward","args":{"step":30,"op":7}},)J"
      R"J({"ph":"X","pid":0,"tid":2,"ts":100,"dur":50,"name":"bucket 0","cat":"all-reduce","args":{"step":30,"bucket":0}}]})J";
  return in;
}

}  // namespace

TEST_CASE("report page: every plot drawn in its own colour, nothing fetched") {
  auto page = render_report_page(two_ranks());
  REQUIRE(page.ok());
  const std::string& html = *page;
  for (const char* id : {"plot-loss", "plot-tokens", "plot-memory", "plot-comm", "plot-exposed",
                         "plot-step-time", "plot-timeline"})
    CHECK(count(html, std::string("id=\"") + id + "\"") == 1);
  // the loss and the tokens/s as polylines of their colours
  CHECK(count(html, "<polyline points=\"") >= 6);
  CHECK(html.find("stroke=\"#d6272a\"") != std::string::npos);
  CHECK(html.find("stroke=\"#1f77b5\"") != std::string::npos);
  CHECK(html.find("<title>validation</title>") != std::string::npos);  // validation.jsonl
  CHECK(html.find("fill=\"#2ca02d\"") != std::string::npos);           // memory's measured bars
  CHECK(html.find("stroke=\"#9467be\"") != std::string::npos);         // communication measured
  CHECK(html.find("fill=\"#8c564c\"") != std::string::npos);  // the timeline's forward span
  CHECK(html.find("<title>h0.attention (step 30, 100.0 us)</title>") != std::string::npos);
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("tiny-1 — succeeded") != std::string::npos);
}

TEST_CASE("report page: what is missing says so; a file that is not a report is refused") {
  ReportPageInputs in = two_ranks();
  in.figures.clear();
  in.trace_json.clear();
  auto page = render_report_page(in);
  REQUIRE(page.ok());
  CHECK(count(*page, ">no data</text>") >= 2);
  CHECK(page->find("No traced steps") != std::string::npos);
  in.report_json = "{\"something\": 1}";
  auto bad = render_report_page(in);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "report.json: not a report of topolaunch run");
}
