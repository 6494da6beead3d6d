// Hang detection: a rank's activity from /proc, and which rank a hang is blamed on.
#include "hang_watch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

namespace topolaunch::launcher {
namespace {

// /proc/<pid>/stat: "pid (comm) state ppid ... utime(14) stime(15) ..."; comm may hold spaces
// and parentheses, so the fields are counted from the last ')'.
bool read_stat_fields(const std::string& proc_root, pid_t pid, char& state, std::uint64_t& ticks) {
  std::ifstream in(fmt::format("{}/{}/stat", proc_root, pid));
  std::string text;
  if (!std::getline(in, text)) return false;
  const auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  std::uint64_t utime = 0, stime = 0;
  for (int index = 3; fields >> field; ++index) {
    if (index == 3) state = field.empty() ? '?' : field[0];
    if (index == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (index == 15) {
      stime = std::strtoull(field.c_str(), nullptr, 10);
      break;
    }
  }
  ticks = utime + stime;
  return true;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += fmt::format("{}{}", out.empty() ? "" : ", ", r);
  return out;
}

}  // namespace

RankActivity read_activity(pid_t worker, const std::vector<pid_t>& tree,
                           const std::string& proc_root) {
  RankActivity activity;
  for (pid_t pid : tree) {
    char state = '?';
    std::uint64_t ticks = 0;
    if (!read_stat_fields(proc_root, pid, state, ticks)) continue;
    activity.cpu_ticks += ticks;
    if (pid == worker) activity.state = state;
  }
  return activity;
}

std::optional<std::uint64_t> parse_counter(const std::string& text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  if (begin == end) return std::nullopt;
  std::uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text.data() + begin, text.data() + end, value);
  if (ec != std::errc() || ptr != text.data() + end) return std::nullopt;
  return value;
}

HangVerdict attribute_hang(const std::vector<RankProgress>& ranks, int fired, double silent_floor_s,
                           const std::string& silence) {
  constexpr double kSameMoment_s = 0.25;  // one or two samples of the watch apart
  std::vector<const RankProgress*> candidates;
  for (const RankProgress& r : ranks) {
    if (r.rank == fired || r.stopped || r.silent_s >= silent_floor_s) candidates.push_back(&r);
  }
  HangVerdict verdict;
  const RankProgress* chosen = nullptr;
  // 1. A stopped process cannot be waiting for anyone: the one stopped longest.
  for (const RankProgress* r : candidates) {
    if (r->stopped && (!chosen || r->stopped_for_s > chosen->stopped_for_s)) chosen = r;
  }
  if (chosen) {
    verdict.why = fmt::format(
        "stopped (state T: SIGSTOP, SIGTSTP or a debugger) for {:.1f}s, {} for {:.1f}s{}",
        chosen->stopped_for_s, silence, chosen->silent_s,
        chosen->counter ? fmt::format(", last counter {}", *chosen->counter) : std::string());
  }
  // 2. The lowest progress counter: the others got further and wait for it.
  if (!chosen) {
    for (const RankProgress* r : candidates) {
      if (!r->armed || !r->counter) continue;
      if (!chosen || *r->counter < *chosen->counter ||
          (*r->counter == *chosen->counter && r->silent_s > chosen->silent_s)) {
        chosen = r;
      }
    }
    if (chosen) {
      bool lowest_alone = true;
      for (const RankProgress* r : candidates) {
        if (r != chosen && r->armed && r->counter && *r->counter == *chosen->counter)
          lowest_alone = false;
      }
      verdict.why = fmt::format("{} heartbeat counter {}, {} for {:.1f}s",
                                lowest_alone && candidates.size() > 1 ? "lowest" : "last",
                                *chosen->counter, silence, chosen->silent_s);
    }
  }
  // 3. Without counters: the first to fall silent.
  if (!chosen) {
    for (const RankProgress* r : candidates) {
      if (!chosen || r->silent_s > chosen->silent_s) chosen = r;
    }
    if (!chosen) return verdict;
    verdict.why = fmt::format("{} for {:.1f}s", silence, chosen->silent_s);
  }
  verdict.rank = chosen->rank;
  for (const RankProgress* r : candidates) {
    if (r == chosen) continue;
    const bool same_counter = r->counter == chosen->counter;
    if (!chosen->stopped && !r->stopped && same_counter &&
        std::abs(r->silent_s - chosen->silent_s) <= kSameMoment_s) {
      verdict.tied.push_back(r->rank);
    } else {
      verdict.waiting.push_back(r->rank);
    }
  }
  if (!verdict.waiting.empty()) {
    verdict.why += fmt::format("; rank{} {} waited for it", verdict.waiting.size() == 1 ? "" : "s",
                               rank_list(verdict.waiting));
  }
  if (!verdict.tied.empty()) {
    verdict.why += fmt::format(
        "; rank{} {} fell silent at the same moment and counter (which of "
        "them the others wait for cannot be told)",
        verdict.tied.size() == 1 ? "" : "s", rank_list(verdict.tied));
  }
  return verdict;
}

}  // namespace topolaunch::launcher
