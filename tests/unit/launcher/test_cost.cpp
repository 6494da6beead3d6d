// Where a job's time, energy and money went: a rank's step-figures lines added up, and the job's
// cost attributed from its ranks and nodes (cost.hpp).
#include <cmath>

#include "catch.hpp"
#include "topolaunch/launcher/cost.hpp"
#include "topolaunch/launcher/report.hpp"

using namespace topolaunch;
using namespace topolaunch::launcher;

namespace {

constexpr const char* kPlanLine =
    R"({"plan":{"backend":"cuda","rank":0,"world_size":2,"tokens_per_step":16384,)"
    R"("flops_per_step":1.5e13,"grad_accum":1,"memory":{"parameters":248000000,)"
    R"("gradients":496000000,"optimizer_state":992000000,"activations":4000000000,)"
    R"("workspaces":100,"arena":6000000000},"allocated":{"arena":6000000000,)"
    R"("outside_arena":33554432,"device_used":7000000000,"device_total":150000000000,)"
    R"("device":"NVIDIA H200"},"comm":{"buckets":10,"bytes_per_step":496000000,)"
    R"("comm_ms":2.5,"exposed_ms":0.5}}})";

std::string interval(int step, int steps, double wall, double compute, double exposed, double data,
                     double ckpt, double idle, const char* loss = nullptr) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                R"({"step":%d,"steps":%d,"t_unix":1000.5,"wall_ms":%g,"tokens":%d,)"
                R"("compute_ms":%g,"comm_exposed_ms":%g,"data_ms":%g,"checkpoint_ms":%g,)"
                R"("idle_ms":%g,"trace_ms":0,"comm_busy_ms":%g,"comm_bytes":%d,"comm_calls":%d)",
                step, steps, wall, steps * 16384, compute, exposed, data, ckpt, idle, 4 * exposed,
                steps * 1000, steps * 10);
  std::string line = buf;
  if (loss) line += std::string(",\"loss\":") + loss;
  return line + "}";
}

}  // namespace

TEST_CASE("step figures: the plan line, then intervals added up; other lines change nothing") {
  StepFigures f;
  CHECK(add_step_figures_line(f, kPlanLine));
  CHECK(f.present);
  CHECK(f.backend == "cuda");
  CHECK(f.tokens_per_step == 16384);
  CHECK(f.planned_bytes.at("optimizer_state") == 992000000);
  CHECK(f.outside_arena_bytes == 33554432);
  CHECK(f.device == "NVIDIA H200");
  CHECK(f.plan_comm_bytes_per_step == 496000000);
  CHECK(add_step_figures_line(f, interval(10, 10, 1000, 800, 100, 5, 0, 95, "3.25")));
  CHECK(add_step_figures_line(f, interval(20, 10, 1100, 800, 100, 5, 150, 45)));
  CHECK_FALSE(add_step_figures_line(f, "not json"));
  CHECK_FALSE(add_step_figures_line(f, R"({"step":3})"));  // no wall_ms: not an interval
  CHECK(f.steps == 20);
  CHECK(f.last_step == 20);
  CHECK(f.tokens == 20 * 16384);
  CHECK(f.wall_ms == 2100);
  CHECK(f.compute_ms == 1600);
  CHECK(f.checkpoint_ms == 150);
  CHECK(f.comm_bytes == 20000);
  REQUIRE(f.last_loss);
  CHECK(*f.last_loss == 3.25);  // the last interval had no loss: the one before stays
  CHECK(f.last_wall_ms == 1100);
  CHECK(f.last_parts_ms[3] == 150);
}

