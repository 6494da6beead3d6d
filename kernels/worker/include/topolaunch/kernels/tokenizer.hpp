// Subword tokenizers through SentencePiece (Debian's libsentencepiece: BPE and unigram models),
// trained on a corpus and used to encode it (`topolaunch-worker data prepare`) and to decode
// samples. SentencePiece encodes one line at a time (as spm_encode does); a line break is its own
// token, the control symbol "<nl>" every model we train has, so a token stream decodes back into
// lines. The library is optional at build time (meson -Dsentencepiece): GPU hosts without it
// train on prepared token files, and whatever needs the tokenizer says it was built without it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "topolaunch/common/result.hpp"

namespace topolaunch::kernels {

// Whether this build links SentencePiece (tokenizer_sentencepiece.cpp) or not
// (tokenizer_absent.cpp).
bool have_sentencepiece();
// "built without SentencePiece (...)": what an operation that needs it says.
std::string without_sentencepiece();

inline constexpr std::string_view kNewlinePiece = "<nl>";

struct TokenizerTraining {
  std::int64_t vocab_size = 1024;
  std::string model_type = "bpe";  // "bpe" or "unigram"
  int threads = 0;                 // 0: every core
  // Lines sampled for training (SentencePiece's input_sentence_size; 0: all of them).
  std::int64_t max_lines = 2'000'000;
};

class Tokenizer {
 public:
  // A model file (`data prepare` wrote it, or any SentencePiece model): a missing, unreadable or
  // corrupt one is an error naming `key` and the file (exit 2).
  static Result<Tokenizer> load(const std::string& path, const std::string& key = "tokenizer");
  // Trains a model on `lines` (each without its line break) and writes it to `path`.
  static Result<Tokenizer> train(const std::vector<std::string_view>& lines,
                                 const TokenizerTraining& options, const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::int64_t vocab_size() const;
  // The "<nl>" token; -1 for a model without it (lines then run together).
  std::int32_t newline_id() const;
  // Appends the tokens of one line (no line break in it). Thread-safe: encoders share one model.
  void encode_line(std::string_view line, std::vector<std::int32_t>& out) const;
  // Appends the tokens of text: each line's, and newline_id() after each line break.
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
  // Text of tokens: each run between newline tokens decoded as one line.
  std::string decode(std::span<const std::int32_t> tokens) const;
  const std::string& path() const;

  struct Model;  // the library's processor (tokenizer_sentencepiece.cpp)

 private:
  explicit Tokenizer(std::unique_ptr<Model> model);
  std::unique_ptr<Model> model_;
};

}  // namespace topolaunch::kernels
