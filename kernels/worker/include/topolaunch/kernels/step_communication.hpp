// One optimizer step's measured gradient communication (an executor that measures it: the CUDA
// one, TrainingExecutor::step_communication) against the plan and the job's [budget]: pure
// functions, unit-tested on hosts without a GPU (tests/unit/kernels/test_step_communication.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace topolaunch::kernels {

// One optimizer step's gradient communication as measured with CUDA events.
struct CommStepFigures {
  std::size_t calls = 0;          // bucket all-reduces
  std::size_t payload_bytes = 0;  // sum of the buckets' sizes
  double busy_ms = 0;             // sum of the all-reduces' own stream times
  double exposed_ms = 0;          // communication still running after the backward's last bucket
};

// Bytes one rank sends in a ring all-reduce of `payload_bytes` over `world` ranks: 2(n-1)/n * S
// (the plan's CommPlan::bytes_per_step counts the same way).
inline double ring_bytes_sent(std::size_t payload_bytes, int world) {
  return world > 1 ? 2.0 * (world - 1) / world * static_cast<double>(payload_bytes) : 0.0;
}

struct CommBudget {
  std::uint64_t bytes_per_micro_step = 0;  // budget.comm_per_step (0: none)
  double exposed_ms_per_micro_step = 0;    // budget.comm_exposed_per_step (0: the fraction below)
  double max_exposed_fraction = 0.05;      // the planner's default: exposed / compute
};

struct CommBudgetCheck {
  std::optional<std::string> bytes_over;    // names budget.comm_per_step
  std::optional<std::string> exposed_over;  // names budget.comm_exposed_per_step
};

// Both budgets are per micro-step on average (as the planner reads them), so a step of
// `grad_accum` micro-steps is divided by it. Without budget.comm_exposed_per_step the exposed time
// is compared with the planner's default fraction of the step's compute (step_ms - exposed).
inline CommBudgetCheck check_comm_budget(const CommStepFigures& f, int world, int grad_accum,
                                         double step_ms, const CommBudget& budget) {
  CommBudgetCheck out;
  const double k = grad_accum > 0 ? grad_accum : 1;
  const double sent = ring_bytes_sent(f.payload_bytes, world) / k;
  char buf[320];
  if (budget.bytes_per_micro_step > 0 && sent > static_cast<double>(budget.bytes_per_micro_step)) {
    std::snprintf(buf, sizeof buf,
                  "communication over budget: %.0f bytes sent per rank per micro-step > "
                  "budget.comm_per_step = %llu",
                  sent, static_cast<unsigned long long>(budget.bytes_per_micro_step));
    out.bytes_over = buf;
  }
  const double exposed = f.exposed_ms / k;
  if (budget.exposed_ms_per_micro_step > 0) {
    if (exposed > budget.exposed_ms_per_micro_step) {
      std::snprintf(buf, sizeof buf,
                    "communication over budget: %.3f ms exposed per micro-step > "
                    "budget.comm_exposed_per_step = %.3f ms",
                    exposed, budget.exposed_ms_per_micro_step);
      out.exposed_over = buf;
    }
  } else {
    const double compute_ms = step_ms - f.exposed_ms;
    if (compute_ms > 0 && f.exposed_ms > budget.max_exposed_fraction * compute_ms) {
      std::snprintf(buf, sizeof buf,
                    "communication over budget: %.3f ms exposed is %.1f%% of %.3f ms compute per "
                    "step > the planner's %.0f%% (budget.comm_exposed_per_step unset)",
                    f.exposed_ms, 100.0 * f.exposed_ms / compute_ms, compute_ms,
                    100.0 * budget.max_exposed_fraction);
      out.exposed_over = buf;
    }
  }
  return out;
}

}  // namespace topolaunch::kernels
