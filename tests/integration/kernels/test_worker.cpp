// The worker as a process: data-parallel equivalence over the TCP ring, bit-exact resume after
// SIGUSR1 and after SIGKILL, bad input (exit 2 with a clear line), the 124M --plan-only.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "worker_process.hpp"

using namespace worker_process;

namespace {

// A tiny GPT on Jane Austen (character level): fast enough for CI on 2 busy cores.
fs::path write_job(const fs::path& dir, const std::string& extra_model = "",
                   const std::string& data = "") {
  const fs::path p = dir / "job.toml";
  std::ofstream f(p);
  f << "[model]\nn_layer = 1\nn_embd = 16\nn_head = 2\nblock_size = 16\n" << extra_model << "\n";
  if (data.empty()) {
    f << "[data]\nkind = \"janeaustenr\"\n";
  } else {
    f << "[data]\nkind = \"text\"\npath = \"" << data << "\"\n";
  }
  // grad_accum fixed: the automatic choice would change the batch between 1 and 2 ranks.
  f << "[train]\nbatch = 2\nseq_len = 16\nsteps = 20\nlearning_rate = 3e-3\nresume = "
       "true\ngrad_accum = 1\n"
    << "checkpoint_dir = \"" << (dir / "ckpt").string() << "\"\n";
  return p;
}

}  // namespace

TEST_CASE(
    "data parallel: 2 ranks x batch 2 give the losses of 1 rank x batch 4 over 20 steps (1e-5 "
    "relative)") {
  require_janeaustenr();
  TempDir d;
  const fs::path job = write_job(d.path);
  const auto one =
      run({"--set", "train.batch=4", "--set", "train.resume=false", "--set",
           "train.metrics_file=\"" + (d.path / "one.jsonl").string() + "\"", job.string()},
          {}, d.path / "one.log");
  REQUIRE(one.exit_code == 0);
  const std::string port = std::to_string(free_port_base());
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(
        spawn({"--set", "train.batch=2", "--set", "train.resume=false", "--set",
               "train.checkpoint_dir=\"" + (d.path / "ckpt2").string() + "\"", "--set",
               "train.metrics_file=\"" + (d.path / "two.jsonl").string() + "\"", job.string()},
              {{"WORLD_SIZE", "2"},
               {"RANK", std::to_string(r)},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port}},
              d.path / ("two-" + std::to_string(r) + ".log")));
  }
  for (auto pid : pids) REQUIRE(wait_exit(pid) == 0);
  const auto a = metric_losses(d.path / "one.jsonl"), b = metric_losses(d.path / "two.jsonl");
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = std::stod(a[i]), y = std::stod(b[i]);
    INFO("step " << i + 1 << ": 1 rank " << a[i] << ", 2 ranks " << b[i]);
    CHECK(std::abs(x - y) <= 1e-5 * std::abs(x));
  }
  CHECK(std::stod(a.back()) < std::stod(a.front()));
}

