// Job config: TOML -> JobConfig, with one precise error line for the first problem found.
// toml++ is used with exceptions off so nothing can escape into the SPANK plugin.
// Header-only and exceptions off in this file only: Debian's pkg-config asks for the shared
// library (TOML_HEADER_ONLY=0), which is built with exceptions; toml++ keeps the two ABIs apart.
#undef TOML_HEADER_ONLY
#undef TOML_SHARED_LIB
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "topolaunch/common/isolated.hpp"
#include "topolaunch/jobspec/toml_guard.hpp"
#include "topolaunch/launcher/job_config.hpp"
#include "topolaunch/launcher/units.hpp"

namespace topolaunch::launcher {
namespace {

using namespace std::chrono_literals;

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

// The schema: which keys each table knows (for "unknown key" and "did you mean").
struct TableSchema {
  std::string_view table;
  std::vector<std::string_view> keys;
};
const std::vector<TableSchema>& schema() {
  static const std::vector<TableSchema> tables{
      {"", {"job", "mapping", "budget", "rdma", "wireup", "worker", "model", "data", "train"}},
      {"job",
       {"name", "nodes", "ranks_per_node", "restarts", "heartbeat_timeout", "stop_grace", "job_dir",
        "checkpoint_dir"}},
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
  };
  return tables;
}

std::string did_you_mean(std::string_view table, std::string_view key) {
  const TableSchema* own = nullptr;
  for (const auto& t : schema()) {
    if (t.table == table) own = &t;
  }
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

// Reads one table. After the first error every call is a no-op, so parsing code reads straight.
class Reader {
 public:
  Reader(const std::string& path, std::optional<Error>& first_error)
      : path_(path), error_(first_error) {}

  bool failed() const { return error_.has_value(); }

  std::string where(const toml::source_region& source) const {
    return fmt::format("{}:{}:{}", path_, source.begin.line, source.begin.column);
  }

  void fail(const toml::source_region& source, std::string_view key, std::string_view what) {
    if (!error_) error_ = make_error(fmt::format("{}: {}: {}", where(source), key, what));
  }

  // Refuses keys the schema does not know.
  void check_keys(const toml::table& table, std::string_view table_name) {
    const TableSchema* own = nullptr;
    for (const auto& t : schema()) {
      if (t.table == table_name) own = &t;
    }
    for (auto&& [key, value] : table) {
      if (failed()) return;
      if (std::find(own->keys.begin(), own->keys.end(), key.str()) != own->keys.end()) continue;
      std::string dotted =
          table_name.empty() ? std::string(key.str()) : fmt::format("{}.{}", table_name, key.str());
      fail(key.source(), dotted, fmt::format("unknown key{}", did_you_mean(table_name, key.str())));
    }
  }

  // The node at `key` when present and of the wanted kind.
  const toml::node* get(const toml::table& table, std::string_view, std::string_view key) {
    if (failed()) return nullptr;
    return table.get(key);
  }

  void type_error(const toml::node& node, std::string_view dotted, std::string_view expected,
                  std::string_view example) {
    fail(node.source(), dotted,
         fmt::format("expected {}, got {} (e.g. {} = {})", expected, type_name(node),
                     dotted.substr(dotted.rfind('.') + 1), example));
  }

  void string(const toml::table& t, std::string_view prefix, std::string_view key, std::string& out,
              std::string_view example = "\"...\"") {
    const toml::node* node = get(t, prefix, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    if (!node->is_string()) return type_error(*node, dotted, "a string", example);
    out = node->as_string()->get();
  }

  void integer(const toml::table& t, std::string_view prefix, std::string_view key, int& out,
               std::int64_t min, std::int64_t max) {
    const toml::node* node = get(t, prefix, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    if (!node->is_integer()) {
      return type_error(*node, dotted, "an integer",
                        std::to_string(std::max<std::int64_t>(min, 1)));
    }
    std::int64_t v = node->as_integer()->get();
    if (v < min || v > max) {
      return fail(node->source(), dotted,
                  fmt::format("{} is out of range (allowed {}..{})", v, min, max));
    }
    out = static_cast<int>(v);
  }

  void boolean(const toml::table& t, std::string_view prefix, std::string_view key, bool& out) {
    const toml::node* node = get(t, prefix, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    if (!node->is_boolean()) return type_error(*node, dotted, "true or false", "true");
    out = node->as_boolean()->get();
  }

  void number(const toml::table& t, std::string_view prefix, std::string_view key, double& out,
              double min, double max) {
    const toml::node* node = get(t, prefix, key);
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

  // Sizes: "16GiB" strings, or an integer number of bytes.
  void size(const toml::table& t, std::string_view prefix, std::string_view key, std::uint64_t& out,
            std::uint64_t max) {
    const toml::node* node = get(t, prefix, key);
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

  template <class Duration>
  void duration(const toml::table& t, std::string_view prefix, std::string_view key, Duration& out,
                std::chrono::microseconds min, std::chrono::microseconds max) {
    const toml::node* node = get(t, prefix, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    if (!node->is_string()) return type_error(*node, dotted, "a duration", "\"90s\"");
    auto parsed = parse_duration(node->as_string()->get());
    if (!parsed) return fail(node->source(), dotted, parsed.error().message);
    if (*parsed < min || *parsed > max) {
      return fail(node->source(), dotted,
                  fmt::format("{} is out of range (allowed {}..{})", format_duration(*parsed),
                              format_duration(min), format_duration(max)));
    }
    out = std::chrono::duration_cast<Duration>(*parsed);
  }

  // One of a fixed set of words.
  template <class Enum>
  void choice(const toml::table& t, std::string_view prefix, std::string_view key, Enum& out,
              const std::vector<std::pair<std::string_view, Enum>>& words) {
    const toml::node* node = get(t, prefix, key);
    if (node == nullptr) return;
    std::string dotted = fmt::format("{}.{}", prefix, key);
    std::string list;
    for (const auto& [word, value] : words)
      list += (list.empty() ? "\"" : ", \"") + std::string(word) + "\"";
    if (!node->is_string())
      return type_error(*node, dotted, fmt::format("one of {}", list),
                        "\"" + std::string(words[0].first) + "\"");
    std::string_view text = node->as_string()->get();
    for (const auto& [word, value] : words) {
      if (word == text) {
        out = value;
        return;
      }
    }
    fail(node->source(), dotted, fmt::format("\"{}\" is not one of {}", text, list));
  }

  // A sub-table; absent = nullptr; present but not a table = error.
  const toml::table* table(const toml::table& t, std::string_view prefix, std::string_view key) {
    const toml::node* node = get(t, prefix, key);
    if (node == nullptr) return nullptr;
    std::string dotted = prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
    if (!node->is_table()) {
      type_error(*node, dotted, "a table", fmt::format("[{}]", dotted));
      return nullptr;
    }
    return node->as_table();
  }

 private:
  const std::string& path_;
  std::optional<Error>& error_;
};

bool valid_job_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

constexpr std::uint64_t kTiB = std::uint64_t{1} << 40;

void read_job(Reader& r, const toml::table& t, JobSection& job) {
  r.check_keys(t, "job");
  r.string(t, "job", "name", job.name, "\"gpt2-124m\"");
  if (!r.failed() && !valid_job_name(job.name)) {
    r.fail(t.get("name")->source(), "job.name",
           fmt::format("\"{}\" is not a job name (1-64 of A-Z a-z 0-9 . _ -)", job.name));
  }
  r.integer(t, "job", "nodes", job.nodes, 0, 100'000);
  r.integer(t, "job", "ranks_per_node", job.ranks_per_node, 0, 4096);
  r.integer(t, "job", "restarts", job.restarts, 0, 1000);
  r.duration(t, "job", "heartbeat_timeout", job.heartbeat_timeout, 0s, 7 * 24h);
  if (!r.failed() && job.heartbeat_timeout.count() != 0 && job.heartbeat_timeout < 100ms) {
    r.fail(t.get("heartbeat_timeout")->source(), "job.heartbeat_timeout",
           "must be \"0s\" (off) or at least \"100ms\"");
  }
  r.duration(t, "job", "stop_grace", job.stop_grace, 0s, 1h);
  r.string(t, "job", "job_dir", job.job_dir, "\"runs/gpt2\"");
  r.string(t, "job", "checkpoint_dir", job.checkpoint_dir, "\"/scratch/ckpt\"");
}

void read_explicit_rows(Reader& r, const toml::node& node, topology::MappingSpec& spec) {
  if (!node.is_array()) {
    return r.type_error(node, "mapping.explicit", "an array of tables", "[[mapping.explicit]]");
  }
  std::set<int> seen;
  for (const toml::node& row_node : *node.as_array()) {
    if (r.failed()) return;
    if (!row_node.is_table()) {
      return r.type_error(row_node, "mapping.explicit", "an array of tables",
                          "[[mapping.explicit]]");
    }
    const toml::table& row = *row_node.as_table();
    r.check_keys(row, "mapping.explicit");
    topology::ExplicitRank rank;
    rank.source_line = static_cast<int>(row.source().begin.line);
    r.integer(row, "mapping.explicit", "rank", rank.rank, 0, 1'000'000);
    r.integer(row, "mapping.explicit", "node", rank.node, 0, 100'000);
    if (r.failed()) return;
    if (!row.contains("rank") || !row.contains("node")) {
      return r.fail(row.source(), "mapping.explicit", "each row needs rank and node");
    }
    if (!seen.insert(rank.rank).second) {
      return r.fail(row.get("rank")->source(), "mapping.explicit.rank",
                    fmt::format("rank {} appears twice", rank.rank));
    }
    if (const toml::node* gpus = row.get("gpus")) {
      if (!gpus->is_array())
        return r.type_error(*gpus, "mapping.explicit.gpus", "an array", "[0, 1]");
      for (const toml::node& g : *gpus->as_array()) {
        if (!g.is_integer() || g.as_integer()->get() < 0 || g.as_integer()->get() > 1024) {
          return r.fail(g.source(), "mapping.explicit.gpus", "expected GPU indexes 0..1024");
        }
        rank.gpus.push_back(static_cast<int>(g.as_integer()->get()));
      }
    }
    std::string cpus;
    r.string(row, "mapping.explicit", "cpus", cpus, "\"0-15\"");
    if (!r.failed() && row.contains("cpus")) {
      rank.cpus = topology::CpuSet::parse_list(cpus);
      if (!rank.cpus || rank.cpus->empty()) {
        return r.fail(row.get("cpus")->source(), "mapping.explicit.cpus",
                      fmt::format("\"{}\" is not a CPU list (e.g. \"0-15,32-47\")", cpus));
      }
    }
    if (const toml::node* nics = row.get("nics")) {
      if (!nics->is_array())
        return r.type_error(*nics, "mapping.explicit.nics", "an array", "[\"mlx5_0\"]");
      for (const toml::node& n : *nics->as_array()) {
        if (!n.is_string())
          return r.fail(n.source(), "mapping.explicit.nics", "expected NIC names");
        rank.nics.emplace_back(n.as_string()->get());
      }
    }
    spec.explicit_ranks.push_back(std::move(rank));
  }
  if (r.failed()) return;
  for (int i = 0; i < static_cast<int>(seen.size()); ++i) {
    if (!seen.contains(i)) {
      return r.fail(
          node.source(), "mapping.explicit",
          fmt::format("ranks must be 0..{} without gaps; rank {} is missing", seen.size() - 1, i));
    }
  }
}

void read_mapping(Reader& r, const toml::table& t, topology::MappingSpec& spec) {
  using topology::MappingPolicy;
  r.check_keys(t, "mapping");
  r.choice<MappingPolicy>(t, "mapping", "policy", spec.policy,
                          {{"auto", MappingPolicy::automatic},
                           {"block", MappingPolicy::block},
                           {"cyclic", MappingPolicy::cyclic},
                           {"explicit", MappingPolicy::explicit_table}});
  r.integer(t, "mapping", "ranks_per_gpu", spec.ranks_per_gpu, 1, 64);
  r.integer(t, "mapping", "gpus_per_rank", spec.gpus_per_rank, 1, 64);
  r.boolean(t, "mapping", "oversubscribe", spec.allow_oversubscribe);
  r.integer(t, "mapping", "tensor", spec.tensor, 1, 4096);
  r.integer(t, "mapping", "pipeline", spec.pipeline, 1, 4096);
  r.integer(t, "mapping", "data", spec.data, 0, 1'000'000);
  r.boolean(t, "mapping", "pin_nics", spec.pin_nics);
  r.boolean(t, "mapping", "bind_memory", spec.bind_memory);
  r.string(t, "mapping", "topology_conf", spec.topology_conf, "\"/etc/slurm/topology.conf\"");
  if (r.failed()) return;
  if (spec.ranks_per_gpu > 1 && spec.gpus_per_rank > 1) {
    return r.fail(t.get("gpus_per_rank")->source(), "mapping.gpus_per_rank",
                  "ranks_per_gpu and gpus_per_rank cannot both be above 1");
  }
  if (const toml::node* rows = t.get("explicit")) read_explicit_rows(r, *rows, spec);
  if (r.failed()) return;
  bool is_explicit = spec.policy == MappingPolicy::explicit_table;
  if (is_explicit && spec.explicit_ranks.empty()) {
    return r.fail(t.get("policy")->source(), "mapping.policy",
                  "\"explicit\" needs [[mapping.explicit]] rows (rank, node, gpus)");
  }
  if (!is_explicit && !spec.explicit_ranks.empty()) {
    return r.fail(t.get("explicit")->source(), "mapping.explicit",
                  "rows are only used with policy = \"explicit\"");
  }
}

void read_budget(Reader& r, const toml::table& t, BudgetSection& budget) {
  r.check_keys(t, "budget");
  r.size(t, "budget", "memory", budget.memory_bytes_per_rank, 64 * kTiB);
  if (!r.failed() && t.contains("memory") && budget.memory_bytes_per_rank < (1u << 20)) {
    r.fail(t.get("memory")->source(), "budget.memory",
           fmt::format("{} is too small for any process (at least 1MiB, or 0 for no budget)",
                       format_size(budget.memory_bytes_per_rank)));
  }
  r.size(t, "budget", "gpu_memory", budget.gpu_memory_bytes_per_rank, 4 * kTiB);
  r.size(t, "budget", "comm_per_step", budget.comm_bytes_per_step, 1024 * kTiB);
  r.duration(t, "budget", "comm_exposed_per_step", budget.comm_exposed_time_per_step, 0s, 24h);
}

void read_rdma(Reader& r, const toml::table& t, RdmaSection& rdma) {
  r.check_keys(t, "rdma");
  r.string(t, "rdma", "nics", rdma.nics_text, "\"mlx5_0,mlx5_1\"");
  if (!r.failed() && !rdma.nics_text.empty()) {
    auto filter = topology::NicFilter::parse(rdma.nics_text);
    if (!filter) return r.fail(t.get("nics")->source(), "rdma.nics", filter.error().message);
    rdma.nics = *filter;
  }
  r.choice<PreflightMode>(t, "rdma", "preflight", rdma.preflight,
                          {{"off", PreflightMode::off},
                           {"quick", PreflightMode::quick},
                           {"full", PreflightMode::full}});
  r.choice<GpuDirectPolicy>(t, "rdma", "gpudirect", rdma.gpudirect,
                            {{"auto", GpuDirectPolicy::automatic},
                             {"require", GpuDirectPolicy::require},
                             {"off", GpuDirectPolicy::off}});
  r.number(t, "rdma", "min_bandwidth_gbps", rdma.min_bandwidth_gbps, 0.0, 10'000.0);
  r.duration(t, "rdma", "max_latency", rdma.max_latency, 0s, 10s);
  r.duration(t, "rdma", "preflight_timeout", rdma.preflight_timeout, 1s, 1h);
}

void read_wireup(Reader& r, const toml::table& t, WireupSection& wireup) {
  r.check_keys(t, "wireup");
  r.choice<WireupBackend>(t, "wireup", "backend", wireup.backend,
                          {{"auto", WireupBackend::automatic},
                           {"tcp", WireupBackend::tcp},
                           {"pmix", WireupBackend::pmix},
                           {"pmi2", WireupBackend::pmi2}});
  r.integer(t, "wireup", "port", wireup.port, 0, 65535);
  if (!r.failed() && wireup.port != 0 && wireup.port < 1024) {
    r.fail(t.get("port")->source(), "wireup.port",
           fmt::format("{} is a privileged port (use 0 for any free port, or 1024..65535)",
                       wireup.port));
  }
  r.duration(t, "wireup", "timeout", wireup.timeout, 100ms, 24h);
}

void read_worker(Reader& r, const toml::table& t, WorkerSection& worker) {
  r.check_keys(t, "worker");
  if (const toml::node* command = t.get("command"); command && !r.failed()) {
    worker.command.clear();
    if (command->is_string()) {
      // A string is split on blanks (no shell quoting); use an array for arguments with spaces.
      std::istringstream words(std::string(command->as_string()->get()));
      for (std::string word; words >> word;) worker.command.push_back(word);
    } else if (command->is_array()) {
      for (const toml::node& word : *command->as_array()) {
        if (!word.is_string()) {
          return r.fail(word.source(), "worker.command",
                        fmt::format("expected strings, got {} (e.g. command = [\"python\", "
                                    "\"train.py\"])",
                                    type_name(word)));
        }
        worker.command.emplace_back(word.as_string()->get());
      }
    } else {
      return r.type_error(*command, "worker.command", "an array of strings",
                          "[\"python\", \"train.py\"]");
    }
    if (worker.command.empty() || worker.command[0].empty()) {
      return r.fail(command->source(), "worker.command", "is empty (name a program)");
    }
  }
  if (const toml::table* env = r.table(t, "worker", "env")) {
    for (auto&& [key, value] : *env) {
      std::string dotted = fmt::format("worker.env.{}", key.str());
      if (!value.is_string()) {
        return r.fail(value.source(), dotted,
                      fmt::format("expected a string, got {} (quote it: {} = \"...\")",
                                  type_name(value), key.str()));
      }
      if (key.str().empty() || key.str().find('=') != std::string_view::npos) {
        return r.fail(key.source(), dotted, "is not an environment variable name");
      }
      worker.env[std::string(key.str())] = value.as_string()->get();
    }
  }
}

std::string serialize_table(const toml::table& t) {
  std::ostringstream out;
  out << t;
  return out.str();
}

}  // namespace

Result<JobConfig> parse_job_config(std::string_view toml_text, const std::string& path) {
  if (Status guarded = jobspec::check_toml_text(toml_text, path); !guarded) return guarded.error();
  toml::parse_result parsed = toml::parse(toml_text, path);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    std::string what(e.description());
    return make_error(fmt::format("{}:{}:{}: TOML syntax error: {}", path, e.source().begin.line,
                                  e.source().begin.column, what));
  }
  const toml::table& root = parsed.table();
  JobConfig config;
  config.path = path;
  std::optional<Error> first_error;
  Reader r(path, first_error);
  r.check_keys(root, "");
  if (const toml::table* t = r.table(root, "", "job")) read_job(r, *t, config.job);
  if (const toml::table* t = r.table(root, "", "mapping")) read_mapping(r, *t, config.mapping);
  if (const toml::table* t = r.table(root, "", "budget")) read_budget(r, *t, config.budget);
  if (const toml::table* t = r.table(root, "", "rdma")) read_rdma(r, *t, config.rdma);
  if (const toml::table* t = r.table(root, "", "wireup")) read_wireup(r, *t, config.wireup);
  if (const toml::table* t = r.table(root, "", "worker")) read_worker(r, *t, config.worker);
  if (const toml::table* t = r.table(root, "", "model")) config.model_toml = serialize_table(*t);
  if (const toml::table* t = r.table(root, "", "data")) config.data_toml = serialize_table(*t);
  if (const toml::table* t = r.table(root, "", "train")) config.train_toml = serialize_table(*t);
  if (first_error) return *first_error;
  config.mapping.ranks_per_node = config.job.ranks_per_node;
  config.mapping.nics = config.rdma.nics;
  return config;
}

Result<JobConfig> parse_job_config_isolated(std::string_view toml_text, const std::string& path,
                                            const IsolationLimits& limits) {
  const Status probed = run_isolated(
      [&]() -> Status {
        auto config = parse_job_config(toml_text, path);
        if (!config) return config.error();
        return ok_status();
      },
      limits, path);
  if (!probed) return probed.error();
  return parse_job_config(toml_text, path);
}

Result<JobConfig> load_job_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(fmt::format("{}: cannot read the job config (check the path)", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(fmt::format("{}: cannot read the job config", path));
  return parse_job_config_isolated(text.str(), path);
}

std::string_view to_string(PreflightMode mode) {
  switch (mode) {
    case PreflightMode::off:
      return "off";
    case PreflightMode::quick:
      return "quick";
    case PreflightMode::full:
      return "full";
  }
  return "?";
}

std::string_view to_string(GpuDirectPolicy policy) {
  switch (policy) {
    case GpuDirectPolicy::automatic:
      return "auto";
    case GpuDirectPolicy::require:
      return "require";
    case GpuDirectPolicy::off:
      return "off";
  }
  return "?";
}

std::string_view to_string(WireupBackend backend) {
  switch (backend) {
    case WireupBackend::automatic:
      return "auto";
    case WireupBackend::tcp:
      return "tcp";
    case WireupBackend::pmix:
      return "pmix";
    case WireupBackend::pmi2:
      return "pmi2";
  }
  return "?";
}

std::string describe(const JobConfig& c) {
  auto or_default = [](const std::string& s, std::string_view fallback) {
    return s.empty() ? std::string(fallback) : s;
  };
  auto count = [](int n, std::string_view zero) {
    return n == 0 ? std::string(zero) : std::to_string(n);
  };
  auto budget = [](std::uint64_t b) { return b == 0 ? std::string("none") : format_size(b); };
  std::string out;
  out += fmt::format(
      "job        {}: nodes {}, ranks/node {}, restarts {}, heartbeat {}\n", c.job.name,
      count(c.job.nodes, "all"), count(c.job.ranks_per_node, "auto"), c.job.restarts,
      c.job.heartbeat_timeout.count() == 0 ? "off" : format_duration(c.job.heartbeat_timeout));
  out +=
      fmt::format("job dir    {}\n", or_default(c.job.job_dir, "topolaunch-jobs/<name>-<run id>"));
  out +=
      fmt::format("budget     memory/rank {}, gpu memory/rank {}, comm/step {}\n",
                  budget(c.budget.memory_bytes_per_rank),
                  budget(c.budget.gpu_memory_bytes_per_rank), budget(c.budget.comm_bytes_per_step));
  out += fmt::format("rdma       nics {}, preflight {}, gpudirect {}\n",
                     or_default(c.rdma.nics_text, "all"), to_string(c.rdma.preflight),
                     to_string(c.rdma.gpudirect));
  out += fmt::format("wireup     {}, port {}\n", to_string(c.wireup.backend),
                     c.wireup.port == 0 ? std::string("any") : std::to_string(c.wireup.port));
  std::string command;
  for (const auto& word : c.worker.command) command += (command.empty() ? "" : " ") + word;
  out += fmt::format("worker     {}{}\n", command,
                     c.model_toml.empty() ? "" : " (with [model] table)");
  return out;
}

}  // namespace topolaunch::launcher
