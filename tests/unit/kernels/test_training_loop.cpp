// The one training loop (run_worker) over a scripted executor that behaves as the CUDA one does
// where the loop has hooks: its host runs ahead, it answers the stop flag one step late and it
// measures each step's communication. So the loop's handling of every hook runs on hosts without
// a GPU; the CPU executor's path is run end to end by tests/integration/kernels.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.hpp"
#include "catch.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/executor.hpp"
#include "topolaunch/kernels/worker.hpp"

using namespace topolaunch;
using namespace topolaunch::kernels;
using topolaunch::testing::read_file;
using topolaunch::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// What the scripted executor saw and what it is told to do; one per run_worker call.
struct Script {
  int rank = 0, world = 1;                                 // the scripted executor's place
  int raise_sigusr1_after_step = 0;                        // 0: never
  std::vector<std::vector<std::int32_t>> tokens, targets;  // each load_batch
  std::vector<std::int64_t> finished_steps;
  std::vector<std::string> sums;  // sum_over_ranks's `what`, in order
  int checkpoints_written = 0;
  std::vector<std::int64_t> nonfinite_steps;  // steps whose gradients the executor found not finite
  DType grad_dtype = DType::i32, activation_dtype = DType::i32;
};
Script g_script;

class ScriptedExecutor final : public TrainingExecutor {
 public:
  explicit ScriptedExecutor(const Plan& plan) : plan_(plan) {}
  const Plan& plan() const override { return plan_; }
  int rank() const override { return g_script.rank; }
  int world_size() const override { return g_script.world; }
  std::string banner(const RunShape& s) const override {
    return "scripted " + s.model_kind + " batch " + std::to_string(s.batch) + "\n";
  }
  std::string where_it_ran() const override { return " on 1 script(s)"; }
  Status init_parameters(std::uint64_t) override { return ok_status(); }
  void set_loss_scale(double) override {}
  Status load_batch(std::span<const std::int32_t> tokens,
                    std::span<const std::int32_t> targets) override {
    g_script.tokens.emplace_back(tokens.begin(), tokens.end());
    g_script.targets.emplace_back(targets.begin(), targets.end());
    return ok_status();
  }
  Status run_micro_step(int, int, const AdamWSettings&, std::int64_t) override {
    return ok_status();
  }
  Status finish_step(const AdamWSettings&, std::int64_t step) override {
    g_script.finished_steps.push_back(step);
    if (step == g_script.raise_sigusr1_after_step) std::raise(SIGUSR1);
    return ok_status();
  }
  Result<double> mean_loss() override { return 2.5; }
  Result<double> last_grad_norm() override { return 0.75; }
  Result<std::int64_t> skipped_steps() override {
    std::int64_t n = 0;
    for (auto s : g_script.nonfinite_steps)
      n += std::count(g_script.finished_steps.begin(), g_script.finished_steps.end(), s) > 0;
    return n;
  }
  Status sum_over_ranks(std::span<double>, const std::string& what) override {
    g_script.sums.push_back(what);
    return ok_status();
  }
  Status synchronize() override { return ok_status(); }
  ReadCheckpointTensor checkpoint_reader() override {
    ++g_script.checkpoints_written;  // rank 0 takes one reader per checkpoint
    return [](const CheckpointEntry&, std::span<float> out) {
      std::fill(out.begin(), out.end(), 0.5f);
      return ok_status();
    };
  }
  WriteCheckpointTensor checkpoint_writer() override {
    return [](const CheckpointEntry&, std::span<const float>) { return ok_status(); };
  }
  // The CUDA executor's hooks, scripted.
  bool runs_ahead() const override { return true; }
  void begin_step() override { ++steps_begun_; }
  Result<bool> stop_after(std::int64_t step, bool signalled) override {
    const bool previous = previous_flag_;  // one step late, as the CUDA executor with NCCL
    previous_flag_ = signalled;
    return step > first_step_seen() && previous;
  }
  Result<std::optional<CommStepFigures>> step_communication() override {
    CommStepFigures f;
    f.calls = 2;
    f.payload_bytes = 4'000'000;
    f.busy_ms = 1.5;
    f.exposed_ms = 0.25;
    return std::optional<CommStepFigures>(f);
  }

