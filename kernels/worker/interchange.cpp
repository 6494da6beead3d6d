// safetensors with Hugging Face GPT-2 names, config.json, model.json (interchange.hpp).
#include "topolaunch/kernels/interchange.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "topolaunch/kernels/checkpoint.hpp"

namespace topolaunch::kernels {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;  // safetensors' own bound

// A name from an untrusted file, fit for a one-line message: control bytes as '?', at most 120
// bytes.
std::string printable(std::string_view text) {
  std::string out(text.substr(0, 120));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return text.size() > 120 ? out + "..." : out;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status write_file(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush())
      return make_error("cannot write " + temporary + ": " + std::strerror(errno), 1);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    return make_error("cannot write " + path + ": " + std::strerror(errno), 1);
  return ok_status();
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot open (check the path and permissions)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

float from_half(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      std::uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Our matrices [out, in] <-> Conv1D's [in, out].
std::vector<float> transposed(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(v.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = v[static_cast<std::size_t>(r * cols + c)];
  return t;
}

struct NameMap {
  std::string ours, theirs;
  std::vector<std::int64_t> their_shape;
  bool transpose = false;  // ours is [their_shape[1], their_shape[0]]
};

std::vector<NameMap> gpt2_names(const GptConfig& c) {
  const std::int64_t C = c.n_embd;
  std::vector<NameMap> m{{"wte", "wte.weight", {c.vocab_size, C}},
                         {"wpe", "wpe.weight", {c.block_size, C}}};
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "h" + std::to_string(l) + ".", q = "h." + std::to_string(l) + ".";
    m.push_back({p + "ln1w", q + "ln_1.weight", {C}});
    m.push_back({p + "ln1b", q + "ln_1.bias", {C}});
    m.push_back({p + "qkvw", q + "attn.c_attn.weight", {C, 3 * C}, true});
    m.push_back({p + "qkvb", q + "attn.c_attn.bias", {3 * C}});
    m.push_back({p + "attprojw", q + "attn.c_proj.weight", {C, C}, true});
    m.push_back({p + "attprojb", q + "attn.c_proj.bias", {C}});
    m.push_back({p + "ln2w", q + "ln_2.weight", {C}});
    m.push_back({p + "ln2b", q + "ln_2.bias", {C}});
    m.push_back({p + "fcw", q + "mlp.c_fc.weight", {C, 4 * C}, true});
    m.push_back({p + "fcb", q + "mlp.c_fc.bias", {4 * C}});
    m.push_back({p + "fcprojw", q + "mlp.c_proj.weight", {4 * C, C}, true});
    m.push_back({p + "fcprojb", q + "mlp.c_proj.bias", {C}});
  }
  m.push_back({"lnfw", "ln_f.weight", {C}});
  m.push_back({"lnfb", "ln_f.bias", {C}});
  return m;
}

std::int64_t padded_vocab(const GptConfig& c) {
  return c.padded_vocab ? c.padded_vocab : (c.vocab_size + 63) / 64 * 64;
}

}  // namespace

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const std::uint64_t bytes = t.values.size() * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string bytes(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += text;
  bytes.reserve(bytes.size() + offset);
  for (const NamedTensor& t : tensors)
    bytes.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  return write_file(path, bytes);
}

Result<std::vector<NamedTensor>> read_safetensors(const std::string& path) {
  auto raw = read_file(path);
  if (!raw) return raw.error();
  const std::string& s = *raw;
  if (s.size() < 8)
    return make_error(path + ": truncated safetensors header (" + std::to_string(s.size()) +
                      " bytes; the 8-byte header length is missing)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(s[static_cast<std::size_t>(i)]);
  if (n > kMaxHeaderBytes || n > s.size() - 8)
    return make_error(path + ": truncated safetensors header (its length says " +
                      std::to_string(n) + " bytes, the file holds " + std::to_string(s.size() - 8) +
                      " after it)");
  json header =
      json::parse(s.begin() + 8, s.begin() + 8 + static_cast<std::ptrdiff_t>(n), nullptr, false);
  if (header.is_discarded() || !header.is_object())
    return make_error(path + ": the safetensors header is not a JSON object");
  const std::uint64_t data_bytes = s.size() - 8 - n;
  const char* data = s.data() + 8 + n;
  std::vector<std::pair<std::uint64_t, NamedTensor>> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor " + printable(name);
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
      return make_error(where + ": needs dtype, shape and data_offsets [begin, end]");
    const std::string dtype = entry["dtype"];
    std::uint64_t width = 0;
    if (dtype == "F32")
      width = 4;
    else if (dtype == "F16" || dtype == "BF16")
      width = 2;
    else
      return make_error(where + ": dtype " + printable(dtype) + " (F32, F16 or BF16 are read)");
    NamedTensor t;
    t.name = name;
    std::uint64_t elements = 1;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (std::uint64_t{1} << 40))
        return make_error(where + ": shape " + entry["shape"].dump() + " is not a list of sizes");
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v != 0 && elements > (std::uint64_t{1} << 40) / v)
        return make_error(where + ": shape " + entry["shape"].dump() + " is too large");
      elements *= v;
      t.shape.push_back(static_cast<std::int64_t>(v));
    }
    const json& range = entry["data_offsets"];
    if (!range[0].is_number_unsigned() || !range[1].is_number_unsigned())
      return make_error(where + ": data_offsets " + range.dump() + " are not byte offsets");
    const std::uint64_t begin = range[0], end = range[1];
    if (begin > end || end > data_bytes)
      return make_error(where + ": data_offsets " + range.dump() + " lie outside the " +
                        std::to_string(data_bytes) + " data bytes (a truncated file?)");
    if (end - begin != elements * width)
      return make_error(where + ": " + std::to_string(end - begin) + " bytes for shape " +
                        shape_text(t.shape) + " of " + dtype + " (needs " +
                        std::to_string(elements * width) + ")");
    t.values.resize(elements);
    const char* p = data + begin;
    for (std::uint64_t i = 0; i < elements; ++i) {
      if (width == 4) {
        std::memcpy(&t.values[i], p + 4 * i, 4);
      } else {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        if (dtype == "BF16") {
          const std::uint32_t bits = std::uint32_t{h} << 16;
          std::memcpy(&t.values[i], &bits, 4);
        } else {
          t.values[i] = from_half(h);
        }
      }
    }
    out.emplace_back(begin, std::move(t));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<NamedTensor> tensors;
  for (auto& [offset, t] : out) tensors.push_back(std::move(t));
  return tensors;
}

