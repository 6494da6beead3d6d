// The worker's part of the job TOML: [model], [data], [train] (ours) and the [budget] keys the
// planner needs (the table belongs to the launcher's JobConfig; we read the same keys, same units).
// Errors name file:line:column and the dotted key; exit code 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/cpu_backend.hpp"
#include "topolaunch/kernels/graph.hpp"

namespace topolaunch::kernels {

struct ModelSpec {
  std::string kind = "gpt2";  // "gpt2" | "mlp"
  GptConfig gpt;              // batch/seq_len come from [train]
  MlpConfig mlp;
  bool vocab_from_data = true;  // model.vocab_size absent: the data's vocabulary decides
};

struct DataSpec {
  // "text": a plain text file, or a folder of them (character level, byte vocabulary);
  // "janeaustenr": the novels in R's lazy-load database (Debian r-cran-janeaustenr), decoded;
  // "tokens": GPT-2 BPE uint16 tokens in llm.c's .bin layout.
  std::string kind = "text";
  std::string path;
};

struct TrainSpec {
  std::int64_t batch = 4, seq_len = 64;  // per rank, per micro-step
  std::int64_t steps = 100;
  AdamWSettings adamw;
  std::int64_t warmup_steps = 0;
  double min_lr_fraction = 1.0;  // cosine decay to this fraction of learning_rate (1: constant)
  std::uint64_t seed = 1337;
  int grad_accum = 0;  // 0: chosen by the communication plan
  int log_every = 1;
  int checkpoint_every = 0;  // 0: only at the end and on SIGUSR1
  std::string checkpoint_dir = "checkpoints";
  bool resume = true;        // resume from checkpoint_dir/checkpoint.bin when it exists
  std::string metrics_file;  // JSON lines, one per step (full-precision loss)
  // "fp32" (the CPU backend) or "bf16" (bf16 params/activations, fp32 optimizer state: the CUDA
  // backend's plan; the CPU backend can only --plan-only it).
  std::string precision = "fp32";
  // Cost model of the communication plan; 0 = by precision: fp32 (CPU over TCP) 2 GB/s, 50 us,
  // 10 GFLOP/s; bf16 (H200 + NCCL, measured in research/static_graph.md) 300 GB/s, 45 us, 400
  // TFLOP/s.
  double link_gbytes_per_s = 0, collective_latency_us = 0, compute_gflops = 0;
};

struct BudgetSpec {
  std::uint64_t memory_bytes = 0;      // [budget] memory (host, per rank): the CPU arena must fit
  std::uint64_t gpu_memory_bytes = 0;  // [budget] gpu_memory: the CUDA arena must fit
  std::uint64_t comm_bytes_per_step = 0;  // [budget] comm_per_step
  double comm_exposed_ms_per_step = 0;    // [budget] comm_exposed_per_step
};

struct WorkerConfig {
  std::string path;
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  BudgetSpec budget;
};

// `overrides` are "table.key=value" with a TOML value (command-line --set), applied before reading.
Result<WorkerConfig> load_worker_config(const std::string& path,
                                        const std::vector<std::string>& overrides = {});

// "16GiB", "1.5GiB", "512MiB", "4096" -> bytes (binary units only, as the launcher).
Result<std::uint64_t> parse_size(const std::string& text);
// "90s", "500ms", "250us", "2m" -> milliseconds.
Result<double> parse_duration_ms(const std::string& text);

}  // namespace topolaunch::kernels
