// Private to the launcher: hang detection for any worker, and which rank a hang is blamed on.
//
// Two watches, both per rank and both off by default ([job] heartbeat_timeout and
// progress_timeout):
//   - the heartbeat (jobspec/worker_contract.hpp): armed from the start for topolaunch-worker,
//     which beats before its first step; for any other program only once it has beaten, so a
//     program that was never told to beat is never killed by it;
//   - the progress watch, which needs no cooperation: no CPU time (under 2% of a core) in the ranks' processes, no
//     output and no beat, in every rank of the node, for progress_timeout (a rank waiting for a
//     busy peer is not hung).
// When one fires, every rank of the node is weighed (attribute_hang): in a collective hang the
// rank that stopped is named, not the ranks waiting for it in the collective.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace topolaunch::launcher {

// What /proc says of a rank's processes.
struct RankActivity {
  std::uint64_t cpu_ticks = 0;  // utime + stime of the live processes of the tree
  char state = '?';             // of the worker process itself: R S D T t Z (or '?': gone)
};
RankActivity read_activity(pid_t worker, const std::vector<pid_t>& tree,
                           const std::string& proc_root = "/proc");

// The heartbeat counter as the worker wrote it ("117\n"); nullopt when it is not a number.
std::optional<std::uint64_t> parse_counter(const std::string& text);

// One rank as attribute_hang sees it.
struct RankProgress {
  int rank = -1;
  bool stopped = false;                  // state T or t: SIGSTOP, SIGTSTP, a debugger
  double stopped_for_s = 0;              // since the agent first saw it stopped
  bool armed = false;                    // its heartbeat watch is armed
  std::optional<std::uint64_t> counter;  // its last heartbeat counter
  double silent_s = 0;  // since its last beat (heartbeat watch) or activity (progress)
};

struct HangVerdict {
  int rank = -1;             // the rank named as hung
  std::string why;           // "stopped (state T: SIGSTOP or a debugger) for 5.0s", ...
  std::vector<int> waiting;  // the other silent ranks, taken to be waiting for it
  std::vector<int> tied;     // silent ranks that cannot be told apart from it
};

// `ranks`: every running rank of the node; `fired`: the rank whose watch fired (one of them);
// a rank silent for at least `silent_floor_s` is a candidate; `silence` says what silent means
// ("no heartbeat"). Rules, in order: a stopped rank (the one stopped longest); the lowest
// heartbeat counter among armed candidates; the candidate silent longest. Ranks within 0.25 s
// of the chosen one, at the same counter, are `tied`.
HangVerdict attribute_hang(const std::vector<RankProgress>& ranks, int fired, double silent_floor_s,
                           const std::string& silence);

}  // namespace topolaunch::launcher