 private:
  std::int64_t first_step_seen() const {
    return g_script.finished_steps.empty() ? 0 : g_script.finished_steps.front();
  }
  const Plan& plan_;
  int steps_begun_ = 0;
  bool previous_flag_ = false;
};

Result<std::unique_ptr<TrainingExecutor>> scripted(const ExecutorSetup& setup) {
  const Graph& g = setup.plan.graph;
  g_script.grad_dtype = g[g[g.params.front()].grad].dtype;
  for (const auto& t : g.tensors)
    if (t.name == "h0.qkv") g_script.activation_dtype = t.dtype;
  return std::unique_ptr<TrainingExecutor>(std::make_unique<ScriptedExecutor>(setup.plan));
}

// 40 distinct characters in a row, again and again: the token at data position p is p % 40, so a
// batch's tokens say where in the data it was read.
std::string alphabet_text() {
  std::string s;
  for (int round = 0; round < 13; ++round)
    for (char c = '!'; c < '!' + 40; ++c) s += c;
  return s;
}

fs::path write_job(const TempDir& d, const std::string& train_extra,
                   const std::string& budget = "") {
  d.write("text.txt", alphabet_text());
  return d.write("job.toml",
                 "[model]\nn_layer = 1\nn_embd = 16\nn_head = 2\nblock_size = 8\n"
                 "[data]\npath = \"" +
                     (d.path / "text.txt").string() +
                     "\"\n[train]\nbatch = 2\nseq_len = 8\nlog_every = 2\ngrad_accum = 1\n"
                     "checkpoint_dir = \"" +
                     (d.path / "ckpt").string() + "\"\n" + train_extra + budget);
}

}  // namespace

TEST_CASE(
    "training loop over an executor with the GPU's hooks: comm line and budget warning once per "
    "key, comm fields in the metrics, throughput, where it ran") {
  g_script = Script{};
  TempDir d;
  const fs::path metrics = d.path / "metrics.jsonl";
  auto job =
      write_job(d, "steps = 5\nresume = false\nmetrics_file = \"" + metrics.string() + "\"\n",
                "[budget]\ncomm_exposed_per_step = \"100us\"\n");
  WorkerOptions o;
  o.config_path = job.string();
  o.fp32_executor = &scripted;
  std::ostringstream out, err;
  REQUIRE(run_worker(o, out, err) == 0);
  const std::string log = out.str();
  INFO(log << err.str());
  CHECK_THAT(log, Catch::Contains("scripted gpt2 batch 2\n"));
  // printed: steps 1, 2, 4 and 5 (log_every = 2, the first and the last)
  CHECK(count(log, "\nstep ") == 4);
  CHECK(count(log, "\ncomm ") == 4);
  CHECK_THAT(log, Catch::Contains("comm      2/5 | all-reduce 4.0 MB in 2 buckets"));
  CHECK_THAT(log, Catch::Contains("| loss 2.500000 |"));
  // judged from the second step on, said once
  CHECK(count(log, "warning: step 2: communication over budget: 0.250 ms exposed") == 1);
  CHECK(count(log, "budget.comm_exposed_per_step") == 1);
  CHECK_THAT(log, Catch::Contains("throughput: "));
  CHECK_THAT(log, Catch::Contains("done: 5 steps on 1 script(s); checkpoint "));
  // a metrics line per step (each step is logged when there is a metrics file), with comm fields
  const std::string m = read_file(metrics);
  CHECK(count(m, "\n") == 5);
  CHECK(count(m, "\"comm_bytes\":4000000,\"comm_sent_bytes\":0,") == 5);
  // the loss sum on each logged step, the checkpoint barrier once at the end
  std::size_t loss_sums = 0, barriers = 0;
  for (const auto& s : g_script.sums) {
    loss_sums += s == "loss all-reduce";
    barriers += s == "checkpoint barrier";
  }
  CHECK(loss_sums == 5);
  CHECK(barriers == 1);
  CHECK(g_script.checkpoints_written == 1);
  // rank 0 of 1 reads consecutive windows of batch x seq_len tokens, targets one ahead
  REQUIRE(g_script.tokens.size() == 5);
  CHECK(g_script.tokens[0].size() == 16);
  CHECK(g_script.tokens[1][0] == g_script.tokens[0][15] + 1);
  CHECK(g_script.targets[0][0] == g_script.tokens[0][1]);
}

