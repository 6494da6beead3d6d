// Parsing of the worker's TOML tables. Unknown keys in our tables are errors (typos must not
// silently train a different model); other tables belong to the launcher and are ignored.
#include "topolaunch/kernels/job.hpp"

#include <toml++/toml.h>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "topolaunch/common/isolated.hpp"
#include "topolaunch/jobspec/toml_guard.hpp"

namespace topolaunch::kernels {

namespace {

std::string where(const std::string& path, const toml::node* node) {
  if (node == nullptr) return path;
  const auto& src = node->source();
  return path + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

struct Reader {
  const std::string& path;
  const toml::table& root;
  std::string error;

  const toml::table* table(const char* name) {
    const toml::node* n = root.get(name);
    if (n == nullptr) return nullptr;
    if (!n->is_table()) {
      fail(n, name, "must be a table");
      return nullptr;
    }
    return n->as_table();
  }
  void fail(const toml::node* n, const std::string& key, const std::string& what) {
    if (error.empty()) error = where(path, n) + ": " + key + ": " + what;
  }
  void check_keys(const toml::table* t, const char* name, std::set<std::string> known) {
    if (t == nullptr) return;
    for (const auto& [k, v] : *t) {
      if (!known.count(std::string(k.str())) && error.empty()) {
        const auto& src = k.source();  // the key itself, not its value
        error = src.begin.line > 0
                    ? path + ":" + std::to_string(src.begin.line) + ":" +
                          std::to_string(src.begin.column) + ": " + name + "." +
                          std::string(k.str()) + ": unknown key"
                    : where(path, &v) + ": " + name + "." + std::string(k.str()) + ": unknown key";
      }
    }
  }
  template <class T>
  void integer(const toml::table* t, const char* table_name, const char* key, T& out) {
    if (t == nullptr) return;
    const toml::node* n = t->get(key);
    if (n == nullptr) return;
    auto v = n->value<std::int64_t>();
    if (!v || !n->is_integer())
      return fail(n, std::string(table_name) + "." + key, "must be an integer");
    out = static_cast<T>(*v);
  }
  void number(const toml::table* t, const char* table_name, const char* key, double& out) {
    if (t == nullptr) return;
    const toml::node* n = t->get(key);
    if (n == nullptr) return;
    if (!n->is_number()) return fail(n, std::string(table_name) + "." + key, "must be a number");
    out = *n->value<double>();
  }
  void string(const toml::table* t, const char* table_name, const char* key, std::string& out) {
    if (t == nullptr) return;
    const toml::node* n = t->get(key);
    if (n == nullptr) return;
    if (!n->is_string()) return fail(n, std::string(table_name) + "." + key, "must be a string");
    out = *n->value<std::string>();
  }
  void boolean(const toml::table* t, const char* table_name, const char* key, bool& out) {
    if (t == nullptr) return;
    const toml::node* n = t->get(key);
    if (n == nullptr) return;
    if (!n->is_boolean())
      return fail(n, std::string(table_name) + "." + key, "must be true or false");
    out = *n->value<bool>();
  }
  const toml::node* node(const toml::table* t, const char* key) {
    return t ? t->get(key) : nullptr;
  }
};

Status apply_override(toml::table& root, const std::string& text) {
  const auto eq = text.find('=');
  const auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    return make_error("--set " + text + ": expected table.key=value (e.g. train.batch=8)");
  const std::string table = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text.substr(eq + 1));
  } catch (const toml::parse_error&) {
    try {
      parsed = toml::parse("v = \"" + text.substr(eq + 1) + "\"");  // bare strings
    } catch (const toml::parse_error& e) {
      return make_error("--set " + text + ": value is not TOML (" + std::string(e.description()) +
                        ")");
    }
  }
  if (!root.contains(table)) root.insert(table, toml::table{});
  auto* t = root.get(table)->as_table();
  if (t == nullptr) return make_error("--set " + text + ": " + table + " is not a table");
  t->insert_or_assign(key, *parsed.get("v"));
  return ok_status();
}

}  // namespace

Result<std::uint64_t> parse_size(const std::string& text) {
  std::size_t idx = 0;
  double v = 0;
  try {
    v = std::stod(text, &idx);
  } catch (...) {
    return make_error("\"" + text + "\" is not a size (use binary units, e.g. \"16GiB\")");
  }
  std::string unit = text.substr(idx);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double mult = 0;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KiB" || unit == "K")
    mult = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  if (mult == 0 || v < 0 || !std::isfinite(v))
    return make_error("\"" + text + "\" is not a size (use binary units, e.g. \"16GiB\")");
  return static_cast<std::uint64_t>(v * mult);
}

