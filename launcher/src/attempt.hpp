// Private to the launcher: one attempt of this node's ranks, supervised by one thread in one
// poll() loop over a signalfd and the workers' pipes (see agent.hpp for what ends an attempt).
#pragma once

#include <signal.h>
#include <sys/signalfd.h>

#include <optional>

#include "job.hpp"
#include "process.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/launcher/report.hpp"

namespace topolaunch::launcher {

// Signals the agent handles: SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD.
sigset_t handled_signals();

// Blocks the handled signals for the agent's lifetime (threads started later inherit the mask)
// and restores the previous mask at the end.
class SignalScope {
 public:
  SignalScope() {
    sigset_t set = handled_signals();
    ::pthread_sigmask(SIG_BLOCK, &set, &previous_);
    fd_.reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
    ::signal(SIGPIPE, SIG_IGN);
  }
  ~SignalScope() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  int fd() const { return fd_.get(); }

 private:
  sigset_t previous_{};
  Fd fd_;
};

// Starts this node's ranks of job.map bound to their cores and NUMA memory, writes their output to
// <job_dir>/attempt-N/rank-R.log (and, merged, to the terminal), watches their heartbeats and
// memory, acts on the signals read from signal_fd (a SignalScope's), and stops every worker at
// the first failure. Sets root_cause to the attempt's first failure when it has none yet, and
// stop_signal to the signal that stopped it. An error only when it could not start (bad port...).
Result<AttemptReport> run_attempt(const Job& job, int attempt, int signal_fd,
                                  std::optional<RootCause>& root_cause, int& stop_signal);

}  // namespace topolaunch::launcher