std::vector<NamedTensor> to_hf_gpt2(const GptConfig& c, const NamedWeights& w) {
  std::vector<NamedTensor> out;
  for (const NameMap& m : gpt2_names(c)) {
    const std::vector<float>& v = w.at(m.ours);
    NamedTensor t{m.theirs, m.their_shape, {}};
    if (m.ours == "wte")
      t.values.assign(v.begin(), v.begin() + c.vocab_size * c.n_embd);  // padded rows dropped
    else if (m.transpose)
      t.values = transposed(v, m.their_shape[1], m.their_shape[0]);
    else
      t.values = v;
    out.push_back(std::move(t));
  }
  return out;
}

std::string hf_gpt2_config_json(const GptConfig& c) {
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.block_size},
            {"n_ctx", c.block_size},
            {"n_embd", c.n_embd},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},  // GELU, tanh approximation
            {"layer_norm_epsilon", 1e-5},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

Result<NamedWeights> from_hf_gpt2(const std::string& dir, const GptConfig& c) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    auto text = read_file(config_path);
    if (!text) return text.error();
    json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return make_error(config_path + ": not a JSON object (a Hugging Face config.json)");
    const std::pair<const char*, std::int64_t> expected[] = {{"n_layer", c.n_layer},
                                                             {"n_embd", c.n_embd},
                                                             {"n_head", c.n_head},
                                                             {"n_positions", c.block_size},
                                                             {"vocab_size", c.vocab_size}};
    const char* ours[] = {"model.n_layer", "model.n_embd", "model.n_head", "model.block_size",
                          "the vocabulary in use"};
    for (std::size_t i = 0; i < std::size(expected); ++i) {
      const auto& [key, want] = expected[i];
      if (j.contains(key) && (!j[key].is_number_integer() || j[key].get<std::int64_t>() != want))
        return make_error(config_path + ": " + key + " = " + j[key].dump() + ", but " + ours[i] +
                          " = " + std::to_string(want));
    }
  }
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  auto tensors = read_safetensors(path);
  if (!tensors) return tensors.error();
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : *tensors) {
    std::string_view name = t.name;
    if (name.starts_with("transformer.")) name.remove_prefix(12);
    // The tied head, and the causal-mask buffers older transformers saved: nothing to load.
    if (name == "lm_head.weight" || name.ends_with(".attn.bias") ||
        name.ends_with(".attn.masked_bias"))
      continue;
    by_name[std::string(name)] = &t;
  }
  NamedWeights w;
  std::set<std::string> used;
  for (const NameMap& m : gpt2_names(c)) {
    auto it = by_name.find(m.theirs);
    if (it == by_name.end())
      return make_error(path + ": tensor " + m.theirs + " is missing (the model needs " +
                        shape_text(m.their_shape) + ")");
    const NamedTensor& t = *it->second;
    if (t.shape != m.their_shape)
      return make_error(path + ": tensor " + printable(t.name) + " has shape " +
                        shape_text(t.shape) + ", the model needs " + shape_text(m.their_shape));
    used.insert(m.theirs);
    if (m.ours == "wte") {
      std::vector<float> v(static_cast<std::size_t>(padded_vocab(c) * c.n_embd), 0.0f);
      std::copy(t.values.begin(), t.values.end(), v.begin());
      w[m.ours] = std::move(v);
    } else if (m.transpose) {
      w[m.ours] = transposed(t.values, m.their_shape[0], m.their_shape[1]);
    } else {
      w[m.ours] = t.values;
    }
  }
  for (const auto& [name, t] : by_name)
    if (!used.contains(name))
      return make_error(path + ": tensor " + printable(t->name) +
                        " is not a parameter of this GPT-2 (" + std::to_string(c.n_layer) +
                        " layers)");
  return w;
}

