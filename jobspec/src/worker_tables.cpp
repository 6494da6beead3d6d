// The built-in worker's tables: [model] [data] [train]. Unknown keys are errors (a typo must not
// silently train a different model); every structural check that needs no data is made here.
#include <limits>

#include "tables.hpp"

namespace topolaunch::jobspec::detail {
namespace {

// Generous limits: they catch a sign or an exponent typed wrong, not a large model.
constexpr std::int64_t kMaxLayers = 4096;
constexpr std::int64_t kMaxWidth = std::int64_t{1} << 20;    // n_embd, hidden widths
constexpr std::int64_t kMaxContext = std::int64_t{1} << 24;  // block_size, seq_len
constexpr std::int64_t kMaxVocab = std::int64_t{1} << 31;
constexpr std::int64_t kMaxBatch = std::int64_t{1} << 20;
constexpr std::int64_t kMaxSteps = std::int64_t{1} << 40;
constexpr double kHuge = std::numeric_limits<double>::max();

}  // namespace

void read_model(Reader& r, const toml::table& t, ModelSpec& model) {
  r.check_keys(t, "model");
  r.choice<ModelKind>(
      t, "model", "kind", model.kind,
      {{"gpt2", ModelKind::gpt2}, {"llama", ModelKind::llama}, {"mlp", ModelKind::mlp}});
  r.integer(t, "model", "n_layer", model.n_layer, 1, kMaxLayers);
  r.integer(t, "model", "n_embd", model.n_embd, 1, kMaxWidth);
  r.integer(t, "model", "n_head", model.n_head, 1, kMaxWidth);
  r.integer(t, "model", "n_kv_head", model.n_kv_head, 0, kMaxWidth);
  r.integer(t, "model", "ffn_hidden", model.ffn_hidden, 0, kMaxWidth);
  r.number(t, "model", "rope_theta", model.rope_theta, 1.0, 1e12);
  r.integer(t, "model", "block_size", model.block_size, 1, kMaxContext);
  if (t.contains("vocab_size")) {
    std::int64_t vocab = 0;
    r.integer(t, "model", "vocab_size", vocab, 1, kMaxVocab);
    model.vocab_size = vocab;
  }
  r.integer(t, "model", "padded_vocab", model.padded_vocab, 0, kMaxVocab);
  if (const toml::node* hidden = t.get("hidden"); hidden != nullptr && !r.failed()) {
    if (!hidden->is_array()) {
      return r.type_error(*hidden, "model.hidden", "an array of layer widths", "[256, 256]");
    }
    model.hidden.clear();
    for (const toml::node& width : *hidden->as_array()) {
      if (!width.is_integer() || width.as_integer()->get() < 1 ||
          width.as_integer()->get() > kMaxWidth) {
        return r.fail(width.source(), "model.hidden",
                      fmt::format("expected layer widths 1..{}", kMaxWidth));
      }
      model.hidden.push_back(width.as_integer()->get());
    }
  }
  if (r.failed()) return;
  if (model.kind != ModelKind::mlp && model.n_embd % model.n_head != 0) {
    r.fail_at(t, "model", t.contains("n_embd") ? "n_embd" : "n_head",
              fmt::format("{} is not divisible by model.n_head = {} (choose n_embd as a multiple "
                          "of n_head)",
                          model.n_embd, model.n_head));
    return;
  }
  if (model.kind != ModelKind::llama) {
    for (const char* key : {"n_kv_head", "ffn_hidden", "rope_theta"}) {
      if (t.contains(key)) {
        r.fail_at(t, "model", key,
                  fmt::format("is a key of model.kind = \"llama\", not of \"{}\"",
                              model.kind == ModelKind::gpt2 ? "gpt2" : "mlp"));
        return;
      }
    }
  } else {
    if (model.n_kv_head == 0) model.n_kv_head = model.n_head;
    if (model.n_head % model.n_kv_head != 0) {
      r.fail_at(t, "model", "n_kv_head",
                fmt::format("{} does not divide model.n_head = {} (each key/value head serves "
                            "n_head / n_kv_head query heads)",
                            model.n_kv_head, model.n_head));
      return;
    }
    if ((model.n_embd / model.n_head) % 2 != 0) {
      r.fail_at(t, "model", t.contains("n_head") ? "n_head" : "n_embd",
                fmt::format("the head size n_embd / n_head = {} is odd (rotary embeddings rotate "
                            "channel pairs)",
                            model.n_embd / model.n_head));
      return;
    }
  }
  if (model.vocab_size && model.padded_vocab != 0 && model.padded_vocab < *model.vocab_size) {
    r.fail_at(t, "model", "padded_vocab",
              fmt::format("{} is smaller than model.vocab_size = {}", model.padded_vocab,
                          *model.vocab_size));
  }
}

void read_data(Reader& r, const toml::table& t, DataSpec& data) {
  r.check_keys(t, "data");
  r.choice<DataKind>(t, "data", "kind", data.kind,
                     {{"text", DataKind::text},
                      {"janeaustenr", DataKind::janeaustenr},
                      {"tokens", DataKind::tokens}});
  r.string(t, "data", "path", data.path, "\"data/austen.txt\"");
  if (data.path.empty() && data.kind == DataKind::janeaustenr) data.path = kJaneAustenRdb;
  r.string(t, "data", "val_path", data.val_path, "\"data/austen/val.bin\"");
  r.string(t, "data", "tokenizer", data.tokenizer, "\"data/austen/tokenizer.model\"");
  if (r.failed()) return;
  if (data.kind != DataKind::tokens) {
    for (const char* key : {"val_path", "tokenizer"}) {
      if (t.contains(key)) {
        r.fail_at(t, "data", key,
                  "needs data.kind = \"tokens\" (`topolaunch-worker data prepare` writes the "
                  "token files and the tokenizer)");
        return;
      }
    }
  }
}

void read_train(Reader& r, const toml::table& t, TrainSpec& train) {
  r.check_keys(t, "train");
  r.integer(t, "train", "batch", train.batch, 1, kMaxBatch);
  r.integer(t, "train", "seq_len", train.seq_len, 1, kMaxContext);
  r.integer(t, "train", "steps", train.steps, 0, kMaxSteps);
  AdamWSpec& a = train.adamw;
  r.number(t, "train", "learning_rate", a.learning_rate, 0.0, 1e3);
  r.number(t, "train", "beta1", a.beta1, 0.0, 1.0);
  r.number(t, "train", "beta2", a.beta2, 0.0, 1.0);
  r.number(t, "train", "epsilon", a.epsilon, 0.0, 1.0);
  r.number(t, "train", "weight_decay", a.weight_decay, 0.0, 1e3);
  r.number(t, "train", "grad_clip", a.grad_clip, -kHuge, kHuge);
  r.integer(t, "train", "warmup_steps", train.warmup_steps, 0, kMaxSteps);
  r.number(t, "train", "min_lr_fraction", train.min_lr_fraction, 0.0, 1.0);
  r.integer(t, "train", "seed", train.seed, 0, std::numeric_limits<std::int64_t>::max());
  r.integer(t, "train", "grad_accum", train.grad_accum, 0, 1 << 16);
  r.integer(t, "train", "log_every", train.log_every, 0, std::numeric_limits<int>::max());
  if (train.log_every == 0) train.log_every = 1;
  r.integer(t, "train", "checkpoint_every", train.checkpoint_every, 0,
            std::numeric_limits<int>::max());
  r.string(t, "train", "checkpoint_dir", train.checkpoint_dir, "\"checkpoints\"");
  if (!r.failed() && train.checkpoint_dir.empty()) {
    r.fail_at(t, "train", "checkpoint_dir", "is empty (name a folder, e.g. \"checkpoints\")");
  }
  r.integer(t, "train", "keep_checkpoints", train.keep_checkpoints, 1, 10000);
  r.boolean(t, "train", "checkpoint_async", train.checkpoint_async);
  r.boolean(t, "train", "resume", train.resume);
  r.string(t, "train", "metrics_file", train.metrics_file, "\"metrics.jsonl\"");
  r.choice<TrainPrecision>(t, "train", "precision", train.precision,
                           {{"fp32", TrainPrecision::fp32},
                            {"bf16", TrainPrecision::bf16},
                            {"fp8", TrainPrecision::fp8}});
  r.choice<ShardSetting>(t, "train", "shard", train.shard,
                         {{"none", ShardSetting::none},
                          {"optimizer", ShardSetting::optimizer},
                          {"gradients", ShardSetting::gradients},
                          {"parameters", ShardSetting::parameters},
                          {"auto", ShardSetting::automatic}});
  r.choice<OffloadSetting>(t, "train", "offload", train.offload,
                           {{"none", OffloadSetting::none},
                            {"optimizer", OffloadSetting::optimizer},
                            {"auto", OffloadSetting::automatic}});
  r.number(t, "train", "host_link_gbytes_per_s", train.host_link_gbytes_per_s, 0.0, 1e6);
  r.number(t, "train", "link_gbytes_per_s", train.link_gbytes_per_s, 0.0, 1e6);
  r.number(t, "train", "collective_latency_us", train.collective_latency_us, 0.0, 1e9);
  r.number(t, "train", "compute_gflops", train.compute_gflops, 0.0, 1e12);
  r.integer(t, "train", "val_every", train.val_every, 0, kMaxSteps);
  r.integer(t, "train", "val_batches", train.val_batches, 1, kMaxSteps);
  r.string(t, "train", "init_from", train.init_from, "\"exported/gpt2\"");
}

void check_model_and_train(Reader& r, const toml::table* model, const toml::table* train,
                           const ModelSpec& spec, const TrainSpec& train_spec) {
  if (r.failed() || model == nullptr) return;
  if (train != nullptr && !train_spec.init_from.empty() && spec.kind != ModelKind::gpt2) {
    r.fail_at(*train, "train", "init_from", "imports GPT-2 weights: needs model.kind = \"gpt2\"");
    return;
  }
  if (spec.kind != ModelKind::mlp && train_spec.seq_len > spec.block_size) {
    if (train != nullptr && train->contains("seq_len")) {
      r.fail_at(
          *train, "train", "seq_len",
          fmt::format("{} exceeds model.block_size = {}", train_spec.seq_len, spec.block_size));
    } else {
      r.fail_at(*model, "model", "block_size",
                fmt::format("{} is below train.seq_len = {}", spec.block_size, train_spec.seq_len));
    }
  }
}

}  // namespace topolaunch::jobspec::detail
