// Tokenizer over Debian's libsentencepiece (0.1.97): training through SentencePieceTrainer with
// our own sentence iterator (no temporary corpus file), encoding through one shared
// SentencePieceProcessor (its Encode is const and thread-safe).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "topolaunch/kernels/tokenizer.hpp"

// Exported by libsentencepiece (spm_train's --minloglevel sets it) but not declared in its
// public headers; without it the trainer writes some hundred INFO lines to stderr.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace topolaunch::kernels {

struct Tokenizer::Model {
  std::string path;
  sentencepiece::SentencePieceProcessor processor;
  std::int32_t newline = -1;
};

bool have_sentencepiece() { return true; }
std::string without_sentencepiece() { return {}; }

namespace {

std::unique_ptr<Tokenizer::Model> from_serialized(const std::string& bytes, const std::string& path,
                                                  const std::string& key, Status& status) {
  auto model = std::make_unique<Tokenizer::Model>();
  model->path = path;
  if (auto s = model->processor.LoadFromSerializedProto(bytes); !s.ok()) {
    status = make_error(key + ": " + path + " is not a SentencePiece model (" +
                        std::string(s.message()) + ")");
    return nullptr;
  }
  if (model->processor.GetPieceSize() <= 0) {
    status = make_error(key + ": " + path + " is a SentencePiece model without pieces");
    return nullptr;
  }
  const int nl = model->processor.PieceToId(std::string(kNewlinePiece));
  if (nl != model->processor.unk_id()) model->newline = nl;
  return model;
}

// Lines in order, for the trainer.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string_view>& lines) : lines_(lines) { load(); }
  bool done() const override { return next_ > lines_.size(); }
  void Next() override { load(); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    // Empty lines teach nothing; skip them (the trainer counts them as sentences).
    while (next_ < lines_.size() && lines_[next_].empty()) ++next_;
    if (next_ < lines_.size()) value_.assign(lines_[next_]);
    ++next_;
  }
  const std::vector<std::string_view>& lines_;
  std::size_t next_ = 0;
  std::string value_;
};

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(key + ": cannot open " + path + " (check the path and permissions)");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (bytes.str().empty())
    return make_error(key + ": " + path + " is empty (not a tokenizer model)");
  Status status = ok_status();
  auto model = from_serialized(bytes.str(), path, key, status);
  if (!model) return status.error();
  return Tokenizer(std::move(model));
}

Result<Tokenizer> Tokenizer::train(const std::vector<std::string_view>& lines,
                                   const TokenizerTraining& o, const std::string& path) {
  sentencepiece::logging::SetMinLogLevel(1);
  sentencepiece::SetRandomGeneratorSeed(1);  // the sampled lines, so the model, are reproducible
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  std::unordered_map<std::string, std::string> args{
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"control_symbols", std::string(kNewlinePiece)},
      {"character_coverage", "1.0"},
      {"input_sentence_size", std::to_string(o.max_lines)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::max(1, threads))},
  };
  LineIterator it(lines);
  std::string serialized;
  if (auto s = sentencepiece::SentencePieceTrainer::Train(args, &it, &serialized); !s.ok())
    return make_error(path + ": training the tokenizer failed: " + std::string(s.message()));
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(serialized.data(), static_cast<std::streamsize>(serialized.size()));
    if (!out.flush())
      return make_error("cannot write " + temporary + ": " + std::strerror(errno), 1);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    return make_error("cannot write " + path + ": " + std::strerror(errno), 1);
  Status status = ok_status();
  auto model = from_serialized(serialized, path, "tokenizer", status);
  if (!model) return status.error();
  return Tokenizer(std::move(model));
}

Tokenizer::Tokenizer(std::unique_ptr<Model> model) : model_(std::move(model)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::int64_t Tokenizer::vocab_size() const { return model_->processor.GetPieceSize(); }
std::int32_t Tokenizer::newline_id() const { return model_->newline; }
const std::string& Tokenizer::path() const { return model_->path; }

void Tokenizer::encode_line(std::string_view line, std::vector<std::int32_t>& out) const {
  std::vector<int> ids;
  model_->processor.Encode(line, &ids).IgnoreError();  // fails only without a model
  out.insert(out.end(), ids.begin(), ids.end());
}

void Tokenizer::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    encode_line(text.substr(0, end), out);
    if (end == std::string_view::npos) break;
    if (model_->newline >= 0) out.push_back(model_->newline);
    text.remove_prefix(end + 1);
  }
}

std::string Tokenizer::decode(std::span<const std::int32_t> tokens) const {
  std::string text;
  std::vector<int> line;
  auto flush = [&] {
    std::string piece;
    model_->processor.Decode(line, &piece).IgnoreError();
    text += piece;
    line.clear();
  };
  const int n = model_->processor.GetPieceSize();
  for (std::int32_t t : tokens) {
    if (t == model_->newline) {
      flush();
      text += '\n';
    } else if (t >= 0 && t < n) {
      line.push_back(t);
    }
  }
  flush();
  return text;
}

}  // namespace topolaunch::kernels
