// data prepare, sample, export (commands.hpp).
#include "topolaunch/kernels/commands.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>

#include "topolaunch/kernels/interchange.hpp"
#include "topolaunch/kernels/prepare.hpp"
#include "topolaunch/kernels/tokenizer.hpp"

namespace topolaunch::kernels {

namespace fs = std::filesystem;

const char* const kDataPrepareUsage =
    "usage: topolaunch-worker data prepare --corpus CORPUS --out DIR [--vocab-size N]\n"
    "         [--model-type bpe|unigram] [--val-fraction F] [--tokenizer MODEL] [--threads N]\n"
    "  CORPUS: janeaustenr, fortunes, a text file or a folder of text files. Trains a\n"
    "  SentencePiece tokenizer on the training split (default BPE, vocabulary 1024; --tokenizer:\n"
    "  encode with an existing model instead) and writes DIR/tokenizer.model, DIR/train.bin and\n"
    "  DIR/val.bin (llm.c's token-file layout; --val-fraction of the text, default 0.05, spread\n"
    "  over the corpus). Encodes on every core (--threads).\n";
const char* const kSampleUsage =
    "usage: topolaunch-worker sample CHECKPOINT [--prompt TEXT] [--prompt-ids 1,2,3]\n"
    "         [--tokens N] [--temperature T] [--top-k K] [--seed S] [--device cpu|cuda]\n"
    "         [--logits FILE]\n"
    "  CHECKPOINT: a checkpoint folder (its newest good generation; model.json and\n"
    "  tokenizer.model beside it) or one checkpoint-<step>.bin in such a folder. Generates N\n"
    "  tokens (default 200) after the prompt with a KV cache: temperature 0.8, top-k 40, seed\n"
    "  1337 by default (temperature 0: the most likely token). Prints the text, decoded by the\n"
    "  stored tokenizer (token ids where this build has no SentencePiece). --logits FILE: the\n"
    "  logits after each prompt token, float32 little-endian, prompt tokens x vocabulary (to\n"
    "  compare with another framework's forward).\n";
const char* const kExportUsage =
    "usage: topolaunch-worker export CHECKPOINT --out DIR\n"
    "  Writes DIR/model.safetensors (Hugging Face GPT-2 tensor names, fp32), DIR/config.json and\n"
    "  DIR/tokenizer.model: transformers.GPT2LMHeadModel.from_pretrained(DIR) loads it, and a job\n"
    "  starts from it with [train] init_from = \"DIR\".\n";

namespace {

int bad(std::ostream& err, const std::string& what) {
  err << "topolaunch-worker: " << what << "\n";
  return 2;
}
int failed(std::ostream& err, const Error& e) {
  err << "topolaunch-worker: " << e.message << "\n";
  return e.exit_code;
}

// --name value pairs and positional words; "--name" without a value is an error.
struct Args {
  std::map<std::string, std::string> options;
  std::vector<std::string> words;
  std::string error;
};

Args parse(const std::vector<std::string>& args, const std::vector<std::string>& known,
           const char* command) {
  Args a;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s.starts_with("--")) {
      if (std::find(known.begin(), known.end(), s) == known.end()) {
        a.error = std::string(command) + ": unknown option " + s;
        return a;
      }
      if (i + 1 >= args.size()) {
        a.error = std::string(command) + ": " + s + " needs a value";
        return a;
      }
      a.options[s] = args[++i];
    } else {
      a.words.push_back(s);
    }
  }
  return a;
}

template <class T>
bool number(const std::string& text, T& out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && p == end;
}

