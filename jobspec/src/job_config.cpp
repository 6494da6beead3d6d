// Job file: TOML -> JobConfig, with one precise error line for the first problem found.
#include "topolaunch/jobspec/job_config.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "tables.hpp"
#include "topolaunch/common/digest.hpp"
#include "topolaunch/common/isolated.hpp"
#include "topolaunch/common/units.hpp"
#include "topolaunch/jobspec/toml_guard.hpp"

namespace topolaunch::jobspec {
namespace {

using detail::Reader;

std::string toml_basic_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// One "table.key=value" into the parsed file. The value keeps a source region whose path is the
// override itself, so a value refused later is reported as "--set table.key=value: ...".
// toml++'s error text quotes what it read ("expected 'true', saw 't<byte>'"), control bytes
// included: shown as \xNN so that the error stays one line.
std::string one_line(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

Status apply_override(toml::table& root, const std::string& text) {
  // One line: a newline would let the value open a table header (toml++ 3.3 aborts on some, see
  // toml_guard.hpp) and would split the error line that echoes it.
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) {
      return make_error(
          fmt::format("--set: control character {:#04x} in an override (expected "
                      "one line, table.key=value)",
                      c));
    }
  }
  const std::string origin = "--set " + text;
  const auto eq = text.find('=');
  const auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    return make_error(origin + ": expected table.key=value (e.g. train.batch=8)");
  }
  const std::string table = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1);
  if (key.empty() || key.find('.') != std::string::npos) {
    return make_error(origin + ": expected table.key=value with one table and one key");
  }
  const detail::TableSchema* schema = table.empty() ? nullptr : detail::find_table(table);
  if (schema == nullptr) {
    return make_error(
        fmt::format("{}: {}: unknown table{}", origin, table, detail::did_you_mean("", table)));
  }
  if (std::find(schema->keys.begin(), schema->keys.end(), key) == schema->keys.end()) {
    return make_error(fmt::format("{}: {}.{}: unknown key{}", origin, table, key,
                                  detail::did_you_mean(table, key)));
  }
  const std::string value = text.substr(eq + 1);
  if (Status guarded = check_toml_text("v = " + value, origin); !guarded) return guarded.error();
  toml::parse_result parsed = toml::parse("v = " + value, origin);
  if (!parsed) parsed = toml::parse("v = " + toml_basic_string(value), origin);  // a bare word
  if (!parsed) {
    return make_error(fmt::format("{}: the value is not TOML ({})", origin,
                                  one_line(parsed.error().description())));
  }
  if (!root.contains(table)) root.insert(table, toml::table{});
  toml::table* target = root.get(table)->as_table();
  if (target == nullptr) return make_error(fmt::format("{}: {} is not a table", origin, table));
  target->insert_or_assign(key, std::move(*parsed.table().get("v")));
  return ok_status();
}

}  // namespace

