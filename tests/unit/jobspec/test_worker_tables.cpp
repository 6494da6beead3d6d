// The built-in worker's tables ([model] [data] [train]) read by the same reader as the
// launcher's, so `topolaunch check` refuses them before anything starts; and the --set overrides.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "catch.hpp"
#include "topolaunch/jobspec/job_config.hpp"

using namespace topolaunch::jobspec;

namespace {

std::string error_of(const std::string& toml, const Overrides& overrides = {}) {
  auto r = parse_job_config(toml, "job.toml", overrides);
  if (r.ok()) return "(parsed fine)";
  CHECK(r.error().exit_code == 2);
  CHECK(r.error().message.find('\n') == std::string::npos);  // one line
  return r.error().message;
}

// A job file in a directory of its own, removed with it.
struct TempJobFile {
  std::filesystem::path dir;
  std::string path;
  explicit TempJobFile(const std::string& text) {
    char tmpl[] = "/tmp/tl-jobspec-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    path = (dir / "job.toml").string();
    std::ofstream(path) << text;
  }
  ~TempJobFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

TEST_CASE("the issue's bad worker tables: one line each, naming file:line:col and the key") {
  CHECK(error_of("[train]\nbatch = -1\n") ==
        "job.toml:2:9: train.batch: -1 is out of range (allowed 1..1048576)");
  CHECK(error_of("[model]\nn_embd = 64\nn_head = 5\n") ==
        "job.toml:2:10: model.n_embd: 64 is not divisible by model.n_head = 5 (choose n_embd "
        "as a multiple of n_head)");
  CHECK(error_of("[budget]\nmemory = \"-3GiB\"\n") ==
        "job.toml:2:10: budget.memory: \"-3GiB\" is negative (a size is at least \"0B\")");
  CHECK(error_of("[train]\nsteps = \"many\"\n") ==
        "job.toml:2:9: train.steps: expected an integer, got a string (e.g. steps = 1)");
  CHECK(error_of("[model]\nkind = \"bert\"\n") ==
        "job.toml:2:8: model.kind: \"bert\" is not one of \"gpt2\", \"llama\", \"mlp\"");
  CHECK(error_of("[trian]\nsteps = 10\n") ==
        "job.toml:1:2: trian: unknown table (did you mean \"train\"?)");
}

TEST_CASE("[model] [data] [train]: every key is read") {
  auto r = parse_job_config(R"(
[model]
kind = "mlp"
n_layer = 3
n_embd = 48
n_head = 6
block_size = 128
vocab_size = 300
padded_vocab = 320
hidden = [96, 32]
[data]
kind = "tokens"
path = "data/austen.bin"
[train]
batch = 8
seq_len = 32
steps = 50
learning_rate = 6e-4
beta1 = 0.8
beta2 = 0.99
epsilon = 1e-6
weight_decay = 0.0
grad_clip = 0.5
warmup_steps = 5
min_lr_fraction = 0.1
seed = 7
grad_accum = 2
log_every = 10
checkpoint_every = 25
checkpoint_dir = "ck"
keep_checkpoints = 5
checkpoint_async = false
resume = false
metrics_file = "m.jsonl"
precision = "bf16"
link_gbytes_per_s = 100
collective_latency_us = 20
compute_gflops = 1000
)",
                            "job.toml");
  REQUIRE(r.ok());
  REQUIRE(r->model.has_value());
  const ModelSpec& m = *r->model;
  CHECK(m.kind == ModelKind::mlp);
  CHECK(m.n_layer == 3);
  CHECK(m.n_embd == 48);
  CHECK(m.n_head == 6);
  CHECK(m.block_size == 128);
  CHECK(m.vocab_size == 300);
  CHECK(m.padded_vocab == 320);
  CHECK(m.hidden == std::vector<std::int64_t>{96, 32});
  CHECK(r->data.kind == DataKind::tokens);
  CHECK(r->data.path == "data/austen.bin");
  const TrainSpec& t = r->train;
  CHECK(t.batch == 8);
  CHECK(t.seq_len == 32);
  CHECK(t.steps == 50);
  CHECK(t.adamw.learning_rate == 6e-4);
  CHECK(t.adamw.beta1 == 0.8);
  CHECK(t.adamw.beta2 == 0.99);
  CHECK(t.adamw.epsilon == 1e-6);
  CHECK(t.adamw.weight_decay == 0.0);
  CHECK(t.adamw.grad_clip == 0.5);
  CHECK(t.warmup_steps == 5);
  CHECK(t.min_lr_fraction == 0.1);
  CHECK(t.seed == 7);
  CHECK(t.grad_accum == 2);
  CHECK(t.log_every == 10);
  CHECK(t.checkpoint_every == 25);
  CHECK(t.checkpoint_dir == "ck");
  CHECK(t.keep_checkpoints == 5);
  CHECK_FALSE(t.checkpoint_async);
  CHECK_FALSE(t.resume);
  CHECK(t.metrics_file == "m.jsonl");
  CHECK(t.precision == TrainPrecision::bf16);
  CHECK(t.link_gbytes_per_s == 100.0);
  CHECK(t.collective_latency_us == 20.0);
  CHECK(t.compute_gflops == 1000.0);
}

TEST_CASE("worker tables: defaults, and the data's vocabulary when vocab_size is absent") {
  auto r = parse_job_config("[model]\n[data]\nkind = \"janeaustenr\"\n", "job.toml");
  REQUIRE(r.ok());
  CHECK(r->model->kind == ModelKind::gpt2);
  CHECK_FALSE(r->model->vocab_size.has_value());
  CHECK(r->data.path == "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb");
  CHECK(r->train.precision == TrainPrecision::fp32);
  auto fp8 = parse_job_config("[train]\nprecision = \"fp8\"\n", "job.toml");
  REQUIRE(fp8.ok());
  CHECK(fp8->train.precision == TrainPrecision::fp8);
  CHECK(r->train.log_every == 1);
  CHECK(r->train.keep_checkpoints == 2);  // one generation to fall back to
  CHECK(r->train.checkpoint_async);
  auto every_step = parse_job_config("[train]\nlog_every = 0\n", "job.toml");
  REQUIRE(every_step.ok());
  CHECK(every_step->train.log_every == 1);
}

TEST_CASE("worker tables: typos get a did-you-mean, keys of another table say where they go") {
  CHECK(error_of("[model]\nn_layer = 1\n[train]\nbatch = 2\nlearnin_rate = 1e-3\n") ==
        "job.toml:5:1: train.learnin_rate: unknown key (did you mean \"learning_rate\"?)");
  CHECK(error_of("[model]\nn_heads = 4\n") ==
        "job.toml:2:1: model.n_heads: unknown key (did you mean \"n_head\"?)");
  CHECK(error_of("[data]\nseq_len = 4\n") ==
        "job.toml:2:1: data.seq_len: unknown key (it belongs in [train])");
}

TEST_CASE("worker tables: structure is checked where the model is written") {
  // seq_len beyond the positions the model has.
  CHECK(error_of("[model]\nblock_size = 32\n[train]\nseq_len = 64\n") ==
        "job.toml:4:11: train.seq_len: 64 exceeds model.block_size = 32");
  CHECK(error_of("[model]\nblock_size = 32\n") ==
        "job.toml:2:14: model.block_size: 32 is below train.seq_len = 64");
  // An mlp has no positions; a gpt2 with n_head absent still divides n_embd by the default 4.
  CHECK(error_of("[model]\nkind = \"mlp\"\nblock_size = 8\n") == "(parsed fine)");
  CHECK(error_of("[model]\nn_embd = 30\n").find("model.n_embd: 30 is not divisible") !=
        std::string::npos);
  CHECK(error_of("[model]\nvocab_size = 100\npadded_vocab = 64\n") ==
        "job.toml:3:16: model.padded_vocab: 64 is smaller than model.vocab_size = 100");
  CHECK(error_of("[model]\nn_layer = 0\n") ==
        "job.toml:2:11: model.n_layer: 0 is out of range (allowed 1..4096)");
  // Once passed by check, then a worker's uncaught bad_alloc after seconds at 2.9 GB.
  CHECK(error_of("[model]\nn_layer = 9223372036854775807\n") ==
        "job.toml:2:11: model.n_layer: 9223372036854775807 is out of range (allowed 1..4096)");
  CHECK(error_of("[model]\nhidden = [64, 0]\n") ==
        "job.toml:2:15: model.hidden: expected layer widths 1..1048576");
  CHECK(error_of("[model]\nhidden = 64\n")
            .find("model.hidden: expected an array of layer "
                  "widths, got an integer") != std::string::npos);
  CHECK(error_of("[train]\nprecision = \"fp16\"\n") ==
        "job.toml:2:13: train.precision: \"fp16\" is not one of \"fp32\", \"bf16\", \"fp8\"");
  CHECK(error_of("[data]\nkind = \"csv\"\n") ==
        "job.toml:2:8: data.kind: \"csv\" is not one of \"text\", \"janeaustenr\", \"tokens\"");
  CHECK(error_of("[train]\nbeta2 = 1.5\n").find("train.beta2: 1.5 is out of range") !=
        std::string::npos);
  CHECK(error_of("[train]\nlearning_rate = \"fast\"\n")
            .find("train.learning_rate: expected a number, got a string") != std::string::npos);
  CHECK(error_of("[train]\ncheckpoint_dir = \"\"\n").find("train.checkpoint_dir: is empty") !=
        std::string::npos);
  CHECK(error_of("[train]\nkeep_checkpoints = 0\n") ==
        "job.toml:2:20: train.keep_checkpoints: 0 is out of range (allowed 1..10000)");
  CHECK(error_of("[train]\ncheckpoint_async = \"yes\"\n")
            .find("train.checkpoint_async: expected true or false") != std::string::npos);
  CHECK(error_of("[train]\nresume = 1\n").find("train.resume: expected true or false") !=
        std::string::npos);
}

TEST_CASE("llama and sharding keys: read, checked where they are written") {
  auto c = parse_job_config(
      "[model]\nkind = \"llama\"\nn_embd = 64\nn_head = 8\nn_kv_head = 2\nffn_hidden = 96\n"
      "rope_theta = 500000.0\n[train]\nshard = \"gradients\"\n",
      "job.toml");
  REQUIRE(c.ok());
  CHECK(c->model->kind == ModelKind::llama);
  CHECK(c->model->n_kv_head == 2);
  CHECK(c->model->ffn_hidden == 96);
  CHECK(c->model->rope_theta == 500000.0);
  CHECK(c->train.shard == ShardSetting::gradients);
  CHECK_THAT(describe(*c), Catch::Contains("llama: 2 layers, n_embd 64, 8 heads (2 key/value)"));
  CHECK_THAT(describe(*c), Catch::Contains(", shard gradients,"));
  auto defaults = parse_job_config("[model]\nkind = \"llama\"\n", "job.toml");
  REQUIRE(defaults.ok());
  CHECK(defaults->model->n_kv_head == defaults->model->n_head);
  CHECK(defaults->train.shard == ShardSetting::none);
  CHECK(parse_job_config("[train]\nshard = \"auto\"\n", "job.toml")->train.shard ==
        ShardSetting::automatic);
  CHECK(error_of("[train]\nshard = \"zero3\"\n") ==
        "job.toml:2:9: train.shard: \"zero3\" is not one of \"none\", \"optimizer\", "
        "\"gradients\", \"parameters\", \"auto\"");
  CHECK(defaults->train.offload == OffloadSetting::automatic);
  CHECK(parse_job_config("[train]\noffload = \"auto\"\n", "job.toml")->train.offload ==
        OffloadSetting::automatic);
  CHECK(parse_job_config("[train]\noffload = \"optimizer\"\nhost_link_gbytes_per_s = 50.0\n",
                         "job.toml")
            ->train.offload == OffloadSetting::optimizer);
  CHECK(error_of("[train]\noffload = \"cpu\"\n") ==
        "job.toml:2:11: train.offload: \"cpu\" is not one of \"none\", \"optimizer\", \"auto\"");
  CHECK(error_of("[train]\nhost_link_gbytes_per_s = -1.0\n")
            .find("train.host_link_gbytes_per_s: -1") != std::string::npos);
  CHECK(error_of("[train]\nshards = \"auto\"\n") ==
        "job.toml:2:1: train.shards: unknown key (did you mean \"shard\"?)");
  CHECK(error_of("[model]\nkind = \"llama\"\nn_head = 4\nn_kv_head = 3\n") ==
        "job.toml:4:13: model.n_kv_head: 3 does not divide model.n_head = 4 (each key/value head "
        "serves n_head / n_kv_head query heads)");
  CHECK(error_of("[model]\nkind = \"llama\"\nn_embd = 12\nn_head = 4\n") ==
        "job.toml:4:10: model.n_head: the head size n_embd / n_head = 3 is odd (rotary "
        "embeddings rotate channel pairs)");
  CHECK(error_of("[model]\nn_kv_head = 2\n") ==
        "job.toml:2:13: model.n_kv_head: is a key of model.kind = \"llama\", not of \"gpt2\"");
  CHECK(error_of("[model]\nkind = \"llama\"\nblock_size = 32\n[train]\nseq_len = 64\n") ==
        "job.toml:5:11: train.seq_len: 64 exceeds model.block_size = 32");
}

TEST_CASE("[budget] sizes and durations are the launcher's, in binary units") {
  auto r = parse_job_config(
      "[budget]\nmemory = \"1.5GiB\"\ncomm_exposed_per_step = \"20ms\"\ngpu_memory = \"1PiB\"\n",
      "job.toml");
  REQUIRE_FALSE(r.ok());  // 1PiB: accepted by the unit parser, refused as absurd for one GPU
  CHECK(r.error().message.find("budget.gpu_memory: 1PiB is absurdly large") != std::string::npos);
  auto ok = parse_job_config("[budget]\nmemory = \"1.5GiB\"\ncomm_exposed_per_step = \"20ms\"\n",
                             "job.toml");
  REQUIRE(ok.ok());
  CHECK(ok->budget.memory_bytes_per_rank == 3ull << 29);
  CHECK(ok->budget.comm_exposed_time_per_step == std::chrono::milliseconds(20));
  CHECK(error_of("[budget]\nmemory = \"16GB\"\n")
            .find("job.toml:2:10: budget.memory: \"16GB\" is not a size") == 0);
}

TEST_CASE("a TOML syntax error that quotes a control byte stays one line") {
  // Found by tests/fuzz/fuzz_job_config: toml++ quotes what it read, a NUL byte included.
  const std::string text("[mapping]\noversubscribe = t\0rue\n", 32);
  const std::string message = error_of(text);
  CHECK(message.find("job.toml:2:") == 0);
  CHECK(message.find("\\x00") != std::string::npos);
  CHECK(std::none_of(message.begin(), message.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20; }));
  // A value quoted back with its escapes decoded: a tab in a job name.
  CHECK(error_of("[job]\nname = \"\\tx\"\n").find("\"\\x09x\" is not a job name") !=
        std::string::npos);
}

