// The job report: what happened to every rank of every attempt, and the first failure named as
// the root cause (not a wall of echoes from the peers that were stopped because of it).
// Written as <job_dir>/report.json and summarised for people.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topolaunch/launcher/cost.hpp"

namespace topolaunch::launcher {

struct RankOutcome {
  int rank = -1;
  int local_rank = -1;
  int node = -1;
  std::string node_name;
  int pid = -1;
  int exit_code = -1;                // when it exited; -1 when killed by a signal or never started
  int signal = 0;                    // the signal that killed it, 0 = none
  std::uint64_t peak_rss_bytes = 0;  // the rank's process tree (see memory_watch.hpp)
  std::uint64_t peak_gpu_bytes = 0;  // NVML, the pids of that tree; 0 when not watched
  double wall_s = 0;
  std::string heartbeat;  // the last counter the worker wrote, "" = never beat
  std::string cause;      // why it ended when the agent ended it: "stopped", "hung", "memory"...
  // From its TORCHELASTIC_ERROR_FILE when it failed (torch's @record): the exception, one line,
  // and its traceback; "" when it wrote none.
  std::string error;
  std::string traceback;
  // What its TOPOLAUNCH_STEP_METRICS_FILE said (the built-in worker writes one; present = false
  // for a worker that wrote none).
  StepFigures figures;
};

struct AttemptReport {
  int attempt = 0;
  double started_s = 0;      // since the job started
  double all_started_s = 0;  // time until every worker of this attempt was running
  double wall_s = 0;
  std::string outcome;  // "succeeded", "failed", "stopped", "requeue"
  std::vector<RankOutcome> ranks;
  std::vector<NodeUsage> nodes;  // what each node's agent held and measured
};

struct RootCause {
  int attempt = -1;
  int rank = -1;  // -1 when no rank was running yet (preflight, wireup)
  std::string node;
  std::string what;   // one line: "exited with status 3", "killed by SIGKILL", ...
  std::string phase;  // "" = while workers ran; "preflight" = [rdma] preflight stopped the job
  // When the agent saw it (seconds since the epoch; 0 = unknown): orders the agents' first
  // failures across nodes, so that a consequence (a worker killed by the step's teardown on
  // another node) is not taken for the cause.
  double at_unix_s = 0;
};

// Of the agents' first failures, the index of the one seen first (by at_unix_s; a failure with a
// time wins over one without; ties and unknown times keep the list's order). causes not empty.
std::size_t earliest_root_cause(const std::vector<RootCause>& causes);

// The built-in worker's figures: the last logged step's loss from rank 0's train.metrics_file
// (JSON lines, when the job has one) and the validation losses of [train] val_every from
// <job_dir>/validation.jsonl (which the worker writes under topolaunch run).
struct TrainingFigures {
  std::string metrics_file;  // "" without one
  std::int64_t step = -1;    // the last logged step (-1: none)
  double loss = 0;
  std::vector<std::pair<std::int64_t, double>> val_losses;  // (step, loss) in file order
};
// nullopt when neither file holds a figure.
std::optional<TrainingFigures> read_training_figures(const std::string& metrics_file,
                                                     const std::string& validation_file);

struct JobReport {
  std::string job_name;
  std::string run_id;
  std::string job_dir;
  std::string status;  // "succeeded", "failed", "stopped", "requeue"
  int exit_code = 0;   // of `topolaunch run`
  double wall_s = 0;
  int restarts_used = 0;
  int max_restarts = 0;
  std::vector<AttemptReport> attempts;
  std::optional<RootCause> root_cause;  // the first failure of the job
  // How the agents exchanged their topologies: "pmix", "pmi2", "tcp", or "none" (one agent,
  // in-process). Workers always get the TCP store.
  std::string agent_wireup;
  std::string preflight;  // what the [rdma] preflight stage did, one line ("" = not reached)
  std::optional<TrainingFigures> training;  // with train.metrics_file
  std::optional<CostReport> cost;  // set_cost(): where the time, energy and money went
  std::string trace;               // the merged timeline of the traced steps, one line ("" = none)
};

// The job's cost from its attempts' ranks and nodes (cost.hpp), into report.cost.
void set_cost(JobReport& report, const jobspec::JobConfig& config);

// The root cause's rank, as its attempt reports it (its error and traceback); null when the
// root cause is no rank's or the attempt is not in the report.
const RankOutcome* root_cause_rank(const JobReport& report);

std::string to_json(const JobReport& report);
// Reads what to_json wrote (agents under Slurm write one per node; `run` merges them).
std::optional<JobReport> report_from_json(const std::string& text);
// A few aligned lines: status, root cause, one row per rank of the last attempt, and where the
// report and logs are; report_error: why report.json could not be written ("" = it was).
std::string summarize(const JobReport& report, std::string_view report_error = "");
std::string describe_wait_status(int exit_code, int signal);  // "exited 3", "killed by SIGKILL"

}  // namespace topolaunch::launcher
