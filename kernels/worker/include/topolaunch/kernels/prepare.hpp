// `topolaunch-worker data prepare`: a corpus (janeaustenr, fortunes, a text file or a folder of
// them) -> a SentencePiece tokenizer trained on its training split and both splits encoded into
// llm.c token files: OUT/tokenizer.model, OUT/train.bin, OUT/val.bin. The job file names them
// ([data] path, val_path, tokenizer).
//
// The corpus is read in blocks of whole lines and cut into pieces of about 16 KiB (at line
// breaks); each piece goes to the validation split while that split holds less than val_fraction
// of the bytes read so far, so the split is spread over the whole corpus and does not depend on
// the thread count. The pieces of a block are encoded on every core and written in order, so the
// output is the same for any number of threads and memory does not grow with the corpus (the
// tokenizer's training sample aside: at most TokenizerTraining::max_lines lines).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/tokenizer.hpp"

namespace topolaunch::kernels {

struct PrepareOptions {
  std::string corpus;  // "janeaustenr", "fortunes", a text file or a folder of text files
  std::string out_dir;
  TokenizerTraining training;
  std::string tokenizer;  // an existing model to encode with ("" : train one into out_dir)
  double val_fraction = 0.05;
  int threads = 0;  // 0: every core
};

struct PreparedData {
  std::string tokenizer_path, train_path, val_path;  // val_path "" with val_fraction 0
  std::int64_t vocab = 0, train_tokens = 0, val_tokens = 0, corpus_bytes = 0;
  double train_seconds = 0, encode_seconds = 0;  // training the tokenizer; reading + encoding
  int threads = 1;
};

Result<PreparedData> prepare_data(const PrepareOptions& options, std::ostream& log);

// The corpus as blocks of whole lines (the last line of a source given its line break), in
// order: `block` is called with each; an error of the source (missing, empty, not text) names it.
// "janeaustenr" is Debian's r-cran-janeaustenr (or $TOPOLAUNCH_JANEAUSTENR), "fortunes" Debian's
// /usr/share/games/fortunes.
Status read_corpus(const std::string& corpus, const std::function<Status(std::string_view)>& block);

// Encodes `text` (whole lines) on `threads` threads: the tokens of each line and the newline
// token after each line break, in order (what prepare writes for it).
std::vector<std::int32_t> encode_parallel(const Tokenizer& tokenizer, std::string_view text,
                                          int threads);

}  // namespace topolaunch::kernels
