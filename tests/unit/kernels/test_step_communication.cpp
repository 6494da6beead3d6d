// The GPU worker's pure parts, on hosts without a GPU: the device a rank takes
// (kernels/worker/cuda/cuda_device.hpp) and the step's communication against the budget
// (step_communication.hpp).
#include "catch.hpp"
#include "cuda_device.hpp"
#include "topolaunch/kernels/step_communication.hpp"

using namespace topolaunch::kernels;
using topolaunch::kernels::cuda::cuda_device_for_local_rank;

TEST_CASE(
    "cuda device of a rank: isolated by CUDA_VISIBLE_DEVICES (one visible GPU) -> 0; all "
    "GPUs visible -> the local rank's; none visible -> error") {
  // The launcher's isolation: every rank sees one GPU.
  CHECK(*cuda_device_for_local_rank(0, 1) == 0);
  CHECK(*cuda_device_for_local_rank(1, 1) == 0);
  CHECK(*cuda_device_for_local_rank(7, 1) == 0);
  // Started by hand on a node with 2 GPUs visible.
  CHECK(*cuda_device_for_local_rank(0, 2) == 0);
  CHECK(*cuda_device_for_local_rank(1, 2) == 1);
  // More ranks than GPUs share them round-robin.
  CHECK(*cuda_device_for_local_rank(5, 4) == 1);
  auto none = cuda_device_for_local_rank(0, 0);
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.error().message, Catch::Contains("no CUDA device"));
  auto negative = cuda_device_for_local_rank(-1, 2);
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.error().exit_code == 2);
}

TEST_CASE(
    "communication budget: ring bytes per micro-step and exposed ms, each warning names its "
    "budget key") {
  CHECK(ring_bytes_sent(1000, 1) == 0.0);
  CHECK(ring_bytes_sent(1000, 2) == 1000.0);
  CHECK(ring_bytes_sent(1000, 4) == 1500.0);

  CommStepFigures f;
  f.calls = 3;
  f.payload_bytes = 4000;  // 2 ranks: 4000 sent per rank per step
  f.busy_ms = 5;
  f.exposed_ms = 2;
  CommBudget b;
  b.bytes_per_micro_step = 3000;
  b.exposed_ms_per_micro_step = 1.5;
  auto over = check_comm_budget(f, 2, 1, 40, b);
  REQUIRE(over.bytes_over);
  CHECK_THAT(*over.bytes_over, Catch::Contains("budget.comm_per_step"));
  REQUIRE(over.exposed_over);
  CHECK_THAT(*over.exposed_over, Catch::Contains("budget.comm_exposed_per_step"));
  // The same step over 2 micro-steps is within both budgets (per micro-step on average).
  auto accum = check_comm_budget(f, 2, 2, 40, b);
  CHECK_FALSE(accum.bytes_over);
  CHECK_FALSE(accum.exposed_over);
  // No exposed budget: the planner's 5% of compute (2 ms of 38 ms is 5.3%: over; 1 ms is not).
  CommBudget unset;
  auto frac = check_comm_budget(f, 2, 1, 40, unset);
  CHECK_FALSE(frac.bytes_over);
  REQUIRE(frac.exposed_over);
  CHECK_THAT(*frac.exposed_over, Catch::Contains("budget.comm_exposed_per_step unset"));
  f.exposed_ms = 1;
  CHECK_FALSE(check_comm_budget(f, 2, 1, 40, unset).exposed_over);
}
