// [observe] and [cost]: read by the one job-file reader, so `topolaunch check` refuses a traced
// step beyond the run, a privileged or shared metrics port and a negative price before anything
// starts, each as one line naming file:line:col and the key.
#include <string>

#include "catch.hpp"
#include "topolaunch/jobspec/job_config.hpp"

using namespace topolaunch::jobspec;

namespace {

const std::string kModel = "[model]\nn_layer = 1\n[train]\nsteps = 50\n";

std::string error_of(const std::string& toml) {
  auto r = parse_job_config(toml, "job.toml");
  if (r.ok()) return "(parsed fine)";
  CHECK(r.error().exit_code == 2);
  CHECK(r.error().message.find('\n') == std::string::npos);
  return r.error().message;
}

}  // namespace

TEST_CASE("[observe] and [cost]: every key is read") {
  auto r = parse_job_config(kModel +
                                "[observe]\ntrace_steps = [12, 3]\nmetrics_port = 9400\n"
                                "peak_tflops_per_rank = 12.5\n[cost]\ngpu_hour = 2.5\n"
                                "core_hour = 0.04\n",
                            "job.toml");
  REQUIRE(r.ok());
  CHECK(r->observe.trace_steps == std::vector<std::int64_t>{3, 12});  // sorted
  CHECK(r->observe.metrics_port == 9400);
  CHECK(r->observe.metrics_port_at == "job.toml:7:16");
  CHECK(r->observe.peak_tflops_per_rank == 12.5);
  CHECK(r->cost.gpu_hour == 2.5);
  CHECK(r->cost.core_hour == 0.04);
  CHECK(describe(*r).find("observe    trace steps 3,12, metrics port 9400") != std::string::npos);
  auto none = parse_job_config(kModel, "job.toml");
  REQUIRE(none.ok());
  CHECK(none->observe.trace_steps.empty());
  CHECK(none->observe.metrics_port == 0);
  CHECK(none->cost.gpu_hour == 0);
}

TEST_CASE("[observe] [cost]: the issue's bad input, one line each naming file:line:col and key") {
  CHECK(error_of(kModel + "[observe]\ntrace_steps = [10, 60]\n") ==
        "job.toml:6:20: observe.trace_steps: step 60 is beyond the run (train.steps = 50)");
  CHECK(error_of(kModel + "[cost]\ngpu_hour = -2.5\n") ==
        "job.toml:6:12: cost.gpu_hour: -2.5 is negative (a price is 0 or more)");
  CHECK(error_of(kModel + "[observe]\nmetrics_port = 80\n") ==
        "job.toml:6:16: observe.metrics_port: 80 is a privileged port (use 1024..65535, or 0 for "
        "off)");
  CHECK(error_of(kModel + "[wireup]\nport = 9400\n[observe]\nmetrics_port = 9400\n") ==
        "job.toml:8:16: observe.metrics_port: 9400 is wireup.port too (the TCP store listens "
        "there)");
  CHECK(error_of(kModel + "[observe]\ntrace_steps = [0]\n") ==
        "job.toml:6:16: observe.trace_steps: expected optimizer step numbers, 1 or more (e.g. "
        "trace_steps = [10, 11])");
  CHECK(error_of(kModel + "[observe]\ntrace_steps = [4, 4]\n") ==
        "job.toml:6:19: observe.trace_steps: step 4 is listed twice");
  CHECK(error_of(kModel + "[observe]\ntrace_steps = 4\n") ==
        "job.toml:6:15: observe.trace_steps: expected an array of step numbers, got an integer "
        "(e.g. trace_steps = [10, 11])");
  CHECK(error_of("[worker]\ncommand = \"python\"\n[observe]\ntrace_steps = [1]\n") ==
        "job.toml:4:15: observe.trace_steps: traces the built-in worker's steps, and this job has "
        "no [model] (the worker is python)");
  CHECK(error_of(kModel + "[observe]\ntrace_step = [1]\n") ==
        "job.toml:6:1: observe.trace_step: unknown key (did you mean \"trace_steps\"?)");
  CHECK(error_of(kModel + "[cost]\ngpu_hours = 1\n") ==
        "job.toml:6:1: cost.gpu_hours: unknown key (did you mean \"gpu_hour\"?)");
  CHECK(error_of("[costs]\ngpu_hour = 1\n") ==
        "job.toml:1:2: costs: unknown table (did you mean \"cost\"?)");
}

TEST_CASE("[observe]: --set overrides are checked like the file") {
  auto r = parse_job_config(kModel, "job.toml", {"observe.trace_steps=[7, 8]"});
  REQUIRE(r.ok());
  CHECK(r->observe.trace_steps == std::vector<std::int64_t>{7, 8});
  auto beyond = parse_job_config(kModel, "job.toml", {"observe.trace_steps=[51]"});
  REQUIRE_FALSE(beyond.ok());
  CHECK(beyond.error().message ==
        "--set observe.trace_steps=[51]: observe.trace_steps: step 51 is beyond the run "
        "(train.steps = 50)");
}
