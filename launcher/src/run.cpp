// `topolaunch run`: inside a multi-node allocation, the Slurm step (slurm_step.hpp); otherwise
// one agent in this process, attempt after attempt up to [job].restarts; see agent.hpp.
#include <sys/prctl.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "attempt.hpp"
#include "job.hpp"
#include "report_merge.hpp"
#include "slurm_step.hpp"
#include "topolaunch/jobspec/worker_contract.hpp"
#include "topolaunch/launcher/agent.hpp"
#include "topolaunch/launcher/agent_wireup.hpp"
#include "topolaunch/launcher/report.hpp"
#include "topolaunch/wireup/kv_store.hpp"
#include "trace_merge.hpp"

namespace topolaunch::launcher {

void finish_observation(const Job& job, JobReport& report) {
  set_cost(report, job.config);
  if (report.attempts.empty()) return;
  const int last = report.attempts.back().attempt;
  auto merged =
      merge_traces(job.job_dir / fmt::format("attempt-{}", last), job.job_dir / "trace.json");
  if (!merged) {
    report.trace = "trace: " + merged.error().message;
  } else if (*merged) {
    report.trace = (*merged)->line;
  }
}

int run_job(const RunOptions& options) {
  SignalScope signals;
  // Orphaned grandchildren of workers come to us, so they can be reaped and never linger.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const auto allocation = env_count("SLURM_JOB_NUM_NODES", "SLURM_NNODES");
  if (!allocation) {
    std::fprintf(stderr, "topolaunch: %s\n", allocation.error().message.c_str());
    return allocation.error().exit_code;
  }
  const int allocation_nodes = *allocation;
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
  contain(job, "topolaunch");
  for (const std::string& warning : job.map.warnings) {
    std::fprintf(stderr, "topolaunch: warning: %s\n", warning.c_str());
  }
  // One agent, in-process: no agent exchange. A PMIx/PMI2 request still has to be satisfiable.
  if (job.config.wireup.backend == jobspec::WireupBackend::pmix ||
      job.config.wireup.backend == jobspec::WireupBackend::pmi2) {
    auto backend = agent_backend(job.config.wireup.backend, current_environment(),
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
    publish_report(job, report, preflight.exit_code != 2);
    return preflight.exit_code;
  }
  if (auto s = start_metrics_server(job); !s) {
    std::fprintf(stderr, "topolaunch: %s\n", s.error().message.c_str());
    return s.error().exit_code;
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
    // An MPI program without an MPI launcher fails the same way every time: bad input.
    if (outcome == "failed" && report.root_cause &&
        report.root_cause->phase == kMpiWithoutLauncherPhase) {
      report.status = outcome;
      exit_code = jobspec::exit_status::kBadInput;
      break;
    }
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
  report.training = read_training_figures(job.config.train.metrics_file,
                                          (job.job_dir / "validation.jsonl").string());
  finish_observation(job, report);
  publish_report(job, report, !options.quiet || exit_code != 0);
  return exit_code;
}

}  // namespace topolaunch::launcher