TEST_CASE(
    "resume after SIGUSR1: exit 75 at a step boundary, later losses equal the uninterrupted run "
    "bit for bit") {
  require_janeaustenr();
  TempDir d;
  const fs::path job = write_job(d.path);
  const auto ref =
      run({"--set", "train.steps=30", "--set", "train.resume=false", "--set",
           "train.checkpoint_dir=\"" + (d.path / "ref").string() + "\"", "--set",
           "train.metrics_file=\"" + (d.path / "ref.jsonl").string() + "\"", job.string()},
          {}, d.path / "ref.log");
  REQUIRE(ref.exit_code == 0);
  const fs::path metrics = d.path / "int.jsonl";
  const pid_t pid = spawn({"--set", "train.steps=100000", "--set",
                           "train.metrics_file=\"" + metrics.string() + "\"", job.string()},
                          {}, d.path / "int.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_lines(metrics) < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(pid, SIGUSR1);
  REQUIRE(wait_exit(pid) == 75);
  const std::string log = read_file(d.path / "int.log");
  INFO(log);
  REQUIRE(log.find("stopped by SIGUSR1 after step") != std::string::npos);
  const std::size_t k = count_lines(metrics);
  REQUIRE(k < 30);
  const auto resumed = run({"--set", "train.steps=30", "--set",
                            "train.metrics_file=\"" + metrics.string() + "\"", job.string()},
                           {}, d.path / "resume.log");
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resumed from") != std::string::npos);
  const auto a = metric_losses(d.path / "ref.jsonl"), b = metric_losses(metrics);
  REQUIRE(a.size() == 30);
  REQUIRE(b.size() == 30);
  for (std::size_t i = 0; i < 30; ++i) {
    INFO("step " << i + 1);
    CHECK(a[i] == b[i]);  // %.17g text: equal strings mean equal doubles
  }
}

TEST_CASE(
    "resume after SIGKILL: the last complete checkpoint loads and the run continues bit for bit") {
  require_janeaustenr();
  TempDir d;
  const fs::path job = write_job(d.path);
  const auto ref =
      run({"--set", "train.steps=30", "--set", "train.resume=false", "--set",
           "train.checkpoint_dir=\"" + (d.path / "ref").string() + "\"", "--set",
           "train.metrics_file=\"" + (d.path / "ref.jsonl").string() + "\"", job.string()},
          {}, d.path / "ref.log");
  REQUIRE(ref.exit_code == 0);
  const fs::path metrics = d.path / "killed.jsonl";
  const pid_t pid =
      spawn({"--set", "train.steps=100000", "--set", "train.checkpoint_every=1", "--set",
             "train.metrics_file=\"" + metrics.string() + "\"", job.string()},
            {}, d.path / "killed.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_lines(metrics) < 6 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ::kill(pid, SIGKILL);
  wait_exit(pid);
  const fs::path resumed_metrics = d.path / "resumed.jsonl";
  const auto resumed =
      run({"--set", "train.steps=30", "--set",
           "train.metrics_file=\"" + resumed_metrics.string() + "\"", job.string()},
          {}, d.path / "resume.log");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const auto at = resumed.output.find("at step ");
  REQUIRE(at != std::string::npos);
  const std::size_t k = std::stoul(resumed.output.substr(at + 8));
  // 6 steps logged, a checkpoint after each: 4 is complete; 5's may still be in flight on the
  // asynchronous writer (one write at a time), and a kill then leaves only its temporary.
  REQUIRE(k >= 4);
  const auto a = metric_losses(d.path / "ref.jsonl"), b = metric_losses(resumed_metrics);
  REQUIRE(b.size() == 30 - k);
  for (std::size_t i = 0; i < b.size(); ++i) CHECK(a[k + i] == b[i]);
}

TEST_CASE("bad input exits 2 with one clear line") {
  TempDir d;
  SECTION("n_embd not divisible by n_head") {
    const fs::path job = write_job(d.path);
    const auto r = run({"--set", "model.n_embd=30", "--set", "model.n_head=4", job.string()}, {},
                       d.path / "log");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("model.n_embd: 30 is not divisible by model.n_head = 4"));
  }
  SECTION("unknown model kind, with file:line:column") {
    const fs::path job = write_job(d.path, "kind = \"rnn\"");
    const auto r = run({job.string()}, {}, d.path / "log");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output,
               Catch::Contains("job.toml:6:8: model.kind: \"rnn\" is not one of \"gpt2\", "
                               "\"llama\", \"mlp\""));
  }
  SECTION("empty data file") {
    std::ofstream(d.path / "empty.txt").close();
    const auto r =
        run({write_job(d.path, "", (d.path / "empty.txt").string()).string()}, {}, d.path / "log");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("is empty"));
  }
  SECTION("non-text data file") {
    std::ofstream bin(d.path / "blob.txt", std::ios::binary);
    for (int i = 0; i < 4096; ++i) bin.put(static_cast<char>(i * 37 % 256));
    bin.close();
    const auto r =
        run({write_job(d.path, "", (d.path / "blob.txt").string()).string()}, {}, d.path / "log");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("is not a text file"));
  }
}

TEST_CASE(
    "checkpoints from another model, truncated or corrupt are refused (exit 2) and never loaded") {
  require_janeaustenr();
  TempDir d;
  const fs::path job = write_job(d.path);
  REQUIRE(run({"--set", "train.steps=2", job.string()}, {}, d.path / "first.log").exit_code == 0);
  const fs::path ckpt = d.path / "ckpt" / "checkpoint-000000000002.bin";  // the only generation
  REQUIRE(fs::exists(ckpt));
  const std::string good = read_file(ckpt);
  SECTION("another model") {
    const auto r = run({"--set", "train.steps=4", "--set", "model.n_embd=32", job.string()}, {},
                       d.path / "log");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("was written by a different model"));
  }
  SECTION("truncated") {
    fs::resize_file(ckpt, good.size() - 100);
    const auto r = run({"--set", "train.steps=4", job.string()}, {}, d.path / "log");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("is truncated"));
  }
  SECTION("one flipped byte") {
    std::string bad = good;
    bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x40);
    std::ofstream(ckpt, std::ios::binary) << bad;
    const auto r = run({"--set", "train.steps=4", job.string()}, {}, d.path / "log");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("fails its checksum"));
    CHECK(read_file(ckpt) == bad);  // refused before training: nothing overwrote it
  }
}

