// Running a parser of untrusted input where its defects cannot hurt: in a forked child with
// resource limits (and, when the caller is root, the input owner's identity). A parser that
// crashes, loops or eats memory takes down the child only; the caller gets one clean error line.
//
// Used as a crash probe: the child parses, the parent learns "it survived" (with the parser's own
// error message when the input was invalid) and then parses the same bytes itself. Parsing is a
// deterministic function of the bytes, so input that the child survived cannot crash the parent,
// and the parent keeps rich results (source positions, tables) without serialising them.
// Where the result has a serialised form anyway (a node's topology as JSON), the child returns
// it instead (run_isolated_output) and the parser runs once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "topolaunch/common/result.hpp"

namespace topolaunch {

struct IsolationLimits {
  std::chrono::milliseconds wall{10'000};           // the child is killed after this
  std::chrono::seconds cpu{5};                      // RLIMIT_CPU
  std::uint64_t extra_memory_bytes = 512ull << 20;  // address space beyond the parent's at fork
  // Switch the child to this identity first (only takes effect when the process may do so,
  // e.g. slurmstepd with the real uid 0): a parser exploit then runs as the input's owner.
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
};

// Runs `probe` in a forked child and returns what it returned. A child that dies of a signal,
// outlives `limits.wall` or cannot be started is an Error naming `what` (exit code 2 for a
// crash or a timeout: the input is what is refused; 1 when fork itself fails).
//
// The child calls only what `probe` calls: in a multi-threaded parent (slurmstepd), a probe may
// allocate (glibc's malloc is fork-safe) but must not take locks other threads could hold at the
// fork (stdio, iostreams, locale).
Status run_isolated(const std::function<Status()>& probe, const IsolationLimits& limits,
                    const std::string& what);

// As run_isolated, and the child's bytes come back: what `parse` returned, at most
// `max_output_bytes` (more is an Error naming `what`, exit code 2).
Result<std::string> run_isolated_output(const std::function<Result<std::string>()>& parse,
                                        const IsolationLimits& limits, const std::string& what,
                                        std::size_t max_output_bytes);

}  // namespace topolaunch
