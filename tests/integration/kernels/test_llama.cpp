// configs/jobs/tiny-llama-cpu.toml as it is shipped, on the GPT example's tokens: `data prepare`
// trains the BPE tokenizer on Jane Austen and writes the splits, then two ranks of
// topolaunch-worker over the TCP ring train the LLaMA-shaped model, and the training and
// validation losses fall.
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "catch.hpp"
#include "worker_process.hpp"

using namespace worker_process;

namespace {

fs::path source_root() {
  const char* p = std::getenv("TOPOLAUNCH_SOURCE_ROOT");
  if (p == nullptr) FAIL("TOPOLAUNCH_SOURCE_ROOT is not set (meson passes the source tree)");
  return p;
}

// step -> validation loss of the metrics file's validation lines.
std::map<int, double> val_losses(const fs::path& metrics) {
  std::map<int, double> out;
  const std::regex line("\"step\":(\\d+),\"val_loss\":([-0-9.e+]+)");
  const std::string text = read_file(metrics);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it)
    out[std::stoi((*it)[1])] = std::stod((*it)[2]);
  return out;
}

}  // namespace

TEST_CASE(
    "tiny-llama-cpu.toml: 2 ranks train the LLaMA on the Austen tokens; training and validation "
    "losses fall") {
  require_janeaustenr();
  TempDir d;
  const fs::path data = d.path / "austen-bpe";
  const auto prepared = run(
      {"data", "prepare", "--corpus", "janeaustenr", "--out", data.string(), "--vocab-size", "512"},
      {}, d.path / "prepare.log");
  INFO(prepared.output);
  REQUIRE(prepared.exit_code == 0);
  const fs::path job = source_root() / "configs" / "jobs" / "tiny-llama-cpu.toml";
  const fs::path metrics = d.path / "metrics.jsonl";
  const std::string port = std::to_string(free_port_base(2));
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(
        spawn({"--set", "train.steps=100", "--set", "train.resume=false", "--set",
               "train.checkpoint_dir=\"" + (d.path / "ckpt").string() + "\"", "--set",
               "train.metrics_file=\"" + metrics.string() + "\"", "--set",
               "data.path=\"" + (data / "train.bin").string() + "\"", "--set",
               "data.val_path=\"" + (data / "val.bin").string() + "\"", "--set",
               "data.tokenizer=\"" + (data / "tokenizer.model").string() + "\"", job.string()},
              {{"WORLD_SIZE", "2"},
               {"RANK", std::to_string(r)},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port}},
              d.path / ("rank-" + std::to_string(r) + ".log")));
  for (auto pid : pids) REQUIRE(wait_exit(pid) == 0);
  const std::string log = read_file(d.path / "rank-0.log");
  INFO(log);
  CHECK_THAT(log, Catch::Contains("model llama:"));
  std::vector<double> losses;
  for (const auto& l : metric_losses(metrics)) losses.push_back(std::stod(l));
  const auto val = val_losses(metrics);
  REQUIRE(val.size() == 3);  // steps 0, 50 and 100
  REQUIRE(losses.size() >= 100);
  // A vocabulary of 512: the first step is about ln(512) = 6.24.
  const double first = losses.front();
  double last = 0;
  for (std::size_t i = losses.size() - 10; i < losses.size(); ++i) last += losses[i] / 10;
  CHECK(std::abs(first - std::log(512.0)) < 0.2);
  CHECK(last < first - 1.0);
  CHECK(val.at(50) < val.at(0));
  CHECK(val.at(100) < val.at(50));
  WARN("tiny llama on the Austen tokens: loss " << first << " -> " << last
                                                << " (mean of the last 10 of 100 steps), "
                                                   "validation "
                                                << val.at(0) << " -> " << val.at(50) << " -> "
                                                << val.at(100));
}