Result<double> parse_duration_ms(const std::string& text) {
  std::size_t idx = 0;
  double v = 0;
  try {
    v = std::stod(text, &idx);
  } catch (...) {
    return make_error("\"" + text + "\" is not a duration (e.g. \"5ms\", \"2s\")");
  }
  const std::string unit = text.substr(idx);
  double mult = 0;
  if (unit == "us")
    mult = 1e-3;
  else if (unit == "ms")
    mult = 1;
  else if (unit == "s")
    mult = 1e3;
  else if (unit == "m" || unit == "min")
    mult = 60e3;
  else if (unit == "h")
    mult = 3600e3;
  if (mult == 0 || v < 0)
    return make_error("\"" + text + "\" is not a duration (e.g. \"5ms\", \"2s\")");
  return v * mult;
}

Result<WorkerConfig> load_worker_config(const std::string& path,
                                        const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot read the job file (check the path)");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  if (Status guarded = jobspec::check_toml_text(text, path); !guarded) return guarded.error();
  auto parse = [&](toml::table& out) -> Status {
    try {
      out = toml::parse(text, path);
    } catch (const toml::parse_error& e) {
      const auto& src = e.source();
      return make_error(path + ":" + std::to_string(src.begin.line) + ":" +
                        std::to_string(src.begin.column) + ": " + std::string(e.description()));
    }
    return ok_status();
  };
  // A crash probe first (common/isolated.hpp): a TOML library defect becomes one error line.
  const Status probed = run_isolated(
      [&] {
        toml::table scratch;
        return parse(scratch);
      },
      IsolationLimits{}, path);
  if (!probed) return probed.error();
  toml::table root;
  if (Status parsed = parse(root); !parsed) return parsed.error();
  for (const auto& o : overrides)
    if (auto s = apply_override(root, o); !s) return s.error();
  WorkerConfig c;
  c.path = path;
  Reader r{path, root, {}};
  const toml::table* model = r.table("model");
  const toml::table* data = r.table("data");
  const toml::table* train = r.table("train");
  const toml::table* budget = r.table("budget");
  if (!r.error.empty()) return make_error(r.error);
  if (model == nullptr)
    return make_error(path + ": model: missing table [model] (the worker needs a model)");

  r.check_keys(model, "model",
               {"kind", "n_layer", "n_embd", "n_head", "block_size", "vocab_size", "padded_vocab",
                "hidden"});
  r.check_keys(data, "data", {"kind", "path"});
  r.check_keys(
      train, "train",
      {"batch",           "seq_len",  "steps",        "learning_rate",     "beta1",
       "beta2",           "epsilon",  "weight_decay", "grad_clip",         "warmup_steps",
       "min_lr_fraction", "seed",     "grad_accum",   "log_every",         "checkpoint_every",
       "checkpoint_dir",  "resume",   "metrics_file", "link_gbytes_per_s", "collective_latency_us",
       "compute_gflops",  "precision"});
  r.string(model, "model", "kind", c.model.kind);
  if (c.model.kind != "gpt2" && c.model.kind != "mlp")
    return make_error(where(path, r.node(model, "kind")) + ": model.kind: unknown model kind \"" +
                      c.model.kind + "\" (known: \"gpt2\", \"mlp\")");
  GptConfig& g = c.model.gpt;
  r.integer(model, "model", "n_layer", g.n_layer);
  r.integer(model, "model", "n_embd", g.n_embd);
  r.integer(model, "model", "n_head", g.n_head);
  r.integer(model, "model", "block_size", g.block_size);
  r.integer(model, "model", "padded_vocab", g.padded_vocab);
  if (r.node(model, "vocab_size") != nullptr) {
    r.integer(model, "model", "vocab_size", g.vocab_size);
    c.model.vocab_from_data = false;
  }
  c.model.mlp.n_embd = g.n_embd;
  c.model.mlp.vocab_size = g.vocab_size;
  if (const toml::node* h = r.node(model, "hidden")) {
    if (!h->is_array())
      return make_error(where(path, h) + ": model.hidden: must be an array of widths");
    c.model.mlp.hidden.clear();
    for (const auto& e : *h->as_array()) {
      if (!e.is_integer())
        return make_error(where(path, &e) + ": model.hidden: widths must be integers");
      c.model.mlp.hidden.push_back(*e.value<std::int64_t>());
    }
  }
  r.string(data, "data", "kind", c.data.kind);
  r.string(data, "data", "path", c.data.path);
  if (c.data.kind != "text" && c.data.kind != "janeaustenr" && c.data.kind != "tokens")
    return make_error(where(path, r.node(data, "kind")) + ": data.kind: unknown data kind \"" +
                      c.data.kind + "\" (known: \"text\", \"janeaustenr\", \"tokens\")");
  if (c.data.path.empty() && c.data.kind == "janeaustenr")
    c.data.path = "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb";

  TrainSpec& t = c.train;
  r.integer(train, "train", "batch", t.batch);
  r.integer(train, "train", "seq_len", t.seq_len);
  r.integer(train, "train", "steps", t.steps);
  r.number(train, "train", "learning_rate", t.adamw.learning_rate);
  r.number(train, "train", "beta1", t.adamw.beta1);
  r.number(train, "train", "beta2", t.adamw.beta2);
  r.number(train, "train", "epsilon", t.adamw.epsilon);
  r.number(train, "train", "weight_decay", t.adamw.weight_decay);
  r.number(train, "train", "grad_clip", t.adamw.grad_clip);
  r.integer(train, "train", "warmup_steps", t.warmup_steps);
  r.number(train, "train", "min_lr_fraction", t.min_lr_fraction);
  r.integer(train, "train", "seed", t.seed);
  r.integer(train, "train", "grad_accum", t.grad_accum);
  r.integer(train, "train", "log_every", t.log_every);
  r.integer(train, "train", "checkpoint_every", t.checkpoint_every);
  r.string(train, "train", "checkpoint_dir", t.checkpoint_dir);
  r.boolean(train, "train", "resume", t.resume);
  r.string(train, "train", "metrics_file", t.metrics_file);
  r.string(train, "train", "precision", t.precision);
  if (t.precision != "fp32" && t.precision != "bf16")
    return make_error(where(path, r.node(train, "precision")) + ": train.precision: \"" +
                      t.precision + "\" is not one of \"fp32\", \"bf16\"");
  r.number(train, "train", "link_gbytes_per_s", t.link_gbytes_per_s);
  r.number(train, "train", "collective_latency_us", t.collective_latency_us);
  r.number(train, "train", "compute_gflops", t.compute_gflops);
  if (!r.error.empty()) return make_error(r.error);
  if (t.steps < 0)
    return make_error(where(path, r.node(train, "steps")) + ": train.steps: must be >= 0");
  if (t.grad_accum < 0)
    return make_error(where(path, r.node(train, "grad_accum")) +
                      ": train.grad_accum: must be >= 0 (0 = auto)");
  if (t.log_every <= 0) t.log_every = 1;
  g.batch = c.model.mlp.batch = t.batch;
  g.seq_len = c.model.mlp.seq_len = t.seq_len;
  if (c.model.kind == "gpt2") {
    if (auto s = validate(g); !s) {
      // Point at the offending key where we can.
      const std::string& m = s.error().message;
      const std::string key = m.substr(0, m.find(':'));
      const toml::table* tbl = key.rfind("train.", 0) == 0 ? train : model;
      const toml::node* n = tbl ? tbl->get(key.substr(key.find('.') + 1)) : nullptr;
      return make_error(where(path, n) + ": " + m);
    }
  } else if (auto s = validate(c.model.mlp); !s) {
    return make_error(path + ": " + s.error().message);
  }

  // [budget]: sizes and durations as strings (the launcher's units).
  auto size_key = [&](const char* key, std::uint64_t& out) -> Status {
    const toml::node* n = r.node(budget, key);
    if (n == nullptr) return ok_status();
    if (n->is_integer()) {
      out = static_cast<std::uint64_t>(*n->value<std::int64_t>());
      return ok_status();
    }
    auto v = n->is_string() ? parse_size(*n->value<std::string>())
                            : Result<std::uint64_t>(make_error("must be a size"));
    if (!v) return make_error(where(path, n) + ": budget." + key + ": " + v.error().message);
    out = *v;
    return ok_status();
  };
  if (auto s = size_key("memory", c.budget.memory_bytes); !s) return s.error();
  if (auto s = size_key("gpu_memory", c.budget.gpu_memory_bytes); !s) return s.error();
  if (auto s = size_key("comm_per_step", c.budget.comm_bytes_per_step); !s) return s.error();
  if (const toml::node* n = r.node(budget, "comm_exposed_per_step")) {
    auto v = n->is_string() ? parse_duration_ms(*n->value<std::string>())
                            : Result<double>(make_error("must be a duration"));
    if (!v)
      return make_error(where(path, n) + ": budget.comm_exposed_per_step: " + v.error().message);
    c.budget.comm_exposed_ms_per_step = *v;
  }
  return c;
}

}  // namespace topolaunch::kernels