TEST_CASE("--set overrides: one line each; a value that opens a table header is refused") {
  // Found by tests/fuzz/fuzz_job_config: "train.steps=1\n[+]" reached toml++ 3.3 as
  // "v = 1\n[+]" and aborted the process in parse_key().
  const std::string job = "[train]\nsteps = 3\n";
  CHECK(error_of(job, {"train.steps=1\n[+]"}) ==
        "--set: control character 0x0a in an override (expected one line, table.key=value)");
  CHECK(error_of(job, {"train.steps=1\x1b[2J"}) ==
        "--set: control character 0x1b in an override (expected one line, table.key=value)");
  // On one line the guard still runs before the parser: an inline table's header-like text.
  auto r = parse_job_config(job, "job.toml", {"train.steps=[+]"});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("--set train.steps=[+]") == 0);
}

TEST_CASE("--set overrides: TOML values, bare words as strings, checked like the file") {
  const std::string job = "[model]\nn_layer = 1\n[train]\nsteps = 3\n";
  auto r = parse_job_config(job, "job.toml",
                            {"train.steps=7", "data.path=/tmp/x", "train.metrics_file=\"m.j\"",
                             "model.hidden=[8, 8]", "budget.gpu_memory=\"16GiB\""});
  REQUIRE(r.ok());
  CHECK(r->train.steps == 7);
  CHECK(r->data.path == "/tmp/x");
  CHECK(r->train.metrics_file == "m.j");
  CHECK(r->model->hidden == std::vector<std::int64_t>{8, 8});
  CHECK(r->budget.gpu_memory_bytes_per_rank == 16ull << 30);
  // A path with quotes and backslashes stays the bare word it was.
  auto quoted = parse_job_config(job, "job.toml", {"data.path=/tmp/a\"b\\c"});
  REQUIRE(quoted.ok());
  CHECK(quoted->data.path == "/tmp/a\"b\\c");
  // An override's bad value is reported as the override, not as a line of the file.
  CHECK(error_of(job, {"train.steps=many"}) ==
        "--set train.steps=many: train.steps: expected an integer, got a string (e.g. steps = 1)");
  CHECK(error_of(job, {"model.n_embd=30", "model.n_head=4"}) ==
        "--set model.n_embd=30: model.n_embd: 30 is not divisible by model.n_head = 4 (choose "
        "n_embd as a multiple of n_head)");
  CHECK(error_of(job, {"trian.steps=1"}) ==
        "--set trian.steps=1: trian: unknown table (did you mean \"train\"?)");
  CHECK(error_of(job, {"train.stpes=1"}) ==
        "--set train.stpes=1: train.stpes: unknown key (did you mean \"steps\"?)");
  CHECK(error_of(job, {"steps=1"}) ==
        "--set steps=1: expected table.key=value (e.g. train.batch=8)");
  CHECK(error_of(job, {"worker.env.A=1"}).find("one table and one key") != std::string::npos);
}

