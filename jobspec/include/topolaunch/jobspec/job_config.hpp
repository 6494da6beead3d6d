// The job file: one TOML file read once into plain data, by the launcher, the SPANK plugin and
// the built-in worker alike. Every error names file:line:column and the dotted key, e.g.
//   job.toml:12:9: budget.memory: "16GB" is not a size (use binary units, e.g. "16GiB")
//   job.toml:3:1: job.restart: unknown key (did you mean "restarts"?)
// Tables: the launcher's [job] [mapping] [budget] [rdma] [wireup] [worker] [observe] [cost], and
// the built-in worker's [model] [data] [train]. All of them are checked here, so `topolaunch check`
// refuses a bad worker table before anything starts. What only the data can tell (its vocabulary,
// whether it is long enough for one step) is left to the worker.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/isolated.hpp"
#include "topolaunch/common/result.hpp"
#include "topolaunch/topology/discover.hpp"
#include "topolaunch/topology/mapping_spec.hpp"

namespace topolaunch::jobspec {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// [job] start: when an agent under Slurm forks its node's workers. "checked": after the agents'
// exchange and the whole job's rank map. "early": right after reading its node's topology, from
// a map of the step's nodes all taken to be like this one; the whole map, once exchanged, must
// give this node the same ranks, or the workers are stopped and the attempt fails (architecture.md,
// "Early start"). Outside Slurm there is no exchange: both are the same.
enum class StartMode { checked, early };

// [job]
struct JobSection {
  std::string name = "job";  // [A-Za-z0-9._-]+, used in the job dir and run id
  int nodes = 0;             // 0 = every node of the allocation (1 outside Slurm)
  int ranks_per_node = 0;    // 0 = derive from the GPUs (or 1 per core set on CPU hosts)
  int restarts = 0;          // whole-job restarts after a failure (0..1000)
  // 0 = off. A rank whose heartbeat file has not changed for this long is hung; topolaunch-worker
  // is watched from its start, any other program from its first beat (worker_contract.hpp).
  milliseconds heartbeat_timeout{0};
  // 0 = off. Needs no cooperation: when no rank of a node used CPU time, wrote output or beat for
  // this long, the node's ranks are hung (one stopped, the others blocked in a collective).
  milliseconds progress_timeout{0};
  milliseconds stop_grace{10'000};  // SIGTERM/SIGUSR1 -> SIGKILL of the process groups
  std::string job_dir;              // "" = ./topolaunch-jobs/<name>-<run id>
  std::string checkpoint_dir;       // "" = <job_dir>/checkpoints
  StartMode start = StartMode::checked;
};

// [budget]: 0 means "no budget". Read by the agent (memory, gpu_memory: watched) and by the
// built-in worker's planner (memory or gpu_memory: the arena must fit; comm_*: the plan).
struct BudgetSection {
  std::uint64_t memory_bytes_per_rank = 0;      // host RSS, enforced by the agent
  std::uint64_t gpu_memory_bytes_per_rank = 0;  // planned by the worker, watched via NVML
  std::uint64_t comm_bytes_per_step = 0;
  microseconds comm_exposed_time_per_step{0};
};

enum class PreflightMode { off, quick, full };
enum class GpuDirectPolicy { automatic, require, off };  // "auto" | "require" | "off"

// [rdma]
struct RdmaSection {
  std::string nics_text;  // NCCL_IB_HCA syntax as written ("" = all compute NICs)
  topology::NicFilter nics;
  PreflightMode preflight = PreflightMode::quick;
  GpuDirectPolicy gpudirect = GpuDirectPolicy::automatic;
  double min_bandwidth_gbps = 0.0;  // preflight fails a NIC pair below this (0 = no check)
  microseconds max_latency{0};      // preflight fails a NIC pair above this (0 = no check)
  milliseconds preflight_timeout{60'000};
};

enum class WireupBackend { automatic, tcp, pmix, pmi2 };

// [wireup]
struct WireupSection {
  WireupBackend backend = WireupBackend::automatic;
  int port = 0;                   // TCP store port on node 0; 0 = any free port
  milliseconds timeout{120'000};  // how long agents/workers wait in fence/get
};

// [worker]
struct WorkerSection {
  std::vector<std::string> command{"topolaunch-worker"};  // argv; argv[0] searched in PATH
  std::map<std::string, std::string> env;                 // extra environment, per rank the same
};

// [observe]: what the job records about itself beside training (docs/observe.md).
struct ObserveSection {
  // Optimizer steps (1-based, ascending, each once) whose timeline each rank of the built-in
  // worker writes as Chrome trace-event JSON; empty: no tracing, and no work for it in any step.
  std::vector<std::int64_t> trace_steps;
  // 0: off. Each agent serves the Prometheus text format on this port (every interface).
  int metrics_port = 0;
  // Where metrics_port was written ("job.toml:31:16"), for the agent's refusal of a port in use.
  std::string metrics_port_at;
  // Peak dense FLOP/s of one rank's device, in TFLOP/s, for the model FLOPs utilisation; 0: from
  // the GPU's model (NVIDIA's datasheet figure for bf16), none for CPU ranks.
  double peak_tflops_per_rank = 0;
};

// [cost]: prices, for the job's cost in report.json and the summary (0: no price).
struct CostSection {
  double gpu_hour = 0;   // one GPU of the allocation for an hour
  double core_hour = 0;  // one CPU core of the allocation for an hour
};

enum class ModelKind { gpt2, llama, mlp };

// [model] of the built-in worker. gpt2: pre-LN GPT-2 (learned positions, tied embedding and
// head); llama: pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, untied head,
// no biases; mlp: embedding -> [matmul + gelu] per `hidden` width -> matmul to the vocabulary.
struct ModelSpec {
  ModelKind kind = ModelKind::gpt2;
  std::int64_t n_layer = 2, n_embd = 64, n_head = 4;
  std::int64_t n_kv_head = 0;    // llama: key/value heads (0: n_head); n_head a multiple of it
  std::int64_t ffn_hidden = 0;   // llama: the SwiGLU width (0: 8/3 n_embd up to a multiple of 64)
  double rope_theta = 10000.0;   // llama: the rotary embedding's base
  std::int64_t block_size = 64;  // max context (gpt2: position embedding rows)
  std::optional<std::int64_t> vocab_size;  // absent: the data's vocabulary decides
  std::int64_t padded_vocab = 0;           // 0: the vocabulary rounded up to a multiple of 64
  std::vector<std::int64_t> hidden{64};    // mlp: the hidden layers' widths
};

enum class DataKind { text, janeaustenr, tokens };

// Jane Austen's novels as Debian's r-cran-janeaustenr installs them (R's lazy-load database).
inline constexpr const char* kJaneAustenRdb = "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb";

// [data] of the built-in worker.
struct DataSpec {
  // text: a plain text file, or a folder of them (character level, byte vocabulary);
  // janeaustenr: the novels in R's lazy-load database (Debian r-cran-janeaustenr), decoded;
  // tokens: uint16 tokens in llm.c's .bin layout (`topolaunch-worker data prepare` writes them
  // with a SentencePiece tokenizer; llm.c's own GPT-2 files load too).
  DataKind kind = DataKind::text;
  std::string path;  // janeaustenr: Debian's Rdata.rdb when not written
  // tokens: the held-out split (train.val_every reads it) and the tokenizer model that encoded
  // both (copied beside the checkpoints, so that a checkpoint is self-describing; the sample
  // command decodes through it). Both optional.
  std::string val_path;
  std::string tokenizer;
};

// [train] precision: "fp32" (the CPU backend), "bf16" (the CUDA backend: bf16 parameters and
// activations, fp32 master weights and AdamW state), "fp8" (bf16 with the transformer blocks'
// GEMMs in FP8 where measured faster, E4M3/E5M2 with delayed per-tensor scaling).
enum class TrainPrecision { fp32, bf16, fp8 };

// [train] shard: what data-parallel ranks hold only their share of (ZeRO stages): "none",
// "optimizer" (AdamW state), "gradients" (+ gradients), "parameters" (+ parameters), or "auto":
// the least of them whose plan fits the memory budget, then recomputation.
enum class ShardSetting { none, optimizer, gradients, parameters, automatic };

// [train] offload: where the optimizer state (AdamW's moments, the fp32 master weights) lives on
// a GPU: "none" (device memory), "optimizer" (host memory, pinned and mapped: AdamW reads and
// writes it over the host link once per optimizer step), or "auto" (the default): host memory only
// when the memory budget needs it and that costs less than the recomputation it saves.
enum class OffloadSetting { none, optimizer, automatic };

struct AdamWSpec {
  double learning_rate = 1e-3;  // the peak of the schedule; 0: no schedule, constant 0
  double beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // <= 0: no clipping
};

// [train] of the built-in worker.
struct TrainSpec {
  std::int64_t batch = 4, seq_len = 64;  // per rank, per micro-step
  std::int64_t steps = 100;
  AdamWSpec adamw;
  std::int64_t warmup_steps = 0;
  double min_lr_fraction = 1.0;  // cosine decay to this fraction of learning_rate (1: constant)
  std::uint64_t seed = 1337;
  int grad_accum = 0;                          // 0: chosen by the communication plan
  int log_every = 1;                           // 0 is read as 1
  int checkpoint_every = 0;                    // 0: only at the end and on SIGUSR1
  std::string checkpoint_dir = "checkpoints";  // TOPOLAUNCH_CHECKPOINT_DIR wins when set
  // Generations kept in checkpoint_dir (checkpoint-<step>.bin): 2, so that a resume whose newest
  // checkpoint is torn or corrupt falls back to the one before.
  int keep_checkpoints = 2;
  // Written by a thread from a copy of the state taken between steps (one more copy of
  // parameters + optimizer state in rank 0's memory, which the memory plan does not count);
  // false: the step loop writes and waits.
  bool checkpoint_async = true;
  bool resume = true;        // resume from the newest good checkpoint of checkpoint_dir, if any
  std::string metrics_file;  // JSON lines, one per step (full-precision loss)
  // fp32: the CPU backend; bf16: bf16 params/activations, fp32 optimizer state (the CUDA
  // backend's plan; the CPU backend can only --plan-only it).
  TrainPrecision precision = TrainPrecision::fp32;
  ShardSetting shard = ShardSetting::none;
  OffloadSetting offload = OffloadSetting::automatic;
  // The host link offload's cost is computed at (GB/s each way); 0: 0.75 x the GPU's PCIe link as
  // the rank map gives it (TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S), else 20.
  double host_link_gbytes_per_s = 0;
  // Cost model of the communication plan; 0 = by precision: fp32 (CPU over TCP) 2 GB/s, 50 us,
  // 10 GFLOP/s; bf16 (H200 + NCCL, measured in research/static_graph.md) 300 GB/s, 45 us, 400
  // TFLOP/s.
  double link_gbytes_per_s = 0, collective_latency_us = 0, compute_gflops = 0;
  // Validation: every val_every steps (and before the first step, and after the last) the mean
  // loss over val_batches batches of data.val_path, beside the training loss. 0: never.
  std::int64_t val_every = 0;
  std::int64_t val_batches = 8;
  // A directory of model.safetensors + config.json (Hugging Face GPT-2 names; `topolaunch-worker
  // export` writes one): the starting weights when no checkpoint is resumed (fine-tuning).
  std::string init_from;
};

struct JobConfig {
  std::string path;    // the file it came from (also TOPOLAUNCH_CONFIG)
  std::string digest;  // load_job_config: content_digest of the bytes and overrides it parsed
  JobSection job;
  topology::MappingSpec mapping;
  BudgetSection budget;
  RdmaSection rdma;
  WireupSection wireup;
  WorkerSection worker;
  ObserveSection observe;
  CostSection cost;
  std::optional<ModelSpec> model;  // absent: no [model] (a job whose worker is another program)
  DataSpec data;
  TrainSpec train;
};

// Command-line overrides "table.key=value", the value in TOML (a bare word is read as a string):
// topolaunch-worker's `--set train.steps=10`. Applied before the tables are read, so they are
// checked like the file; an error in one names it ("--set train.steps=x: train.steps: ...").
using Overrides = std::vector<std::string>;

// Parses and validates. Errors: exit_code 2, message "<path>:<line>:<col>: <key>: <what>".
Result<JobConfig> parse_job_config(std::string_view toml_text, const std::string& path,
                                   const Overrides& overrides = {});
// The same, first run as a crash probe in an isolated child (common/isolated.hpp): a defect of
// the TOML library that the guard (toml_guard.hpp) does not know yet becomes one error line, not
// a dead process. The one entry for every reader of a job file: launcher, plugin and worker.
Result<JobConfig> parse_job_config_isolated(std::string_view toml_text, const std::string& path,
                                            const IsolationLimits& limits = {},
                                            const Overrides& overrides = {});
// Reads `path` and parses it isolated. A `probed_digest` equal to the bytes' and overrides'
// digest says a probe of this process's user survived these very bytes (parsing is a function of
// them): they are parsed here without another probe. `topolaunch run` passes its config's digest
// to its agents, which read the same file on every node; a process that runs as anyone else (the
// SPANK plugin in slurmstepd) never passes one.
Result<JobConfig> load_job_config(const std::string& path, const Overrides& overrides = {},
                                  std::string_view probed_digest = {});

// Whether the job file knows "table.key" ("job.restarts", "mapping.explicit.rank"): messages
// that name a key are held to it (tests/unit/jobspec/test_message_keys.cpp).
bool is_schema_key(std::string_view dotted);

std::string_view to_string(StartMode mode);
std::string_view to_string(PreflightMode mode);
std::string_view to_string(GpuDirectPolicy policy);
std::string_view to_string(WireupBackend backend);
std::string_view to_string(ModelKind kind);
std::string_view to_string(DataKind kind);
std::string_view to_string(TrainPrecision precision);
std::string_view to_string(ShardSetting shard);
std::string_view to_string(OffloadSetting offload);

// A short human summary of the effective config (what `topolaunch check` prints).
std::string describe(const JobConfig& config);

}  // namespace topolaunch::jobspec