Status export_hf_gpt2(const std::string& dir, const GptConfig& c, const NamedWeights& w,
                      const std::string& tokenizer) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error("cannot create " + dir + ": " + ec.message(), 1);
  if (auto s = write_safetensors((fs::path(dir) / "model.safetensors").string(), to_hf_gpt2(c, w),
                                 {{"format", "pt"}});
      !s)
    return s;
  if (auto s = write_file((fs::path(dir) / "config.json").string(), hf_gpt2_config_json(c)); !s)
    return s;
  if (!tokenizer.empty()) {
    fs::copy_file(tokenizer, fs::path(dir) / "tokenizer.model",
                  fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error("cannot copy " + tokenizer + " to " + dir + ": " + ec.message(), 1);
  }
  return ok_status();
}

Status write_model_description(const std::string& dir, const ModelDescription& m) {
  const GptConfig& c = m.config;
  json j = {{"kind", "gpt2"},
            {"n_layer", c.n_layer},
            {"n_embd", c.n_embd},
            {"n_head", c.n_head},
            {"block_size", c.block_size},
            {"vocab_size", c.vocab_size},
            {"padded_vocab", padded_vocab(c)}};
  if (m.newline_token >= 0) j["newline_token"] = m.newline_token;
  std::error_code ec;
  fs::create_directories(dir, ec);
  return write_file((fs::path(dir) / "model.json").string(), j.dump(2) + "\n");
}

