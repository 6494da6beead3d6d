// Private to the launcher: the ranks' step timelines (<attempt dir>/trace/rank-R.json, Chrome
// trace-event JSON that topolaunch-worker writes for [observe] trace_steps) merged into one job
// trace: one process per rank, the clocks of other nodes aligned, the skew stated.
//
// Alignment: after each traced step every rank leaves the same few all-reduces (the clock-sync
// points of its file) at the same moment, up to the collective's own jitter. A node's offset from
// rank 0's clock is the median over its ranks and those points of (its time - rank 0's time);
// ranks on rank 0's node share its clock and are not moved. What is left after the alignment is
// the stated skew: per rank the median |difference - offset| over the points, and the worst one
// (a rank descheduled between leaving the collective and reading its clock shows there).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::launcher {

struct ClockOffset {
  int rank = 0;
  std::string node;
  double offset_us = 0;    // subtracted from the rank's times
  double residual_us = 0;  // the median disagreement left with rank 0 at the sync points
  double worst_us = 0;     // the largest one
  int points = 0;          // sync points in common with rank 0
};

struct MergedTrace {
  std::filesystem::path path;
  std::vector<int> ranks;
  std::vector<long long> steps;
  std::size_t spans = 0;
  std::vector<ClockOffset> clocks;
  double max_skew_us = 0;    // the largest rank's median residual
  double worst_skew_us = 0;  // the largest single disagreement
  std::string line;          // for the summary: where, what, and the skew
};

// Rank 0's clock against each rank's from their sync points (the pure part of the merge).
struct SyncPoints {
  int rank = 0;
  std::string node;
  std::vector<std::pair<long long, double>> points;  // (step * 1000 + index, t_us)
};
std::vector<ClockOffset> align_clocks(const std::vector<SyncPoints>& ranks);

// Merges <attempt_dir>/trace/rank-*.json into `out`; nullopt when there are none. An error when
// a file is not a trace topolaunch-worker wrote.
Result<std::optional<MergedTrace>> merge_traces(const std::filesystem::path& attempt_dir,
                                                const std::filesystem::path& out);

}  // namespace topolaunch::launcher
