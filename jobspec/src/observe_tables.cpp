// [observe] and [cost]: the step timeline, the agents' metrics endpoint, the peak for the model
// FLOPs utilisation, and the prices of the job's cost.
#include <algorithm>
#include <limits>

#include "tables.hpp"

namespace topolaunch::jobspec::detail {
namespace {

// A trace holds every op of every traced step; beyond this many steps it is a log, not a timeline.
constexpr std::size_t kMaxTracedSteps = 1000;
constexpr double kMaxPrice = 1e6;

}  // namespace

void read_observe(Reader& r, const toml::table& t, ObserveSection& observe) {
  r.check_keys(t, "observe");
  if (const toml::node* steps = t.get("trace_steps"); steps != nullptr && !r.failed()) {
    if (!steps->is_array())
      return r.type_error(*steps, "observe.trace_steps", "an array of step numbers", "[10, 11]");
    for (const toml::node& step : *steps->as_array()) {
      if (!step.is_integer() || step.as_integer()->get() < 1)
        return r.fail(step.source(), "observe.trace_steps",
                      "expected optimizer step numbers, 1 or more (e.g. trace_steps = [10, 11])");
      const std::int64_t n = step.as_integer()->get();
      if (std::find(observe.trace_steps.begin(), observe.trace_steps.end(), n) !=
          observe.trace_steps.end())
        return r.fail(step.source(), "observe.trace_steps",
                      fmt::format("step {} is listed twice", n));
      observe.trace_steps.push_back(n);
    }
    if (observe.trace_steps.size() > kMaxTracedSteps)
      return r.fail(steps->source(), "observe.trace_steps",
                    fmt::format("{} steps; at most {} are traced (a timeline, not a log)",
                                observe.trace_steps.size(), kMaxTracedSteps));
    std::sort(observe.trace_steps.begin(), observe.trace_steps.end());
  }
  r.integer(t, "observe", "metrics_port", observe.metrics_port, 0, 65535);
  if (!r.failed() && observe.metrics_port != 0) {
    const toml::node* port = t.get("metrics_port");
    if (observe.metrics_port < 1024)
      return r.fail(port->source(), "observe.metrics_port",
                    fmt::format("{} is a privileged port (use 1024..65535, or 0 for off)",
                                observe.metrics_port));
    observe.metrics_port_at = r.where(port->source());
  }
  r.number(t, "observe", "peak_tflops_per_rank", observe.peak_tflops_per_rank, 0.0, 1e6);
}

void read_cost(Reader& r, const toml::table& t, CostSection& cost) {
  r.check_keys(t, "cost");
  for (auto [key, price] :
       {std::pair{"gpu_hour", &cost.gpu_hour}, {"core_hour", &cost.core_hour}}) {
    r.number(t, "cost", key, *price, -std::numeric_limits<double>::max(), kMaxPrice);
    if (!r.failed() && *price < 0)
      r.fail_at(t, "cost", key, fmt::format("{} is negative (a price is 0 or more)", *price));
  }
}

void check_observe(Reader& r, const toml::table* observe, const JobConfig& c) {
  if (r.failed() || observe == nullptr) return;
  const ObserveSection& o = c.observe;
  if (!o.trace_steps.empty()) {
    const toml::array& written = *observe->get("trace_steps")->as_array();
    if (!c.model)
      return r.fail(written.source(), "observe.trace_steps",
                    "traces the built-in worker's steps, and this job has no [model] (the "
                    "worker is " +
                        c.worker.command.front() + ")");
    for (const toml::node& step : written) {
      const std::int64_t n = step.as_integer()->get();
      if (n > c.train.steps)
        return r.fail(
            step.source(), "observe.trace_steps",
            fmt::format("step {} is beyond the run (train.steps = {})", n, c.train.steps));
    }
  }
  if (o.metrics_port != 0 && o.metrics_port == c.wireup.port)
    r.fail_at(*observe, "observe", "metrics_port",
              fmt::format("{} is wireup.port too (the TCP store listens there)", o.metrics_port));
}

}  // namespace topolaunch::jobspec::detail