TEST_CASE(
    "training loop: a stop flag answered one step late stops after the next step, checkpointed "
    "(exit 75); the resumed run continues with the next step and the next batch") {
  g_script = Script{};
  g_script.raise_sigusr1_after_step = 3;
  TempDir d;
  auto job = write_job(d, "steps = 8\nresume = true\n");
  WorkerOptions o;
  o.config_path = job.string();
  o.fp32_executor = &scripted;
  std::ostringstream out, err;
  REQUIRE(run_worker(o, out, err) == 75);
  INFO(out.str() << err.str());
  CHECK_THAT(out.str(), Catch::Contains("stopped by SIGUSR1 after step 4; checkpoint "));
  CHECK(g_script.finished_steps == std::vector<std::int64_t>{1, 2, 3, 4});
  CHECK(g_script.checkpoints_written == 1);
  REQUIRE(fs::exists(d.path / "ckpt" / "checkpoint-000000000004.bin"));
  std::vector<std::int32_t> fifth_batch(16);  // data position 4 x 16 = 64
  for (std::size_t i = 0; i < fifth_batch.size(); ++i)
    fifth_batch[i] = static_cast<std::int32_t>((64 + i) % 40);

  g_script = Script{};  // no signal this time
  std::ostringstream out2, err2;
  REQUIRE(run_worker(o, out2, err2) == 0);
  INFO(out2.str() << err2.str());
  CHECK_THAT(out2.str(), Catch::Contains("at step 4\n"));
  CHECK(g_script.finished_steps == std::vector<std::int64_t>{5, 6, 7, 8});
  REQUIRE_FALSE(g_script.tokens.empty());
  CHECK(g_script.tokens[0] == fifth_batch);
  CHECK_THAT(out2.str(), Catch::Contains("done: 8 steps on 1 script(s)"));
}

TEST_CASE(
    "training loop, rank 1 of 2: reads the second slice of each window, writes no checkpoint, says "
    "only that it stopped") {
  g_script = Script{};
  g_script.rank = 1;
  g_script.world = 2;
  g_script.raise_sigusr1_after_step = 1;
  TempDir d;
  auto job = write_job(d, "steps = 8\nresume = false\n");
  WorkerOptions o;
  o.config_path = job.string();
  o.fp32_executor = &scripted;
  std::ostringstream out, err;
  REQUIRE(run_worker(o, out, err) == 75);
  INFO(out.str() << err.str());
  CHECK(out.str() == "rank 1 stopped after step 2 (rank 0 wrote " +
                         (d.path / "ckpt" / "checkpoint-000000000002.bin").string() + ")\n");
  CHECK(g_script.checkpoints_written == 0);
  REQUIRE(g_script.tokens.size() == 2);
  CHECK(g_script.tokens[0][0] == 16);       // window 0..31: rank 1 reads 16..31
  CHECK(g_script.tokens[1][0] == 48 % 40);  // window 32..63: rank 1 reads 48..63
}

TEST_CASE("worker: train.precision bf16 needs the CUDA backend; with one it gets the bf16 plan") {
  g_script = Script{};
  TempDir d;
  auto job = write_job(d, "steps = 1\nresume = false\nprecision = \"bf16\"\n");
  WorkerOptions o;
  o.config_path = job.string();
  std::ostringstream out, err;
  CHECK(run_worker(o, out, err) == 2);
  CHECK_THAT(err.str(), Catch::Contains("train.precision: \"bf16\" needs the CUDA backend"));
  CHECK_THAT(err.str(), Catch::Contains("-Dcuda=enabled"));
  o.bf16_executor = &scripted;
  std::ostringstream out2, err2;
  CHECK(run_worker(o, out2, err2) == 0);
  CHECK(g_script.finished_steps == std::vector<std::int64_t>{1});
  CHECK(g_script.grad_dtype == DType::f32);         // fp32 parameter gradients
  CHECK(g_script.activation_dtype == DType::bf16);  // bf16 activations
}

