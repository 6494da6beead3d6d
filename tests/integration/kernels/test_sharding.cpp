// Sharded data parallelism ([train] shard) as real worker processes over the TCP ring: every
// mode trains bit-identically to unsharded data parallelism at 2 and 4 ranks (losses, and the
// checkpoint files byte for byte); with grad_accum 2 the modes that reduce-scatter every
// micro-step differ by a bounded reordering; each mode's planned per-rank memory against the
// peak resident set it measured; a sharded checkpoint resumed on other rank counts re-shards.
#include <cmath>
#include <string>
#include <vector>

#include "catch.hpp"
#include "worker_process.hpp"

using namespace worker_process;

namespace {

const std::vector<std::string> kModes = {"none", "optimizer", "gradients", "parameters"};

// Under AddressSanitizer the resident set measures the sanitizer as well: each 8 bytes of
// application memory have one byte of shadow memory, and freed blocks stay resident in its
// quarantine. The memory case turns the quarantine off in its workers and counts the shadow.
#if defined(__SANITIZE_ADDRESS__)
constexpr double kResidentPerHeapByte = 9.0 / 8.0;
Env memory_measuring_env() {
  const char* inherited = std::getenv("ASAN_OPTIONS");
  return {{"ASAN_OPTIONS",
           std::string(inherited != nullptr ? inherited : "") + ":quarantine_size_mb=0"}};
}
#else
constexpr double kResidentPerHeapByte = 1.0;
Env memory_measuring_env() { return {}; }
#endif

// A small LLaMA (two layers, grouped-query attention) on Jane Austen: seconds per run.
fs::path write_job(const fs::path& dir, int n_embd = 32, int n_layer = 2) {
  const fs::path p = dir / "job.toml";
  std::ofstream f(p);
  f << "[model]\nkind = \"llama\"\nn_layer = " << n_layer << "\nn_embd = " << n_embd
    << "\nn_head = 4\nn_kv_head = 2\nblock_size = 16\n"
    << "[data]\nkind = \"janeaustenr\"\n"
    << "[train]\nbatch = 2\nseq_len = 16\nsteps = 10\nlearning_rate = 3e-3\ngrad_accum = 1\n"
    << "resume = false\ncheckpoint_async = false\n";
  return p;
}

struct Run {
  fs::path metrics, checkpoints;
  std::vector<Exit> ranks;
  std::string log0;
};

// `world` ranks of the job with train.shard = mode and the extra --set overrides.
Run run_ranks(const fs::path& job, const fs::path& dir, int world, const std::string& mode,
              const std::vector<std::string>& extra = {}, const Env& extra_env = {}) {
  static int runs = 0;
  const std::string tag = mode + "-" + std::to_string(world) + "-" + std::to_string(++runs);
  Run out{dir / (tag + ".jsonl"), dir / (tag + "-ckpt"), {}, {}};
  const std::string port = std::to_string(free_port_base(world));
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {
        "--set", "train.shard=\"" + mode + "\"",
        "--set", "train.checkpoint_dir=\"" + out.checkpoints.string() + "\"",
        "--set", "train.metrics_file=\"" + out.metrics.string() + "\""};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(job.string());
    Env env = {{"WORLD_SIZE", std::to_string(world)},
               {"RANK", std::to_string(r)},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port}};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    pids.push_back(spawn(args, env, dir / (tag + "-rank" + std::to_string(r) + ".log")));
  }
  for (auto pid : pids) out.ranks.push_back(wait_exit_with_rss(pid));
  out.log0 = read_file(dir / (tag + "-rank0.log"));
  return out;
}

void require_ok(const Run& run) {
  INFO(run.log0);
  for (const auto& r : run.ranks) REQUIRE(r.code == 0);
}

std::string checkpoint_of(const Run& run, int step) {
  char name[40];
  std::snprintf(name, sizeof name, "checkpoint-%012d.bin", step);
  return read_file(run.checkpoints / name);
}

