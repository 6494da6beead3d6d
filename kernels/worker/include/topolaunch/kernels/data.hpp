// Training data without downloads: character-level text (a file or a folder of files), Jane
// Austen's novels decoded from R's lazy-load database, or tokens in llm.c's .bin layout (written by
// `topolaunch-worker data prepare` with a SentencePiece tokenizer, or llm.c's own GPT-2 files).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/jobspec/job_config.hpp"

namespace topolaunch::kernels {

struct Dataset {
  std::vector<std::int32_t> tokens;
  std::int64_t vocab_size = 0;
  std::vector<unsigned char> byte_of_token;  // character level: token id -> byte
  std::string description;                   // for the log: what was loaded
};

// Character level over the bytes that occur (sorted), so the vocabulary is small.
Result<Dataset> char_level_dataset(const std::string& text, const std::string& what);
// A text file, or every regular file of a folder (sorted by name; fortune ".dat" indexes and
// other binary files skipped). Empty or non-text input is an error naming the file.
Result<std::string> read_text(const std::string& path);
// Decodes every character vector of an R lazy-load database (.rdb: per object a 4-byte
// big-endian length + a zlib stream of R's XDR serialisation) and joins the elements with '\n'.
Result<std::string> decode_r_lazyload_text(const std::string& rdb_path);
// llm.c token file: a 256 x int32 header (magic 20240520, version 1, header[2] the token count),
// then count uint16 tokens. header[3] is ours: the vocabulary size of the tokenizer that wrote the
// file (`data prepare`); llm.c leaves it 0, read as GPT-2's 50257. A token at or above the
// vocabulary, a count the file does not hold, a wrong magic or version: errors naming the file
// and `key` (exit 2).
inline constexpr std::int32_t kTokenFileMagic = 20240520;
inline constexpr std::int64_t kGpt2Vocabulary = 50257;
inline constexpr std::int64_t kMaxTokenFileVocabulary = 65535;  // the bound on uint16 ids
Result<Dataset> load_token_file(const std::string& path, const std::string& key = "data.path");

// Writes a token file as the tokens come (the header's count is filled in by finish), to a
// temporary name renamed into place by finish: a reader never sees a half-written file.
class TokenFileWriter {
 public:
  // vocab: 1..kMaxTokenFileVocabulary, stored in header[3].
  static Result<TokenFileWriter> create(const std::string& path, std::int64_t vocab);
  TokenFileWriter(TokenFileWriter&& other) noexcept;
  TokenFileWriter& operator=(TokenFileWriter&&) = delete;
  ~TokenFileWriter();
  Status append(std::span<const std::int32_t> tokens);
  Status finish();
  std::int64_t count() const { return count_; }

 private:
  TokenFileWriter(std::string path, std::FILE* file, std::int64_t vocab);
  std::string path_, temporary_;
  std::FILE* file_ = nullptr;
  std::int64_t vocab_ = 0, count_ = 0;
  std::vector<std::uint16_t> buffer_;
};

Result<Dataset> load_dataset(const jobspec::DataSpec& spec);

}  // namespace topolaunch::kernels