TEST_CASE("worker: train.precision fp8 needs the CUDA backend too, and runs the bf16 plan") {
  g_script = Script{};
  TempDir d;
  auto job = write_job(d, "steps = 1\nresume = false\nprecision = \"fp8\"\n");
  WorkerOptions o;
  o.config_path = job.string();
  o.fp32_executor = &scripted;  // a CPU executor is no substitute
  std::ostringstream out, err;
  CHECK(run_worker(o, out, err) == 2);
  CHECK_THAT(err.str(), Catch::Contains("train.precision: \"fp8\" needs the CUDA backend"));
  o.bf16_executor = &scripted;
  std::ostringstream out2, err2;
  CHECK(run_worker(o, out2, err2) == 0);
  CHECK(g_script.finished_steps == std::vector<std::int64_t>{1});
  CHECK(g_script.grad_dtype == DType::f32);
  CHECK(g_script.activation_dtype == DType::bf16);  // the GEMMs' casts are the executor's
}

TEST_CASE(
    "training loop, [observe]: only the traced steps are traced, each followed by clock-sync sums; "
    "the step figures cover every step once") {
  g_script = Script{};
  g_script.world = 2;
  TempDir d;
  auto job = write_job(d, "steps = 6\nresume = false\n", "[observe]\ntrace_steps = [3, 4]\n");
  const fs::path trace = d.path / "trace.json", figures = d.path / "figures.jsonl";
  ::setenv("TOPOLAUNCH_TRACE_FILE", trace.c_str(), 1);
  ::setenv("TOPOLAUNCH_STEP_METRICS_FILE", figures.c_str(), 1);
  ::setenv("GROUP_WORLD_SIZE", "2", 1);  // two nodes: three clock syncs a traced step
  WorkerOptions o;
  o.config_path = job.string();
  o.fp32_executor = &scripted;
  std::ostringstream out, err;
  const int rc = run_worker(o, out, err);
  ::unsetenv("TOPOLAUNCH_TRACE_FILE");
  ::unsetenv("TOPOLAUNCH_STEP_METRICS_FILE");
  ::unsetenv("GROUP_WORLD_SIZE");
  REQUIRE(rc == 0);
  INFO(out.str() << err.str());
  // three clock-sync sums after each traced step (one on a single node), none elsewhere
  std::vector<std::string> around;
  for (std::size_t i = 0; i < g_script.sums.size(); ++i)
    if (g_script.sums[i] == "trace clock sync") around.push_back(g_script.sums[i]);
  CHECK(around.size() == 6);
  CHECK_THAT(out.str(), Catch::Contains("trace: rank 0 wrote "));
  const std::string t = read_file(trace);
  CHECK(count(t, "\"name\":\"step 3\"") == 1);
  CHECK(count(t, "\"name\":\"step 4\"") == 1);
  CHECK(count(t, "\"args\":{\"step\":3") > 2);  // its data, waits, the step itself
  for (int untraced : {1, 2, 5, 6})
    CHECK(count(t, "\"args\":{\"step\":" + std::to_string(untraced) + "}") == 0);
  CHECK_THAT(t, Catch::Contains("\"thread_name\",\"args\":{\"name\":\"compute stream"));
  CHECK(count(t, "\"index\":") == 6);  // the sync points
  // the plan line, one line per logged step (1, 2, 4, 6), the last (the final checkpoint)
  const std::string f = read_file(figures);
  CHECK(f.rfind("{\"plan\":{\"backend\":\"cpu\",\"rank\":0,\"world_size\":2,", 0) == 0);
  CHECK(count(f, "\n") == 6);
  std::int64_t steps = 0;
  for (std::size_t at = f.find("\"steps\":"); at != std::string::npos;
       at = f.find("\"steps\":", at + 1))
    steps += std::stoll(f.substr(at + 8));
  CHECK(steps == 6);
  CHECK(count(f, "\"loss\":1.25") == 4);  // the scripted sum leaves each rank's half
}