// The "arena total" of `topolaunch-worker --plan-only` as rank 1 of `world` (bytes, from MiB
// with two decimals).
double planned_arena_bytes(const fs::path& job, const fs::path& dir, int world,
                           const std::string& mode) {
  const auto r =
      run({"--plan-only", "--set", "train.shard=\"" + mode + "\"", job.string()},
          {{"WORLD_SIZE", std::to_string(world)}, {"RANK", "1"}}, dir / ("plan-" + mode + ".log"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto at = r.output.find("arena total");
  REQUIRE(at != std::string::npos);
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  const double mib = std::stod(line.substr(line.find_first_of("0123456789")));
  REQUIRE(line.find("MiB") != std::string::npos);
  return mib * 1024 * 1024;
}

}  // namespace

TEST_CASE(
    "2 and 4 ranks: every shard mode gives the losses of unsharded data parallelism bit for bit, "
    "and the same checkpoint file byte for byte") {
  require_janeaustenr();
  TempDir d;
  const fs::path job = write_job(d.path);
  for (int world : {2, 4}) {
    const Run none = run_ranks(job, d.path, world, "none");
    require_ok(none);
    const auto reference = metric_losses(none.metrics);
    REQUIRE(reference.size() == 10);
    const std::string reference_file = checkpoint_of(none, 10);
    REQUIRE(!reference_file.empty());
    for (std::size_t m = 1; m < kModes.size(); ++m) {
      const Run sharded = run_ranks(job, d.path, world, kModes[m]);
      require_ok(sharded);
      CHECK_THAT(sharded.log0, Catch::Contains("shard " + kModes[m]));
      const auto losses = metric_losses(sharded.metrics);
      REQUIRE(losses.size() == reference.size());
      for (std::size_t i = 0; i < losses.size(); ++i) {
        INFO(world << " ranks, shard " << kModes[m] << ", step " << i + 1);
        CHECK(losses[i] == reference[i]);  // %.17g text: equal strings, equal doubles
      }
      INFO(world << " ranks, shard " << kModes[m]
                 << ": the checkpoint every rank wrote its part of");
      CHECK(checkpoint_of(sharded, 10) == reference_file);
    }
  }
}

TEST_CASE(
    "grad_accum 2 at 4 ranks: optimizer sharding stays bit-identical; gradients and parameters, "
    "which reduce-scatter every micro-step and then accumulate, stay within 1e-6 relative") {
  require_janeaustenr();
  TempDir d;
  const fs::path job = write_job(d.path);
  const std::vector<std::string> accum = {"--set", "train.grad_accum=2"};
  const Run none = run_ranks(job, d.path, 4, "none", accum);
  require_ok(none);
  const auto reference = metric_losses(none.metrics);
  REQUIRE(reference.size() == 10);
  for (std::size_t m = 1; m < kModes.size(); ++m) {
    const Run sharded = run_ranks(job, d.path, 4, kModes[m], accum);
    require_ok(sharded);
    const auto losses = metric_losses(sharded.metrics);
    REQUIRE(losses.size() == reference.size());
    double worst = 0;
    for (std::size_t i = 0; i < losses.size(); ++i) {
      const double a = std::stod(reference[i]), b = std::stod(losses[i]);
      worst = std::max(worst, std::abs(a - b) / std::abs(a));
      INFO("shard " << kModes[m] << ", step " << i + 1 << ": " << reference[i] << " vs "
                    << losses[i]);
      if (kModes[m] == "optimizer" || i == 0)  // the first step's loss precedes any update
        CHECK(losses[i] == reference[i]);
      else
        CHECK(std::abs(a - b) <= 1e-6 * std::abs(a));
    }
    WARN("grad_accum 2, 4 ranks, shard " << kModes[m] << ": largest relative loss difference "
                                         << worst << " over 10 steps");
  }
}

TEST_CASE(
    "4 ranks: each mode's planned per-rank memory against its measured peak resident set (the "
    "difference to unsharded within 10% + 2 MiB of the planned one)") {
  require_janeaustenr();
  TempDir d;
  // Parameters and optimizer state dominate (3.3 M parameters, 13 MiB in fp32 each) and the
  // steps are short.
  const fs::path job = write_job(d.path, 256, 4);
  const std::vector<std::string> short_run = {"--set", "train.steps=3", "--set", "train.batch=1"};
  std::vector<double> planned, measured;
  for (const auto& mode : kModes) {
    planned.push_back(planned_arena_bytes(job, d.path, 4, mode));
    const Run r = run_ranks(job, d.path, 4, mode, short_run, memory_measuring_env());
    require_ok(r);
    // Rank 1's peak (rank 0 alone holds a copy of the state while an unsharded checkpoint is
    // written); every rank's plan has the same sizes.
    measured.push_back(static_cast<double>(r.ranks[1].peak_rss_bytes));
  }
  for (std::size_t m = 0; m < kModes.size(); ++m)
    WARN("shard " << kModes[m] << ": planned arena " << planned[m] / (1 << 20)
                  << " MiB per rank, measured peak RSS " << measured[m] / (1 << 20)
                  << " MiB (rank 1 of 4)");
  for (std::size_t m = 1; m < kModes.size(); ++m) {
    INFO("shard " << kModes[m]);
    CHECK(planned[m] < planned[m - 1]);
    const double planned_saving = (planned[0] - planned[m]) * kResidentPerHeapByte,
                 measured_saving = measured[0] - measured[m];
    CHECK(std::abs(measured_saving - planned_saving) <= 0.1 * planned_saving + 2.0 * (1 << 20));
  }
}

TEST_CASE(
    "a checkpoint written by 2 ranks with shard = \"parameters\" resumes re-sharded: on 1 rank, "
    "on 4 ranks, and bit for bit on 2 unsharded ranks") {
  require_janeaustenr();
  TempDir d;
  const fs::path job = write_job(d.path);
  // Every run sees the same 64 tokens per step (ranks x batch x seq_len).
  const Run whole = run_ranks(job, d.path, 2, "parameters");
  require_ok(whole);
  const auto reference = metric_losses(whole.metrics);
  REQUIRE(reference.size() == 10);
  struct Resume {
    int world;
    std::string mode, batch;
    bool bit_identical;
  };
  const Run first = run_ranks(job, d.path, 2, "parameters", {"--set", "train.steps=6"});
  require_ok(first);
  for (const Resume& r : {Resume{1, "none", "4", false}, Resume{4, "gradients", "1", false},
                          Resume{2, "none", "2", true}}) {
    INFO("resume on " << r.world << " rank(s), shard " << r.mode);
    const fs::path ckpt = d.path / ("resume-" + std::to_string(r.world) + "-" + r.mode);
    fs::copy(first.checkpoints, ckpt);
    const Run resumed = run_ranks(job, d.path, r.world, r.mode,
                                  {"--set", "train.resume=true", "--set", "train.batch=" + r.batch,
                                   "--set", "train.checkpoint_dir=\"" + ckpt.string() + "\""});
    require_ok(resumed);
    CHECK_THAT(resumed.log0, Catch::Contains("resumed from"));
    CHECK_THAT(resumed.log0, Catch::Contains("at step 6"));
    const auto losses = metric_losses(resumed.metrics);
    REQUIRE(losses.size() == 4);
    for (std::size_t i = 0; i < losses.size(); ++i) {
      INFO("step " << i + 7 << ": " << reference[i + 6] << " vs " << losses[i]);
      if (r.bit_identical)
        CHECK(losses[i] == reference[i + 6]);
      else  // the same tokens split over other ranks: the sums in another order
        CHECK(std::abs(std::stod(losses[i]) - std::stod(reference[i + 6])) <=
              1e-5 * std::stod(reference[i + 6]));
    }
  }
}