TEST_CASE(
    "--plan-only on GPT-2 124M (bf16, B=64): under a second, refuses a budget with the smallest "
    "that fits") {
  TempDir d;
  const fs::path job = d.path / "gpt2.toml";
  std::ofstream(job)
      << "[model]\nn_layer = 12\nn_embd = 768\nn_head = 12\nblock_size = 1024\nvocab_size = 50257\n"
         "padded_vocab = 50304\n[train]\nbatch = 64\nseq_len = 1024\nprecision = \"bf16\"\n"
         "[budget]\ngpu_memory = \"120GiB\"\n";
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run({"--plan-only", job.string()}, {}, d.path / "log");
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("arena / lower bound"));
  CHECK_THAT(r.output, Catch::Contains("recompute: none"));
  WARN("--plan-only 124M wall time " << wall_s << " s");
  const auto at = r.output.find("planned in ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(r.output.substr(at + 11)) < 1000.0);
  const auto tight = run({"--plan-only", "--set", "budget.gpu_memory=\"16GiB\"", job.string()}, {},
                         d.path / "log2");
  CHECK(tight.exit_code == 0);
  CHECK_THAT(tight.output, Catch::Contains("recompute: "));
  CHECK_THAT(tight.output, Catch::Contains("fits"));
  const auto refused = run({"--plan-only", "--set", "budget.gpu_memory=\"1GiB\"", "--set",
                            "train.offload=\"none\"", job.string()},
                           {}, d.path / "log3");
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output,
             Catch::Contains("below the parameters, gradients and optimizer state"));
  CHECK_THAT(refused.output, Catch::Contains("the smallest budget that fits"));
  CHECK_THAT(refused.output, Catch::Contains("train.offload = \"auto\" or \"optimizer\""));
  // offload = "auto", the default: 5 GiB is below what recomputation reaches with the optimizer
  // state on the device (5.57 GiB), and above it with the state in host memory (4.18 GiB)
  const auto offloaded = run({"--plan-only", "--set", "budget.gpu_memory=\"5GiB\"", job.string()},
                             {}, d.path / "log4");
  CHECK(offloaded.exit_code == 0);
  CHECK_THAT(offloaded.output, Catch::Contains("of which in host memory"));
  CHECK_THAT(offloaded.output,
             Catch::Contains("moved the optimizer state to host memory: without it no "
                             "recomputation fits the budget"));
  // The host link it is costed at: 20 GB/s without the rank map's PCIe figure, else 0.75 of it;
  // the state's 1.39 GiB (1.494 GB) each way takes 74.7 ms at 20 GB/s and 31.1 ms at 48.
  CHECK_THAT(offloaded.output,
             Catch::Contains("over 74.7 ms per optimizer step, at 20 GB/s each way"));
  const auto gen5 = run({"--plan-only", "--set", "budget.gpu_memory=\"5GiB\"", job.string()},
                        {{"TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S", "64.0"}}, d.path / "log6");
  CHECK(gen5.exit_code == 0);
  CHECK_THAT(gen5.output, Catch::Contains("over 31.1 ms per optimizer step, at 48 GB/s each way"));
  const auto garbled = run({"--plan-only", "--set", "budget.gpu_memory=\"5GiB\"", job.string()},
                           {{"TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S", "fast"}}, d.path / "log7");
  CHECK(garbled.exit_code == 2);
  CHECK_THAT(
      garbled.output,
      Catch::Contains("TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S=fast: not a positive number of GB/s"));
  const auto below = run({"--plan-only", "--set", "budget.gpu_memory=\"512MiB\"", job.string()}, {},
                         d.path / "log5");
  CHECK(below.exit_code == 2);
  CHECK_THAT(below.output, Catch::Contains("below the parameters and gradients"));
}
