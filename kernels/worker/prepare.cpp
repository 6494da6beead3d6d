// data prepare: corpus -> tokenizer -> train/val token files (prepare.hpp).
#include "topolaunch/kernels/prepare.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <thread>
#include <vector>

#include "topolaunch/common/env.hpp"
#include "topolaunch/jobspec/job_config.hpp"
#include "topolaunch/kernels/data.hpp"

namespace topolaunch::kernels {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kBlockBytes = std::size_t{4} << 20;   // read at a time (whole lines)
constexpr std::size_t kPieceBytes = std::size_t{16} << 10;  // the unit of the train/val split
constexpr const char* kFortunes = "/usr/share/games/fortunes";

// Text: no NUL bytes and at most 1% control characters other than tab/newline/CR/form feed.
bool looks_like_text(std::string_view s) {
  std::size_t control = 0;
  for (unsigned char c : s) {
    if (c == 0) return false;
    if (c < 32 && c != '\n' && c != '\t' && c != '\r' && c != '\f') ++control;
  }
  return control * 100 <= s.size();
}

// One file in blocks of whole lines. `skip_binary`: a folder's file that is not text is passed
// over (fortune's .dat indexes); a file named alone must be text.
Status stream_file(const fs::path& path, bool skip_binary,
                   const std::function<Status(std::string_view)>& block, std::size_t& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("data prepare: cannot open " + path.string());
  std::string buf, carry;
  bool first = true;
  while (in) {
    buf.resize(kBlockBytes);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    buf.resize(static_cast<std::size_t>(in.gcount()));
    if (buf.empty()) break;
    if (first && !looks_like_text(buf)) {
      if (skip_binary) return ok_status();
      return make_error("data prepare: " + path.string() + " is not a text file (binary bytes)");
    }
    first = false;
    const std::size_t last = buf.rfind('\n');
    if (last == std::string::npos) {
      carry += buf;
      continue;
    }
    std::string text = carry + buf.substr(0, last + 1);
    carry = buf.substr(last + 1);
    bytes += text.size();
    if (auto s = block(text); !s) return s;
  }
  if (!carry.empty()) {
    carry += '\n';
    bytes += carry.size();
    if (auto s = block(carry); !s) return s;
  }
  return ok_status();
}

}  // namespace

Status read_corpus(const std::string& corpus,
                   const std::function<Status(std::string_view)>& block) {
  std::size_t bytes = 0;
  if (corpus == "janeaustenr" || corpus.ends_with(".rdb")) {
    const std::string rdb =
        corpus != "janeaustenr"
            ? corpus
            : env_value("TOPOLAUNCH_JANEAUSTENR").value_or(jobspec::kJaneAustenRdb);
    auto text = decode_r_lazyload_text(rdb);
    if (!text) return make_error("data prepare: " + text.error().message);
    for (std::size_t at = 0; at < text->size();) {
      std::size_t end = std::min(text->size(), at + kBlockBytes);
      const std::size_t nl = text->rfind('\n', end - 1);
      if (end < text->size() && nl != std::string::npos && nl >= at) end = nl + 1;
      if (auto s = block(std::string_view(*text).substr(at, end - at)); !s) return s;
      bytes += end - at;
      at = end;
    }
  } else {
    const fs::path path = corpus == "fortunes" ? fs::path(kFortunes) : fs::path(corpus);
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(path, ec))
        if (e.is_regular_file() && e.path().extension() != ".dat" && e.path().extension() != ".u8")
          files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files)
        if (auto s = stream_file(f, true, block, bytes); !s) return s;
    } else if (!fs::exists(path, ec)) {
      return make_error("data prepare: " + path.string() + " does not exist (a text file, a " +
                        "folder of them, janeaustenr or fortunes)");
    } else if (auto s = stream_file(path, false, block, bytes); !s) {
      return s;
    }
    if (bytes == 0)
      return make_error("data prepare: " + path.string() +
                        " is empty (no text to train a tokenizer on)");
  }
  if (bytes == 0) return make_error("data prepare: " + corpus + " is empty (no text)");
  return ok_status();
}