TEST_CASE(
    "training loop: optimizer steps skipped for non-finite gradients get a warning on the next "
    "logged step and a closing line") {
  for (const bool every_step : {false, true}) {
    g_script = Script{};
    g_script.nonfinite_steps = {3, 5, 6};
    TempDir d;
    const std::string metrics = (d.path / "metrics.jsonl").string();
    auto job = write_job(d, "steps = 8\nresume = false\n" +
                                (every_step ? "metrics_file = \"" + metrics + "\"\n" : ""));
    WorkerOptions o;
    o.config_path = job.string();
    o.fp32_executor = &scripted;
    std::ostringstream out, err;
    REQUIRE(run_worker(o, out, err) == 0);
    const std::string log = out.str();
    INFO(log << err.str());
    if (every_step) {  // every step is logged: one line per skipped step
      CHECK(count(log,
                  "warning: step 3: gradients not finite (global norm 0.75): the optimizer "
                  "step is skipped (1 skipped in all)") == 1);
      CHECK(count(log, "warning: step 5: gradients not finite") == 1);
      CHECK(count(log,
                  "warning: step 6: gradients not finite (global norm 0.75): the optimizer "
                  "step is skipped (3 skipped in all)") == 1);
      CHECK(count(log, "warning: ") == 3);
    } else {  // logged steps 1, 2, 4, 6, 8: the skips between them, counted
      CHECK(count(log,
                  "warning: steps 3..4: 1 with gradients not finite: their optimizer steps "
                  "are skipped (1 skipped in all)") == 1);
      CHECK(count(log,
                  "warning: steps 5..6: 2 with gradients not finite: their optimizer steps "
                  "are skipped (3 skipped in all)") == 1);
      CHECK(count(log, "warning: ") == 2);
    }
    CHECK_THAT(log, Catch::Contains("skipped: 3 optimizer step(s) with gradients not finite"));
  }
}

TEST_CASE(
    "training loop on the CPU executor: TOPOLAUNCH_FAULT_NONFINITE_STEP poisons one step, which is "
    "skipped and said; the steps after it train") {
  g_script = Script{};
  TempDir d;
  const std::string metrics = (d.path / "metrics.jsonl").string();
  auto job = write_job(d, "steps = 4\nresume = false\nmetrics_file = \"" + metrics + "\"\n");
  WorkerOptions o;
  o.config_path = job.string();  // the real CPU executor
  ::setenv("TOPOLAUNCH_FAULT_NONFINITE_STEP", "2", 1);
  std::ostringstream out, err;
  const int rc = run_worker(o, out, err);
  ::unsetenv("TOPOLAUNCH_FAULT_NONFINITE_STEP");
  const std::string log = out.str();
  INFO(log << err.str());
  REQUIRE(rc == 0);
  CHECK(count(log,
              "warning: step 2: gradients not finite (global norm nan): the optimizer step "
              "is skipped (1 skipped in all)") == 1);
  CHECK(count(log, "warning: ") == 1);
  CHECK_THAT(log, Catch::Contains("skipped: 1 optimizer step(s) with gradients not finite"));
  // the metrics: every loss finite (the poison is in the gradients), step 2's norm not
  const std::string m = read_file(metrics);
  CHECK(count(m, "\"loss\":") == 4);
  CHECK(count(m, "nan,\"grad_norm\"") == 0);
  CHECK(count(m, "\"grad_norm\":nan") + count(m, "\"grad_norm\":-nan") == 1);
  // a bad value is refused, naming the variable
  ::setenv("TOPOLAUNCH_FAULT_NONFINITE_STEP", "two", 1);
  std::ostringstream out2, err2;
  CHECK(run_worker(o, out2, err2) == 2);
  ::unsetenv("TOPOLAUNCH_FAULT_NONFINITE_STEP");
  CHECK_THAT(err2.str(), Catch::Contains("TOPOLAUNCH_FAULT_NONFINITE_STEP=two"));
}
