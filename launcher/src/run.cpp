// `topolaunch run`: inside a multi-node allocation, the Slurm step (slurm_step.hpp); otherwise
// one agent in this process, attempt after attempt up to [job].restarts; see agent.hpp.
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "attempt.hpp"
#include "job.hpp"
#include "report_merge.hpp"
#include "slurm_step.hpp"
#include "topolaunch/launcher/agent.hpp"
#include "topolaunch/launcher/agent_wireup.hpp"
#include "topolaunch/launcher/report.hpp"
#include "topolaunch/wireup/kv_store.hpp"

namespace topolaunch::launcher {

int run_job(const RunOptions& options) {
  SignalScope signals;
  // Orphaned grandchildren of workers come to us, so they can be reaped and never linger.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const int allocation_nodes = env_int("SLURM_JOB_NUM_NODES", env_int("SLURM_NNODES", 1));
  if (!options.local && std::getenv("SLURM_JOB_ID") != nullptr && allocation_nodes > 1) {
    auto job = prepare_job(options, "");
    if (!job) {
      std::fprintf(stderr, "topolaunch: %s\n", job.error().message.c_str());
      return job.error().exit_code;
    }
    int nodes = job->config.job.nodes > 0 ? job->config.job.nodes : allocation_nodes;
    if (nodes > allocation_nodes) {
      std::fprintf(stderr, "topolaunch: job.nodes: %d nodes asked, the allocation has %d\n", nodes,
                   allocation_nodes);
      return 2;
    }
    return run_slurm(*job, nodes, signals.fd());
  }
  auto prepared = prepare(options);
  if (!prepared) {
    std::fprintf(stderr, "topolaunch: %s\n", prepared.error().message.c_str());
    return prepared.error().exit_code;
  }
  Job& job = *prepared;
  for (const std::string& warning : job.map.warnings) {
    std::fprintf(stderr, "topolaunch: warning: %s\n", warning.c_str());
  }
  // One agent, in-process: no agent exchange. A PMIx/PMI2 request still has to be satisfiable.
  if (job.config.wireup.backend == WireupBackend::pmix ||
      job.config.wireup.backend == WireupBackend::pmi2) {
    auto backend = agent_backend(job.config.wireup.backend, wireup::current_environment(),
                                 wireup::compiled_backends());
    if (!backend) {
      std::fprintf(stderr, "topolaunch: %s; on one node use \"auto\" or \"tcp\"\n",
                   backend.error().message.c_str());
      return 2;
    }
  }

  JobReport report;
  report.job_name = job.config.job.name;
  report.run_id = job.run_id;
  report.job_dir = job.job_dir.string();
  report.max_restarts = job.config.job.restarts;
  report.agent_wireup = "none";
  int exit_code = 0;
  const PreflightStageOutcome preflight = preflight_stage(job, nullptr);
  report.preflight = preflight.line;
  if (!preflight.ok) {
    report.status = "failed";
    report.exit_code = preflight.exit_code;
    report.root_cause = preflight_root_cause(job, 0, preflight);
    report.wall_s = seconds_between(job.job_start, Clock::now());
    (void)write_file(job.job_dir / "report.json", to_json(report));
    if (preflight.exit_code != 2) std::fputs(summarize(report).c_str(), stderr);
    return preflight.exit_code;
  }
  open_gpu_watch(job);
  for (int attempt = 0;; ++attempt) {
    int stop_signal = 0;
    auto result = run_attempt(job, attempt, signals.fd(), report.root_cause, stop_signal);
    if (!result) {
      std::fprintf(stderr, "topolaunch: %s\n", result.error().message.c_str());
      if (attempt == 0) return result.error().exit_code;
      report.status = "failed";
      exit_code = 1;
      break;
    }
    report.attempts.push_back(*result);
    report.restarts_used = attempt;
    const std::string& outcome = result->outcome;
    if (outcome == "failed" && attempt < job.config.job.restarts) {
      std::fprintf(stderr, "topolaunch: attempt %d failed (%s); restarting (%d of %d)\n", attempt,
                   report.root_cause ? report.root_cause->what.c_str() : "?", attempt + 1,
                   job.config.job.restarts);
      continue;
    }
    report.status = outcome;
    exit_code = exit_code_of(outcome, stop_signal);
    break;
  }
  report.exit_code = exit_code;
  report.wall_s = seconds_between(job.job_start, Clock::now());
  if (auto s = write_file(job.job_dir / "report.json", to_json(report)); !s) {
    std::fprintf(stderr, "topolaunch: %s\n", s.error().message.c_str());
  }
  if (options.print_json) {
    std::fputs(to_json(report).c_str(), stdout);
  } else if (!options.quiet || exit_code != 0) {
    std::fputs(summarize(report).c_str(), stderr);
  }
  return exit_code;
}

}  // namespace topolaunch::launcher