TEST_CASE("cost: GPU-hours from the allocation, energy, tokens per joule, MFU, the price") {
  StepFigures a, b;
  for (StepFigures* f : {&a, &b}) {
    add_step_figures_line(*f, kPlanLine);
    add_step_figures_line(*f, interval(100, 100, 10000, 8000, 1000, 100, 0, 900));
  }
  const std::vector<RankStepFigures> ranks{{0, 0, &a}, {0, 1, &b}};
  NodeUsage node;
  node.node = "gpu1";
  node.gpus = 2;
  node.cores = 32;
  node.wall_s = 12;
  node.gpu_energy_j = {6000, 5000};
  node.cpu_energy_note = "CPU energy not measured: no RAPL here";
  jobspec::JobConfig config;
  config.cost.gpu_hour = 2.5;
  const CostReport c = attribute_cost(ranks, {node}, 3600, config);
  CHECK(c.gpus == 2);
  CHECK(c.cores == 32);
  CHECK(c.gpu_hours == 2.0);
  CHECK(c.core_hours == 32.0);
  REQUIRE(c.gpu_energy_j);
  CHECK(*c.gpu_energy_j == 11000);
  CHECK_FALSE(c.cpu_energy_j);
  REQUIRE(c.per_gpu.size() == 2);
  CHECK(c.per_gpu[1].joules == 5000);
  CHECK(c.notes.front() == "gpu1: CPU energy not measured: no RAPL here");
  CHECK(c.tokens == 2 * 100 * 16384);
  CHECK(c.tokens_per_s == Approx(2 * 100 * 16384 / 10.0));  // the slowest rank's 10 s
  REQUIRE(c.tokens_per_j);
  CHECK(*c.tokens_per_j == Approx(2 * 100 * 16384 / 11000.0));
  // 100 steps x 1.5e13 FLOPs per rank in 10 s against 989.4 TFLOP/s (the H200's data sheet)
  REQUIRE(c.mfu);
  CHECK(*c.mfu == Approx(100 * 1.5e13 / (10 * 989.4e12)));
  CHECK(c.peak_from == "NVIDIA H200 data sheet (dense bf16)");
  CHECK(c.step_wall_ms == 20000);
  CHECK(c.step_parts_ms.at("compute") == 16000);
  REQUIRE(c.cost);
  CHECK(*c.cost == Approx(5.0));  // 2 GPU-hours at 2.5
  REQUIRE(c.cost_per_million_tokens);
  CHECK(*c.cost_per_million_tokens == Approx(5.0 / (2 * 100 * 16384) * 1e6));
}

TEST_CASE("cost: the peak of [observe] wins; CPU ranks without one get no MFU, said why") {
  StepFigures f;
  add_step_figures_line(
      f, R"({"plan":{"backend":"cpu","tokens_per_step":16384,"flops_per_step":2e8}})");
  add_step_figures_line(f, interval(10, 10, 2000, 1500, 400, 1, 0, 99));
  jobspec::JobConfig config;
  CostReport none = attribute_cost({{0, 0, &f}}, {}, 3, config);
  CHECK_FALSE(none.mfu);
  CHECK_FALSE(none.cost);
  CHECK(none.notes.back() == "MFU: no peak known for CPU ranks (set observe.peak_tflops_per_rank)");
  config.observe.peak_tflops_per_rank = 0.01;
  config.cost.core_hour = 0.1;
  CostReport set = attribute_cost({{0, 0, &f}}, {}, 3, config);
  REQUIRE(set.mfu);
  CHECK(*set.mfu == Approx(10 * 2e8 / (2.0 * 1e10)));
  CHECK(set.peak_from == "observe.peak_tflops_per_rank");
  REQUIRE(set.cost);  // no core of an allocation measured here: a price of nothing
  CHECK(*set.cost == 0);
}

TEST_CASE("cost: attempts run one after another; the allocation is the largest of them") {
  NodeUsage a0{0, "n1", 4, 64, 10, {}, "", {}, "", {}, {}},
      a1{1, "n1", 4, 64, 10, {}, "", {}, "", {}, {}},
      b1{1, "n2", 4, 64, 10, {}, "", 120.0, "", {}, {}};
  const CostReport c = attribute_cost({}, {a0, a1, b1}, 7200, jobspec::JobConfig{});
  CHECK(c.gpus == 8);
  CHECK(c.gpu_hours == 16);
  REQUIRE(c.cpu_energy_j);
  CHECK(*c.cpu_energy_j == 120);
}