// Where the checkpoint's model.json and tokenizer are: the folder, or the file's folder; "" when
// the path names nothing.
std::string checkpoint_folder(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  if (fs::is_directory(path, ec)) return path;
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

int run_data_prepare(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Args a = parse(args,
                 {"--corpus", "--out", "--vocab-size", "--model-type", "--val-fraction",
                  "--tokenizer", "--threads"},
                 "data prepare");
  if (!a.error.empty()) return bad(err, a.error);
  if (!a.words.empty()) return bad(err, "data prepare: unexpected argument " + a.words[0]);
  PrepareOptions o;
  o.corpus = a.options["--corpus"];
  o.out_dir = a.options["--out"];
  if (o.corpus.empty())
    return bad(err,
               "data prepare: --corpus is missing (janeaustenr, fortunes, a file or a folder)");
  if (o.out_dir.empty()) return bad(err, "data prepare: --out is missing (the folder to write)");
  if (a.options.contains("--vocab-size") &&
      !number(a.options["--vocab-size"], o.training.vocab_size))
    return bad(err,
               "data prepare: --vocab-size " + a.options["--vocab-size"] + " is not an integer");
  if (a.options.contains("--model-type")) o.training.model_type = a.options["--model-type"];
  if (a.options.contains("--val-fraction")) {
    try {
      std::size_t used = 0;
      o.val_fraction = std::stod(a.options["--val-fraction"], &used);
      if (used != a.options["--val-fraction"].size()) throw std::invalid_argument("x");
    } catch (const std::exception&) {
      return bad(
          err, "data prepare: --val-fraction " + a.options["--val-fraction"] + " is not a number");
    }
  }
  if (a.options.contains("--threads") &&
      (!number(a.options["--threads"], o.threads) || o.threads < 1 || o.threads > 4096))
    return bad(err, "data prepare: --threads " + a.options["--threads"] + " is not 1..4096");
  o.tokenizer = a.options["--tokenizer"];
  auto r = prepare_data(o, out);
  if (!r) return failed(err, r.error());
  return 0;
}

int run_export(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Args a = parse(args, {"--out"}, "export");
  if (!a.error.empty()) return bad(err, a.error);
  if (a.words.size() != 1) return bad(err, "export: name one checkpoint (a folder or a file)");
  if (!a.options.contains("--out"))
    return bad(err, "export: --out is missing (the folder to write)");
  const std::string folder = checkpoint_folder(a.words[0]);
  if (folder.empty())
    return bad(
        err, "export: " + a.words[0] + " does not exist (a checkpoint folder or checkpoint file)");
  auto model = read_model_description(folder);
  if (!model) return failed(err, model.error());
  auto weights = load_checkpoint_weights(a.words[0], model->config);
  if (!weights) return failed(err, weights.error());
  if (auto s = export_hf_gpt2(a.options["--out"], model->config, weights->second,
                              tokenizer_beside(folder));
      !s)
    return failed(err, s.error());
  out << "exported " << weights->first << " to " << a.options["--out"]
      << "/model.safetensors (+ config.json"
      << (tokenizer_beside(folder).empty() ? "" : ", tokenizer.model") << ")\n";
  return 0;
}

int run_sample(const std::vector<std::string>& args, DecoderFactory cuda_decoder, std::ostream& out,
               std::ostream& err) {
  Args a = parse(args,
                 {"--prompt", "--prompt-ids", "--tokens", "--temperature", "--top-k", "--seed",
                  "--device", "--logits"},
                 "sample");
  if (!a.error.empty()) return bad(err, a.error);
  if (a.words.size() != 1) return bad(err, "sample: name one checkpoint (a folder or a file)");
  SamplingOptions so;
  if (a.options.contains("--tokens") &&
      (!number(a.options["--tokens"], so.tokens) || so.tokens < 1))
    return bad(err, "sample: --tokens " + a.options["--tokens"] + " is not a positive integer");
  if (a.options.contains("--top-k") && (!number(a.options["--top-k"], so.top_k) || so.top_k < 0))
    return bad(err, "sample: --top-k " + a.options["--top-k"] + " is not a count (0: all)");
  if (a.options.contains("--seed") && !number(a.options["--seed"], so.seed))
    return bad(err, "sample: --seed " + a.options["--seed"] + " is not an unsigned integer");
  if (a.options.contains("--temperature")) {
    try {
      std::size_t used = 0;
      so.temperature = std::stod(a.options["--temperature"], &used);
      if (used != a.options["--temperature"].size() || so.temperature < 0)
        throw std::invalid_argument("x");
    } catch (const std::exception&) {
      return bad(err,
                 "sample: --temperature " + a.options["--temperature"] + " is not a number >= 0");
    }
  }
  const std::string device = a.options.contains("--device") ? a.options["--device"] : "cpu";
  if (device != "cpu" && device != "cuda")
    return bad(err, "sample: --device " + device + " is not one of cpu, cuda");
  if (device == "cuda" && cuda_decoder == nullptr)
    return bad(err,
               "sample: --device cuda needs the CUDA backend, and this topolaunch-worker was "
               "built without it (meson setup -Dcuda=enabled)");
  const std::string folder = checkpoint_folder(a.words[0]);
  if (folder.empty())
    return bad(
        err, "sample: " + a.words[0] + " does not exist (a checkpoint folder or checkpoint file)");
  auto model = read_model_description(folder);
  if (!model) return failed(err, model.error());
  const GptConfig& config = model->config;

  // The tokenizer stored with the checkpoint, where this build can read it.
  std::optional<Tokenizer> tokenizer;
  const std::string tokenizer_path = tokenizer_beside(folder);
  std::string no_text_because;
  if (tokenizer_path.empty()) {
    no_text_because = folder + " holds no tokenizer.model (the job named no data.tokenizer)";
  } else if (!have_sentencepiece()) {
    no_text_because = without_sentencepiece();
  } else {
    auto t = Tokenizer::load(tokenizer_path, "sample");
    if (!t) return failed(err, t.error());
    if (t->vocab_size() != config.vocab_size)
      return bad(err, "sample: " + tokenizer_path + " has a vocabulary of " +
                          std::to_string(t->vocab_size()) + ", the model " +
                          std::to_string(config.vocab_size));
    tokenizer.emplace(std::move(*t));
  }

  std::vector<std::int32_t> prompt;
  if (a.options.contains("--prompt-ids")) {
    std::string_view rest = a.options["--prompt-ids"];
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      std::int32_t id = -1;
      if (!number(std::string(rest.substr(0, comma)), id) || id < 0 || id >= config.vocab_size)
        return bad(err, "sample: --prompt-ids: " + std::string(rest.substr(0, comma)) +
                            " is not a token id below " + std::to_string(config.vocab_size));
      prompt.push_back(id);
      rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
    }
  } else if (a.options.contains("--prompt")) {
    if (!tokenizer)
      return bad(err, "sample: --prompt needs the tokenizer: " + no_text_because +
                          " (give --prompt-ids instead)");
    tokenizer->encode(a.options["--prompt"], prompt);
  }
  if (prompt.empty()) {  // start a new line
    const std::int32_t nl = tokenizer ? tokenizer->newline_id() : model->newline_token;
    prompt.push_back(nl >= 0 ? nl : 0);
  }

  auto weights = load_checkpoint_weights(a.words[0], config);
  if (!weights) return failed(err, weights.error());
  auto decoder = (device == "cuda" ? cuda_decoder : &create_cpu_decoder)(config, weights->second);
  if (!decoder) {
    err << "topolaunch-worker: sample: " << decoder.error().message << "\n";
    return decoder.error().exit_code;
  }
  err << "sample: " << weights->first << " (" << (*decoder)->description() << "), " << prompt.size()
      << " prompt token(s), " << so.tokens << " new, temperature " << so.temperature << ", top-k "
      << so.top_k << ", seed " << so.seed << "\n";
  if (!tokenizer) err << "sample: token ids, not text: " << no_text_because << "\n";
  if (a.options.contains("--logits")) {
    // The prompt's logits alone, through a decoder of their own (generate starts afresh).
    auto probe = (device == "cuda" ? cuda_decoder : &create_cpu_decoder)(config, weights->second);
    if (!probe) return failed(err, probe.error());
    std::ofstream file(a.options["--logits"], std::ios::binary | std::ios::trunc);
    for (std::int32_t t : prompt) {
      auto l = (*probe)->step(t);
      if (!l) return failed(err, l.error());
      file.write(reinterpret_cast<const char*>(l->data()),
                 static_cast<std::streamsize>(l->size() * sizeof(float)));
    }
    if (!file.flush()) return bad(err, "sample: --logits: cannot write " + a.options["--logits"]);
  }
  auto tokens = generate(**decoder, prompt, so, config.block_size);
  if (!tokens) {
    err << "topolaunch-worker: sample: " << tokens.error().message << "\n";
    return tokens.error().exit_code;
  }
  if (tokenizer) {
    std::vector<std::int32_t> all = prompt;
    all.insert(all.end(), tokens->begin(), tokens->end());
    out << tokenizer->decode(all) << "\n";
  } else {
    for (std::size_t i = 0; i < tokens->size(); ++i) out << (i ? " " : "") << (*tokens)[i];
    out << "\n";
  }
  return 0;
}

}  // namespace topolaunch::kernels
