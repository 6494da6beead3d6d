#include "reader.hpp"

#include <limits>

namespace topolaunch::jobspec::detail {
namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + cost});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

const std::vector<TableSchema>& schema() {
  static const std::vector<TableSchema> tables{
      {"",
       {"job", "mapping", "budget", "rdma", "wireup", "worker", "observe", "cost", "model", "data",
        "train"}},
      {"job",
       {"name", "nodes", "ranks_per_node", "restarts", "heartbeat_timeout", "progress_timeout",
        "stop_grace", "job_dir", "checkpoint_dir", "start"}},
      {"mapping",
       {"policy", "ranks_per_gpu", "gpus_per_rank", "oversubscribe", "tensor", "pipeline", "data",
        "pin_nics", "bind_memory", "topology_conf", "explicit"}},
      {"mapping.explicit", {"rank", "node", "gpus", "cpus", "nics"}},
      {"budget", {"memory", "gpu_memory", "comm_per_step", "comm_exposed_per_step"}},
      {"rdma",
       {"nics", "preflight", "gpudirect", "min_bandwidth_gbps", "max_latency",
        "preflight_timeout"}},
      {"wireup", {"backend", "port", "timeout"}},
      {"worker", {"command", "env"}},
      {"observe", {"trace_steps", "metrics_port", "peak_tflops_per_rank"}},
      {"cost", {"gpu_hour", "core_hour"}},
      {"model",
       {"kind", "n_layer", "n_embd", "n_head", "n_kv_head", "ffn_hidden", "rope_theta",
        "block_size", "vocab_size", "padded_vocab", "hidden"}},
      {"data", {"kind", "path", "val_path", "tokenizer"}},
      {"train",
       {"batch",
        "seq_len",
        "steps",
        "learning_rate",
        "beta1",
        "beta2",
        "epsilon",
        "weight_decay",
        "grad_clip",
        "warmup_steps",
        "min_lr_fraction",
        "seed",
        "grad_accum",
        "log_every",
        "checkpoint_every",
        "checkpoint_dir",
        "keep_checkpoints",
        "checkpoint_async",
        "resume",
        "metrics_file",
        "precision",
        "shard",
        "offload",
        "host_link_gbytes_per_s",
        "link_gbytes_per_s",
        "collective_latency_us",
        "compute_gflops",
        "val_every",
        "val_batches",
        "init_from"}},
  };
  return tables;
}

const TableSchema* find_table(std::string_view table) {
  for (const auto& t : schema()) {
    if (t.table == table) return &t;
  }
  return nullptr;
}

std::string did_you_mean(std::string_view table, std::string_view key) {
  const TableSchema* own = find_table(table);
  if (own != nullptr) {
    std::string_view best;
    std::size_t best_distance = std::numeric_limits<std::size_t>::max();
    for (std::string_view known : own->keys) {
      std::size_t d = edit_distance(key, known);
      if (d < best_distance) best_distance = d, best = known;
    }
    if (best_distance <= std::max<std::size_t>(2, key.size() / 3)) {
      return fmt::format(" (did you mean \"{}\"?)", best);
    }
  }
  for (const auto& t : schema()) {
    if (t.table == table || t.table.empty()) continue;
    if (std::find(t.keys.begin(), t.keys.end(), key) != t.keys.end()) {
      return fmt::format(" (it belongs in [{}])", t.table);
    }
  }
  if (own != nullptr) {
    std::string list;
    for (std::string_view known : own->keys)
      list += (list.empty() ? "" : ", ") + std::string(known);
    return fmt::format(" (known keys: {})", list);
  }
  return "";
}

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

std::string Reader::where(const toml::source_region& source) const {
  if (source.path != nullptr && *source.path != path_) return *source.path;
  if (source.begin.line == 0) return path_;  // a table that only an override created
  return fmt::format("{}:{}:{}", path_, source.begin.line, source.begin.column);
}

void Reader::check_keys(const toml::table& table, std::string_view table_name) {
  const TableSchema* own = find_table(table_name);
  for (auto&& [key, value] : table) {
    if (failed()) return;
    if (std::find(own->keys.begin(), own->keys.end(), key.str()) != own->keys.end()) continue;
    std::string dotted =
        table_name.empty() ? std::string(key.str()) : fmt::format("{}.{}", table_name, key.str());
    const bool is_table = table_name.empty() && value.is_table();
    fail(key.source(), dotted,
         fmt::format("unknown {}{}", is_table ? "table" : "key",
                     did_you_mean(table_name, key.str())));
  }
}

void Reader::string(const toml::table& t, std::string_view prefix, std::string_view key,
                    std::string& out, std::string_view example) {
  const toml::node* node = get(t, key);
  if (node == nullptr) return;
  std::string dotted = fmt::format("{}.{}", prefix, key);
  if (!node->is_string()) return type_error(*node, dotted, "a string", example);
  out = node->as_string()->get();
}

void Reader::boolean(const toml::table& t, std::string_view prefix, std::string_view key,
                     bool& out) {
  const toml::node* node = get(t, key);
  if (node == nullptr) return;
  std::string dotted = fmt::format("{}.{}", prefix, key);
  if (!node->is_boolean()) return type_error(*node, dotted, "true or false", "true");
  out = node->as_boolean()->get();
}

void Reader::number(const toml::table& t, std::string_view prefix, std::string_view key,
                    double& out, double min, double max) {
  const toml::node* node = get(t, key);
  if (node == nullptr) return;
  std::string dotted = fmt::format("{}.{}", prefix, key);
  double v = 0;
  if (node->is_integer()) {
    v = static_cast<double>(node->as_integer()->get());
  } else if (node->is_floating_point()) {
    v = node->as_floating_point()->get();
  } else {
    return type_error(*node, dotted, "a number", "100");
  }
  if (!(v >= min && v <= max)) {
    return fail(node->source(), dotted,
                fmt::format("{} is out of range (allowed {}..{})", v, min, max));
  }
  out = v;
}

void Reader::size(const toml::table& t, std::string_view prefix, std::string_view key,
                  std::uint64_t& out, std::uint64_t max) {
  const toml::node* node = get(t, key);
  if (node == nullptr) return;
  std::string dotted = fmt::format("{}.{}", prefix, key);
  std::uint64_t bytes = 0;
  if (node->is_integer()) {
    std::int64_t v = node->as_integer()->get();
    if (v < 0) return fail(node->source(), dotted, fmt::format("{} is negative", v));
    bytes = static_cast<std::uint64_t>(v);
  } else if (node->is_string()) {
    auto parsed = parse_size_bytes(node->as_string()->get());
    if (!parsed) return fail(node->source(), dotted, parsed.error().message);
    bytes = *parsed;
  } else {
    return type_error(*node, dotted, "a size", "\"16GiB\"");
  }
  if (bytes > max) {
    return fail(
        node->source(), dotted,
        fmt::format("{} is absurdly large (at most {})", format_size(bytes), format_size(max)));
  }
  out = bytes;
}

const toml::table* Reader::table(const toml::table& t, std::string_view prefix,
                                 std::string_view key) {
  const toml::node* node = get(t, key);
  if (node == nullptr) return nullptr;
  std::string dotted = prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
  if (!node->is_table()) {
    type_error(*node, dotted, "a table", fmt::format("[{}]", dotted));
    return nullptr;
  }
  return node->as_table();
}

}  // namespace topolaunch::jobspec::detail