TEST_CASE("report.json: each rank's step figures, each node's usage and the cost round-trip") {
  JobReport r;
  r.run_id = "job-1";
  r.wall_s = 3600;
  AttemptReport a;
  RankOutcome o;
  o.rank = 0;
  add_step_figures_line(o.figures, kPlanLine);
  add_step_figures_line(o.figures, interval(10, 10, 1000, 800, 100, 5, 0, 95, "2.5"));
  a.ranks = {o};
  a.nodes = {NodeUsage{0,
                       "gpu1",
                       1,
                       8,
                       3600,
                       {3600.5},
                       "",
                       7.25,
                       "",
                       {{"main", 1700000000.25}, {"config", 1700000000.5}},
                       {{"main", 0.0}, {"config", 0.0125}}}};
  r.attempts = {a};
  jobspec::JobConfig config;
  config.cost.gpu_hour = 3;
  set_cost(r, config);
  const std::string json = to_json(r);
  CHECK(json.find("\"gpu_hours\": 1.0") != std::string::npos);
  CHECK(json.find("\"total\": 3.0") != std::string::npos);
  const auto back = report_from_json(json);
  REQUIRE(back);
  const StepFigures& f = back->attempts[0].ranks[0].figures;
  CHECK(f.present);
  CHECK(f.wall_ms == 1000);
  CHECK(f.compute_ms == 800);
  CHECK(f.planned_bytes.at("gradients") == 496000000);
  CHECK(f.device == "NVIDIA H200");
  REQUIRE(back->attempts[0].nodes.size() == 1);
  CHECK(back->attempts[0].nodes[0].gpu_energy_j == std::vector<double>{3600.5});
  REQUIRE(back->attempts[0].nodes[0].cpu_energy_j);
  CHECK(*back->attempts[0].nodes[0].cpu_energy_j == 7.25);
  // The agent's start marks keep their order (not an object's sorted keys).
  using Marks = std::vector<std::pair<std::string, double>>;
  CHECK(back->attempts[0].nodes[0].start_marks_unix_s ==
        Marks{{"main", 1700000000.25}, {"config", 1700000000.5}});
  CHECK(back->attempts[0].nodes[0].start_marks_cpu_s == Marks{{"main", 0.0}, {"config", 0.0125}});
  const std::string summary = summarize(r);
  CHECK(summary.find("cost: 1 GPU(s), 8 core(s) for 3600.0s = 1 GPU-hours, 8 core-hours; 3 at 3 "
                     "per GPU-hour") != std::string::npos);
  CHECK(summary.find("energy: GPUs 3600.5 J (NVML), CPU packages 7.2 J (RAPL)") !=
        std::string::npos);
  CHECK(summary.find("step time: compute 80.0%, comm_exposed 10.0%, data 0.5%, checkpoint 0.0%, "
                     "idle 9.5%, trace 0.0%, validation 0.0%") != std::string::npos);
}

TEST_CASE(
    "skipped optimizer steps: a rank's running count, the largest rank of each attempt, summed "
    "over "
    "attempts") {
  auto with_skipped = [](int step, int skipped) {
    std::string line = interval(step, 1, 100, 80, 0, 5, 0, 15);
    line.pop_back();
    return line + ",\"skipped_steps\":" + std::to_string(skipped) + "}";
  };
  StepFigures r0, r1, again;
  CHECK(add_step_figures_line(r0, interval(1, 1, 100, 80, 0, 5, 0, 15)));
  CHECK(r0.skipped_steps == 0);
  CHECK(add_step_figures_line(r0, with_skipped(2, 1)));
  CHECK(add_step_figures_line(r0, with_skipped(3, 2)));
  CHECK(add_step_figures_line(r0, interval(4, 1, 100, 80, 0, 5, 0, 15)));  // older worker: no key
  CHECK(r0.skipped_steps == 2);
  CHECK(add_step_figures_line(r1, with_skipped(3, 2)));
  CHECK(add_step_figures_line(again, with_skipped(9, 1)));
  const CostReport c =
      attribute_cost({{0, 0, &r0}, {0, 1, &r1}, {1, 0, &again}}, {}, 60, jobspec::JobConfig{});
  CHECK(c.skipped_steps == 3);  // attempt 0: 2 (both ranks skipped the same steps), attempt 1: 1
}