namespace {

// Pieces of about kPieceBytes, cut after a line break.
std::vector<std::string_view> cut_pieces(std::string_view block) {
  std::vector<std::string_view> pieces;
  while (!block.empty()) {
    std::size_t end = std::min(block.size(), kPieceBytes);
    if (end < block.size()) {
      const std::size_t nl = block.find('\n', end - 1);
      end = nl == std::string_view::npos ? block.size() : nl + 1;
    }
    pieces.push_back(block.substr(0, end));
    block.remove_prefix(end);
  }
  return pieces;
}

// Which split each piece goes to: validation while it holds less than `fraction` of the bytes.
struct SplitRule {
  double fraction;
  std::size_t seen = 0, val = 0;
  bool to_val(std::size_t piece) {
    seen += piece;
    const bool v =
        fraction > 0 && static_cast<double>(val + piece / 2) < fraction * static_cast<double>(seen);
    if (v) val += piece;
    return v;
  }
};

int thread_count(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::vector<std::vector<std::int32_t>> encode_pieces(const Tokenizer& tokenizer,
                                                     const std::vector<std::string_view>& pieces,
                                                     int threads) {
  std::vector<std::vector<std::int32_t>> out(pieces.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < pieces.size(); i = next++) tokenizer.encode(pieces[i], out[i]);
  };
  const int n = std::min<int>(threads, static_cast<int>(pieces.size()));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<std::int32_t> encode_parallel(const Tokenizer& tokenizer, std::string_view text,
                                          int threads) {
  std::vector<std::int32_t> all;
  for (auto& part : encode_pieces(tokenizer, cut_pieces(text), thread_count(threads)))
    all.insert(all.end(), part.begin(), part.end());
  return all;
}

Result<PreparedData> prepare_data(const PrepareOptions& o, std::ostream& log) {
  PreparedData r;
  r.threads = thread_count(o.threads);
  if (o.training.vocab_size < 2 || o.training.vocab_size > kMaxTokenFileVocabulary)
    return make_error("data prepare: --vocab-size " + std::to_string(o.training.vocab_size) +
                      " is out of range (allowed 2..65535: token files hold uint16 ids)");
  if (o.training.model_type != "bpe" && o.training.model_type != "unigram")
    return make_error("data prepare: --model-type \"" + o.training.model_type +
                      "\" is not one of \"bpe\", \"unigram\"");
  if (!(o.val_fraction >= 0 && o.val_fraction < 0.5))
    return make_error("data prepare: --val-fraction " + std::to_string(o.val_fraction) +
                      " is out of range (allowed 0 to below 0.5)");
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return make_error("data prepare: cannot create " + o.out_dir + ": " + ec.message(), 1);
  r.train_path = (fs::path(o.out_dir) / "train.bin").string();
  if (o.val_fraction > 0) r.val_path = (fs::path(o.out_dir) / "val.bin").string();

  // The tokenizer: an existing one, or trained on the training split's lines.
  std::optional<Tokenizer> tokenizer;
  auto t0 = std::chrono::steady_clock::now();
  if (!o.tokenizer.empty()) {
    auto loaded = Tokenizer::load(o.tokenizer, "data prepare: --tokenizer");
    if (!loaded) return loaded.error();
    tokenizer.emplace(std::move(*loaded));
    r.tokenizer_path = o.tokenizer;
  } else {
    if (!have_sentencepiece()) return make_error("data prepare: " + without_sentencepiece());
    std::vector<std::string> kept;  // the training sample's text
    std::int64_t lines = 0;
    SplitRule split{o.val_fraction};
    auto collect = [&](std::string_view block) -> Status {
      for (std::string_view piece : cut_pieces(block)) {
        if (split.to_val(piece.size())) continue;
        if (o.training.max_lines > 0 && lines >= o.training.max_lines) continue;
        kept.emplace_back(piece);
        lines += static_cast<std::int64_t>(std::count(piece.begin(), piece.end(), '\n'));
      }
      return ok_status();
    };
    if (auto s = read_corpus(o.corpus, collect); !s) return s.error();
    std::vector<std::string_view> views;
    for (const std::string& piece : kept) {
      std::string_view rest = piece;
      while (!rest.empty()) {
        const std::size_t nl = rest.find('\n');
        views.push_back(rest.substr(0, nl));
        rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
      }
    }
    if (std::none_of(views.begin(), views.end(), [](std::string_view l) { return !l.empty(); }))
      return make_error("data prepare: " + o.corpus + " holds no text to train a tokenizer on");
    r.tokenizer_path = (fs::path(o.out_dir) / "tokenizer.model").string();
    TokenizerTraining training = o.training;
    training.threads = r.threads;
    auto trained = Tokenizer::train(views, training, r.tokenizer_path);
    if (!trained) return make_error("data prepare: " + trained.error().message);
    tokenizer.emplace(std::move(*trained));
    r.train_seconds = seconds_since(t0);
    log << "tokenizer: " << r.tokenizer_path << " (" << o.training.model_type << ", vocabulary "
        << tokenizer->vocab_size() << ", trained on " << views.size() << " lines in "
        << static_cast<int>(r.train_seconds * 1000) << " ms)\n";
  }
  r.vocab = tokenizer->vocab_size();
  if (r.vocab > kMaxTokenFileVocabulary)
    return make_error("data prepare: " + r.tokenizer_path + ": a vocabulary of " +
                      std::to_string(r.vocab) + " does not fit uint16 tokens (at most 65535)");

  // Encoding: every piece of a block on the threads, written in order.
  auto train_file = TokenFileWriter::create(r.train_path, r.vocab);
  if (!train_file) return train_file.error();
  std::optional<TokenFileWriter> val_file;
  if (!r.val_path.empty()) {
    auto v = TokenFileWriter::create(r.val_path, r.vocab);
    if (!v) return v.error();
    val_file.emplace(std::move(*v));
  }
  t0 = std::chrono::steady_clock::now();
  SplitRule split{o.val_fraction};
  auto encode = [&](std::string_view block) -> Status {
    const auto pieces = cut_pieces(block);
    const auto tokens = encode_pieces(*tokenizer, pieces, r.threads);
    r.corpus_bytes += static_cast<std::int64_t>(block.size());
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      TokenFileWriter& out = split.to_val(pieces[i].size()) ? *val_file : *train_file;
      if (auto s = out.append(tokens[i]); !s) return s;
    }
    return ok_status();
  };
  if (auto s = read_corpus(o.corpus, encode); !s) return s.error();
  r.train_tokens = train_file->count();
  r.val_tokens = val_file ? val_file->count() : 0;
  if (val_file && r.val_tokens == 0)
    return make_error("data prepare: " + o.corpus + " is too small for a validation split (" +
                      std::to_string(r.corpus_bytes) +
                      " bytes; pieces are 16 KiB): use --val-fraction 0");
  if (auto s = train_file->finish(); !s) return s.error();
  if (val_file)
    if (auto s = val_file->finish(); !s) return s.error();
  r.encode_seconds = seconds_since(t0);
  const double tokens = static_cast<double>(r.train_tokens + r.val_tokens);
  log << "train: " << r.train_path << " (" << r.train_tokens << " tokens)\n";
  if (val_file) log << "val: " << r.val_path << " (" << r.val_tokens << " tokens)\n";
  log << "encoded " << r.corpus_bytes << " bytes in " << static_cast<int>(r.encode_seconds * 1000)
      << " ms on " << r.threads << " thread(s): "
      << static_cast<long long>(r.encode_seconds > 0 ? tokens / r.encode_seconds : 0)
      << " tokens/s\n";
  return r;
}

}  // namespace topolaunch::kernels