Result<JobConfig> parse_job_config(std::string_view toml_text, const std::string& path,
                                   const Overrides& overrides) {
  if (Status guarded = check_toml_text(toml_text, path); !guarded) return guarded.error();
  toml::parse_result parsed = toml::parse(toml_text, path);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    std::string what = one_line(e.description());
    return make_error(fmt::format("{}:{}:{}: TOML syntax error: {}", path, e.source().begin.line,
                                  e.source().begin.column, what));
  }
  toml::table& root = parsed.table();
  for (const std::string& text : overrides) {
    if (Status applied = apply_override(root, text); !applied) return applied.error();
  }
  JobConfig config;
  config.path = path;
  std::optional<Error> first_error;
  Reader r(path, first_error);
  r.check_keys(root, "");
  const toml::table* job = r.table(root, "", "job");
  if (job != nullptr) read_job(r, *job, config.job);
  const toml::table* mapping = r.table(root, "", "mapping");
  if (mapping != nullptr) read_mapping(r, *mapping, config.mapping);
  if (const toml::table* t = r.table(root, "", "budget")) read_budget(r, *t, config.budget);
  const toml::table* rdma = r.table(root, "", "rdma");
  if (rdma != nullptr) read_rdma(r, *rdma, config.rdma);
  if (const toml::table* t = r.table(root, "", "wireup")) read_wireup(r, *t, config.wireup);
  if (const toml::table* t = r.table(root, "", "worker")) read_worker(r, *t, config.worker);
  const toml::table* observe = r.table(root, "", "observe");
  if (observe != nullptr) read_observe(r, *observe, config.observe);
  if (const toml::table* t = r.table(root, "", "cost")) read_cost(r, *t, config.cost);
  const toml::table* model = r.table(root, "", "model");
  if (model != nullptr) read_model(r, *model, config.model.emplace());
  if (const toml::table* t = r.table(root, "", "data")) read_data(r, *t, config.data);
  const toml::table* train = r.table(root, "", "train");
  if (train != nullptr) read_train(r, *train, config.train);
  if (config.model) check_model_and_train(r, model, train, *config.model, config.train);
  if (!r.failed() && train != nullptr && config.train.val_every > 0 && config.data.val_path.empty())
    r.fail_at(*train, "train", "val_every",
              "needs data.val_path (the held-out token file `topolaunch-worker data prepare` "
              "writes)");
  check_observe(r, observe, config);
  check_start(r, job, mapping, rdma, config);
  if (first_error) {
    // Values are quoted in the message as they are, escapes decoded ("\t"): one line.
    first_error->message = one_line(first_error->message);
    return *first_error;
  }
  config.mapping.ranks_per_node = config.job.ranks_per_node;
  config.mapping.nics = config.rdma.nics;
  return config;
}

Result<JobConfig> parse_job_config_isolated(std::string_view toml_text, const std::string& path,
                                            const IsolationLimits& limits,
                                            const Overrides& overrides) {
  const Status probed = run_isolated(
      [&]() -> Status {
        auto config = parse_job_config(toml_text, path, overrides);
        if (!config) return config.error();
        return ok_status();
      },
      limits, path);
  if (!probed) return probed.error();
  return parse_job_config(toml_text, path, overrides);
}