Result<ModelDescription> read_model_description(const std::string& dir) {
  const std::string path = (fs::path(dir) / "model.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    return make_error(path + " does not exist (a checkpoint folder of topolaunch-worker holds it)");
  auto text = read_file(path);
  if (!text) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(path + ": not a JSON object");
  ModelDescription m;
  if (!j.contains("kind") || j["kind"] != "gpt2")
    return make_error(path + ": kind: only \"gpt2\" is sampled and exported");
  const std::pair<const char*, std::int64_t*> fields[] = {
      {"n_layer", &m.config.n_layer},       {"n_embd", &m.config.n_embd},
      {"n_head", &m.config.n_head},         {"block_size", &m.config.block_size},
      {"vocab_size", &m.config.vocab_size}, {"padded_vocab", &m.config.padded_vocab}};
  for (const auto& [key, out] : fields) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 1 ||
        j[key].get<std::int64_t>() > (std::int64_t{1} << 31))
      return make_error(path + ": " + key + ": missing or not a positive integer");
    *out = j[key].get<std::int64_t>();
  }
  if (m.config.n_embd % m.config.n_head != 0 || m.config.padded_vocab < m.config.vocab_size)
    return make_error(path + ": n_embd, n_head, vocab_size and padded_vocab do not fit together");
  if (j.contains("newline_token") && j["newline_token"].is_number_integer())
    m.newline_token = j["newline_token"].get<std::int32_t>();
  m.config.batch = 1;
  m.config.seq_len = 1;
  return m;
}

std::string tokenizer_beside(const std::string& dir) {
  std::error_code ec;
  const fs::path p = fs::path(dir) / "tokenizer.model";
  return fs::is_regular_file(p, ec) ? p.string() : std::string();
}

Status describe_checkpoint_dir(const std::string& dir, const ModelDescription& model,
                               const std::string& tokenizer) {
  // Written once: a restart (perhaps onto a full disk) finds the same files and writes nothing.
  ModelDescription written;
  if (auto m = read_model_description(dir); m) written = *m;
  const GptConfig &a = written.config, &b = model.config;
  const bool same = a.n_layer == b.n_layer && a.n_embd == b.n_embd && a.n_head == b.n_head &&
                    a.block_size == b.block_size && a.vocab_size == b.vocab_size &&
                    a.padded_vocab == padded_vocab(b) &&
                    written.newline_token == model.newline_token;
  if (!same)
    if (auto s = write_model_description(dir, model); !s) return s;
  if (tokenizer.empty()) return ok_status();
  const fs::path to = fs::path(dir) / "tokenizer.model";
  auto from_bytes = read_file(tokenizer);
  if (!from_bytes)
    return make_error("data.tokenizer: " + from_bytes.error().message,
                      from_bytes.error().exit_code);
  if (auto to_bytes = read_file(to.string()); to_bytes && *to_bytes == *from_bytes)
    return ok_status();
  if (auto s = write_file(to.string(), *from_bytes); !s)
    return make_error("data.tokenizer: " + s.error().message, s.error().exit_code);
  return ok_status();
}

Status load_initial_weights(
    const std::string& dir, const GptConfig& config, const Graph& graph,
    const std::function<Status(const CheckpointEntry&, std::span<const float>)>& write) {
  auto weights = from_hf_gpt2(dir, config);
  if (!weights) return make_error("train.init_from: " + weights.error().message);
  for (const CheckpointEntry& e : checkpoint_layout(graph)) {
    if (e.kind != CheckpointEntry::Kind::parameter) continue;
    const std::vector<float>& v = weights->at(e.name);
    if (v.size() != e.elements)
      return make_error("train.init_from: " + e.name + ": " + std::to_string(v.size()) +
                        " values, the model has " + std::to_string(e.elements));
    if (auto s = write(e, v); !s) return s;
  }
  return ok_status();
}

Result<std::pair<std::string, NamedWeights>> load_checkpoint_weights(const std::string& path,
                                                                     const GptConfig& config) {
  GptConfig c = config;
  c.batch = 1;
  c.seq_len = 1;
  Graph g = build_gpt2(c);
  append_backward(g);
  append_optimizer(g);
  NamedWeights w;
  WriteCheckpointTensor keep = [&](const CheckpointEntry& e, std::span<const float> v) -> Status {
    if (e.kind == CheckpointEntry::Kind::parameter) w[e.name].assign(v.begin(), v.end());
    return ok_status();
  };
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    auto r = resume_from_newest(path, g, keep);
    if (!r) return r.error();
    if (!*r) return make_error(path + " holds no checkpoint (checkpoint-<step>.bin)");
    return std::make_pair((*r)->path, std::move(w));
  }
  auto r = load_checkpoint(path, g, keep);
  if (!r) return r.error();
  return std::make_pair(path, std::move(w));
}

}  // namespace topolaunch::kernels
