// Training data without downloads: character-level text (a file or a folder of files), Jane
// Austen's novels decoded from R's lazy-load database, or GPT-2 BPE tokens in llm.c's .bin layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/job.hpp"

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
// llm.c token file: 256 int32 header (magic 20240520, version 1, count), then count uint16.
Result<Dataset> load_token_file(const std::string& path);

Result<Dataset> load_dataset(const DataSpec& spec);

}  // namespace topolaunch::kernels
