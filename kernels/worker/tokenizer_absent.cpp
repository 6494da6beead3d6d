// A build without SentencePiece (meson -Dsentencepiece=disabled, or a host without
// libsentencepiece-dev): training on prepared token files works; tokenizing says why not.
#include "topolaunch/kernels/tokenizer.hpp"

namespace topolaunch::kernels {

struct Tokenizer::Model {
  std::string path;
};

bool have_sentencepiece() { return false; }

std::string without_sentencepiece() {
  return "this topolaunch-worker was built without SentencePiece (install libsentencepiece-dev "
         "and configure with meson -Dsentencepiece=enabled)";
}

Result<Tokenizer> Tokenizer::load(const std::string& path, const std::string& key) {
  return make_error(key + ": " + path + ": cannot read the tokenizer: " + without_sentencepiece());
}

Result<Tokenizer> Tokenizer::train(const std::vector<std::string_view>&, const TokenizerTraining&,
                                   const std::string& path) {
  return make_error(path + ": cannot train a tokenizer: " + without_sentencepiece());
}

Tokenizer::Tokenizer(std::unique_ptr<Model> model) : model_(std::move(model)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;
std::int64_t Tokenizer::vocab_size() const { return 0; }
std::int32_t Tokenizer::newline_id() const { return -1; }
void Tokenizer::encode_line(std::string_view, std::vector<std::int32_t>&) const {}
void Tokenizer::encode(std::string_view, std::vector<std::int32_t>&) const {}
std::string Tokenizer::decode(std::span<const std::int32_t>) const { return {}; }
const std::string& Tokenizer::path() const { return model_->path; }

}  // namespace topolaunch::kernels