Result<JobConfig> load_job_config(const std::string& path, const Overrides& overrides,
                                  std::string_view probed_digest) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(fmt::format("{}: cannot read the job config (check the path)", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(fmt::format("{}: cannot read the job config", path));
  std::string parsed = text.str();
  for (const std::string& o : overrides) parsed += '\0' + o;
  const std::string digest = content_digest(parsed);
  auto config = !probed_digest.empty() && probed_digest == digest
                    ? parse_job_config(text.str(), path, overrides)
                    : parse_job_config_isolated(text.str(), path, IsolationLimits{}, overrides);
  if (config) config->digest = digest;
  return config;
}

std::string_view to_string(StartMode mode) {
  return mode == StartMode::early ? "early" : "checked";
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

std::string_view to_string(ModelKind kind) {
  switch (kind) {
    case ModelKind::gpt2:
      return "gpt2";
    case ModelKind::llama:
      return "llama";
    case ModelKind::mlp:
      return "mlp";
  }
  return "?";
}

std::string_view to_string(DataKind kind) {
  switch (kind) {
    case DataKind::text:
      return "text";
    case DataKind::janeaustenr:
      return "janeaustenr";
    case DataKind::tokens:
      return "tokens";
  }
  return "?";
}

std::string_view to_string(TrainPrecision precision) {
  switch (precision) {
    case TrainPrecision::fp32:
      return "fp32";
    case TrainPrecision::bf16:
      return "bf16";
    case TrainPrecision::fp8:
      return "fp8";
  }
  return "?";
}

std::string_view to_string(OffloadSetting offload) {
  switch (offload) {
    case OffloadSetting::none:
      return "none";
    case OffloadSetting::optimizer:
      return "optimizer";
    case OffloadSetting::automatic:
      return "auto";
  }
  return "?";
}

std::string_view to_string(ShardSetting shard) {
  switch (shard) {
    case ShardSetting::none:
      return "none";
    case ShardSetting::optimizer:
      return "optimizer";
    case ShardSetting::gradients:
      return "gradients";
    case ShardSetting::parameters:
      return "parameters";
    case ShardSetting::automatic:
      return "auto";
  }
  return "?";
}

bool is_schema_key(std::string_view dotted) {
  const auto dot = dotted.rfind('.');
  if (dot == std::string_view::npos) return false;
  const detail::TableSchema* table = detail::find_table(dotted.substr(0, dot));
  if (table == nullptr) return false;
  const std::string_view key = dotted.substr(dot + 1);
  return std::find(table->keys.begin(), table->keys.end(), key) != table->keys.end();
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
      "job        {}: nodes {}, ranks/node {}, restarts {}, heartbeat {}, progress watch {}\n",
      c.job.name, count(c.job.nodes, "all"), count(c.job.ranks_per_node, "auto"), c.job.restarts,
      c.job.heartbeat_timeout.count() == 0 ? "off" : format_duration(c.job.heartbeat_timeout),
      c.job.progress_timeout.count() == 0 ? "off" : format_duration(c.job.progress_timeout));
  if (c.job.start == StartMode::early)
    out += "start      early: workers before the agents' exchange, checked against the map\n";
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
  if (!c.observe.trace_steps.empty() || c.observe.metrics_port != 0) {
    std::string steps;
    for (auto s : c.observe.trace_steps) steps += (steps.empty() ? "" : ",") + std::to_string(s);
    out += fmt::format(
        "observe    trace steps {}, metrics port {}\n", steps.empty() ? std::string("none") : steps,
        c.observe.metrics_port == 0 ? std::string("off") : std::to_string(c.observe.metrics_port));
  }
  if (c.cost.gpu_hour > 0 || c.cost.core_hour > 0)
    out += fmt::format("cost       {} per GPU-hour, {} per core-hour\n", c.cost.gpu_hour,
                       c.cost.core_hour);
  std::string command;
  for (const auto& word : c.worker.command) command += (command.empty() ? "" : " ") + word;
  out += fmt::format("worker     {}{}\n", command, c.model ? " (with [model] table)" : "");
  if (c.model) {
    const ModelSpec& m = *c.model;
    const std::string vocab = m.vocab_size ? std::to_string(*m.vocab_size) : "from the data";
    if (m.kind == ModelKind::gpt2) {
      out += fmt::format("model      gpt2: {} layers, n_embd {}, {} heads, block {}, vocab {}\n",
                         m.n_layer, m.n_embd, m.n_head, m.block_size, vocab);
    } else if (m.kind == ModelKind::llama) {
      out += fmt::format(
          "model      llama: {} layers, n_embd {}, {} heads ({} key/value), ffn {}, block {}, "
          "vocab {}\n",
          m.n_layer, m.n_embd, m.n_head, m.n_kv_head,
          m.ffn_hidden ? std::to_string(m.ffn_hidden) : std::string("8/3 n_embd"), m.block_size,
          vocab);
    } else {
      out += fmt::format("model      mlp: n_embd {}, {} hidden layers, vocab {}\n", m.n_embd,
                         m.hidden.size(), vocab);
    }
    const TrainSpec& t = c.train;
    const std::string shard =
        t.shard == ShardSetting::none ? "" : fmt::format(", shard {}", to_string(t.shard));
    out += fmt::format("train      {} steps of batch {} x seq {}, {}{}, data {}{}{}\n", t.steps,
                       t.batch, t.seq_len, to_string(t.precision), shard, to_string(c.data.kind),
                       c.data.path.empty() ? "" : " ", c.data.path);
  }
  return out;
}

}  // namespace topolaunch::jobspec