TEST_CASE("overrides go through the isolated probe too (load_job_config)") {
  const TempJobFile file("[model]\nn_layer = 1\n");
  const std::string& path = file.path;
  auto r = load_job_config(path, {"train.steps=11"});
  REQUIRE(r.ok());
  CHECK(r->train.steps == 11);
  auto bad = load_job_config(path, {"train.batch=-1"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message ==
        "--set train.batch=-1: train.batch: -1 is out of range (allowed 1..1048576)");
}

TEST_CASE("load_job_config: the digest of bytes already probed skips the probe, no other does") {
  const TempJobFile file("[job]\nrestarts = 2\n");
  const std::string& path = file.path;
  // A probe is a forked child, whose copy-on-write page faults show in RUSAGE_CHILDREN.
  auto child_faults = [] {
    rusage usage{};
    ::getrusage(RUSAGE_CHILDREN, &usage);
    return usage.ru_minflt;
  };
  long before = child_faults();
  auto probed = load_job_config(path);
  REQUIRE(probed.ok());
  CHECK(child_faults() > before);
  CHECK(probed->digest.size() == 32);

  before = child_faults();
  auto trusted = load_job_config(path, {}, probed->digest);
  REQUIRE(trusted.ok());
  CHECK(child_faults() == before);
  CHECK(trusted->job.restarts == 2);
  CHECK(trusted->digest == probed->digest);

  // Other bytes, or the same bytes with overrides, are not the bytes that were probed.
  auto with_override = load_job_config(path, {"job.restarts=3"}, probed->digest);
  REQUIRE(with_override.ok());
  CHECK(with_override->digest != probed->digest);
  CHECK(child_faults() > before);
  before = child_faults();
  std::ofstream(path) << "[job]\nrestarts = 4\n";
  auto changed = load_job_config(path, {}, probed->digest);
  REQUIRE(changed.ok());
  CHECK(changed->job.restarts == 4);
  CHECK(child_faults() > before);
}

TEST_CASE("describe names the model and the training when there is a [model]") {
  auto r = parse_job_config("[model]\nn_layer = 2\n[train]\nsteps = 30\n", "job.toml");
  REQUIRE(r.ok());
  const std::string text = describe(*r);
  CHECK(text.find("model      gpt2: 2 layers, n_embd 64, 4 heads, block 64, vocab from the data") !=
        std::string::npos);
  CHECK(text.find("train      30 steps of batch 4 x seq 64, fp32, data text") != std::string::npos);
}
