// Private to the launcher: one attempt of this node's ranks, supervised by one thread in one
// poll() loop over a signalfd and the workers' pipes (see agent.hpp for what ends an attempt).
#pragma once

#include <signal.h>
#include <sys/signalfd.h>

#include <memory>
#include <optional>
#include <string>

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

class AttemptRunner;

// run_attempt in two halves, for an agent that has more to do between them (job.start =
// "early": the agents' exchange and the check of the whole map while the workers run). The
// workers' output waits in their pipes, and signals in signal_fd, until supervise() reads them.
class StartedAttempt {
 public:
  // Starts this node's ranks of job.map (run_attempt's first half). `job` must outlive this;
  // its map may be replaced before supervise() by one that gives this node the same ranks.
  static Result<StartedAttempt> start(const Job& job, int attempt, int signal_fd);
  StartedAttempt(StartedAttempt&&) noexcept;
  StartedAttempt& operator=(StartedAttempt&&) noexcept;
  ~StartedAttempt();

  // Fails the attempt from outside its workers: `what` becomes its root cause (rank -1, this
  // node, `phase`), every worker gets SIGTERM, and SIGKILL after job.stop_grace; call supervise()
  // next, which reaps them.
  void fail(const std::string& what, const std::string& phase);
  // Supervises the workers to the attempt's end (run_attempt's second half). Once only.
  AttemptReport supervise(std::optional<RootCause>& root_cause, int& stop_signal);

 private:
  explicit StartedAttempt(std::unique_ptr<AttemptRunner> runner);
  std::unique_ptr<AttemptRunner> runner_;
};

}  // namespace topolaunch::launcher
