// Private to the launcher: `topolaunch report JOB_DIR`, one self-contained HTML page of a job
// (inline CSS and SVG, no script, nothing fetched): the loss (training, and validation from
// validation.jsonl or the step figures), tokens/s, memory per rank, communication planned vs
// measured per step, the step-time split, the cost table, the attempts with the root cause of a
// failure, and the timeline of the traced steps.
//
// Each plot draws its data in a colour of its own (kSeriesColours), without anti-aliasing, so
// that a screenshot shows whether it drew anything (tests/integration/observe).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::launcher {

// What the page is made of, read from the job directory.
struct ReportPageInputs {
  std::string report_json;  // report.json
  // Every rank's step figures, attempt by attempt: (attempt, rank, the file's text).
  struct Figures {
    int attempt = 0, rank = 0;
    std::string text;
  };
  std::vector<Figures> figures;
  std::string trace_json;  // trace.json ("" when no step was traced)
  // validation.jsonl: the worker's validation losses, {"step", "val_loss", ...} a line ("" none)
  std::string validation_jsonl;
};

// The colour of each plot's data, one per plot, used nowhere else on the page.
struct SeriesColour {
  const char* plot;
  const char* hex;
};
inline constexpr SeriesColour kSeriesColours[] = {
    {"loss", "#d6272a"},          {"tokens_per_s", "#1f77b5"}, {"memory", "#2ca02d"},
    {"communication", "#9467be"}, {"step_time", "#ff7f0f"},    {"timeline", "#8c564c"},
};

ReportPageInputs read_report_inputs(const std::filesystem::path& job_dir, std::string& error);
// The page; an error when report.json is not a report.
Result<std::string> render_report_page(const ReportPageInputs& inputs);

}  // namespace topolaunch::launcher
